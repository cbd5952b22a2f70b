"""Vector env functions ``fn(n) -> VectorEnv`` for the vectorized-slice tests (importable by
spawned workers: the tests folder is on their path)."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorWrapper


def native_cartpole(n: int) -> gym.vector.VectorEnv:
    """Gymnasium's own batched CartPole (``CartPoleVectorEnv``, NEXT_STEP)."""
    return gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")


def _cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def sync_cartpole(n: int, mode: str = "NextStep") -> gym.vector.VectorEnv:
    """A ``SyncVectorEnv`` of CartPoles in autoreset ``mode`` (supports every mode)."""
    return SyncVectorEnv([_cartpole] * n, autoreset_mode=AutoresetMode(mode))


class InfoCartPole(gym.Wrapper):
    """CartPole whose step info holds its step count (an int) and position (an array)."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.count = 0

    def step(self, action: Any):
        obs, rew, term, trunc, info = self.env.step(action)
        self.count += 1
        return obs, rew, term, trunc, {**info, "count": self.count, "pos": obs[:2].copy()}


def sync_info_cartpole(n: int, mode: str = "NextStep") -> gym.vector.VectorEnv:
    """:func:`sync_cartpole` whose envs put infos in every step."""
    return SyncVectorEnv([InfoCartPole] * n, autoreset_mode=AutoresetMode(mode))


class FailingVectorEnv(VectorWrapper):
    """Raises ``ValueError`` in its ``fail_at``-th step (counting from its build)."""

    def __init__(self, env: gym.vector.VectorEnv, fail_at: int) -> None:
        super().__init__(env)
        self.fail_at = fail_at
        self.steps = 0

    def step(self, actions: Any):
        self.steps += 1
        if self.steps == self.fail_at:
            raise ValueError(f"boom at step {self.steps}")
        return self.env.step(actions)


def failing_cartpole(n: int, fail_at: int = 5, fail_size: int = 3) -> gym.vector.VectorEnv:
    """Native CartPole that fails at step ``fail_at`` when it holds ``fail_size`` envs (so only
    the slice of that size fails)."""
    envs = native_cartpole(n)
    return FailingVectorEnv(envs, fail_at) if n == fail_size else envs


def wrong_count(n: int) -> gym.vector.VectorEnv:
    """Builds one env more than asked."""
    return native_cartpole(n + 1)


def not_a_vector_env(n: int) -> Any:
    return np.zeros(n)


def costly_sync(n: int, cpu_s: float = 0.0006) -> gym.vector.VectorEnv:
    """A ``SyncVectorEnv`` whose envs each busy-wait ``cpu_s`` per step: a batch costs ``n``
    times that, so slicing it over workers pays."""
    from vecaccel.testing.envs import HeavyTailEnv

    env_fn = functools.partial(HeavyTailEnv, cpu_s=cpu_s, p_slow=0.0)
    return SyncVectorEnv([env_fn] * n)
