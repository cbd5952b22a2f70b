"""The episode counter of the training loops: returns and lengths of the episodes that end,
from the rewards alone or from each env's ``RecordEpisodeStatistics`` (``final_info``), on real CartPole vector envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from vecaccel.trainers.services.episodes import EpisodeCounter


def _run(envs: gym.vector.VectorEnv, counter: EpisodeCounter, steps: int) -> list:
    counter.reset(envs.num_envs)
    envs.reset(seed=3)
    envs.action_space.seed(3)
    finished = []
    for _ in range(steps):
        _, reward, terminated, truncated, infos = envs.step(envs.action_space.sample())
        finished += counter.record(reward, terminated | truncated, infos)
    return finished


def test_counted_episodes_are_the_ones_the_statistics_wrapper_records() -> None:
    def make(wrapped: bool) -> gym.vector.VectorEnv:
        def env_fn() -> gym.Env:
            env = gym.make("CartPole-v1")
            return gym.wrappers.RecordEpisodeStatistics(env) if wrapped else env

        return gym.vector.SyncVectorEnv(
            [env_fn] * 3, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )

    counted = EpisodeCounter()
    from_rewards = _run(make(False), counted, 200)
    assert not counted.saw_info
    recorded = EpisodeCounter()
    from_info = _run(make(True), recorded, 200)
    assert recorded.saw_info
    assert len(from_rewards) > 10
    assert from_rewards == from_info
    assert all(ret == length for ret, length in from_rewards)  # CartPole: 1 per step


def test_inactive_rows_take_no_step() -> None:
    counter = EpisodeCounter()
    counter.reset(2)
    active = {"active": np.array([True, False])}
    assert counter.record(np.array([1.0, 0.0]), np.array([False, False]), active) == []
    finished = counter.record(np.array([1.0, 2.0]), np.array([True, True]), {})
    assert finished == [(2.0, 2.0), (2.0, 1.0)]
