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
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from vecaccel.errors import WorkerError
from vecaccel.spaces import leaf_specs, nbytes_of, read_item, views_from_buffer, write_item
from vecaccel.vector import EnvRunner

__all__ = ["SharedLayout", "WorkerPool", "Command", "Status"]


class Command:
    STEP = 1  # step every env of the slice, one status byte at the end
    STEP_MASKED = 2  # step the envs flagged in the mask, one byte per env as each finishes
    RESET = 3
    CALL = 4
    SET_ATTR = 5
    CLOSE = 6
    REBUILD = 7


class Status:
    OK = 0
    OK_DATA = 1  # a payload follows on the data channel
    ERROR = 2  # an error report follows on the data channel
    READY = 3


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
        )
        self.nbytes = nbytes_of(self.specs) + 64

    def views(self, buffer: Any) -> SharedViews:
        out = []
        offset = 0
        for spec in self.specs:
            view, offset = views_from_buffer(spec, buffer, offset)
            out.append(view)
        obs, actions, rewards, terms, truncs, mask, seq = out
        return SharedViews(obs, actions, rewards, terms, truncs, mask, seq[::8])


# ---------------------------------------------------------------------------------------------
# the worker process


def _error_report(index: int, exc: BaseException, what: str) -> tuple:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return (index, type(exc).__name__, str(exc), text, what)


