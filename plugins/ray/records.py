"""The caller's records of its shards: where each runs, what it owes, and how one was lost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Shard", "ShardLost", "ShardSpaces"]


@dataclass
class Shard:
    """The caller's record of one shard."""

    index: int
    start: int
    stop: int
    actor: Any = None
    node: str = "?"
    pending: Any = None  # the ObjectRef of the step in flight
    sent_at: float = 0.0
    result: tuple | None = None  # a step's result received, not yet returned
    restart_result: tuple | None = None  # a restart's truncation, owed to the next step
    env_fns: list = field(default_factory=list)

    @property
    def env_indices(self) -> list[int]:
        return list(range(self.start, self.stop))

    def describe(self) -> str:
        return f"shard {self.index} (envs {self.start}..{self.stop - 1}, node {self.node})"


class ShardSpaces:
    """What :class:`VecEnv` reads from an env, as shard 0 reported it (no env is built here)."""

    def __init__(self, described: dict[str, Any]) -> None:
        self.observation_space = described["observation_space"]
        self.action_space = described["action_space"]
        self.metadata = described["metadata"]
        self.render_mode = described["render_mode"]
        self.spec = described["spec"]


class ShardLost(Exception):
    """A shard's actor died, its node was lost, or it overran ``step_timeout_s``."""

    def __init__(self, message: str, shard: Shard) -> None:
        super().__init__(message)
        self.shard = shard
