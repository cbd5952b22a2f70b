"""``vecaccel.testing.action_server.check_action_server``: it passes the real backend, and it
catches a half whose trajectory is not the serial one."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
import torch

from vecaccel.testing.action_server import check_action_server


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers need the other core
    yield
    torch.set_num_threads(before)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def cartpole_marked_by_process() -> gym.Env:
    """CartPole whose observations carry the id of the process stepping it: the serial backend
    steps it here, ``action_server`` in a worker, so their trajectories differ."""
    env = gym.make("CartPole-v1")
    space = gym.spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float64)
    return gym.wrappers.TransformObservation(
        env, lambda obs: obs.astype(np.float64) + os.getpid(), space
    )


def test_the_action_server_passes_on_the_cpu():
    report = check_action_server([cartpole] * 4, "cpu", steps=12, num_workers=1)
    assert report == {
        "device": "cpu",
        "num_envs": 4,
        "steps": 12,
        "pinned_staging": None,
        "halves_exact": True,
    }


def test_a_half_that_differs_from_the_serial_run_fails_the_check():
    with pytest.raises(AssertionError, match="differ from the serial backend's"):
        check_action_server([cartpole_marked_by_process] * 2, "cpu", steps=3, num_workers=1)


@pytest.mark.parametrize("num_envs", [1, 3])
def test_alternating_halves_need_an_even_number_of_envs(num_envs):
    with pytest.raises(ValueError, match=f"even number of envs >= 2, got {num_envs}"):
        check_action_server([cartpole] * num_envs, "cpu")
