"""The two ends of an asynchronous run's collector process, and the waits between them.

:class:`CollectorHandle` is the optimiser's end: it allocates the
:class:`~vecaccel.trainers.runners.asynchronous.shared.CollectorChannels`, starts the process, publishes
weights, checks that the process lives and stops it. :class:`ChildLink` is the process's end: it
waits (counted as the sampler's waiting time), pulls weights and notices when the optimiser's
process is gone. The process runs its family's loop (in
:mod:`~vecaccel.trainers.runners.asynchronous.replay_feed` or
:mod:`~vecaccel.trainers.runners.asynchronous.rollout_feed`) through :func:`child_main`, which
reports what it raises.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vecaccel.manager import register_envs
from vecaccel.trainers.runners.asynchronous.shared import CollectorChannels
from vecaccel.worker.process import FORK_BLOCKED_SIGNALS, fork_guarded

__all__ = [
    "ChildLink",
    "CollectorError",
    "CollectorHandle",
    "CollectorOptions",
    "Waits",
    "child_main",
    "leave_cores_to_collector",
]

# how often a side blocked on the other checks that it lives (and whether to stop)
_LIVENESS_PERIOD_S = 0.05


class CollectorError(RuntimeError):
    """The asynchronous collector process died or raised.

    Attributes:
        exitcode: the process's exit code (negative: killed by that signal), if it has exited.
        remote_traceback: the traceback the sampler sent before dying, if any.
    """

    def __init__(self, message: str, exitcode: int | None, remote_traceback: str = "") -> None:
        super().__init__(message + (f"\n{remote_traceback}" if remote_traceback else ""))
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback


@dataclass(frozen=True)
class CollectorOptions:
    """How a collector process runs.

    Attributes:
        context: multiprocessing start method of the process.
        poll_interval: seconds between checks that the process lives while the optimiser
            waits for it to start.
        threads: torch threads of the process.
        affinity: CPUs to pin the process to (``None``: those of the optimiser's process).
        fixed_lag: act on every item with the weights of a fixed earlier update (see
            :class:`~vecaccel.trainers.runners.asynchronous.shared.CollectorChannels`).
    """

    context: str = "spawn"
    poll_interval: float = 0.0005
    threads: int = 1
    affinity: set[int] | None = None
    fixed_lag: bool = False


def take(channel: Any, check: Callable[[], None], period: float = _LIVENESS_PERIOD_S) -> Any:
    """The next item of the queue ``channel``, calling ``check()`` (which raises if the other
    side died or a stop was asked) every ``period`` seconds while none is there."""
    while True:
        try:
            return channel.get(timeout=period)
        except queue.Empty:
            check()


class Waits:
    """The optimiser's waits for the sampler, timed: what ``optimizer_wait_fraction`` counts.

    Args:
        check: called every so often while waiting; raises if the sampler died or the run must
            stop now.
    """

    def __init__(self, check: Callable[[], None]) -> None:
        self.check = check
        self.seconds = 0.0

    def take(self, channel: Any) -> Any:
        """The next item of the queue ``channel``."""
        started = time.perf_counter()
        item = take(channel, self.check)
        self.seconds += time.perf_counter() - started
        return item

    def acquire(self, semaphore: Any) -> None:
        """Acquire ``semaphore``."""
        started = time.perf_counter()
        while not semaphore.acquire(timeout=_LIVENESS_PERIOD_S):
            self.check()
        self.seconds += time.perf_counter() - started


class _GuardedLock:
    """A cross-process lock acquired in bounded waits, checking between them that the other
    process lives: a process killed while holding a lock never releases it."""

    def __init__(self, lock: Any, check: Callable[[], None]) -> None:
        self.lock = lock
        self.check = check

    def __enter__(self) -> None:
        while not self.lock.acquire(timeout=0.25):
            self.check()

    def __exit__(self, *exc_info: Any) -> None:
        self.lock.release()


class _OptimiserGone(Exception):
    """Raised in a collector process whose optimiser's process has exited."""


def child_main(loop: Callable[[dict[str, Any]], None], spec: dict[str, Any]) -> None:
    """Entry point of a collector process: run ``loop(spec)``, reporting what it raises."""
    try:
        register_envs()  # the sampler builds envs: under spawn it starts knowing no plugin ids
        loop(spec)
    except _OptimiserGone:
        return
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        try:
            spec["errors"].put(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        except Exception:  # noqa: BLE001 - the report is best effort; the error is re-raised
            pass
        raise


class ChildLink:
    """The collector process's end: its set-up, the shared counters and hand-over, waits, weight
    pulls and the liveness of the optimiser.

    Args:
        spec: the process's spec (see :meth:`CollectorHandle.start`).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        # the optimiser handles SIGINT and SIGTERM and stops this process through `stop`;
        # torchrun sends SIGTERM to each rank's whole process group, this process included
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        # forked, it started with both blocked (CollectorHandle.start): ignored now, let through
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORK_BLOCKED_SIGNALS)
        options: CollectorOptions = spec["options"]
        if options.affinity:
            os.sched_setaffinity(0, options.affinity)
        torch.set_num_threads(int(options.threads))
        self.channels: CollectorChannels = spec["channels"]
        self.counters = self.channels.counters
        self.version = -1
        self._parent = spec["parent_pid"]
        self._weights_lock = _GuardedLock(self.channels.weights_lock, self.check_optimiser)

    def check_optimiser(self) -> None:
        """Raise if the optimiser's process has exited (this process was re-parented), perhaps
        holding a lock; :func:`child_main` then ends this process quietly."""
        if os.getppid() != self._parent:
            raise _OptimiserGone

    def acquire(self, semaphore: Any) -> bool:
        """Wait for ``semaphore`` (counted as waiting time); ``False`` if a stop was asked."""
        if semaphore.acquire(block=False):
            return True
        started = time.perf_counter()
        try:
            while not semaphore.acquire(timeout=_LIVENESS_PERIOD_S):
                self.check_optimiser()
                if self.counters.stop:
                    return False
            return True
        finally:
            self.counters.sampler_wait += time.perf_counter() - started

    def weights_for(self, n: int, params: Sequence[torch.Tensor]) -> int | None:
        """Copy the weights item ``n`` is collected with into ``params``: with a fixed lag those
        of the publish meant for it (waited for), otherwise the newest. Their version, or
        ``None`` if a stop was asked meanwhile."""
        fixed_lag = self.channels.fixed_lag
        if fixed_lag and n >= 2 and not self.acquire(self.channels.publishes):
            return None
        if self.counters.version != self.version:
            with self._weights_lock:
                self.version = self.counters.version
                for mine, shared in zip(params, self.channels.weights):
                    mine.copy_(shared)
        if fixed_lag:
            self.channels.pulls.release()
        return self.version


class CollectorHandle:
    """The optimiser's end of a collector process: its hand-over, start, weight publish, liveness
    check and stop.

    Args:
        options: how the process runs (its context makes the locks and queues too).
        role: ``sampler`` or ``rollout`` (in messages and the process's name).
        model: the module whose weights are published (its ``state_dict`` tensors share storage
            with the parameters, so the list taken here stays current).
        extra: further tensors published with the weights, after them and kept current in
            place alike (the run's normalisation statistics).
    """

    def __init__(
        self,
        options: CollectorOptions,
        role: str,
        model: torch.nn.Module,
        extra: Sequence[torch.Tensor] = (),
    ) -> None:
        import torch.multiprocessing as mp

        self.role = role
        self.options = options
        self.ctx = ctx = mp.get_context(options.context)
        self._state = [*model.state_dict().values(), *extra]
        self.channels = CollectorChannels(ctx, self._state, options.fixed_lag)
        self.counters = self.channels.counters
        self._weights_lock = _GuardedLock(self.channels.weights_lock, self.check)
        self.errors = ctx.Queue()
        self.process: Any = None

    def publish(self, version: int) -> None:
        """Copy the model's weights to shared memory as ``version``."""
        with self._weights_lock:
            for shared, tensor in zip(self.channels.weights, self._state):
                shared.copy_(tensor)
            self.counters.version = version

    def start(self, loop: Callable[[dict[str, Any]], None], entries: dict[str, Any]) -> None:
        """Start the process running ``loop`` on a spec of ``entries`` and of what
        :class:`ChildLink` reads."""
        link = dict(channels=self.channels, errors=self.errors, parent_pid=os.getpid())
        spec = {**entries, **link, "options": self.options}
        self.process = self.ctx.Process(
            target=child_main, args=(loop, spec), name=f"vecaccel-async-{self.role}"
        )
        # a forked child must not run the optimiser's handlers before it sets its own
        with fork_guarded(self.ctx.get_start_method() == "fork"):
            self.process.start()

    def wait_started(self, check: Callable[[], None]) -> Any:
        """Wait until the process runs, checking every ``poll_interval``; the double buffer's
        slots it hands over then."""
        slots = take(self.channels.started, check, self.options.poll_interval)
        self.channels.started_seen.release()
        return slots

    def check(self) -> None:
        """Raise :class:`CollectorError` if the process died before the run's normal end (a clean
        exit, after its last item, which may still be on the queue, or when asked to stop)."""
        process = self.process
        if process is None or process.is_alive():
            return
        process.join(timeout=1.0)
        if self.counters.stop or process.exitcode == 0:
            return
        remote = ""
        try:
            remote = self.errors.get(timeout=0.2)
        except (queue.Empty, OSError, EOFError):
            pass
        from vecaccel.trainers.services import distributed

        where = f" of rank {distributed.rank()}" if distributed.is_distributed() else ""
        raise CollectorError(
            f"the asynchronous {self.role} process{where} (pid {process.pid}) died with exit "
            f"code {process.exitcode} after {self.counters.steps} env steps",
            process.exitcode,
            remote,
        )

    def stop(self) -> None:
        """Ask the process to stop, wait for it (killing it if it does not), close the queues."""
        self.counters.stop = 1
        process = self.process
        if process is not None:
            process.join(timeout=10.0)
            if process.is_alive():  # it ignores SIGTERM: end it with SIGKILL
                process.kill()
                process.join(timeout=5.0)
        for channel in (self.errors, self.channels.started, self.channels.filled):
            channel.close()
            channel.cancel_join_thread()


def leave_cores_to_collector(cfg: Any, collector_threads: int) -> None:
    """With automatic torch threads (``torch_threads=0``), leave the collector process (and its
    env workers) their cores: torch's default of one thread per core would make the optimiser's
    OpenMP threads spin on them. Ranks on one machine share its cores, and cores that other
    processes keep busy are left to them (:func:`~vecaccel.trainers.services.threads.automatic_threads`)."""
    if getattr(cfg, "torch_threads", 0) > 0:
        return
    from vecaccel.trainers.services.threads import automatic_threads

    threads = automatic_threads(
        cfg.backend, cfg.num_envs, getattr(cfg, "num_workers", 0), collector_threads
    )
    torch.set_num_threads(threads)
