"""Worker processes that step slices of environments straight into shared memory.

Protocol. Each worker owns a contiguous slice ``[start, stop)`` of the envs and three channels:

* ``cmd``: one byte from the parent per command (the hot path carries nothing else);
* ``done``: one status byte from the worker when a command has finished
  (or, in per-env mode, one byte per env with the env's slot in the slice);
* ``data``: a pickled side channel, used only for payloads that are irregular or rare: reset
  arguments, infos when non-empty, ``call`` results, and error reports.

Observations, actions, rewards and flags live in one shared buffer laid out from the spaces.
The parent waits with ``poll`` on the ``done`` pipes *and* the process sentinels, so a worker that
dies is noticed at once, never as a bare ``EOFError`` and never as a hang.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from vecaccel.errors import WorkerError
from vecaccel.spaces import (
    item_reader,
    item_writer,
    leaf_specs,
    nbytes_of,
    read_item,
    views_from_buffer,
)
from vecaccel.vector import EnvRunner, check_env_spaces

__all__ = ["SharedLayout", "WorkerPool", "Command", "Status"]


class Command:
    STEP = 1  # step every env of the slice, one status byte at the end
    STEP_MASKED = 2  # step the envs flagged in the mask, one byte per env as each finishes
    RESET = 3
    CALL = 4
    SET_ATTR = 5
    CLOSE = 6


class Status:
    OK = 0
    OK_DATA = 1  # a payload follows on the data channel
    ERROR = 2  # an error report follows on the data channel
    READY = 3
    RESTARTED = 4  # (parent side only) the worker died and was started again


#: How often an idle worker checks that its parent is still alive (seconds).
PARENT_CHECK_INTERVAL = 1.0


@dataclass
class SharedViews:
    obs: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    step_mask: np.ndarray  # which envs a STEP_MASKED command steps
    done_seq: np.ndarray  # per worker, bumped before each status byte (lets the parent spin)
    payload_len: np.ndarray  # per worker: bytes of its reply's payload in payload_slab, or -1
    payload_slab: np.ndarray  # [num_workers, PAYLOAD_SLAB_BYTES] pickled reply payloads
    last_cpu: np.ndarray  # per worker: the CPU of its last reply, or -1 (WorkerPool.send_all)


#: Shared memory per worker for the pickled payload of a reply (step infos, reset infos...):
#: one that fits travels there instead of through the data pipe, which saves the worker a send
#: and the parent a poll and two reads. Bigger payloads still take the pipe.
PAYLOAD_SLAB_BYTES = 1 << 16


class SharedLayout:
    """The shared-memory layout of one vector env, computed the same way in parent and workers."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        num_envs: int,
        num_workers: int,
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_envs = num_envs
        self.num_workers = num_workers
        f64, boolean = np.dtype(np.float64), np.dtype(np.bool_)
        self.specs = (
            leaf_specs(observation_space, num_envs),
            leaf_specs(action_space, num_envs),
            ((num_envs,), f64),
            ((num_envs,), boolean),
            ((num_envs,), boolean),
            ((num_envs,), np.dtype(np.uint8)),
            ((num_workers * 8,), np.dtype(np.int64)),  # one cache line per worker
            ((num_workers, PAYLOAD_SLAB_BYTES), np.dtype(np.uint8)),
        )
        self.nbytes = nbytes_of(self.specs) + 64

    def views(self, buffer: Any) -> SharedViews:
        out = []
        offset = 0
        for spec in self.specs:
            view, offset = views_from_buffer(spec, buffer, offset)
            out.append(view)
        obs, actions, rewards, terms, truncs, mask, seq, slab = out
        return SharedViews(
            obs, actions, rewards, terms, truncs, mask, seq[::8], seq[1::8], slab, seq[2::8]
        )


# ---------------------------------------------------------------------------------------------
# the worker process


#: what an env's own code may raise and a worker reports, naming the env, instead of dying:
#: ``SystemExit`` too (an env or a library calling ``sys.exit``), which would otherwise end the
#: worker and report only its exit code
_ENV_ERRORS = (Exception, SystemExit)


def _error_report(index: int, exc: BaseException, what: str) -> tuple:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return (index, type(exc).__name__, str(exc), text, what)


def derived_seed(base: int | None, env_index: int, restart: int) -> int | None:
    """The seed for env ``env_index`` after its ``restart``-th rebuild (``None`` stays random).

    Example:
        >>> derived_seed(7, 3, 1) == derived_seed(7, 3, 1) != derived_seed(7, 3, 2)
        True
    """
    if base is None:
        return None
    return int(np.random.SeedSequence([int(base), env_index, restart]).generate_state(1)[0])


def restarted_info(autoreset_mode: AutoresetMode, obs: Any, reason: str) -> dict:
    """The info of the step that reports a rebuilt env (its episode ends as truncated)."""
    info = {"worker_restarted": True, "restart_reason": reason}
    if autoreset_mode is AutoresetMode.SAME_STEP:
        return {"final_obs": obs, "final_info": dict(info), **info}
    return info


def _pickled(dumps: Callable, payload: Any, index: int, what: str) -> tuple[bool, Any]:
    """Pickle ``payload`` for the data channel; if it cannot be pickled (an info holding a lock,
    say), pickle an error report naming the env at fault instead: it must not kill the worker."""
    try:
        return True, dumps(payload)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        if isinstance(payload, list):  # (env index, info) pairs: find the env at fault
            for item in payload:
                try:
                    dumps(item)
                except Exception:  # noqa: BLE001
                    if isinstance(item, tuple) and item and isinstance(item[0], int):
                        index = item[0]
                    break
        return False, dumps([_error_report(index, exc, what)])


