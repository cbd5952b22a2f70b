"""The parent's side of the worker processes: start, send, wait, kill, restart, close.

A :class:`WorkerPool` owns the worker processes of one vector env, their channels and the shared
buffer. This module starts, restarts and stops them and sends their commands; waiting for their
replies is :class:`~vecaccel.worker.replies.Replies`, and the control commands (``reset``,
``call``, ``set_attr``) are :class:`~vecaccel.worker.commands.ControlCommands`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from vecaccel.errors import WorkerError, WorkerTimeoutError
from vecaccel.options import WorkerOptions
from vecaccel.spaces import read_item
from vecaccel.spaces.payload import item_columns, take_items
from vecaccel.worker import pickling
from vecaccel.worker.commands import ControlCommands
from vecaccel.worker.concurrency import ConcurrencyGate, LaneGate
from vecaccel.worker.cpus import current_cpu, usable_cpus
from vecaccel.worker.env_slice import FailureCounter, restarted_info
from vecaccel.worker.handle import (
    WorkerHandle,
    describe_exit,
    get_context,
    refuse_start_while_importing_main,
)
from vecaccel.worker.info_schema import InfoSchema, InfoSchemaTracker
from vecaccel.worker.process import fork_guarded, worker_main
from vecaccel.worker.protocol import Command, SharedLayout, Status, send_startup
from vecaccel.worker.replies import Replies
from vecaccel.worker.stacks import STACK_WAIT_S, describe_stacks, request_stacks

__all__ = ["WorkerPool"]


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


class WorkerPool(Replies, ControlCommands):
    """Worker processes, the shared buffer, and the parent's side of the protocol.

    The ``shm``, ``async`` and ``action_server`` backends all drive one of these.

    With ``on_worker_failure="restart"`` an env that raises is rebuilt inside its worker, and a
    worker that dies (or exceeds ``step_timeout_s`` and is killed) is started again; the envs
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
        options: WorkerOptions | None = None,
        *,
        inline_envs: int = 0,
    ) -> None:
        """Start the workers and wait until each has built its envs.

        Args:
            env_fns: one env function per env of the vector env.
            observation_space: every env's observation space.
            action_space: every env's action space.
            autoreset_mode: Gymnasium's autoreset mode.
            options: the worker options (default: every default).
            inline_envs: how many envs (the first ones) the caller steps itself.

        Raises:
            ValueError: if ``inline_envs`` leaves no env for the workers.
            WorkerError: if an env function raises, or a worker dies or does not report ready
                within ``options.start_timeout_s``.
        """
        options = WorkerOptions() if options is None else options
        num_envs = len(env_fns)
        if not isinstance(inline_envs, (int, np.integer)) or not 0 <= inline_envs < num_envs:
            raise ValueError(
                f"inline_envs must be an integer in 0..{num_envs - 1} (at least one env runs "
                f"in a worker), got {inline_envs!r}"
            )
        num_workers = options.num_workers
        if num_workers is None:
            num_workers = min(num_envs - inline_envs, usable_cpus())
        num_workers = min(int(num_workers), num_envs - inline_envs)
        self.options = options
        self.num_envs = num_envs
        self.inline_envs = int(inline_envs)  # envs 0..inline_envs-1 are stepped by the caller
        self.num_workers = num_workers
        self.autoreset_mode = autoreset_mode
        self.ctx = get_context(options.context)
        self.restart = options.on_worker_failure == "restart"
        self.max_restarts = options.max_restarts
        self.step_timeout_s = options.step_timeout_s
        self.start_timeout_s = options.start_timeout_s
        self.worker_threads = options.worker_threads
        self.worker_spin_seconds = float(options.worker_spin_us or 0.0) / 1e6
        # Blocking by default: measured on 2 cores (benchmarks/waiting/spin_vs_block.py), spinning before
        # blocking gained nothing within noise with a free core, and cost up to 12% without one.
        self.spin_seconds = float(options.spin_us or 0.0) / 1e6
        self.failure_counter = FailureCounter(num_envs, options.max_restarts)
        self.last_seeds: list[int | None] = [None] * num_envs
        self.layout = SharedLayout(observation_space, action_space, num_envs, num_workers)
        self._layout_args = (observation_space, action_space, num_envs, num_workers)
        self._buffer = self.ctx.RawArray("b", self.layout.nbytes)
        self.views = self.layout.views(self._buffer)
        # item columns of leaves with no fixed size; empty lists for spaces fixed throughout
        self.obs_columns = item_columns(self.views.obs)
        self.action_columns = item_columns(self.views.actions)
        # step infos of a fixed schema ride in shared memory once learned (observe_infos)
        self.info_schema = InfoSchemaTracker(self.views.info_area, self.views.info_flags)
        self.gate: ConcurrencyGate | None = None
        if options.max_concurrency is not None:
            self.gate = ConcurrencyGate(self.ctx, options.max_concurrency, self.views.gate_held)
        self._local_slices: list[Any] = []  # the caller's inline envs (EnvSlice), if any
        self.workers: list[WorkerHandle] = []
        self._owner_pid = os.getpid()  # a forked child of the user's process does not own them
        self._control_in_flight = False  # a reset/call/set_attr sent and not fully answered
        self.broken: str | None = None
        self._broken_envs: tuple[int, ...] = ()
        self._poller = select.poll()
        self._fd_to_worker: dict[int, WorkerHandle] = {}
        self._sentinel_to_worker: dict[int, WorkerHandle] = {}
        self._env_fns = list(env_fns)
        pin_cpus = options.pin_cpus
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

    def _start_worker(self, k: int, start: int, stop: int) -> WorkerHandle:
        self.views.payload_len[k] = -1  # nothing in its slab (a dead predecessor's is stale)
        self.views.last_cpu[k] = -1
        self.views.info_flags[start:stop] = 0  # no slot info until its envs step again
        refuse_start_while_importing_main()
        cmd_recv, cmd_send = self.ctx.Pipe(duplex=False)
        done_recv, done_send = self.ctx.Pipe(duplex=False)
        data_parent, data_child = self.ctx.Pipe(duplex=True)
        stack_recv, stack_send = self.ctx.Pipe(duplex=False)
        cpu = self._cpus[k % len(self._cpus)] if self._cpus else None
        process = self.ctx.Process(
            target=worker_main,
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
                self.ctx.get_start_method() != "spawn",
                stack_send,
                None if self.gate is None else self.gate.semaphore,
            ),
            daemon=True,
        )
        # cloudpickle, as under fork the spaces were inherited, never pickled: a custom space
        # holding a lambda must go on working there
        startup = cloudpickle.dumps((self._pickle_env_fns(k, start, stop), self._layout_args))
        try:
            with fork_guarded(self.ctx.get_start_method() == "fork"):
                process.start()
        finally:
            for conn in (cmd_recv, done_send, data_child, stack_send):
                conn.close()
        self._startup_writers.append(send_startup(data_parent, startup))
        worker = WorkerHandle(k, start, stop, process, cmd_send, done_recv, data_parent, stack_recv)
        if k < len(self.workers):
            self.workers[k] = worker
        else:
            self.workers.append(worker)
        self._poller.register(worker.done_fd, select.POLLIN)
        self._poller.register(process.sentinel, select.POLLIN)
        self._fd_to_worker[worker.done_fd] = worker
        self._sentinel_to_worker[process.sentinel] = worker
        return worker

    def _pickle_env_fns(self, k: int, start: int, stop: int) -> bytes:
        try:
            return pickling.dumps(self._env_fns[start:stop])
        except Exception:
            for i in range(start, stop):
                try:
                    pickling.dumps(self._env_fns[i])
                except Exception as exc:
                    raise WorkerError(
                        f"env function {i} cannot be pickled for worker {k}: "
                        f"{type(exc).__name__}: {exc}",
                        env_indices=[i],
                        original_type=type(exc).__name__,
                    ) from exc
            raise

    def _forget(self, worker: WorkerHandle) -> None:
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

    def _await_ready(self, workers: list[WorkerHandle]) -> None:
        writers, self._startup_writers = self._startup_writers, []
        statuses = self._wait_for_start(workers)
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

    def _wait_for_start(self, workers: list[WorkerHandle]) -> dict[int, tuple[int, ...]]:
        """Wait for ``workers`` to report ready.

        Raises:
            WorkerTimeoutError: with the stacks of the workers still starting once
                ``start_timeout_s`` is up. The stacks are asked for a little before that, so
                that the error comes on time; a worker may still get ready meanwhile.
        """
        timeout = self.start_timeout_s
        if timeout is None:
            return self.wait(workers, None, what="start", restartable=False)
        ends_at = time.monotonic() + timeout
        stack_wait = min(STACK_WAIT_S, timeout / 4)
        try:
            return self.wait(workers, timeout - stack_wait, what="start", restartable=False)
        except TimeoutError as early:
            statuses, stuck = early.results, early.pending  # type: ignore[attr-defined]
        request_stacks(stuck, stack_wait)
        try:
            left = max(0.0, ends_at - time.monotonic())
            statuses.update(self.wait(stuck, left, what="start", restartable=False))
        except TimeoutError as late:
            still = sorted(late.pending, key=lambda w: w.index)  # type: ignore[attr-defined]
            envs = [i for w in still for i in w.env_indices]
            names = ", ".join(str(w.index) for w in still)
            raise WorkerTimeoutError(
                f"worker{'s' if len(still) > 1 else ''} {names} (envs {envs}) did not start "
                f"within start_timeout_s={timeout} s; where it was stuck:\n\n"
                f"{describe_stacks(still)}",
                worker_indices=[w.index for w in still],
                env_indices=envs,
                remote_traceback=describe_stacks(still),
            ) from None
        return statuses

    def _dispose(self, worker: WorkerHandle) -> None:
        """Make sure a worker process is gone and its channels are closed."""
        self._forget(worker)
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(2.0)
        if self.gate is not None and worker.process.is_alive():
            # a permit it holds is given back only once it can no longer release it itself;
            # a killed process may take longer than that to exit on a loaded machine
            worker.process.join(10.0)
        if self.gate is not None and not worker.process.is_alive():
            self.gate.reclaim(worker.index)
        for conn in (worker.cmd, worker.done, worker.data, worker.stack_conn):
            try:
                conn.close()
            except OSError:
                pass

    def respawn(self, worker: WorkerHandle) -> dict[int, dict]:
        """Start a dead worker again, reset its envs from derived seeds, mark them truncated.

        Returns ``{env index: info}`` for the restarted envs.
        """
        # reap it first: a worker seen dead by its closed pipe may not have been reaped yet,
        # and its exit code (the signal that ended it) belongs in the reason
        worker.process.join(0.5)
        reason = (
            worker.killed_for or f"worker {worker.index} {describe_exit(worker.process.exitcode)}"
        )
        self._dispose(worker)
        envs = list(worker.env_indices)
        self.count_failures(envs, reason)
        try:
            fresh = self._start_worker(worker.index, worker.start, worker.stop)
            self._await_ready([fresh])
            if self.info_schema.current is not None:  # before any step: it steps with slots
                self.send(fresh, Command.INFO_SCHEMA, self.info_schema.current.schema)
            seeds = [self.failure_counter.seed(self.last_seeds[i], i) for i in envs]
            needs_reset = self.autoreset_mode is not AutoresetMode.SAME_STEP
            self.send(fresh, Command.RESET, (seeds, None, None, needs_reset))
            status = self.wait([fresh], self.start_timeout_s, what="restart", restartable=False)
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

    @property
    def failures(self) -> int:
        """Failures recovered from so far."""
        return self.failure_counter.total

    @property
    def failures_per_env(self) -> np.ndarray:
        """Failures recovered from, per env."""
        return self.failure_counter.per_env

    def count_failures(self, env_indices: Sequence[int], reason: str) -> None:
        """Count restarts; raise :class:`WorkerError` once ``max_restarts`` is exceeded."""
        message = self.failure_counter.count(env_indices, reason)
        if message is not None:
            self.broken = message
            self._broken_envs = tuple(env_indices)
            raise WorkerError(message, env_indices=list(env_indices))

    def note_restarts(self, pairs: Sequence[tuple[int, dict]]) -> None:
        """Count the envs a worker rebuilt in place (their infos say ``worker_restarted``)."""
        for i, reason in FailureCounter.restarts_in(pairs):
            self.count_failures([i], reason)

    # -- infos in shared memory ---------------------------------------------------------------

    def inline_gate(self) -> LaneGate | None:
        """The ``max_concurrency`` gate for the envs the caller steps itself (``None``: no
        cap). The caller's lane is not in shared memory: if the caller dies, so does the pool."""
        if self.gate is None:
            return None
        return self.gate.lane(0, np.zeros(1, dtype=np.int64))

    def env_busy_s(self) -> np.ndarray:
        """Seconds each lane's envs spent in ``step`` and ``reset`` so far: one per worker (as
        of its last reply), then one per slice the caller steps itself."""
        workers = self.views.env_busy_ns.astype(np.float64) / 1e9
        local = [envs.busy_ns / 1e9 for envs in self._local_slices]
        return np.concatenate([workers, np.asarray(local, dtype=np.float64)])

    def add_local_slice(self, envs: Any) -> None:
        """Have the caller's own :class:`~vecaccel.worker.EnvSlice` (``hybrid``'s inline envs)
        follow the info schema as the workers do."""
        self._local_slices.append(envs)

    def observe_infos(self, pairs: Sequence[tuple[int, dict]], in_slots: int) -> None:
        """Take note of a step's infos (:meth:`InfoSchemaTracker.observe`); a schema learned
        from them is announced to every worker and local slice, for the steps that follow.

        Called with no command in flight (lock-step), or while some are (per-env stepping):
        each env's flag then says which schema its block was written under.
        """
        schema = self.info_schema.observe(pairs, in_slots)
        if schema is not None:
            self.announce_info_schema(schema)

    def announce_info_schema(self, schema: InfoSchema) -> None:
        """Send ``schema`` to every worker (and local slice); no reply comes."""
        for envs in self._local_slices:
            envs.set_info_schema(schema)
        self.send_many([(worker, Command.INFO_SCHEMA, schema) for worker in self.workers])

    # -- sending ------------------------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise the :class:`WorkerError` that broke the pool, if one did."""
        if self.broken is not None:
            raise WorkerError(self.broken, env_indices=self._broken_envs)

    def send(self, worker: WorkerHandle, command: int, payload: Any = None) -> None:
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

    def send_all(self, workers: Sequence[WorkerHandle], command: int, spread: bool = False) -> None:
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

    def _spread(self, workers: Sequence[WorkerHandle], here: int) -> None:
        last_cpu, allowed = self.views.last_cpu, self._allowed
        for worker in workers:
            if worker.nudged:  # back to every CPU; it stays where it ran last
                worker.nudged = False
                self._set_affinity(worker, allowed)
        taken: set[int] = set()
        crowded: list[WorkerHandle] = []  # workers that last ran on a CPU another one ran on too
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
    def _set_affinity(worker: WorkerHandle, cpus: Sequence[int]) -> bool:
        try:
            os.sched_setaffinity(worker.process.pid, cpus)
        except (OSError, TypeError):  # the worker died (its sentinel reports it) or has no pid
            return False
        return True

    def send_many(self, messages: Sequence[tuple[WorkerHandle, int, Any]]) -> None:
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

    def send_action_items(
        self, workers: Sequence[WorkerHandle], command: int, env_ids: Sequence[int] | None = None
    ) -> None:
        """Send a step ``command`` to each of ``workers`` with the action items (leaves with no
        fixed size, from :attr:`views`' item columns) of its envs among ``env_ids`` (default:
        all its envs). Only for an action space with such leaves: the worker reads them after
        the command byte."""
        messages = []
        for worker in workers:
            if env_ids is None:
                ids: Sequence[int] = worker.env_indices
            else:
                ids = [i for i in env_ids if worker.start <= i < worker.stop]
            messages.append((worker, command, take_items(self.action_columns, ids)))
        self.send_many(messages)

    def worker_of(self, env_index: int) -> WorkerHandle:
        """The worker whose slice holds env ``env_index``."""
        for worker in self.workers:
            if worker.start <= env_index < worker.stop:
                return worker
        raise IndexError(env_index)

    # -- shutdown -----------------------------------------------------------------------------

    def close(self, terminate: bool = False, timeout: float = 5.0) -> None:
        """Stop every worker (politely unless ``terminate``) and release the channels."""
        _POOLS.discard(self)
        if os.getpid() != self._owner_pid:
            # a child made by os.fork(): the workers are the parent's; drop our copies of the
            # channels only (the parent's stay open)
            for worker in self.workers:
                for conn in (worker.cmd, worker.done, worker.data, worker.stack_conn):
                    try:
                        conn.close()
                    except OSError:
                        pass
            self.workers = []
            self._release_buffer()
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
        self._release_buffer()

    def _release_buffer(self) -> None:
        """Drop every view of the shared buffer, so that multiprocessing's heap frees its block
        now (a view kept anywhere would hold the block, and the next pool would map another)."""
        self.views = None  # type: ignore[assignment]
        self.gate = None  # its semaphore is unlinked once no process refers to it
        self.info_schema = None  # type: ignore[assignment]  # it holds views of the info area
        self._buffer = None
