"""The Atari set-up: the Gymnasium wrappers it uses, and life loss; the spaces an agent without
envs reads from one env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import vecaccel
from vecaccel.trainers.envs.make import (
    EpisodicLifeEnv,
    env_spaces,
    is_atari_id,
    is_mujoco_id,
    make_env_for_training,
)

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("env_id", "mujoco"),
    [
        ("Hopper-v5", True),
        ("Ant-v4", True),
        ("InvertedPendulum-v5", True),
        ("Pendulum-v1", False),
        ("ALE/Pong-v5", False),
        ("MinAtar/Breakout-v0", False),
        ("NoSuchEnv-v0", False),
    ],
)
def test_mujoco_ids_are_told_from_the_registry(env_id, mujoco):
    # the registry alone decides: no env is made, so the answer needs no mujoco installed
    assert is_mujoco_id(env_id) is mujoco
    assert not (mujoco and is_atari_id(env_id))


def test_atari_setup_uses_gymnasium_wrappers():
    pytest.importorskip("ale_py")
    envs = make_env_for_training("BreakoutNoFrameskip-v4", 1, backend="serial", seed=0)
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
        env = envs.envs[0]
        names = []
        while hasattr(env, "env"):
            names.append(type(env).__name__)
            env = env.env
        for wrapper in ("FrameStackObservation", "ClipReward", "EpisodicLifeEnv",
                        "AtariPreprocessing", "RecordEpisodeStatistics"):  # fmt: skip
            assert wrapper in names
    finally:
        envs.close()
    evaluation = make_env_for_training(
        "BreakoutNoFrameskip-v4", 1, backend="serial", training=False
    )
    try:
        env = evaluation.envs[0]
        wrappers = set()
        while hasattr(env, "env"):
            wrappers.add(type(env).__name__)
            env = env.env
        assert not wrappers & {"ClipReward", "EpisodicLifeEnv"}
    finally:
        evaluation.close()


def test_life_loss_ends_the_episode_but_not_the_game():
    pytest.importorskip("ale_py")
    from vecaccel.manager import register_envs

    register_envs()
    env = EpisodicLifeEnv(
        gym.wrappers.AtariPreprocessing(gym.make("BreakoutNoFrameskip-v4"), noop_max=0)
    )
    env.reset(seed=0)
    lives = env.unwrapped.ale.lives()
    for _ in range(2000):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated:
            break
    assert terminated and not env.game_over
    assert env.unwrapped.ale.lives() == lives - 1
    env.reset()
    assert env.unwrapped.ale.lives() == lives - 1  # the same game goes on
    env.close()


def test_env_spaces_are_the_training_envs_and_refuse_an_unknown_id_as_make_vec_does():
    envs = make_env_for_training("CartPole-v1", 1, backend="serial")
    try:
        assert env_spaces("CartPole-v1") == (
            envs.single_observation_space,
            envs.single_action_space,
        )
    finally:
        envs.close()
    with pytest.raises(ValueError) as layer:
        vecaccel.make_vec("CartPol-v1", 2)
    with pytest.raises(ValueError) as spaces:
        env_spaces("CartPol-v1")
    assert str(spaces.value) == str(layer.value)
