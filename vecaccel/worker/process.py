"""The worker process: its loop over commands, and how it ends with the process that started it.

The loop reads one command byte at a time from ``cmd`` and answers on ``done`` (see
:mod:`vecaccel.worker.protocol`). An env's own error never ends the loop: it is reported to the
parent, naming the env. The worker ends when the parent sends ``CLOSE``, closes the pipe, or
dies.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle
import numpy as np
from gymnasium.vector import AutoresetMode

from vecaccel.manager import register_envs
from vecaccel.worker.concurrency import LaneGate
from vecaccel.worker.cpus import current_cpu, limit_threads_after_envs, limit_threads_before_envs
from vecaccel.worker.env_slice import EnvMakeError
from vecaccel.worker.protocol import (
    ENV_PAYLOAD_FLAG,
    PARENT_CHECK_INTERVAL,
    PAYLOAD_SLAB_BYTES,
    Command,
    ObsItems,
    SharedLayout,
    Status,
    error_report,
    read_startup,
)
from vecaccel.worker.stacks import arm_stack_dump
from vecaccel.worker.vector_env_slice import make_env_slice

__all__ = ["FORK_BLOCKED_SIGNALS", "fork_guarded", "parent_garbage_kept", "worker_main"]

#: The signals a forked worker starts with blocked, until it has handlers of its own: a handler
#: the parent installed in Python (Ray's, a trainer's), run in a child just forked, would run the
#: parent's code there (an exception it raises unwinds into a copy of the parent's program).
FORK_BLOCKED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def parent_garbage_kept(forking: bool) -> Iterator[None]:
    """Around the start of a forked child (``forking``), freeze the garbage collector's objects
    so that the child never collects the parent's: a cycle the parent dropped but had not
    collected yet (an EnvPool closed a moment earlier, its threads in the parent) would otherwise
    run its finaliser in the child, where those threads do not exist, and kill it with SIGSEGV or
    SIGABRT. The parent's objects are unfrozen when the child has started. Where the caller froze
    objects of its own, which unfreezing would undo, the parent's garbage is collected before the
    fork instead.

    Example:
        >>> with parent_garbage_kept(True):
        ...     gc.get_freeze_count() > 0
        True
    """
    if not forking:
        yield
        return
    freezing = gc.get_freeze_count() == 0
    if freezing:
        gc.freeze()
    else:
        gc.collect()
    try:
        yield
    finally:
        if freezing:
            gc.unfreeze()


@contextmanager
def fork_guarded(forking: bool) -> Iterator[None]:
    """Around the start of a forked worker (``forking``), keep the parent's state out of the
    child's hands until it has its own.

    * :data:`FORK_BLOCKED_SIGNALS` are blocked in this thread; the child inherits the mask and
      :func:`worker_main` lifts it. A signal that arrives meanwhile waits, and reaches the parent
      once the mask is restored.
    * The child never collects the parent's garbage (:func:`parent_garbage_kept`).

    Example:
        >>> with fork_guarded(True):
        ...     signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        True
    """
    if not forking:
        yield
        return
    with parent_garbage_kept(True):
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORK_BLOCKED_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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
        return False, dumps([error_report(index, exc, what)])


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


def worker_main(
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
    forked: bool = True,
    stack_conn: Any = None,
    gate_semaphore: Any = None,
) -> None:
    """The worker process's entry point: build the slice of envs, then serve commands.

    Args:
        worker_index: the worker's index in the pool (its row of the per-worker arrays).
        start: the index of the slice's first env in the vector env.
        buffer: the shared buffer (a ``RawArray``), laid out by :class:`SharedLayout`.
        autoreset_mode: Gymnasium's autoreset mode.
        cmd_conn: the read end of the ``cmd`` pipe.
        done_conn: the write end of the ``done`` pipe.
        data_conn: the worker's end of the ``data`` channel; the startup message comes first.
        parent_pid: the vector env's process, which the worker must not outlive.
        cpu: the CPU to pin the worker to, or ``None``.
        restart_on_error: rebuild an env that raises in a step instead of reporting it.
        started_by_main_thread: whether the parent's main thread started this worker.
        worker_threads: the cap on native thread pools (``None``: no cap).
        spin_seconds: how long to look for the next command before sleeping, while the
            previous command came within that time.
        forked: whether the worker was forked (fork, forkserver), not a fresh interpreter.
        stack_conn: the write end of its stack pipe (:mod:`vecaccel.worker.stacks`).
        gate_semaphore: the ``max_concurrency`` semaphore (:mod:`vecaccel.worker.concurrency`),
            or ``None``.
    """
    # what a forked worker came with: their thread pools may have run in the parent
    inherited = frozenset(sys.modules) if forked else frozenset()
    arm_stack_dump(stack_conn)
    # Ctrl-C belongs to the parent, which shuts workers down cleanly (no tracebacks). SIGTERM
    # takes its default: multiprocessing's exit handler terminates daemonic workers with it, and a
    # forked worker must not run a handler the parent installed (Ray's, a trainer's). A forked
    # worker starts with both blocked (WorkerPool): they are let through from here on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORK_BLOCKED_SIGNALS)
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
        pickled_env_fns, layout_args = pickle.loads(read_startup(data_conn.fileno()))
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
    busy_ns, ready_at = views.env_busy_ns, views.ready_at
    gate = None
    if gate_semaphore is not None:
        gate = LaneGate(gate_semaphore, views.gate_held, worker_index)

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
        if built:  # the time its envs spent in step and reset, for the run's stats
            busy_ns[worker_index] = built[0].busy_ns
        seq[worker_index] += 1
        os.write(done_fd, bytes((status,)))
        if data is not None:
            data_conn.send_bytes(data)

    built: list[Any] = []  # the slice, once made
    limit_threads_before_envs(worker_threads)
    try:
        # a spawned worker starts from a fresh interpreter, where Gymnasium 1.x knows no
        # namespace of a plugin package (ALE, MinAtar) until its registration runs: a user's
        # env function calling gym.make("ALE/Pong-v5") must work here as in the caller
        register_envs()
        env_fns: list[Callable] = cloudpickle.loads(pickled_env_fns)
        envs = make_env_slice(
            start,
            env_fns,
            autoreset_mode,
            views,
            layout.observation_space,
            layout.action_space,
            restart_on_error,
            owner=f"worker {worker_index}",
            gate=gate,
        )
        built.append(envs)
    except EnvMakeError as failed:  # the report names the env whose function raised
        reply(Status.ERROR, [error_report(failed.index, failed.error, "make")])
        return
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        reply(Status.ERROR, [error_report(start, exc, "make")])
        return
    limit_threads_after_envs(worker_threads, inherited)
    reply(Status.READY)

    poller = select.poll()
    poller.register(cmd_fd, select.POLLIN)
    count = len(env_fns)
    # leaves with no fixed size: observation items go with each reply, action items come
    # after each step command; both are off (and cost nothing) for spaces fixed throughout
    obs_items = envs.obs_items if envs.obs_columns else None
    action_items = bool(envs.action_columns)
    every_env, every_slot = range(start, start + count), range(count)
    # Spin only while the gaps between commands fit in the spin: a worker whose last command
    # came later than that (a long policy forward pass, an update phase) sleeps at once.
    spin_next = bool(spin_seconds)
    try:
        while True:
            idle_since = time.perf_counter()
            if spin_next:  # look for the next command without sleeping for a while first
                deadline = idle_since + spin_seconds
                while not poller.poll(0) and time.perf_counter() < deadline:
                    pass
            if not poller.poll(PARENT_CHECK_INTERVAL * 1000):
                if not _parent_alive(parent_pid, launcher_pid):
                    break  # the parent died: leave quietly
                spin_next = False
                continue
            if spin_seconds:
                spin_next = time.perf_counter() - idle_since < spin_seconds
            raw = os.read(cmd_fd, 1)
            if not raw:
                break  # the parent closed the pipe
            command = raw[0]
            if command == Command.STEP:
                if action_items:
                    envs.take_action_items(data_conn.recv())
                infos, errors = envs.step_all()
                if errors:
                    reply(Status.ERROR, errors)
                elif obs_items is not None:
                    items = ObsItems(infos, obs_items(every_env))
                    reply(Status.OK_DATA, items, "step (sending its observation and info)")
                elif infos:
                    reply(Status.OK_DATA, infos, "step (sending its info)")
                else:
                    reply(Status.OK)
            elif command == Command.STEP_MASKED:
                mask = views.step_mask
                # with action items, exactly the envs this command's items name: the mask may
                # already hold envs of a later command whose items are not read yet
                slots = envs.take_action_items(data_conn.recv()) if action_items else every_slot
                for j in slots:
                    if not mask[start + j]:
                        continue
                    mask[start + j] = 0
                    info, error = envs.step(j)
                    ready_at[start + j] = time.monotonic()
                    busy_ns[worker_index] = envs.busy_ns
                    seq[worker_index] += 1
                    if error is None and not info and obs_items is None:
                        os.write(done_fd, bytes((j,)))
                        continue
                    if error is not None:
                        data = dumps((Status.ERROR, [error]))
                    else:
                        payload = (Status.OK_DATA, info)
                        if obs_items is not None:
                            payload = ObsItems(payload, obs_items((start + j,)))
                        try:
                            data = dumps(payload)
                        except Exception as exc:  # noqa: BLE001 - an unpicklable info
                            report = error_report(start + j, exc, "step (sending its info)")
                            data = dumps((Status.ERROR, [report]))
                    os.write(done_fd, bytes((ENV_PAYLOAD_FLAG + j,)))
                    data_conn.send_bytes(data)
                last_cpu[worker_index] = current_cpu()
            elif command == Command.RESET:
                seeds, options, mask, needs_reset = data_conn.recv()
                infos, errors = envs.reset_all(seeds, options, mask, needs_reset)
                if errors:
                    reply(Status.ERROR, errors)
                elif obs_items is not None:
                    items = ObsItems(infos, obs_items([i for i, _ in infos]))
                    reply(Status.OK_DATA, items, "reset (sending its observation and info)")
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
                        reply(Status.ERROR, [error_report(start, exc, f"call({name!r})")])
                    else:
                        reply(Status.OK_DATA, payload)
            elif command == Command.SET_ATTR:
                name, pairs = data_conn.recv()
                errors = envs.set_attrs(name, pairs)
                reply(Status.ERROR, errors) if errors else reply(Status.OK)
            elif command == Command.INFO_SCHEMA:  # no reply: it governs the steps that follow
                envs.set_info_schema(data_conn.recv())
            elif command == Command.CLOSE:
                envs.close()
                reply(Status.OK)
                break
    except (BrokenPipeError, EOFError, OSError):
        pass  # the parent went away mid-command
    finally:
        envs.close()