class _MakeError(Exception):
    """An env function raised while a worker built its slice."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error


class _Slice:
    """The envs of one worker: step, reset, and rebuild them, writing into shared memory."""

    def __init__(
        self, start, env_fns, autoreset_mode, views, obs_space, action_space, restart_on_error
    ):
        self.start = start
        self.env_fns = env_fns
        self.autoreset_mode = autoreset_mode
        self.views = views
        self.obs_space = obs_space
        self.action_space = action_space
        self.restart_on_error = restart_on_error
        self.runners: list[EnvRunner] = []
        self.write_obs = item_writer(obs_space, views.obs)
        self.read_action = item_reader(views.actions, copy=True)
        self.last_seeds: list[int | None] = [None] * len(env_fns)
        self.restarts = [0] * len(env_fns)
        self._rewards: list[Any] = [0.0] * len(env_fns)
        self._terms: list[Any] = [False] * len(env_fns)
        self._truncs: list[Any] = [False] * len(env_fns)
        for j, fn in enumerate(env_fns):
            try:
                env = fn()
            except BaseException as exc:
                self.close()  # the envs built so far
                raise _MakeError(start + j, exc) from exc
            self.runners.append(EnvRunner(env, autoreset_mode, start + j))
            try:
                check_env_spaces(env, start + j, obs_space, action_space)
            except RuntimeError as exc:
                self.close()
                raise _MakeError(start + j, exc) from exc

    def step(self, j: int) -> tuple[dict | None, tuple | None]:
        """Step env ``j`` of the slice; return ``(info, error_report)``."""
        i = self.start + j
        views = self.views
        try:
            obs, rew, term, trunc, info = self.runners[j].step(self.read_action(i))
            self.write_obs(i, obs)
        except _ENV_ERRORS as exc:  # noqa: BLE001 - reported to the parent
            return self._failed(j, exc)
        views.rewards[i] = rew
        views.terminations[i] = term
        views.truncations[i] = trunc
        return info, None

    def step_all(self) -> tuple[list[tuple[int, dict]], list[tuple]]:
        """Step every env of the slice (the lock-step hot loop); return ``(infos, errors)``.

        Rewards and flags are gathered in lists and written with one slice assignment each,
        which saves three numpy item writes per env.
        """
        start, views = self.start, self.views
        read_action, write_obs = self.read_action, self.write_obs
        rewards, terms, truncs = self._rewards, self._terms, self._truncs
        infos: list[tuple[int, dict]] = []
        errors: list[tuple] = []
        for j, runner in enumerate(self.runners):
            i = start + j
            try:
                obs, rewards[j], terms[j], truncs[j], info = runner.step(read_action(i))
                write_obs(i, obs)
            except _ENV_ERRORS as exc:  # noqa: BLE001 - reported to the parent
                info, error = self._failed(j, exc)
                if error is not None:
                    errors.append(error)
                rewards[j] = views.rewards[i]  # as the failure left them (rebuilt or unchanged)
                terms[j], truncs[j] = views.terminations[i], views.truncations[i]
            if info:
                infos.append((i, info))
        stop = start + len(self.runners)
        views.rewards[start:stop] = rewards
        views.terminations[start:stop] = terms
        views.truncations[start:stop] = truncs
        return infos, errors

    def _failed(self, j: int, exc: BaseException) -> tuple[dict | None, tuple | None]:
        if not self.restart_on_error:
            return None, _error_report(self.start + j, exc, "step")
        return self.rebuild(j, f"{type(exc).__name__}: {exc}")

    def rebuild(self, j: int, reason: str) -> tuple[dict | None, tuple | None]:
        """Replace env ``j`` by a fresh one from its env function, reseeded from a derived seed."""
        i = self.start + j
        try:
            try:
                self.runners[j].env.close()
            except Exception:  # noqa: BLE001 - the broken env is being replaced anyway
                pass
            self.restarts[j] += 1
            runner = EnvRunner(self.env_fns[j](), self.autoreset_mode, i)
            self.runners[j] = runner
            check_env_spaces(runner.env, i, self.obs_space, self.action_space)
            obs, _ = runner.reset(seed=derived_seed(self.last_seeds[j], i, self.restarts[j]))
            self.write_obs(i, obs)
        except _ENV_ERRORS as exc:  # noqa: BLE001
            return None, _error_report(i, exc, "restart")
        # the interrupted episode ends as truncated; NEXT_STEP/DISABLED reset on the next step
        runner.needs_reset = self.autoreset_mode is not AutoresetMode.SAME_STEP
        self.views.rewards[i] = 0.0
        self.views.terminations[i] = False
        self.views.truncations[i] = True
        return restarted_info(self.autoreset_mode, obs, reason), None

    def reset(self, j: int, seed, options, needs_reset: bool = False):
        i = self.start + j
        self.last_seeds[j] = seed if seed is not None else self.last_seeds[j]
        obs, info = self.runners[j].reset(seed=seed, options=options)
        self.write_obs(i, obs)
        self.views.terminations[i] = self.views.truncations[i] = False
        self.views.rewards[i] = 0.0
        self.runners[j].needs_reset = needs_reset
        return info

    def reset_all(self, seeds, options, mask, needs_reset: bool = False) -> tuple[list, list]:
        """Reset the slice's envs (those in ``mask``, local); ``(infos, error reports)``."""
        infos, errors = [], []
        for j in range(len(self.runners)):
            if mask is not None and not mask[j]:
                continue
            try:
                infos.append((self.start + j, self.reset(j, seeds[j], options, needs_reset)))
            except _ENV_ERRORS as exc:  # noqa: BLE001 - reported to the caller
                errors.append(_error_report(self.start + j, exc, "reset"))
        return infos, errors

    def call_all(self, name, local_indices, args, kwargs) -> tuple[list, list]:
        """Call ``name`` on the envs at ``local_indices``; ``(results, error reports)``."""
        results, errors = [], []
        for j in local_indices:
            try:
                results.append(self.runners[j].call(name, args, kwargs))
            except _ENV_ERRORS as exc:  # noqa: BLE001 - reported to the caller
                errors.append(_error_report(self.start + j, exc, f"call({name!r})"))
        return results, errors

    def set_attrs(self, name: str, pairs) -> list:
        """Set ``name`` to each ``(local index, value)`` of ``pairs``; the error reports."""
        errors = []
        for j, value in pairs:
            try:
                self.runners[j].set_attr(name, value)
            except _ENV_ERRORS as exc:  # noqa: BLE001 - reported to the caller
                errors.append(_error_report(self.start + j, exc, f"set_attr({name!r})"))
        return errors

    def close(self) -> None:
        for runner in self.runners:
            try:
                runner.env.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self.runners = []


def _die_with_parent(parent_pid: int, launcher_pid: int, main_thread: bool) -> None:
    """Make sure this worker ends as soon as the vector env's process exits.

    A parent killed by SIGTERM or SIGKILL runs no clean-up; without this, a worker busy in a long
    (or stuck) step would outlive it until the step returns (the idle check of
    :func:`_parent_alive` covers the rest, and other platforms).

    Linux's ``PR_SET_PDEATHSIG`` fires when the *thread* that started the worker exits, so it
    serves only workers the parent's main thread started; otherwise (another thread, or the fork
    server, which outlives the parent while any of its children runs) a thread waits on a pidfd
    of the parent.
    """
    if not sys.platform.startswith("linux"):
        return
    if main_thread and launcher_pid == parent_pid:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
            return
        except (OSError, AttributeError):
            pass
    try:
        pidfd = os.pidfd_open(parent_pid)
    except (AttributeError, OSError):
        return

    def watch() -> None:
        select.select([pidfd], [], [])  # readable once the process has exited
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="vecaccel-parent-watch", daemon=True).start()


