"""Module-level test envs for the async and action-server tests (picklable under spawn)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CounterEnv(gym.Env):
    """Observation is ``[env tag, step count]``; optionally sleeps on chosen steps."""

    def __init__(self, tag: int = 0, sleep_on: dict[int, float] | None = None, fail_on: int = -1):
        self.tag = tag
        self.sleep_on = dict(sleep_on or {})
        self.fail_on = fail_on
        self.observation_space = spaces.Box(-1e9, 1e9, (2,), np.float64)
        self.action_space = spaces.Discrete(3)
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([self.tag, 0.0]), {}

    def step(self, action):
        self.count += 1
        if self.count == self.fail_on:
            raise ValueError(f"boom at step {self.count} in env {self.tag}")
        delay = self.sleep_on.get(self.count)
        if delay:
            time.sleep(delay)
        return np.array([self.tag, float(self.count)]), float(action), False, self.count >= 50, {}


class HeavyTailEnv(gym.Env):
    """Costs ``cpu_s`` of CPU per step; a fraction ``p_slow`` of steps also sleeps ``sleep_s``."""

    def __init__(self, cpu_s: float = 0.0002, p_slow: float = 0.02, sleep_s: float = 0.02):
        self.cpu_s, self.p_slow, self.sleep_s = cpu_s, p_slow, sleep_s
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        end = time.perf_counter() + self.cpu_s
        while time.perf_counter() < end:
            pass
        if self.np_random.random() < self.p_slow:
            time.sleep(self.sleep_s)
        self.t += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= 200, {}


def counter(tag: int = 0, **kwargs) -> CounterEnv:
    return CounterEnv(tag, **kwargs)


def heavy_tail() -> HeavyTailEnv:
    return HeavyTailEnv()
