"""The probe of one env's step cost: the time a slow env's step takes, the resets of short
episodes counted, the first reset kept apart, and the env closed after."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from vecaccel.backend_choice.env_step_cost import CHUNK_STEPS, probe_step_cost


class _SlowEnv(gym.Env):
    """Steps that take ``step_s``; episodes of ``length`` steps."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    closed = False

    def __init__(self, step_s: float = 0.0, length: int = 1000, reset_s: float = 0.0) -> None:
        self.step_s, self.length, self.reset_s = step_s, length, reset_s
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        time.sleep(self.reset_s)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(self.step_s)
        self.t += 1
        return np.zeros(1, np.float32), 0.0, self.t >= self.length, False, {}

    def close(self):
        type(self).closed = True


def test_a_slow_step_is_measured_at_its_cost() -> None:
    cost = probe_step_cost(lambda: _SlowEnv(step_s=0.002), seconds=0.1)
    assert cost.steps >= CHUNK_STEPS
    assert 0.002 <= cost.step_s < 0.02


def test_short_episodes_pay_their_resets_and_the_first_reset_is_apart() -> None:
    cost = probe_step_cost(lambda: _SlowEnv(length=5, reset_s=0.01), seconds=0.05)
    assert cost.resets >= cost.steps // 5 - 1
    assert cost.reset_s >= 0.01
    assert cost.step_s >= 0.01 / 5  # a reset every 5 steps, in the step cost


def test_a_real_env_is_probed_and_closed() -> None:
    _SlowEnv.closed = False
    probe_step_cost(lambda: _SlowEnv(), seconds=0.005)
    assert _SlowEnv.closed
    made: list[gym.Env] = []

    def cartpole_fn() -> gym.Env:
        made.append(gym.make("CartPole-v1"))
        return made[-1]

    cartpole = probe_step_cost(cartpole_fn, seconds=0.02, seed=3)
    assert cartpole.steps > 0 and 0 < cartpole.step_s < 0.01 and cartpole.reset_s > 0
    assert cartpole.resets >= 1  # random CartPole episodes end within a few dozen steps
    assert len(made) == 1  # one env, stepped through its resets


def test_the_probe_needs_a_positive_time() -> None:
    with pytest.raises(ValueError, match="seconds must be positive"):
        probe_step_cost(lambda: _SlowEnv(), seconds=0)