def _parent_alive(parent_pid: int, launcher_pid: int) -> bool:
    """Whether the vector env's process (``parent_pid``) still runs.

    ``launcher_pid`` was this worker's parent when it started: the vector env's process under
    fork and spawn, but the fork server under forkserver, so comparing ``os.getppid()`` with
    ``parent_pid`` alone would end every forkserver worker at its first idle second.
    """
    if os.getppid() != launcher_pid:
        return False
    if launcher_pid == parent_pid:
        return True
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


_THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def _limit_threads_before_envs(threads: int | None) -> None:
    """Cap native thread pools that load after this point (spawned workers load them afresh)."""
    if threads is None:
        return
    for name in _THREAD_ENV_VARS:
        os.environ[name] = str(threads)


def _limit_threads_after_envs(threads: int | None) -> None:
    """Cap the thread pools of libraries the envs loaded (or that fork brought along).

    A worker is meant to keep one core busy. OpenCV (which Gymnasium's ``AtariPreprocessing``
    uses to resize frames) and torch default to a thread per core, and their threads then
    fight the other workers: one worker stepping Pong ran 24% slower than the same envs in the
    parent until OpenCV was limited to one thread.
    """
    if threads is None:
        return
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(threads)
        except RuntimeError:
            pass


def _read_startup(fd: int) -> bytes:
    """The startup message :meth:`WorkerPool._send_startup` wrote: a length, then the bytes."""
    (size,) = struct.unpack("!Q", _read_exact(fd, 8))
    return _read_exact(fd, size)


def _read_exact(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_rest(fd: int, data: memoryview) -> None:
    """Write what the socket could not take at once; ``fd`` is this thread's own duplicate."""
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the worker died or was stopped: the pool sees that through its sentinel
    finally:
        os.close(fd)


def _worker_main(
    worker_index: int,
    start: int,
    buffer: Any,
    autoreset_mode: AutoresetMode,
    cmd_conn: Any,
    done_conn: Any,
    data_conn: Any,
    parent_pid: int,
    cpu: int | None,
    restart_on_error: bool = False,
    started_by_main_thread: bool = False,
    worker_threads: int | None = 1,
    spin_seconds: float = 0.0,
) -> None:
    # Ctrl-C belongs to the parent, which shuts workers down cleanly (no tracebacks). SIGTERM
    # keeps its default: multiprocessing's exit handler terminates daemonic workers with it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A process group of its own: a signal to the parent's group (torchrun stops a rank with
    # killpg(SIGTERM)) is the parent's to handle, e.g. by writing a checkpoint while its envs
    # still run; the worker goes when the parent closes it or dies (_die_with_parent).
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    launcher_pid = os.getppid()  # the parent, or the fork server that forked this worker
    _die_with_parent(parent_pid, launcher_pid, started_by_main_thread)
    if not _parent_alive(parent_pid, launcher_pid):
        return  # the parent died while this worker started
    try:
        pickled_env_fns, layout_args = pickle.loads(_read_startup(data_conn.fileno()))
    except EOFError:
        return  # the parent gave up on this worker (or died) before handing it its envs
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            pass
    cmd_fd, done_fd = cmd_conn.fileno(), done_conn.fileno()
    layout = SharedLayout(*layout_args)
    views = layout.views(buffer)
    seq = views.done_seq
    payload_len, slab = views.payload_len, views.payload_slab[worker_index]
    last_cpu = views.last_cpu

    # the pickler data_conn.send uses (the standard library's, or multiprocess's dill)
    connection_module = sys.modules.get(type(data_conn).__module__)
    dumps = getattr(connection_module, "_ForkingPickler", ForkingPickler).dumps

    def reply(status: int, payload: Any = None, what: str = "sending its result") -> None:
        data = None
        if status in (Status.OK_DATA, Status.ERROR):
            ok, data = _pickled(dumps, payload, start, what)
            status = status if ok else Status.ERROR
            if len(data) <= PAYLOAD_SLAB_BYTES:  # read by the parent once the status is there
                slab[: len(data)] = np.frombuffer(data, dtype=np.uint8)
                payload_len[worker_index] = len(data)
                data = None
        last_cpu[worker_index] = current_cpu()
        seq[worker_index] += 1
        os.write(done_fd, bytes((status,)))
        if data is not None:
            data_conn.send_bytes(data)

    _limit_threads_before_envs(worker_threads)
    try:
        env_fns: list[Callable] = cloudpickle.loads(pickled_env_fns)
        envs = _Slice(
            start,
            env_fns,
            autoreset_mode,
            views,
            layout.observation_space,
            layout.action_space,
            restart_on_error,
        )
    except _MakeError as failed:  # the report names the env whose function raised
        reply(Status.ERROR, [_error_report(failed.index, failed.error, "make")])
        return
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        reply(Status.ERROR, [_error_report(start, exc, "make")])
        return
    _limit_threads_after_envs(worker_threads)
    reply(Status.READY)

    poller = select.poll()
    poller.register(cmd_fd, select.POLLIN)
    count = len(env_fns)
    try:
        while True:
            if spin_seconds:  # look for the next command without sleeping for a while first
                deadline = time.perf_counter() + spin_seconds
                while not poller.poll(0) and time.perf_counter() < deadline:
                    pass
            if not poller.poll(PARENT_CHECK_INTERVAL * 1000):
                if not _parent_alive(parent_pid, launcher_pid):
                    break  # the parent died: leave quietly
                continue
            raw = os.read(cmd_fd, 1)
            if not raw:
                break  # the parent closed the pipe
            command = raw[0]
            if command == Command.STEP:
                infos, errors = envs.step_all()
                if errors:
                    reply(Status.ERROR, errors)
                elif infos:
                    reply(Status.OK_DATA, infos, "step (sending its info)")
                else:
                    reply(Status.OK)
            elif command == Command.STEP_MASKED:
                mask = views.step_mask
                for j in range(count):
                    if not mask[start + j]:
                        continue
                    mask[start + j] = 0
                    info, error = envs.step(j)
                    seq[worker_index] += 1
                    if error is None and not info:
                        os.write(done_fd, bytes((j,)))
                        continue
                    if error is not None:
                        data = dumps((Status.ERROR, [error]))
                    else:
                        try:
                            data = dumps((Status.OK_DATA, info))
                        except Exception as exc:  # noqa: BLE001 - an unpicklable info
                            report = _error_report(start + j, exc, "step (sending its info)")
                            data = dumps((Status.ERROR, [report]))
                    os.write(done_fd, bytes((128 + j,)))
                    data_conn.send_bytes(data)
                last_cpu[worker_index] = current_cpu()
            elif command == Command.RESET:
                seeds, options, mask, needs_reset = data_conn.recv()
                infos, errors = envs.reset_all(seeds, options, mask, needs_reset)
                if errors:
                    reply(Status.ERROR, errors)
                else:
                    reply(Status.OK_DATA, infos, "reset (sending its info)")
            elif command == Command.CALL:
                name, local_indices, args, kwargs = data_conn.recv()
                results, errors = envs.call_all(name, local_indices, args, kwargs)
                if errors:
                    reply(Status.ERROR, errors)
                else:
                    try:
                        payload = cloudpickle.dumps(results)
                    except Exception as exc:  # noqa: BLE001 - an unpicklable result
                        reply(Status.ERROR, [_error_report(start, exc, f"call({name!r})")])
                    else:
                        reply(Status.OK_DATA, payload)
            elif command == Command.SET_ATTR:
                name, pairs = data_conn.recv()
                errors = envs.set_attrs(name, pairs)
                reply(Status.ERROR, errors) if errors else reply(Status.OK)
            elif command == Command.CLOSE:
                envs.close()
                reply(Status.OK)
                break
    except (BrokenPipeError, EOFError, OSError):
        pass  # the parent went away mid-command
    finally:
        envs.close()


# ---------------------------------------------------------------------------------------------
# the parent side


def _get_context(context: str | None):
    if context == "multiprocess":
        import multiprocess

        return multiprocess.get_context("spawn")
    if context is None:
        return mp.get_context()
    if context not in mp.get_all_start_methods():
        raise ValueError(
            f"unknown start method context={context!r}; choose from "
            f"{mp.get_all_start_methods() + ['multiprocess']}"
        )
    return mp.get_context(context)


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is unresponsive"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with code {exitcode}"


def _cpu_getter() -> Callable[[], int]:
    try:
        import ctypes

        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
        getcpu.restype = ctypes.c_int
        getcpu.argtypes = []
        if getcpu() >= 0:
            return getcpu
    except (OSError, AttributeError, TypeError):
        pass
    return lambda: -1


#: The CPU the calling thread runs on (glibc's ``sched_getcpu``), or -1 where unknown.
current_cpu: Callable[[], int] = _cpu_getter()


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def warn_if_torch_oversubscribes(num_workers: int, stacklevel: int = 2) -> None:
    """Warn when torch's threads and the env workers together want more cores than there are.

    torch's OpenMP threads spin between the policy's forward passes; on cores that the env
    workers need, that made SB3 PPO on CartPole with ``shm`` about 30x slower here (2 cores,
    torch's default 2 threads, 2 workers), and the CPU action server on Pong 2.6x slower. One
    torch thread per free core avoids it. Nothing is said where torch is not imported.
    """
    import warnings

    torch = sys.modules.get("torch")
    if torch is None or num_workers <= 0:
        return
    cpus = usable_cpus()
    threads = torch.get_num_threads()
    if threads > max(1, cpus - num_workers):
        warnings.warn(
            f"torch uses {threads} threads and vecaccel {num_workers} env workers on {cpus} "
            f"cores: torch's spinning threads will starve the workers. Call "
            f"torch.set_num_threads({max(1, cpus - num_workers)}) or pass fewer num_workers.",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )


class _Worker:
    __slots__ = (
        "index",
        "start",
        "stop",
        "process",
        "cmd",
        "done",
        "data",
        "done_fd",
        "killed_for",
        "loads",
        "nudged",
    )

    def __init__(self, index, start, stop, process, cmd, done, data):
        self.index, self.start, self.stop = index, start, stop
        self.process, self.cmd, self.done, self.data = process, cmd, done, data
        self.done_fd = done.fileno()
        self.killed_for: str | None = None
        self.nudged = False  # its CPU affinity was narrowed for one step (WorkerPool.send_all)
        # the unpickler of payloads in shared memory: the one the data pipe's own recv()
        # uses (the standard library's, or multiprocess's dill), as the worker pickles with it
        module = sys.modules.get(type(data).__module__)
        self.loads = getattr(module, "_ForkingPickler", ForkingPickler).loads

    @property
    def env_indices(self) -> range:
        return range(self.start, self.stop)


FAILURE_POLICIES = ("raise", "restart")


#: Every open pool of this process, so that a child made by a plain ``os.fork()`` can drop them.
_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _forget_pools_in_child() -> None:
    """After ``os.fork()`` in the user's process: the child must leave the parent's workers
    alone. multiprocessing's exit handler terminates every daemon child it knows of, and the
    child inherited that list; a pool's ``close()`` in the child must not stop them either."""
    children = getattr(mp.process, "_children", None)
    for pool in list(_POOLS):
        for worker in pool.workers:
            if children is not None:
                children.discard(worker.process)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_in_child)


