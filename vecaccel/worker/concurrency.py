"""``max_concurrency``: at most N envs step or reset at one time, across every worker.

One semaphore, created by the parent and handed to each worker at its start, is held around each
env's ``step`` and ``reset`` (Gymnasium's ``AsyncVectorEnv(max_concurrency=N)`` does the same
around its workers' steps and resets). A worker marks in shared memory while it holds a permit,
so that the parent can give back the permit of a worker that died holding it (a worker killed
for ``step_timeout_s`` is killed in the middle of a step): without that, every other env would
wait for a permit that nobody returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ConcurrencyGate", "LaneGate"]


class LaneGate:
    """The semaphore as one worker (or the caller's inline envs) holds it: a context manager.

    Example:
        >>> import multiprocessing
        >>> held = np.zeros(1, dtype=np.int64)
        >>> gate = LaneGate(multiprocessing.BoundedSemaphore(1), held, 0)
        >>> with gate:
        ...     int(held[0])
        1
        >>> int(held[0])
        0
    """

    def __init__(self, semaphore: Any, held: np.ndarray, lane: int) -> None:
        self.semaphore = semaphore
        self.held = held
        self.lane = lane

    def __enter__(self) -> None:
        self.semaphore.acquire()
        self.held[self.lane] = 1

    def __exit__(self, *exc_info: object) -> None:
        self.held[self.lane] = 0
        self.semaphore.release()


class ConcurrencyGate:
    """The parent's side: the semaphore and the permits of workers that died holding one.

    Args:
        ctx: the multiprocessing context the workers start with.
        limit: ``max_concurrency``.
        held: per worker, 1 while it holds a permit (shared memory the workers write).

    Example:
        >>> import multiprocessing
        >>> held = np.zeros(2, dtype=np.int64)
        >>> gate = ConcurrencyGate(multiprocessing.get_context("fork"), 1, held)
        >>> gate.lane(0).__enter__()
        >>> gate.semaphore.acquire(block=False)
        False
        >>> gate.reclaim(0)  # worker 0 died holding it
        >>> gate.semaphore.acquire(block=False)
        True
    """

    def __init__(self, ctx: Any, limit: int, held: np.ndarray) -> None:
        self.limit = int(limit)
        self.semaphore = ctx.BoundedSemaphore(self.limit)
        self.held = held

    def lane(self, index: int, held: np.ndarray | None = None) -> LaneGate:
        """The gate for lane ``index`` of ``held`` (default: the workers' shared flags)."""
        return LaneGate(self.semaphore, self.held if held is None else held, index)

    def reclaim(self, worker_index: int) -> None:
        """Give back the permit of a worker that is gone, if it held one."""
        if self.held[worker_index]:
            self.held[worker_index] = 0
            self.semaphore.release()
