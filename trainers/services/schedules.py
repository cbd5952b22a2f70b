"""Schedules of the training loop: a value annealed linearly over env steps, and the off-policy
family's replay schedule (warm-up, replay ratio, target-network updates), all in env steps.

The off-policy family's synchronous loop (:mod:`vecaccel.trainers.algos.off_policy.loop`) and
its asynchronous feed (:mod:`vecaccel.trainers.algos.off_policy.feed`) both time their updates
with one :class:`ReplaySchedule`; :class:`LogPeriod` says when a metric row is due.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["LogPeriod", "ReplaySchedule", "linear_schedule"]


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """``start`` moving linearly to ``end`` over ``duration`` steps, then ``end``.

    Example:
        >>> linear_schedule(1.0, 0.1, 100, 50)
        0.55
    """
    if duration <= 0:
        return end
    return end + (start - end) * max(0.0, 1.0 - t / duration)


@dataclass(frozen=True)
class ReplaySchedule:
    """When an off-policy run updates, counted in the env steps it collected.

    Updates start once ``learning_starts`` steps are in the replay buffer (and enough to sample
    a batch); from then on ``updates × batch ≤ replay_ratio × steps since then``; the target
    network follows every ``target_update_period`` steps. On several ranks every count is over
    all of them: each rank collects its share of the steps, and every update takes a batch from
    each rank.

    Example:
        >>> schedule = ReplaySchedule(
        ...     learning_starts=100, replay_ratio=4.0, batch_size=16, target_update_period=50
        ... )
        >>> schedule.learn_from(0, min_fill=8)  # updates start after step 100
        100
        >>> schedule.updates_due(140 - 100)  # 4 samples per step over 40 steps, 16 per update
        10
        >>> schedule.target_update_due(step=150, last_target_update=100)
        True
        >>> schedule.updates_per_target_update
        12

    Attributes:
        learning_starts: env steps collected before the first update.
        replay_ratio: samples trained on per env step collected, after the warm-up.
        batch_size: samples per update on one rank.
        target_update_period: env steps between target-network updates.
        ranks: ranks that train together (data-parallel).
    """

    learning_starts: int
    replay_ratio: float
    batch_size: int
    target_update_period: int
    ranks: int = 1

    @classmethod
    def of(cls, config: Any, ranks: int = 1) -> ReplaySchedule:
        """The schedule an off-policy algorithm's config sets, on ``ranks`` ranks."""
        return cls(
            learning_starts=int(config.learning_starts),
            replay_ratio=config.replay_ratio,
            batch_size=int(config.batch_size),
            target_update_period=int(config.target_update_period),
            ranks=int(ranks),
        )

    @property
    def samples_per_update(self) -> int:
        """Samples an update trains on, over all ranks."""
        return self.batch_size * self.ranks

    def learn_from(self, start: int, *, min_fill: int, warm_up: bool = True) -> int:
        """The step after which a run that starts at ``start`` updates.

        Args:
            start: the run's first step.
            min_fill: steps the replay buffer needs before it can sample at all.
            warm_up: wait for ``learning_starts`` steps (a run that continues with its
                buffer does not).
        """
        return start + max(self.learning_starts if warm_up else 0, min_fill)

    def updates_due(self, learned: int) -> int:
        """Updates due once ``learned`` steps were collected since updates began."""
        return int(self.replay_ratio * learned // self.samples_per_update)

    def measured_ratio(self, updates: int, learned: float) -> float:
        """The replay ratio that ``updates`` made over ``learned`` steps give."""
        return updates * self.samples_per_update / learned

    def target_update_due(self, step: int, last_target_update: int) -> bool:
        """Whether the target network is due at ``step``, last updated at ``last_target_update``."""
        return step - last_target_update >= self.target_update_period

    @property
    def updates_per_target_update(self) -> int:
        """``target_update_period`` in updates (at least one): how a loop that must move the
        target at the same update on every rank counts it."""
        updates_per_step = self.replay_ratio / self.samples_per_update
        return max(1, round(self.target_update_period * updates_per_step))

    def rank_share(self) -> ReplaySchedule:
        """The same schedule as one of the ranks counts it, in its own steps: its share of
        ``learning_starts`` (rounded up), and its own batch per update."""
        return ReplaySchedule(
            learning_starts=math.ceil(self.learning_starts / self.ranks),
            replay_ratio=self.replay_ratio,
            batch_size=self.batch_size,
            target_update_period=self.target_update_period,
        )


class LogPeriod:
    """Whether a metric row is due: every ``period`` env steps (0: every iteration).

    Args:
        period: env steps between rows (0: a row every time).
        next_step: the step the next row is due at.

    Example:
        >>> period = LogPeriod(100, next_step=100)
        >>> period.due(50), period.due(100), period.due(150), period.due(200)
        (False, True, False, True)
    """

    def __init__(self, period: int, next_step: int) -> None:
        self.period = int(period)
        self.next_step = int(next_step)

    def due(self, step: int) -> bool:
        if self.period <= 0:
            return True
        if step < self.next_step:
            return False
        self.next_step += self.period
        return True
