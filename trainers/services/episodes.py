"""Returns and lengths of the episodes a vector env finishes, counted step by step.

The sampler (:class:`vecaccel.Sampler`) counts the episodes of the rollouts it collects and
hands them over as :class:`vecaccel.sampler.EpisodeStats`; :class:`EpisodeCounter` does the same
for a loop that steps the envs one vector step at a time (the off-policy family's collector).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EpisodeCounter"]


class EpisodeCounter:
    """Each env's running episode return and length, and the episodes that end.

    ``info["episode"]`` of ``RecordEpisodeStatistics`` (real game scores for Atari, across
    lives) is preferred; envs without it are measured from the rewards seen.

    Example:
        >>> stats = EpisodeCounter()
        >>> stats.reset(2)
        >>> done = np.array([False, True])
        >>> stats.record(np.array([1.0, 2.0]), done, {})
        [(2.0, 1.0)]

    Attributes:
        saw_info: whether the envs report ``info["episode"]`` (then only that is counted).
    """

    def __init__(self) -> None:
        self.saw_info = False
        self._return = np.zeros(0)
        self._length = np.zeros(0, dtype=np.int64)

    def reset(self, num_envs: int) -> None:
        """Start every env's episode from zero."""
        self._return = np.zeros(num_envs)
        self._length = np.zeros(num_envs, dtype=np.int64)

    def record(
        self, reward: np.ndarray, done: np.ndarray, infos: dict[str, Any]
    ) -> list[tuple[float, float]]:
        """Add one vector step; the ``(return, length)`` of the episodes that ended in it.

        A multi-agent env's rows whose agent was not live (``infos["active"]`` False) take no
        step: their lengths stand still.
        """
        self._return += reward
        active = infos.get("active")
        self._length += 1 if active is None else np.asarray(active, dtype=np.int64)
        finished: list[tuple[float, float]] = []
        final_info = infos.get("final_info", {})
        stats = final_info.get("episode") if isinstance(final_info, dict) else None
        if stats is not None:
            self.saw_info = True
            mask = final_info.get("_episode", np.ones(len(done), dtype=bool))
            for i in np.flatnonzero(mask):
                finished.append((float(stats["r"][i]), float(stats["l"][i])))
        elif not self.saw_info:
            for i in np.flatnonzero(done):
                finished.append((float(self._return[i]), float(self._length[i])))
        self._return[done] = 0.0
        self._length[done] = 0
        return finished
