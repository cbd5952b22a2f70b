"""The counters of a run's loop, in one object the runner owns and checkpoints save."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["RunState"]


@dataclass
class RunState:
    """Where a run's loop stands, beyond the algorithm's own step and update counts.

    The runner owns it; an off-policy checkpoint saves it (as ``loop``), so that a loaded agent
    that continues its run with the same budget picks the loop up exactly where it was.

    Example:
        >>> state = RunState(horizon=1_000, learn_from=100)
        >>> RunState.from_dict(state.as_dict()) == state
        True

    Attributes:
        horizon: the step the run ends at.
        learn_from: the step after which updates start (``learning_starts`` from the run's
            start, or enough for the buffer to sample).
        updates_at_start: the update count when learning began (the replay ratio counts from it).
        beta: prioritized replay's importance-sampling exponent last used.
        next_log: the step at which the next metric row is due.
        last_target_update: the step of the last target-network update.
        saw_episode_info: whether the envs report ``info["episode"]``.
    """

    horizon: int
    learn_from: int = 0
    updates_at_start: int = 0
    beta: float = 0.0
    next_log: int = 0
    last_target_update: int = 0
    saw_episode_info: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunState:
        """The state a checkpoint saved (keys it does not know are ignored)."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in names})
