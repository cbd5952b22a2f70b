"""torch's intra-op threads: how many a run starts with, and how many it keeps while it goes.

torch's threads wait for each other at the end of every operation: when another process takes
one of their cores, every operation waits for the thread it descheduled, and a run that took 6 s
alone took 36 s beside one busy loop with torch's default of a thread per core (7 s with one
thread). So with automatic threads (``torch_threads=0``) a run starts with the cores that are
free: this process's CPUs (affinity and cgroup quota), less the env workers' and less what other
processes keep busy, measured at start (:func:`automatic_threads`). A synchronous run's updates
also take the workers' cores, which wait while it updates. While it runs,
:class:`AdaptiveThreads` reads the machine's load again every few seconds and times each update
against the best time seen with as many threads, and drops a thread when others took the cores
or the updates slow down (a hypervisor's steal, a quota), and takes it back once the cores are
free again. One warning says when that happened and what to set.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

from vecaccel.worker.cpus import CpuLoad, TorchThreadsWarning, available_cpus, user_stacklevel

__all__ = [
    "AdaptiveThreads",
    "automatic_threads",
    "configure_torch_threads",
    "env_workers",
    "free_cores",
]

#: How long the load is measured at start (seconds).
START_SAMPLE_SECONDS = 0.1


def free_cores(others: float | None = None) -> int:
    """This process's share of the CPUs it may use (affinity and cgroup quota; ranks started by
    ``torchrun`` on one machine split them), less the cores other processes keep busy
    (``others``; measured now when ``None``). At least one.

    Example:
        >>> free_cores(others=0.0) >= 1
        True
    """
    cpus = available_cpus() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if others is None:
        others = CpuLoad.measure(START_SAMPLE_SECONDS)
    # a light background (an editor, a shell) does not take a core; a busy loop does
    return max(1, cpus - int(others + 0.5))


def env_workers(backend: str, num_envs: int, num_workers: int = 0) -> int:
    """The cores a run's env workers fill: none on the ``serial`` backend, else its worker
    processes (``num_workers``, or one per env up to one per CPU).

    Example:
        >>> env_workers("serial", 64), env_workers("shm", 64, num_workers=3)
        (0, 3)
    """
    if backend == "serial":
        return 0
    return num_workers if num_workers > 0 else min(num_envs, available_cpus())


def automatic_threads(
    backend: str,
    num_envs: int,
    num_workers: int = 0,
    reserved: int = 0,
    others: float | None = None,
) -> int:
    """The torch threads of an automatic run while its env workers step: the free cores
    (:func:`free_cores`) less the ones its env workers fill (:func:`env_workers`) and
    ``reserved`` (an async run's collector). At least one.

    Example:
        >>> automatic_threads("shm", num_envs=64, others=0.0)
        1
    """
    workers = env_workers(backend, num_envs, num_workers)
    return max(1, free_cores(others) - workers - reserved)


def configure_torch_threads(
    requested: int,
    backend: str,
    num_envs: int,
    num_workers: int = 0,
    reserved: int = 0,
    others: float | None = None,
) -> int:
    """Set torch's intra-op threads; return the number in force.

    ``requested > 0`` is applied as given; ``0`` (automatic) sets :func:`automatic_threads`
    (``others``: the cores other processes keep busy, measured now when ``None``).

    Example:
        >>> configure_torch_threads(1, "serial", 8)
        1
    """
    import torch

    threads = (
        requested
        if requested > 0
        else automatic_threads(backend, num_envs, num_workers, reserved, others)
    )
    torch.set_num_threads(threads)
    return threads


class AdaptiveThreads:
    """Keeps torch's threads at what the machine leaves free while a run goes.

    In a synchronous run (``phases=True``) the env workers wait while this process updates, so
    an update may take their cores too, and the collection leaves them to the workers: the
    runner calls :meth:`collect_phase` before collecting and :meth:`update_phase` before
    updating (setting the count costs microseconds). An asynchronous run's workers step all the
    time, and both counts are the collection's.

    The runner calls :meth:`observe` after every update with its time. Every ``check_every``
    seconds the load of other processes is read again (without waiting: the reading is compared
    with the previous one); an automatic run then moves to the threads that are free. Between
    readings, ``patience`` updates in a row slower than ``slow`` times the best seen with as many
    threads drop one thread; the dropped thread comes back only once a reading says its core is
    free and a hold (doubling each time a thread comes back and is dropped again) has passed, so a
    busy machine does not make the count swing.

    With threads set by hand (``requested > 0``) the count stays, and the same signs give one
    warning that says what to set.

    Args:
        requested: the run's ``torch_threads`` (0: automatic).
        backend, num_envs, num_workers: the run's envs, whose workers keep their cores.
        reserved: cores kept for another part of the run (an async run's collector).
        others: the cores other processes kept busy when the run started (``None``: none known;
            the first reading, ``check_every`` seconds in, tells).
        phases: a synchronous run, whose updates may use the workers' cores.
        check_every: seconds between two readings of the load.
        slow: how many times its best an update may take before it counts as slow.
        patience: slow updates in a row that drop a thread.

    Example:
        >>> configure_torch_threads(1, "serial", num_envs=1)
        1
        >>> threads = AdaptiveThreads(requested=1, backend="serial", num_envs=1)
        >>> threads.observe(0.01, updates=1)
        1
    """

    def __init__(
        self,
        requested: int,
        backend: str,
        num_envs: int,
        num_workers: int = 0,
        reserved: int = 0,
        others: float | None = None,
        phases: bool = False,
        check_every: float = 5.0,
        slow: float = 1.5,
        patience: int = 3,
    ) -> None:
        import torch

        self._torch = torch
        self.automatic = requested <= 0
        self.phases = phases
        self.workers = env_workers(backend, num_envs, num_workers)
        self.reserved = reserved
        # what the envs leave on a quiet machine: the most an automatic run takes
        self.ceiling = self._update_target(free_cores(0.0))
        self.free = free_cores(0.0 if others is None else others)
        if self.automatic:
            self.threads = min(self.ceiling, self._update_target(self.free))
        else:
            self.threads = torch.get_num_threads()
        self.check_every, self.slow, self.patience = check_every, slow, patience
        self.best: dict[int, float] = {}
        self.slow_run = 0
        self.hold, self.hold_until = check_every * 2, 0.0
        self.warned = False
        self.changes: list[tuple[int, int, str]] = []
        self._reading = CpuLoad()

    def _update_target(self, free: int) -> int:
        """The threads an update takes when ``free`` cores are free."""
        workers = 0 if self.phases else self.workers
        return max(1, free - workers - self.reserved)

    @property
    def collect_threads(self) -> int:
        """The threads the collection takes (the workers step beside it)."""
        if not (self.automatic and self.phases):
            return self.threads
        return max(1, min(self.threads, self.free - self.workers - self.reserved))

    def collect_phase(self) -> None:
        """Set the threads for collecting."""
        self._torch.set_num_threads(self.collect_threads)

    def update_phase(self) -> None:
        """Set the threads for updating."""
        self._torch.set_num_threads(self.threads)

    def observe(self, seconds: float, updates: int = 1) -> int:
        """Take an update's time (``updates`` gradient updates took ``seconds``); return the
        threads in force for the next one."""
        if updates <= 0:
            return self.threads
        per_update = seconds / updates
        best = self.best.get(self.threads)
        if best is None or per_update < best:
            self.best[self.threads] = per_update
        elif per_update > self.slow * best:
            self.slow_run += 1
        else:
            self.slow_run = 0
        now = self.check()
        if self.slow_run >= self.patience and self.threads > 1:
            ratio = per_update / self.best[self.threads]
            self._change(self.threads - 1, f"updates took {ratio:.1f}x their best time", now)
        return self.threads

    def check(self) -> float:
        """Read the load again if ``check_every`` seconds passed since the last reading, and move
        to the threads it leaves free; return the time now (``time.monotonic``)."""
        now = time.monotonic()
        if now - self._reading.time >= self.check_every:
            reading = CpuLoad()
            others = reading.others_since(self._reading)
            self._reading = reading
            self.follow_load(others, now)
        return now

    def follow_load(self, others: float, now: float | None = None) -> None:
        """Move to the threads the machine leaves free while other processes keep ``others``
        cores busy (a thread comes back only after the hold)."""
        now = time.monotonic() if now is None else now
        self.free = free_cores(others)
        free = min(self.ceiling, self._update_target(self.free))
        if free < self.threads:
            self._change(free, f"other processes kept {others:.1f} cores busy", now)
        elif free > self.threads and self.automatic and now >= self.hold_until:
            self._change(self.threads + 1, "cores came free", now)

    def _change(self, threads: int, why: str, now: float) -> None:
        before = self.threads
        self.slow_run = 0
        if not self.automatic:
            self._warn(
                f"torch_threads={before} is more than this machine leaves free ({why}); "
                f"set torch_threads=0 (--torch-threads 0) to adapt, or {max(1, threads)}"
            )
            return
        if threads < before and self.changes and self.changes[-1][1] > self.changes[-1][0]:
            self.hold *= 2  # a thread taken back was dropped again: wait longer next time
        self.hold_until = now + self.hold
        self._torch.set_num_threads(threads)
        self.threads = threads
        self.changes.append((before, threads, why))
        if threads < before:
            self._warn(
                f"torch threads {before} -> {threads}: {why}. The run adapts; set "
                f"torch_threads (--torch-threads) to fix the count yourself"
            )

    def _warn(self, message: str) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(message, TorchThreadsWarning, stacklevel=user_stacklevel())

    def summary(self) -> dict[str, Any]:
        """The threads in force, the changes made (before, after, why) and the best update time
        per thread count."""
        return {"threads": self.threads, "changes": list(self.changes), "best": dict(self.best)}