def _worker_main(
    worker_index: int,
    start: int,
    pickled_env_fns: bytes,
    layout_args: tuple,
    buffer: Any,
    autoreset_mode: AutoresetMode,
    cmd_conn: Any,
    done_conn: Any,
    data_conn: Any,
    parent_pid: int,
    cpu: int | None,
) -> None:
    # Ctrl-C belongs to the parent, which shuts workers down cleanly; no worker tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError:
            pass
    cmd_fd, done_fd = cmd_conn.fileno(), done_conn.fileno()
    layout = SharedLayout(*layout_args)
    views = layout.views(buffer)
    seq = views.done_seq
    obs_space, act_space = layout.observation_space, layout.action_space

    def reply(status: int, payload: Any = None, has_payload: bool = False) -> None:
        seq[worker_index] += 1
        os.write(done_fd, bytes((status,)))
        if has_payload or status in (Status.OK_DATA, Status.ERROR):
            data_conn.send(payload)

    env_fns: list[Callable] = cloudpickle.loads(pickled_env_fns)
    runners: list[EnvRunner] = []
    try:
        for j, fn in enumerate(env_fns):
            runners.append(EnvRunner(fn(), autoreset_mode, start + j))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        reply(Status.ERROR, [_error_report(start + len(runners), exc, "make")])
        return
    reply(Status.READY)

    poller = select.poll()
    poller.register(cmd_fd, select.POLLIN)
    stop = start + len(runners)
    try:
        while True:
            if not poller.poll(PARENT_CHECK_INTERVAL * 1000):
                if os.getppid() != parent_pid:
                    break  # the parent died: leave quietly
                continue
            raw = os.read(cmd_fd, 1)
            if not raw:
                break  # parent closed the pipe
            command = raw[0]
            if command == Command.STEP:
                infos, errors = [], []
                for j, runner in enumerate(runners):
                    i = start + j
                    try:
                        obs, rew, term, trunc, info = runner.step(read_item(views.actions, i))
                        write_item(obs_space, views.obs, i, obs)
                    except Exception as exc:  # noqa: BLE001 - reported to the parent
                        errors.append(_error_report(i, exc, "step"))
                        continue
                    views.rewards[i] = rew
                    views.terminations[i] = term
                    views.truncations[i] = trunc
                    if info:
                        infos.append((i, info))
                if errors:
                    reply(Status.ERROR, errors)
                elif infos:
                    reply(Status.OK_DATA, infos)
                else:
                    reply(Status.OK)
            elif command == Command.STEP_MASKED:
                for j, runner in enumerate(runners):
                    i = start + j
                    if not views.step_mask[i]:
                        continue
                    views.step_mask[i] = 0
                    try:
                        obs, rew, term, trunc, info = runner.step(read_item(views.actions, i))
                        write_item(obs_space, views.obs, i, obs)
                    except Exception as exc:  # noqa: BLE001
                        seq[worker_index] += 1
                        os.write(done_fd, bytes((128 + j,)))
                        data_conn.send((Status.ERROR, [_error_report(i, exc, "step")]))
                        continue
                    views.rewards[i] = rew
                    views.terminations[i] = term
                    views.truncations[i] = trunc
                    seq[worker_index] += 1
                    if info:
                        os.write(done_fd, bytes((128 + j,)))
                        data_conn.send((Status.OK_DATA, info))
                    else:
                        os.write(done_fd, bytes((j,)))
            elif command == Command.RESET:
                seeds, options, mask = data_conn.recv()
                infos, errors = [], []
                for j, runner in enumerate(runners):
                    if mask is not None and not mask[j]:
                        continue
                    i = start + j
                    try:
                        obs, info = runner.reset(seed=seeds[j], options=options)
                        write_item(obs_space, views.obs, i, obs)
                    except Exception as exc:  # noqa: BLE001
                        errors.append(_error_report(i, exc, "reset"))
                        continue
                    views.terminations[i] = views.truncations[i] = False
                    views.rewards[i] = 0.0
                    infos.append((i, info))
                reply(Status.ERROR, errors) if errors else reply(Status.OK_DATA, infos)
            elif command == Command.CALL:
                name, local_indices, args, kwargs = data_conn.recv()
                results, errors = [], []
                for j in local_indices:
                    try:
                        results.append(runners[j].call(name, args, kwargs))
                    except Exception as exc:  # noqa: BLE001
                        errors.append(_error_report(start + j, exc, f"call({name!r})"))
                if errors:
                    reply(Status.ERROR, errors)
                else:
                    try:
                        reply(Status.OK_DATA, results)
                    except Exception as exc:  # unpicklable result
                        data_conn.send([_error_report(start, exc, f"call({name!r}) result")])
            elif command == Command.SET_ATTR:
                name, pairs = data_conn.recv()
                errors = []
                for j, value in pairs:
                    try:
                        runners[j].set_attr(name, value)
                    except Exception as exc:  # noqa: BLE001
                        errors.append(_error_report(start + j, exc, f"set_attr({name!r})"))
                reply(Status.ERROR, errors) if errors else reply(Status.OK)
            elif command == Command.REBUILD:
                local_index, seed = data_conn.recv()
                try:
                    try:
                        runners[local_index].env.close()
                    except Exception:  # noqa: BLE001 - the old env is being replaced anyway
                        pass
                    runner = EnvRunner(env_fns[local_index](), autoreset_mode, start + local_index)
                    runners[local_index] = runner
                    obs, info = runner.reset(seed=seed)
                    write_item(obs_space, views.obs, start + local_index, obs)
                    reply(Status.OK_DATA, info)
                except Exception as exc:  # noqa: BLE001
                    reply(Status.ERROR, [_error_report(start + local_index, exc, "rebuild")])
            elif command == Command.CLOSE:
                for runner in runners:
                    try:
                        runner.env.close()
                    except Exception:  # noqa: BLE001 - closing anyway
                        pass
                runners = []
                reply(Status.OK)
                break
    except (BrokenPipeError, EOFError, OSError):
        pass  # the parent went away mid-command
    finally:
        for runner in runners:
            try:
                runner.env.close()
            except Exception:  # noqa: BLE001
                pass
        del views, seq
    del stop


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


def usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class _Worker:
    __slots__ = ("index", "start", "stop", "process", "cmd", "done", "data", "done_fd", "alive")

    def __init__(self, index, start, stop, process, cmd, done, data):
        self.index, self.start, self.stop = index, start, stop
        self.process, self.cmd, self.done, self.data = process, cmd, done, data
        self.done_fd = done.fileno()
        self.alive = True

    @property
    def env_indices(self) -> range:
        return range(self.start, self.stop)


