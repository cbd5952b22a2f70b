"""Where a run's time goes: in the envs, in the transport, or in the caller between steps.

Every backend keeps a :class:`StepClock` (on by default: two clock reads and a read of one
number per worker a step) and answers ``envs.stats()`` with a :class:`RunStats`. A step's wall
time, from the end of one ``step`` to the end of the next, splits into three parts:

* **policy**: the caller's time between one step's return and the next step's call (its
  policy, its learning, its logging);
* **env**: the part of the time inside ``step`` that the envs account for: the most any one
  worker (or the caller's own envs) spent inside env ``step``/``reset`` since the previous
  step returned, at most the time inside ``step``;
* **transport**: the rest of the time inside ``step``: moving actions and results, waking
  workers, batching infos, waiting on a worker that is not stepping an env.

The verdict names the largest part. An ``async`` batch whose envs stepped while the caller ran
its policy costs the caller nothing to wait for, so it counts little env time, as it should:
such a run is policy-bound. A backend that cannot see into its envs (``ray``: they run on other
nodes) counts all the time inside ``step`` as env time.

Example:
    >>> clock = StepClock()
    >>> clock.begin(); clock.end()
    >>> stats = clock.stats()
    >>> stats.steps, stats.verdict in VERDICTS
    (1, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["VERDICTS", "RunStats", "StepClock", "StepTimes"]

#: What a run is bound by, as :attr:`RunStats.verdict` says it.
VERDICTS = ("env-bound", "policy-bound", "transport-bound")


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one step, or per step on average."""

    policy_s: float
    """In the caller between the previous step's return and this step's call."""
    env_s: float
    """Inside ``step``, spent by the envs (the busiest worker)."""
    transport_s: float
    """Inside ``step``, spent on anything else."""

    @property
    def verdict(self) -> str:
        """The largest part: ``"env-bound"``, ``"policy-bound"`` or ``"transport-bound"``."""
        parts = (self.env_s, self.policy_s, self.transport_s)
        return VERDICTS[int(np.argmax(parts))]


@dataclass(frozen=True)
class RunStats:
    """A run's timing so far: cumulative seconds, per step and of the last step.

    Example:
        >>> stats = RunStats(steps=4, policy_s=0.4, env_s=0.2, transport_s=0.04,
        ...                  last=StepTimes(0.1, 0.05, 0.01))
        >>> stats.verdict, round(stats.per_step.policy_s, 3)
        ('policy-bound', 0.1)
        >>> sorted(stats.as_dict())[:2]
        ['stats/env_ms_per_step', 'stats/env_share']
    """

    steps: int
    policy_s: float
    env_s: float
    transport_s: float
    last: StepTimes

    @property
    def per_step(self) -> StepTimes:
        """The mean seconds per step of each part."""
        n = max(self.steps, 1)
        return StepTimes(self.policy_s / n, self.env_s / n, self.transport_s / n)

    @property
    def verdict(self) -> str:
        """What the whole run is bound by (the largest cumulative part)."""
        return StepTimes(self.policy_s, self.env_s, self.transport_s).verdict

    def as_dict(self) -> dict[str, float]:
        """Scalars to log: milliseconds per step and each part's share of the wall time."""
        total = self.policy_s + self.env_s + self.transport_s or 1.0
        per = self.per_step
        return {
            "stats/env_ms_per_step": per.env_s * 1e3,
            "stats/env_share": self.env_s / total,
            "stats/policy_ms_per_step": per.policy_s * 1e3,
            "stats/policy_share": self.policy_s / total,
            "stats/transport_ms_per_step": per.transport_s * 1e3,
            "stats/transport_share": self.transport_s / total,
        }

    def summary(self) -> str:
        """One line: the verdict and the milliseconds per step of each part."""
        per = self.per_step
        return (
            f"{self.verdict}: env {per.env_s * 1e3:.2f} ms, policy {per.policy_s * 1e3:.2f} ms, "
            f"transport {per.transport_s * 1e3:.2f} ms per step over {self.steps} steps"
        )


class StepClock:
    """Times each step of a vector env (see the module's docstring for the parts).

    Args:
        env_busy_s: returns the cumulative seconds inside the envs, one per lane (worker), or
            ``None`` where the backend cannot tell (then all the time inside ``step`` counts
            as env time).
    """

    def __init__(self, env_busy_s: Callable[[], np.ndarray | None] | None = None) -> None:
        self.env_busy_s = env_busy_s
        self.steps = 0
        self.policy_s = self.env_s = self.transport_s = 0.0
        self.last = StepTimes(0.0, 0.0, 0.0)
        self._began: float | None = None
        self._ended: float | None = None
        self._busy: np.ndarray | None = None

    def begin(self) -> None:
        """A step is called (a no-op while one is open: ``step`` calls ``send``)."""
        if self._began is None:
            if self._busy is None and self.env_busy_s is not None:
                self._busy = self.env_busy_s()
            self._began = time.perf_counter()

    def end(self) -> None:
        """The open step returns its result (a no-op when none is open)."""
        began = self._began
        if began is None:
            return
        now = time.perf_counter()
        self._began = None
        inside = now - began
        policy = 0.0 if self._ended is None else max(0.0, began - self._ended)
        self._ended = now
        env = inside
        busy = None if self.env_busy_s is None else self.env_busy_s()
        if busy is not None:
            if self._busy is not None and len(self._busy) == len(busy):
                env = min(inside, float(np.max(busy - self._busy, initial=0.0)))
            self._busy = busy
        self.last = StepTimes(policy, env, inside - env)
        self.steps += 1
        self.policy_s += policy
        self.env_s += env
        self.transport_s += inside - env

    def cancel(self) -> None:
        """The open step ended in an error: it is not counted."""
        self._began = None

    def stats(self) -> RunStats:
        """The timing so far."""
        return RunStats(self.steps, self.policy_s, self.env_s, self.transport_s, self.last)
