"""Proportional prioritized replay on a sum tree, over the uniform buffer's storage."""

from __future__ import annotations

from typing import Any

import numpy as np

from vecaccel.trainers.replay.buffer import ReplayBuffer, ReplaySample
from vecaccel.trainers.replay.sumtree import SumTree

__all__ = ["PrioritizedReplayBuffer"]


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) on a :class:`SumTree`.

    A transition is drawn with probability ``p_i ** alpha / sum_j p_j ** alpha``. New transitions
    get the largest priority seen so far; :meth:`update_priorities` sets ``p_i = |error_i| + eps``.
    Importance weights ``(N P(i)) ** -beta``, normalised by their maximum, correct the bias; the
    caller anneals ``beta`` towards 1 and passes it to :meth:`sample`. Slots that cannot be sampled
    (see :meth:`ReplayBuffer._valid`) hold priority zero.

    Args:
        *args: as :class:`ReplayBuffer`.
        alpha: prioritization exponent (0 is uniform).
        eps: added to every priority so that no transition starves.
        stratified: draw one value per equal segment of the total priority.
        **kwargs: as :class:`ReplayBuffer`.

    Example:
        >>> import numpy as np
        >>> from gymnasium.spaces import Box, Discrete
        >>> buffer = PrioritizedReplayBuffer(Box(-1, 1, (1,)), Discrete(2), capacity=32, seed=0)
        >>> for step in range(10):
        ...     buffer.add(np.full((1, 1), step, np.float32), [0], [0.0], [False], [False])
        >>> batch = buffer.sample(4, beta=0.4)
        >>> buffer.update_priorities(batch.indices, np.array([0.0, 1.0, 2.0, 3.0]))
    """

    def __init__(
        self,
        *args: Any,
        alpha: float = 0.6,
        eps: float = 1e-6,
        stratified: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.stratified = stratified
        self.tree = SumTree(self.capacity, self._factory)
        # the largest priority (before the alpha exponent) seen so far, shared like the rest
        self.max_priority = self._factory((1,), np.dtype(np.float64))
        self.max_priority[0] = 1.0

    def _extra_nbytes(self) -> int:
        return SumTree.estimate_nbytes(self.T * self.num_envs) + 8

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        arrays = super().arrays
        arrays.update(
            tree_sum=self.tree._sum, tree_min=self.tree._min, max_priority=self.max_priority
        )
        return arrays

    def _on_write(self, env_ids: np.ndarray, slots: np.ndarray) -> None:
        T, B = self.T, self.num_envs
        # the slot just written (and, once the ring wraps, the oldest slot whose stack lost a
        # frame) may have been valid before; the slot n_step back has just become valid
        stale = np.concatenate([slots, (slots + self.frame_stack - 1) % T])
        stale_envs = np.concatenate([env_ids, env_ids])
        keep = self._valid(stale, stale_envs)
        stale_flat = stale * B + stale_envs
        self.tree.update(stale_flat[~keep], 0.0)
        fresh = (slots - self.n_step) % T
        fresh_valid = self._valid(fresh, env_ids)
        priority = self.max_priority[0] ** self.alpha
        self.tree.update(fresh * B + env_ids, np.where(fresh_valid, priority, 0.0))

    def _on_invalidate(self, env_ids: np.ndarray, slots: np.ndarray) -> None:
        self.tree.update(slots * self.num_envs + env_ids, 0.0)

    def restored(self, saved_n_step: int | None = None, saved_alpha: float | None = None) -> None:
        """Make the priorities read from a checkpoint fit this buffer's ``n_step`` and ``alpha``.

        The tree holds ``p ** alpha``. Saved under another ``alpha``, every leaf becomes
        ``leaf ** (alpha / saved_alpha)``, the same priorities under the new exponent; saved
        under ``alpha = 0`` (uniform, every leaf 1) the priorities themselves are lost, and the
        valid slots start over at the largest priority seen, as new transitions do.

        They were kept for the saved buffer's valid slots. Under a larger ``n_step`` the newest
        slots of each column have no complete window yet: drawn, their targets would read
        rewards and bootstrap observations from slots not written for them, so they drop to
        zero. Under a smaller one, slots whose windows just became complete hold zero and would
        never be drawn: they get the largest priority seen, as a newly added transition does.
        With the same ``n_step`` nothing changes (a resumed run stays exact).
        """
        leaves = self.tree.priorities()
        if saved_alpha is not None and float(saved_alpha) != self.alpha:
            held = np.flatnonzero(leaves > 0)
            if float(saved_alpha) > 0:
                self.tree.update(held, leaves[held] ** (self.alpha / float(saved_alpha)))
            else:
                self.tree.update(held, self.max_priority[0] ** self.alpha)
        valid = self._valid_mask().reshape(-1)
        stale = ~valid & (leaves > 0)
        fresh = valid & (leaves == 0)
        if saved_n_step is not None:
            # only slots too young to have been valid before; others hold zero deliberately
            # (eps=0 and a zero error)
            slots = np.arange(self.T)[:, None]
            age = ((self.cursor[None, :] - 1 - slots) % self.T).reshape(-1)
            fresh &= age < saved_n_step
        self.tree.update(np.flatnonzero(stale), 0.0)
        self.tree.update(np.flatnonzero(fresh), self.max_priority[0] ** self.alpha)

    def sample(self, batch_size: int, beta: float = 0.4) -> ReplaySample:
        """Draw ``batch_size`` transitions by priority, with importance weights for ``beta``.

        Raises:
            ValueError: no transition can be sampled yet.
        """
        if not self.tree.total() > 0:
            raise self._no_data_error()
        indices = self.tree.sample(batch_size, self.rng, stratified=self.stratified)
        sample = self.get(indices)
        # (N P(i))^-beta / max_j (N P(j))^-beta = (p_i / p_min)^-beta
        weights = (self.tree[indices] / self.tree.min()) ** (-beta)
        return sample._replace(weights=weights.astype(np.float32))

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set new priorities (typically absolute TD errors) for sampled ``indices``.

        Transitions that can no longer be sampled (overwritten meanwhile) keep priority zero.
        """
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        raw = np.abs(np.asarray(priorities, dtype=np.float64).reshape(-1)) + self.eps
        if not np.all(np.isfinite(raw)):
            raise ValueError("priorities must be finite")
        self.max_priority[0] = max(self.max_priority[0], float(raw.max(initial=0.0)))
        slots, env_ids = np.divmod(indices, self.num_envs)
        valid = self._valid(slots, env_ids)
        self.tree.update(indices, np.where(valid, raw**self.alpha, 0.0))