class WorkerPool:
    """Worker processes, the shared buffer, and the parent's side of the protocol.

    The ``shm``, ``async`` and ``action_server`` backends all drive one of these.
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
    ) -> None:
        num_envs = len(env_fns)
        if num_workers is None:
            num_workers = min(num_envs, usable_cpus())
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
        num_workers = min(num_workers, num_envs)
        self.num_envs = num_envs
        self.num_workers = num_workers
        self.autoreset_mode = autoreset_mode
        self.ctx = _get_context(context)
        # A spinning parent steals the core a worker needs when every core has a worker.
        if spin_us is None:
            spin_us = 0.0 if num_workers >= usable_cpus() else 50.0
        self.spin_seconds = spin_us / 1e6
        self.layout = SharedLayout(observation_space, action_space, num_envs, num_workers)
        self._buffer = self.ctx.RawArray("b", self.layout.nbytes)
        self.views = self.layout.views(self._buffer)
        self.workers: list[_Worker] = []
        self.broken: str | None = None
        self._poller = select.poll()
        self._fd_to_worker: dict[int, _Worker] = {}
        self._sentinel_to_worker: dict[int, _Worker] = {}

        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int)
        if isinstance(pin_cpus, bool):
            cpus = sorted(os.sched_getaffinity(0)) if pin_cpus and hasattr(os, "sched_getaffinity") else None
        else:
            cpus = list(pin_cpus)
        layout_args = (observation_space, action_space, num_envs, num_workers)
        try:
            for k in range(num_workers):
                start, stop = int(bounds[k]), int(bounds[k + 1])
                self._start_worker(k, start, stop, env_fns[start:stop], layout_args, cpus)
            self._await_ready(list(self.workers), start_timeout)
        except BaseException:
            self.close(terminate=True)
            raise

    # -- process management -------------------------------------------------------------------

    def _start_worker(self, k, start, stop, env_fns, layout_args, cpus) -> _Worker:
        cmd_parent, cmd_child = self.ctx.Pipe(duplex=False)[::-1]  # (send end, recv end)
        done_parent, done_child = self.ctx.Pipe(duplex=False)  # (recv end, send end)
        data_parent, data_child = self.ctx.Pipe(duplex=True)
        cpu = cpus[k % len(cpus)] if cpus else None
        process = self.ctx.Process(
            target=_worker_main,
            name=f"vecaccel-worker-{k}",
            args=(
                k,
                start,
                cloudpickle.dumps(list(env_fns)),
                layout_args,
                self._buffer,
                self.autoreset_mode,
                cmd_child,
                done_child,
                data_child,
                os.getpid(),
                cpu,
            ),
            daemon=True,
        )
        process.start()
        for conn in (cmd_child, done_child, data_child):
            conn.close()
        worker = _Worker(k, start, stop, process, cmd_parent, done_parent, data_parent)
        if len(self.workers) > k:
            self.workers[k] = worker
        else:
            self.workers.append(worker)
        self._poller.register(worker.done_fd, select.POLLIN)
        self._poller.register(process.sentinel, select.POLLIN)
        self._fd_to_worker[worker.done_fd] = worker
        self._sentinel_to_worker[process.sentinel] = worker
        return worker

    def _forget(self, worker: _Worker) -> None:
        for fd, table in ((worker.done_fd, self._fd_to_worker), (worker.process.sentinel, self._sentinel_to_worker)):
            if fd in table:
                try:
                    self._poller.unregister(fd)
                except (KeyError, ValueError):
                    pass
                del table[fd]

    def _await_ready(self, workers: list[_Worker], timeout: float) -> None:
        statuses = self.wait(workers, timeout, what="start")
        errors = []
        for worker in workers:
            if statuses[worker.index][0] == Status.ERROR:
                errors.extend(self.recv_payload(worker))
        if errors:
            raise self._error_from_reports(errors, "creating the env")

    # -- sending ------------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.broken is not None:
            raise WorkerError(self.broken, env_indices=self._broken_envs)

    _broken_envs: tuple[int, ...] = ()

    def send(self, worker: _Worker, command: int, payload: Any = None, has_payload: bool = False) -> None:
        try:
            os.write(worker.cmd.fileno(), bytes((command,)))
            if has_payload:
                worker.data.send(payload)
        except (BrokenPipeError, OSError):
            self._declare_dead(worker)

    # -- waiting ------------------------------------------------------------------------------

    def _spin(self, workers: list[_Worker], seqs: dict[int, int]) -> None:
        deadline = time.perf_counter() + self.spin_seconds
        done_seq = self.views.done_seq
        while time.perf_counter() < deadline:
            if all(done_seq[w.index] != seqs[w.index] for w in workers):
                return

    def wait(
        self,
        workers: list[_Worker],
        timeout: float | None,
        what: str = "step",
        seqs: dict[int, int] | None = None,
    ) -> dict[int, tuple[int, ...]]:
        """Wait for one status byte from each of ``workers``.

        Returns ``{worker index: (status,)}``. Raises :class:`WorkerError` if a worker dies,
        :class:`TimeoutError` (with ``.pending`` set to the workers still running) on timeout.
        """
        pending = {w.done_fd: w for w in workers}
        results: dict[int, tuple[int, ...]] = {}
        if self.spin_seconds and seqs is not None:
            self._spin(workers, seqs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            if deadline is None:
                wait_ms = None
            else:
                wait_ms = max(0.0, (deadline - time.monotonic()) * 1000)
            events = self._poller.poll(wait_ms)
            dead: list[_Worker] = []
            for fd, _ in events:
                worker = pending.get(fd)
                if worker is not None:
                    byte = os.read(fd, 1)
                    if byte:
                        results[worker.index] = (byte[0],)
                        del pending[fd]
                    else:
                        dead.append(worker)
                elif fd in self._sentinel_to_worker:
                    candidate = self._sentinel_to_worker[fd]
                    if candidate.done_fd in pending:
                        dead.append(candidate)
            for worker in dead:
                # a worker may exit right after replying; take a reply that is already there
                if worker.done_fd in pending and worker.done.poll(0):
                    byte = os.read(worker.done_fd, 1)
                    if byte:
                        results[worker.index] = (byte[0],)
                        del pending[worker.done_fd]
                        continue
                self._declare_dead(worker)
            if pending and deadline is not None and time.monotonic() >= deadline:
                error = TimeoutError(
                    f"{what} did not finish within {timeout} s; envs still running: "
                    f"{sorted(i for w in pending.values() for i in w.env_indices)}"
                )
                error.pending = list(pending.values())  # type: ignore[attr-defined]
                error.results = results  # type: ignore[attr-defined]
                raise error
        return results

    def wait_bytes(self, timeout: float | None) -> tuple[list[tuple[_Worker, bytes]], list[_Worker]]:
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

    def declare_dead(self, worker: _Worker) -> None:
        """Raise the :class:`WorkerError` for a worker that died (and mark the pool broken)."""
        self._declare_dead(worker)

    def recv_payload(self, worker: _Worker, timeout: float = 60.0) -> Any:
        """Receive the payload that follows a status byte, noticing a worker that dies."""
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

    def _declare_dead(self, worker: _Worker) -> None:
        worker.process.join(0.5)
        exitcode = worker.process.exitcode
        worker.alive = False
        self._forget(worker)
        envs = list(worker.env_indices)
        message = (
            f"worker {worker.index} (pid {worker.process.pid}, envs {envs}) "
            f"{_describe_exit(exitcode)}"
        )
        self.broken = f"{message}; this vector env cannot continue: close() it"
        self._broken_envs = tuple(envs)
        raise WorkerError(message, env_indices=envs, exitcode=exitcode)

    def _error_from_reports(self, reports: list[tuple], during: str) -> WorkerError:
        reports = sorted(reports)
        index, type_name, text, tb, what = reports[0]
        more = f" (and {len(reports) - 1} more envs failed)" if len(reports) > 1 else ""
        return WorkerError(
            f"env {index} raised {type_name} in {what}: {text}{more}",
            env_indices=[r[0] for r in reports],
            remote_traceback="\n".join(r[3] for r in reports),
            original_type=type_name,
        )

    def error_from_reports(self, reports: list[tuple], during: str = "step") -> WorkerError:
        return self._error_from_reports(reports, during)

    def worker_of(self, env_index: int) -> _Worker:
        for worker in self.workers:
            if worker.start <= env_index < worker.stop:
                return worker
        raise IndexError(env_index)

    # -- shutdown -----------------------------------------------------------------------------

    def close(self, terminate: bool = False, timeout: float = 5.0) -> None:
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
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(1.0)
            for conn in (worker.cmd, worker.done, worker.data):
                try:
                    conn.close()
                except OSError:
                    pass
            try:
                worker.process.close()
            except ValueError:
                pass
        self.workers = []
        self._fd_to_worker.clear()
        self._sentinel_to_worker.clear()
        self.views = None  # type: ignore[assignment]
        self._buffer = None
