"""Finding the vecaccel backend under a trainer's wrappers."""

from __future__ import annotations

import gymnasium as gym
import torch

import vecaccel
from vecaccel.trainers.envs.layers import layers, set_policy_version


def test_the_version_reaches_the_action_server_under_a_wrapper() -> None:
    torch.set_num_threads(1)
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="action_server", num_workers=1)
    try:
        wrapped = gym.vector.VectorWrapper(gym.vector.VectorWrapper(envs))
        assert list(layers(wrapped))[-1] is envs
        assert set_policy_version(wrapped, 7) and envs.policy_version == 7
        wrapped.reset(seed=0)
        *_, infos = wrapped.step(torch.zeros(2, dtype=torch.int64))
        assert infos["policy_version"].tolist() == [7, 7]
    finally:
        envs.close()


def test_an_env_that_stamps_nothing_is_left_alone() -> None:
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
    try:
        assert not set_policy_version(envs, 1)
        assert not hasattr(envs, "policy_version")
    finally:
        envs.close()