class WorkerPool:
    """Worker processes, the shared buffer, and the parent's side of the protocol.

    The ``shm``, ``async`` and ``action_server`` backends all drive one of these.

    With ``on_worker_failure="restart"`` an env that raises is rebuilt inside its worker, and a
    worker that dies (or exceeds ``step_timeout`` and is killed) is started again; the envs
    concerned are reseeded from derived seeds and their interrupted episodes end as truncated
    with ``info["worker_restarted"]``. Past ``max_restarts`` failures the failure is raised.

    With ``inline_envs=k`` the workers hold envs ``k..num_envs-1`` only; the shared buffer
    still covers every env, and the caller steps the first ``k`` itself (``hybrid`` backend).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable],
        observation_space: spaces.Space,
        action_space: spaces.Space,
        autoreset_mode: AutoresetMode,
        *,
        num_workers: int | None = None,
        context: str | None = None,
        pin_cpus: bool | Sequence[int] = False,
        spin_us: float | None = None,
        start_timeout: float = 120.0,
        on_worker_failure: str = "raise",
        max_restarts: int = 100,
        step_timeout: float | None = None,
        worker_threads: int | None = 1,
        inline_envs: int = 0,
        worker_spin_us: float = 0.0,
    ) -> None:
        num_envs = len(env_fns)
        if not isinstance(inline_envs, (int, np.integer)) or not 0 <= inline_envs < num_envs:
            raise ValueError(
                f"inline_envs must be an integer in 0..{num_envs - 1} (at least one env runs "
                f"in a worker), got {inline_envs!r}"
            )
        if num_workers is None:
            num_workers = min(num_envs - inline_envs, usable_cpus())
        if not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
        if on_worker_failure not in FAILURE_POLICIES:
            raise ValueError(
                f"on_worker_failure must be one of {FAILURE_POLICIES}, got {on_worker_failure!r}"
            )
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be positive seconds, got {step_timeout!r}")
        if not isinstance(worker_spin_us, (int, float)) or not 0 <= worker_spin_us < 1e6:
            raise ValueError(
                f"worker_spin_us must be microseconds in [0, 1e6), got {worker_spin_us!r}"
            )
        num_workers = min(int(num_workers), num_envs - inline_envs)
        self.num_envs = num_envs
        self.inline_envs = int(inline_envs)  # envs 0..inline_envs-1 are stepped by the caller
        self.num_workers = num_workers
        self.autoreset_mode = autoreset_mode
        self.ctx = _get_context(context)
        self.restart = on_worker_failure == "restart"
        self.max_restarts = max_restarts
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.worker_threads = worker_threads
        self.worker_spin_seconds = float(worker_spin_us) / 1e6
        self.failures = 0
        self.failures_per_env = np.zeros(num_envs, dtype=np.int64)
        self.last_seeds: list[int | None] = [None] * num_envs
        # Blocking by default: measured on 2 cores (benchmarks/spin_vs_block.py), spinning before
        # blocking gained nothing within noise with a free core, and cost up to 12% without one.
        if spin_us is None:
            spin_us = 0.0
        self.spin_seconds = spin_us / 1e6
        self.layout = SharedLayout(observation_space, action_space, num_envs, num_workers)
        self._layout_args = (observation_space, action_space, num_envs, num_workers)
        self._buffer = self.ctx.RawArray("b", self.layout.nbytes)
        self.views = self.layout.views(self._buffer)
        self.workers: list[_Worker] = []
        self._owner_pid = os.getpid()  # a forked child of the user's process does not own them
        self._control_in_flight = False  # a reset/call/set_attr sent and not fully answered
        self.broken: str | None = None
        self._broken_envs: tuple[int, ...] = ()
        self._poller = select.poll()
        self._fd_to_worker: dict[int, _Worker] = {}
        self._sentinel_to_worker: dict[int, _Worker] = {}
        self._env_fns = list(env_fns)
        if isinstance(pin_cpus, bool):
            use_cpus = pin_cpus and hasattr(os, "sched_getaffinity")
            self._cpus = sorted(os.sched_getaffinity(0)) if use_cpus else None
        else:
            self._cpus = list(pin_cpus)
        # the CPUs unpinned workers may run on, for send_all's nudges (None: no affinity API)
        self._allowed = None
        if self._cpus is None and hasattr(os, "sched_setaffinity"):
            self._allowed = sorted(os.sched_getaffinity(0))
        bounds = np.linspace(inline_envs, num_envs, num_workers + 1).round().astype(int)
        _POOLS.add(self)
        self._startup_writers: list[threading.Thread | None] = []
        try:
            for k in range(num_workers):
                self._start_worker(k, int(bounds[k]), int(bounds[k + 1]))
            self._await_ready(list(self.workers))
        except BaseException:
            self.close(terminate=True)
            raise

    # -- process management -------------------------------------------------------------------

    def _start_worker(self, k: int, start: int, stop: int) -> _Worker:
        self.views.payload_len[k] = -1  # nothing in its slab (a dead predecessor's is stale)
        self.views.last_cpu[k] = -1
        cmd_recv, cmd_send = self.ctx.Pipe(duplex=False)
        done_recv, done_send = self.ctx.Pipe(duplex=False)
        data_parent, data_child = self.ctx.Pipe(duplex=True)
        cpu = self._cpus[k % len(self._cpus)] if self._cpus else None
        process = self.ctx.Process(
            target=_worker_main,
            name=f"vecaccel-worker-{k}",
            args=(
                k,
                start,
                self._buffer,
                self.autoreset_mode,
                cmd_recv,
                done_send,
                data_child,
                os.getpid(),
                cpu,
                self.restart,
                threading.current_thread() is threading.main_thread(),
                self.worker_threads,
                self.worker_spin_seconds,
            ),
            daemon=True,
        )
        # cloudpickle, as under fork the spaces were inherited, never pickled: a custom space
        # holding a lambda must go on working there
        startup = cloudpickle.dumps((self._pickle_env_fns(k, start, stop), self._layout_args))
        try:
            process.start()
        finally:
            for conn in (cmd_recv, done_send, data_child):
                conn.close()
        self._startup_writers.append(self._send_startup(data_parent, startup))
        worker = _Worker(k, start, stop, process, cmd_send, done_recv, data_parent)
        if k < len(self.workers):
            self.workers[k] = worker
        else:
            self.workers.append(worker)
        self._poller.register(worker.done_fd, select.POLLIN)
        self._poller.register(process.sentinel, select.POLLIN)
        self._fd_to_worker[worker.done_fd] = worker
        self._sentinel_to_worker[process.sentinel] = worker
        return worker

    @staticmethod
    def _send_startup(conn: Any, startup: bytes) -> threading.Thread | None:
        """Hand a started worker its env functions and the buffer's layout.

        They are not the process's arguments: under spawn those go down a pipe whose read end
        the parent holds open until it has written them all, so a child that died before
        reading them (a script without the ``__main__`` guard, with arguments larger than the
        pipe, as Pong's spaces are) hung ``process.start()`` for good. Here a dead child's
        socket fails the write, and what the socket cannot take at once is written by a thread
        on a duplicate of the socket, so the start timeout still governs the wait.
        """
        data = memoryview(struct.pack("!Q", len(startup)) + startup)
        fd = conn.fileno()
        os.set_blocking(fd, False)
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            pass
        except OSError:
            return None  # the worker died already: waiting for it reports that
        finally:
            os.set_blocking(fd, True)
        if not data:
            return None
        writer = threading.Thread(
            target=_write_rest, args=(os.dup(fd), data), name="vecaccel-startup", daemon=True
        )
        writer.start()
        return writer

    def _pickle_env_fns(self, k: int, start: int, stop: int) -> bytes:
        try:
            return cloudpickle.dumps(self._env_fns[start:stop])
        except Exception:  # noqa: BLE001 - find the env function to name
            for i in range(start, stop):
                try:
                    cloudpickle.dumps(self._env_fns[i])
                except Exception as exc:  # noqa: BLE001
                    raise WorkerError(
                        f"env function {i} cannot be pickled for worker {k}: "
                        f"{type(exc).__name__}: {exc}",
                        env_indices=[i],
                        original_type=type(exc).__name__,
                    ) from exc
            raise

    def _forget(self, worker: _Worker) -> None:
        tables = (
            (worker.done_fd, self._fd_to_worker),
            (worker.process.sentinel, self._sentinel_to_worker),
        )
        for fd, table in tables:
            if fd in table:
                try:
                    self._poller.unregister(fd)
                except (KeyError, ValueError):
                    pass
                del table[fd]

    def _await_ready(self, workers: list[_Worker]) -> None:
        writers, self._startup_writers = self._startup_writers, []
        statuses = self.wait(workers, self.start_timeout, what="start", restartable=False)
        # every worker answered, so each read its startup message (or died, failing the
        # write): the writers are done or about to close their duplicate sockets. (After an
        # error the workers are killed, which ends the writers too.)
        for writer in writers:
            if writer is not None:
                writer.join(1.0)
        errors = []
        for worker in workers:
            if statuses[worker.index][0] == Status.ERROR:
                errors.extend(self.recv_payload(worker))
        if errors:
            raise self.error_from_reports(errors)

    def _dispose(self, worker: _Worker) -> None:
        """Make sure a worker process is gone and its channels are closed."""
        self._forget(worker)
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(2.0)
        for conn in (worker.cmd, worker.done, worker.data):
            try:
                conn.close()
            except OSError:
                pass

    def respawn(self, worker: _Worker) -> dict[int, dict]:
        """Start a dead worker again, reset its envs from derived seeds, mark them truncated.

        Returns ``{env index: info}`` for the restarted envs.
        """
        # reap it first: a worker seen dead by its closed pipe may not have been reaped yet,
        # and its exit code (the signal that ended it) belongs in the reason
        worker.process.join(0.5)
        reason = (
            worker.killed_for or f"worker {worker.index} {_describe_exit(worker.process.exitcode)}"
        )
        self._dispose(worker)
        envs = list(worker.env_indices)
        self.count_failures(envs, reason)
        try:
            fresh = self._start_worker(worker.index, worker.start, worker.stop)
            self._await_ready([fresh])
            seeds = []
            for i in envs:
                seeds.append(derived_seed(self.last_seeds[i], i, int(self.failures_per_env[i])))
            needs_reset = self.autoreset_mode is not AutoresetMode.SAME_STEP
            self.send(fresh, Command.RESET, (seeds, None, None, needs_reset))
            status = self.wait([fresh], self.start_timeout, what="restart", restartable=False)
            payload = self.recv_payload(fresh)
            if status[fresh.index][0] == Status.ERROR:
                raise self.error_from_reports(payload)
        except BaseException as exc:
            if self.broken is None:  # the restart itself failed: nothing more can be done
                self.broken = (
                    f"worker {worker.index} (envs {envs}) could not be restarted "
                    f"({type(exc).__name__}: {exc}); this vector env cannot continue: close() it"
                )
                self._broken_envs = tuple(envs)
            raise
        views = self.views
        infos = {}
        for i, _ in payload:
            views.rewards[i] = 0.0
            views.terminations[i] = False
            views.truncations[i] = True
            infos[i] = restarted_info(self.autoreset_mode, read_item(views.obs, i), reason)
        return infos

    def count_failures(self, env_indices: Sequence[int], reason: str) -> None:
        """Count restarts; raise :class:`WorkerError` once ``max_restarts`` is exceeded."""
        for i in env_indices:
            self.failures_per_env[i] += 1
        self.failures += 1
        if self.failures > self.max_restarts:
            envs = list(env_indices)
            message = (
                f"envs {envs} failed ({reason}); {self.failures} failures exceed "
                f"max_restarts={self.max_restarts}"
            )
            self.broken = message
            self._broken_envs = tuple(envs)
            raise WorkerError(message, env_indices=envs)

    def note_restarts(self, pairs: Sequence[tuple[int, dict]]) -> None:
        """Count the envs a worker rebuilt in place (their infos say ``worker_restarted``)."""
        for i, info in pairs:
            if info.get("worker_restarted"):
                self.count_failures([i], str(info.get("restart_reason", "env failed")))

    # -- sending ------------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.broken is not None:
            raise WorkerError(self.broken, env_indices=self._broken_envs)

    def send(self, worker: _Worker, command: int, payload: Any = None) -> None:
        """Send one command byte (and its payload, if any) to ``worker``.

        The payload is pickled first: one that cannot be pickled raises here, before the command
        byte goes out, so the worker is never left waiting for a payload that will not come.
        cloudpickle lets ``call`` take lambdas and local functions under every start method.
        """
        if payload is not None:
            self.send_many([(worker, command, payload)])
            return
        try:  # the hot path: one byte
            os.write(worker.cmd.fileno(), bytes((command,)))
        except OSError:
            pass  # a dead worker: its sentinel reports it in the wait that follows

    def send_all(self, workers: Sequence[_Worker], command: int, spread: bool = False) -> None:
        """Send one payload-free ``command`` to each of ``workers``, so that they start at once,
        on different CPUs where there are CPUs enough.

        Each command byte wakes a worker, and when no CPU is idle at that moment the kernel may
        queue the woken worker behind another one. Measured on 2 cores (Pong, two workers, SB3's
        loop), both workers ended up on one CPU in 12-17% of steps, and such a step took the
        time of two; both measures below together brought that to 2-6%:

        * workers that last ran on the caller's CPU are signalled last: the ones signalled first
          find their own CPUs idle, and these start as soon as the caller waits (signalled
          first, one could preempt the caller before it had signalled the others);
        * with ``spread`` (lock-step commands to every worker), unpinned workers that last ran
          on the same CPU are first spread: each extra one may run only on a CPU that no worker
          ran on (the caller's first) for this command, and gets its whole affinity back before
          the next one. The kernel then keeps it where it ran.
        """
        here = current_cpu()  # -1 where unknown: no CPU matches, the order stays as given
        if spread and here >= 0 and len(workers) > 1 and self._allowed is not None:
            self._spread(workers, here)
        last_cpu = self.views.last_cpu
        for worker in sorted(workers, key=lambda w: last_cpu[w.index] == here):
            self.send(worker, command)

    def _spread(self, workers: Sequence[_Worker], here: int) -> None:
        last_cpu, allowed = self.views.last_cpu, self._allowed
        for worker in workers:
            if worker.nudged:  # back to every CPU; it stays where it ran last
                worker.nudged = False
                self._set_affinity(worker, allowed)
        taken: set[int] = set()
        crowded: list[_Worker] = []  # workers that last ran on a CPU another one ran on too
        for worker in workers:
            cpu = int(last_cpu[worker.index])
            if cpu in taken:
                crowded.append(worker)
            elif cpu >= 0:
                taken.add(cpu)
        if not crowded:
            return
        free = [cpu for cpu in allowed if cpu not in taken]
        if here in free:  # the caller's CPU frees up first: it is about to wait
            free.remove(here)
            free.insert(0, here)
        for worker, cpu in zip(crowded, free):
            if self._set_affinity(worker, [cpu]):
                worker.nudged = True
                last_cpu[worker.index] = cpu

    @staticmethod
    def _set_affinity(worker: _Worker, cpus: Sequence[int]) -> bool:
        try:
            os.sched_setaffinity(worker.process.pid, cpus)
        except (OSError, TypeError):  # the worker died (its sentinel reports it) or has no pid
            return False
        return True

    def send_many(self, messages: Sequence[tuple[_Worker, int, Any]]) -> None:
        """Send ``(worker, command, payload)`` messages; every payload is pickled before any
        message goes out, so a failure leaves no worker with a reply that nobody reads."""
        pickled = [(w, c, None if p is None else cloudpickle.dumps(p)) for w, c, p in messages]
        for worker, command, data in pickled:
            try:
                os.write(worker.cmd.fileno(), bytes((command,)))
                if data is not None:
                    worker.data.send_bytes(data)
            except OSError:
                pass  # a dead worker: its sentinel reports it in the wait that follows

    # -- waiting ------------------------------------------------------------------------------

    def _spin(self, workers: list[_Worker], seqs: dict[int, int]) -> None:
        deadline = time.perf_counter() + self.spin_seconds
        done_seq = self.views.done_seq
        while time.perf_counter() < deadline:
            if all(done_seq[w.index] != seqs[w.index] for w in workers):
                return

    def _kill_stuck(self, workers: Sequence[_Worker], what: str = "step") -> None:
        for worker in workers:
            if worker.process.is_alive() and worker.killed_for is None:
                worker.killed_for = (
                    f"worker {worker.index} (envs {list(worker.env_indices)}) exceeded "
                    f"step_timeout={self.step_timeout} s in {what} and was killed"
                )
                worker.process.kill()

    def wait(
        self,
        workers: list[_Worker],
        timeout: float | None,
        what: str = "step",
        seqs: dict[int, int] | None = None,
        restartable: bool = True,
        timed: bool | None = None,
    ) -> dict[int, tuple[int, ...]]:
        """Wait for one status byte from each of ``workers``.

        Returns ``{worker index: (status,)}``; a worker that died and was started again (under
        the restart policy) answers ``(Status.RESTARTED, infos)``. Raises :class:`WorkerError`
        if a worker dies otherwise, :class:`TimeoutError` (with ``.pending``, the workers still
        running, and ``.results``) once ``timeout`` passes.
        """
        pending = {w.done_fd: w for w in workers}
        results: dict[int, tuple[Any, ...]] = {}
        if self.spin_seconds and seqs is not None:
            self._spin(workers, seqs)
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        kill_at = None
        # step_timeout kills a worker stuck in a step, or (timed) in a reset or call
        if self.step_timeout is not None and (what == "step" if timed is None else timed):
            kill_at = now + self.step_timeout
        try:
            self._wait_loop(pending, results, deadline, kill_at, timeout, what, restartable)
        except KeyboardInterrupt as interrupt:
            # what the caller needs to finish the step later: the replies already taken
            interrupt.pending = list(pending.values())  # type: ignore[attr-defined]
            interrupt.results = results  # type: ignore[attr-defined]
            raise
        return results

    def _wait_loop(self, pending, results, deadline, kill_at, timeout, what, restartable):
        while pending:
            ends = [t for t in (deadline, kill_at) if t is not None]
            wait_ms = None if not ends else max(0.0, (min(ends) - time.monotonic()) * 1000)
            events = self._poller.poll(wait_ms)
            dead: list[_Worker] = []
            for fd, _ in events:
                worker = pending.get(fd)
                if worker is not None:
                    byte = os.read(fd, 1)
                    if byte:
                        results[worker.index] = (byte[0],)
                        del pending[fd]
                    elif worker not in dead:
                        dead.append(worker)
                elif fd in self._sentinel_to_worker:
                    candidate = self._sentinel_to_worker[fd]
                    if candidate.done_fd in pending and candidate not in dead:
                        dead.append(candidate)
            for worker in dead:
                # a worker may exit right after replying; take a reply that is already there
                if worker.done.poll(0):
                    byte = os.read(worker.done_fd, 1)
                    if byte:
                        results[worker.index] = (byte[0],)
                        del pending[worker.done_fd]
                        continue
                del pending[worker.done_fd]
                if self.restart and restartable:
                    results[worker.index] = (Status.RESTARTED, self.respawn(worker))
                else:
                    self._declare_dead(worker)
            now = time.monotonic()
            if pending and kill_at is not None and now >= kill_at:
                self._kill_stuck(list(pending.values()), what)
                kill_at = None  # their sentinels report them on the next poll
            if pending and deadline is not None and now >= deadline:
                error = TimeoutError(
                    f"{what} did not finish within {timeout} s; envs still running: "
                    f"{sorted(i for w in pending.values() for i in w.env_indices)}"
                )
                error.pending = list(pending.values())  # type: ignore[attr-defined]
                error.results = results  # type: ignore[attr-defined]
                raise error

    def wait_bytes(
        self, timeout: float | None
    ) -> tuple[list[tuple[_Worker, bytes]], list[_Worker]]:
        """Wait until any worker has written to its ``done`` pipe or died.

        Used by the per-env (``STEP_MASKED``) protocol, where each byte names one env that
        finished. Returns ``(arrived, dead)``: what each worker wrote, and the workers that died
        (after taking whatever they wrote before dying). Both are empty on timeout.
        """
        arrived: list[tuple[_Worker, bytes]] = []
        events = self._poller.poll(None if timeout is None else max(0.0, timeout * 1000))
        dead: list[_Worker] = []
        for fd, _ in events:
            worker = self._fd_to_worker.get(fd)
            if worker is not None:
                data = os.read(fd, 4096)
                if data:
                    arrived.append((worker, data))
                elif worker not in dead:
                    dead.append(worker)
            elif fd in self._sentinel_to_worker:
                worker = self._sentinel_to_worker[fd]
                if worker not in dead:
                    dead.append(worker)
        for worker in dead:
            if worker.done.poll(0):
                data = os.read(worker.done_fd, 4096)
                if data:
                    arrived.append((worker, data))
        return arrived, dead

    def recv_payload(self, worker: _Worker, timeout: float = 60.0) -> Any:
        """Receive the payload that follows a status byte, noticing a worker that dies."""
        length = int(self.views.payload_len[worker.index])
        if length >= 0:  # in shared memory, complete before the status byte was written
            self.views.payload_len[worker.index] = -1
            return worker.loads(self.views.payload_slab[worker.index, :length].tobytes())
        deadline = time.monotonic() + timeout
        while not worker.data.poll(0.05):
            if not worker.process.is_alive() and not worker.data.poll(0):
                self._declare_dead(worker)
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"worker {worker.index} (envs {list(worker.env_indices)}) sent no payload "
                    f"within {timeout} s",
                    env_indices=worker.env_indices,
                )
        try:
            return worker.data.recv()
        except (EOFError, OSError):
            self._declare_dead(worker)

    def declare_dead(self, worker: _Worker) -> None:
        """Raise the :class:`WorkerError` for a worker that died (and mark the pool broken)."""
        self._declare_dead(worker)

    def _declare_dead(self, worker: _Worker) -> None:
        worker.process.join(0.5)
        exitcode = worker.process.exitcode
        self._forget(worker)
        envs = list(worker.env_indices)
        message = worker.killed_for or (
            f"worker {worker.index} (pid {worker.process.pid}, envs {envs}) "
            f"{_describe_exit(exitcode)}"
        )
        self.broken = f"{message}; this vector env cannot continue: close() it"
        self._broken_envs = tuple(envs)
        raise WorkerError(message, env_indices=envs, exitcode=exitcode)

    def error_from_reports(self, reports: list[tuple]) -> WorkerError:
        """One :class:`WorkerError` for the error reports of one or more envs."""
        reports = sorted(reports)
        index, type_name, text, _, what = reports[0]
        more = f" (and {len(reports) - 1} more envs failed)" if len(reports) > 1 else ""
        return WorkerError(
            f"env {index} raised {type_name} in {what}: {text}{more}",
            env_indices=[r[0] for r in reports],
            remote_traceback="\n".join(r[3] for r in reports),
            original_type=type_name,
        )

    def worker_of(self, env_index: int) -> _Worker:
        for worker in self.workers:
            if worker.start <= env_index < worker.stop:
                return worker
        raise IndexError(env_index)

    # -- control commands (rare, so their arguments and results are pickled) ------------------

    def _by_worker(self, indices: Sequence[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for index in indices:
            groups.setdefault(self.worker_of(index).index, []).append(index)
        return groups

    def _command(
        self, messages: list[tuple[_Worker, int, Any]], what: str
    ) -> tuple[dict[int, Any], dict[int, dict]]:
        """Send a control command and wait for its replies; raise the env errors reported.

        Returns ``(payloads by worker index, {env index: restart info})``: under the restart
        policy a worker that died (before or during the command) is started again, and its
        envs, reset from derived seeds, did not run the command.
        """
        workers = [worker for worker, _, _ in messages]
        self._control_in_flight = True
        try:
            self.send_many(messages)
            results = self.wait(workers, None, what=what, restartable=self.restart, timed=True)
            payloads, errors, restarted = {}, [], {}
            for worker in workers:
                status = results[worker.index]
                if status[0] == Status.ERROR:
                    errors.extend(self.recv_payload(worker))
                elif status[0] == Status.OK_DATA:
                    payloads[worker.index] = self.recv_payload(worker)
                elif status[0] == Status.RESTARTED:
                    restarted.update(status[1])
        except Exception:
            self._control_in_flight = False
            raise
        except BaseException:
            # KeyboardInterrupt: replies may still come, and the next command would take them
            # for its own; nothing can tell them apart, so the pool stops here
            self.broken = (
                f"{what} was interrupted before every worker had answered; this vector env "
                "cannot continue: close() it"
            )
            self._broken_envs = tuple(i for w in workers for i in w.env_indices)
            raise
        self._control_in_flight = False
        if errors:
            raise self.error_from_reports(errors)
        return payloads, restarted

    def _finish_command(self, messages: list[tuple[_Worker, int, Any]], what: str) -> dict:
        payloads, restarted = self._command(messages, what)
        if restarted:
            envs = sorted(restarted)
            reason = restarted[envs[0]].get("restart_reason", "it died")
            raise WorkerError(
                f"envs {envs} did not run {what}: their worker died ({reason}) and was "
                "restarted, and they start over from a reset",
                env_indices=envs,
            )
        return payloads

    def reset(
        self, seeds: Sequence[int | None], options: dict | None, mask: np.ndarray | None
    ) -> list[tuple[int, dict]]:
        """Reset the envs (those in ``mask``, if given); return ``(env index, info)`` pairs."""
        workers, messages = [], []
        for worker in self.workers:
            part = None if mask is None else mask[worker.start : worker.stop]
            if part is not None and not part.any():
                continue
            for i in worker.env_indices:
                if (part is None or part[i - worker.start]) and seeds[i] is not None:
                    self.last_seeds[i] = seeds[i]
            payload = (list(seeds[worker.start : worker.stop]), options, part, False)
            messages.append((worker, Command.RESET, payload))
            workers.append(worker)
        payloads, restarted = self._command(messages, "reset")
        while restarted:  # a dead worker was started again: reset its envs as asked after all
            again = [
                (self.workers[worker.index], command, payload)
                for worker, command, payload in messages
                if worker.start in restarted
            ]
            more, restarted = self._command(again, "reset")
            payloads.update(more)
        pairs = [pair for worker in workers for pair in payloads.get(worker.index, [])]
        return sorted(pairs, key=lambda pair: pair[0])

    def call(self, name: Any, indices: Sequence[int], args: tuple, kwargs: dict) -> list[Any]:
        """Call ``name`` on the envs at ``indices``; results in the order of ``indices``."""
        groups = self._by_worker(indices)
        workers = [self.workers[k] for k in groups]
        messages = []
        for worker in workers:
            local = [i - worker.start for i in groups[worker.index]]
            messages.append((worker, Command.CALL, (name, local, args, kwargs)))
        payloads = self._finish_command(messages, f"call({name!r})")
        by_index: dict[int, list[Any]] = {}
        for k, group in groups.items():
            for index, value in zip(group, cloudpickle.loads(payloads[k])):
                by_index.setdefault(index, []).append(value)
        return [by_index[index].pop(0) for index in indices]

    def set_attr(self, name: str, indices: Sequence[int], values: Sequence[Any]) -> None:
        """Set attribute ``name`` to ``values`` on the envs at ``indices``."""
        pairs: dict[int, list[tuple[int, Any]]] = {}
        for index, value in zip(indices, values):
            worker = self.worker_of(index)
            pairs.setdefault(worker.index, []).append((index - worker.start, value))
        workers = [self.workers[k] for k in pairs]
        messages = [(w, Command.SET_ATTR, (name, pairs[w.index])) for w in workers]
        self._finish_command(messages, f"set_attr({name!r})")

    # -- shutdown -----------------------------------------------------------------------------

    def close(self, terminate: bool = False, timeout: float = 5.0) -> None:
        """Stop every worker (politely unless ``terminate``) and release the channels."""
        _POOLS.discard(self)
        if os.getpid() != self._owner_pid:
            # a child made by os.fork(): the workers are the parent's; drop our copies of the
            # channels only (the parent's stay open)
            for worker in self.workers:
                for conn in (worker.cmd, worker.done, worker.data):
                    try:
                        conn.close()
                    except OSError:
                        pass
            self.workers = []
            self.views = None  # type: ignore[assignment]
            self._buffer = None
            return
        if self._control_in_flight:
            terminate = True  # an interrupted command: its reply would only delay the close
        workers = [w for w in self.workers if w.process.is_alive()]
        if not terminate:
            for worker in workers:
                try:
                    os.write(worker.cmd.fileno(), bytes((Command.CLOSE,)))
                except OSError:
                    pass
        deadline = time.monotonic() + (0.0 if terminate else timeout)
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(1.0)
            self._dispose(worker)
            try:
                worker.process.close()
            except ValueError:
                pass
        self.workers = []
        self._fd_to_worker.clear()
        self._sentinel_to_worker.clear()
        self.views = None  # type: ignore[assignment]
        self._buffer = None
