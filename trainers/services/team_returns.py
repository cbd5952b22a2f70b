"""Team returns of multi-agent envs: the sum over an env's agents of their episode returns.

A multi-agent vector env (``vecaccel.make_vec`` on a PettingZoo env) has one row per
``(env, agent)`` and says which env each row belongs to in ``envs.row_env``. Each row's own
episode return is the agent's (the sampler and :class:`~vecaccel.trainers.services.episodes.EpisodeCounter`
report those); :class:`TeamReturns` adds the rows of each env up and reports one team return per
env episode. An env's episode ends at the step where every one of its rows is done or no longer
active (agents that died earlier are inactive), which is the step at which it autoresets.

Example:
    >>> import numpy as np
    >>> team = TeamReturns([0, 0, 1, 1])
    >>> no, live = np.zeros(4, bool), np.ones(4, bool)
    >>> team.record(np.array([1.0, 2.0, 0.5, 0.5]), no, live)
    []
    >>> # env 0's first agent ends its episode, its second stays live
    >>> team.record(np.array([1.0, 0.0, 0.0, 0.0]), np.array([True, False, False, False]), live)
    []
    >>> # then the second ends while the first is inactive: env 0's episode is over
    >>> team.record(np.array([0.0, 3.0, 0.0, 0.0]), np.array([False, True, False, False]),
    ...             np.array([False, True, True, True]))
    [7.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TeamReturns", "team_returns_for"]


class TeamReturns:
    """Running team returns of each env of a multi-agent vector env, and the ones that end.

    Args:
        row_env: the env index of each row (``envs.row_env``).
    """

    def __init__(self, row_env: Sequence[int] | np.ndarray) -> None:
        self.row_env = np.asarray(row_env, dtype=np.int64).reshape(-1)
        if self.row_env.size == 0 or (self.row_env < 0).any():
            raise ValueError(f"row_env must hold non-negative env indices, got {row_env!r}")
        self.num_envs = int(self.row_env.max()) + 1
        self.rows_per_env = np.bincount(self.row_env, minlength=self.num_envs)
        self._return = np.zeros(self.num_envs)

    def reset(self) -> None:
        """Start every env's team episode from zero (after the envs were reset)."""
        self._return[:] = 0.0

    def record(self, reward: Any, done: Any, active: Any) -> list[float]:
        """Add one vector step; returns the team returns of the env episodes that ended in it.

        Args:
            reward: ``[rows]`` rewards of the step.
            done: ``[rows]`` bool, terminated or truncated.
            active: ``[rows]`` bool ``infos["active"]`` of the step.
        """
        row_env, n = self.row_env, self.num_envs
        done = np.asarray(done, dtype=bool).reshape(-1)
        self._return += np.bincount(
            row_env, weights=np.asarray(reward, dtype=np.float64).reshape(-1), minlength=n
        )
        if not done.any():
            return []
        over = done | ~np.asarray(active, dtype=bool).reshape(-1)
        ended = (np.bincount(row_env, weights=over, minlength=n) == self.rows_per_env) & (
            np.bincount(row_env, weights=done, minlength=n) > 0
        )
        finished = self._return[ended].tolist()
        self._return[ended] = 0.0
        return finished

    def record_batch(self, batch: Any) -> list[float]:
        """Add the ``T`` steps of a sampler batch (``batch.active`` set); returns the team
        returns of the env episodes that ended in it, in order."""
        rewards = batch.rewards.cpu().numpy()
        done = (batch.terminated | batch.truncated).cpu().numpy()
        active = batch.active.cpu().numpy()
        finished: list[float] = []
        for t in range(rewards.shape[0]):
            finished += self.record(rewards[t], done[t], active[t])
        return finished


def team_returns_for(envs: Any) -> TeamReturns | None:
    """A :class:`TeamReturns` for a multi-agent vector env (one with ``row_env``), else ``None``."""
    row_env = getattr(envs, "row_env", None)
    return None if row_env is None else TeamReturns(row_env)
