"""Proportional prioritized replay: transitions drawn in proportion to ``p ** alpha``,
importance weights normalised by their maximum, new transitions at the largest priority seen,
and saved priorities carried over to another ``alpha``."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete

from vecaccel.trainers.replay.prioritized import PrioritizedReplayBuffer


def _filled(alpha: float, steps: int = 12) -> PrioritizedReplayBuffer:
    buffer = PrioritizedReplayBuffer(
        Box(-1, 1, (1,)), Discrete(2), capacity=32, seed=0, alpha=alpha, check_memory=False
    )
    for step in range(steps):
        buffer.add(np.full((1, 1), step, np.float32), [0], [float(step)], [False], [False])
    return buffer


def _held(buffer: PrioritizedReplayBuffer) -> np.ndarray:
    return np.flatnonzero(buffer.tree.priorities() > 0)


def test_draws_follow_the_priorities_to_the_power_alpha() -> None:
    buffer = _filled(alpha=0.5)
    held = _held(buffer)
    assert len(held) >= 8
    priorities = np.arange(1, len(held) + 1, dtype=np.float64)
    buffer.update_priorities(held, priorities)
    expected = priorities**0.5 / np.sum(priorities**0.5)
    counts = np.zeros(len(held))
    for _ in range(40):
        batch = buffer.sample(500, beta=0.4)
        counts += np.bincount(np.searchsorted(held, batch.indices), minlength=len(held))
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)


def test_importance_weights_are_normalised_by_their_maximum() -> None:
    buffer = _filled(alpha=1.0)
    held = _held(buffer)
    buffer.update_priorities(held, np.linspace(0.5, 4.0, len(held)))
    batch = buffer.sample(256, beta=0.7)
    leaves = buffer.tree.priorities()
    chance = leaves[batch.indices] / leaves.sum()
    lowest = leaves[held].min() / leaves.sum()
    np.testing.assert_allclose(batch.weights, (chance / lowest) ** -0.7, rtol=1e-5)
    assert batch.weights.max() <= 1.0 + 1e-6


def test_new_transitions_get_the_largest_priority_seen() -> None:
    buffer = _filled(alpha=1.0)
    held = _held(buffer)
    buffer.update_priorities(held, np.full(len(held), 0.1))
    buffer.update_priorities(held[:1], np.array([7.0]))
    buffer.add(np.full((1, 1), 99, np.float32), [1], [0.0], [False], [False])
    newest = np.setdiff1d(_held(buffer), held)
    assert len(newest) == 1
    assert buffer.tree.priorities()[newest[0]] == pytest.approx(7.0, rel=1e-4)


def test_priorities_saved_under_another_alpha_keep_their_order_and_ratios() -> None:
    buffer = _filled(alpha=0.5)
    held = _held(buffer)
    priorities = np.linspace(1.0, 9.0, len(held))
    buffer.update_priorities(held, priorities)
    buffer.alpha = 1.0
    buffer.restored(saved_alpha=0.5)
    leaves = buffer.tree.priorities()[held]
    np.testing.assert_allclose(leaves / leaves[0], priorities / priorities[0], rtol=1e-4)
