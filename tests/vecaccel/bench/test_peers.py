"""The implementations ``vecaccel bench`` compares with: which can run here and why not, how
each is built and reset with a seed, and an unknown one refused."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

from vecaccel.bench.peers import PEERS, build_peer, installed, reset_envs, unavailable_reason
from vecaccel.bench.workloads import resolve_env

SB3 = importlib.util.find_spec("stable_baselines3") is not None


def test_a_peer_is_unavailable_only_for_a_missing_package_or_a_missing_twin() -> None:
    cartpole, acrobot = resolve_env("CartPole-v1"), resolve_env("Acrobot-v1")
    for peer in ("raw", "ceiling", "gym-sync", "gym-async"):
        assert unavailable_reason(peer, acrobot) is None
    sb3 = unavailable_reason("sb3-dummy", cartpole)
    assert sb3 == (None if SB3 else "stable-baselines3 is not installed")
    assert unavailable_reason("sb3-subproc", cartpole) == sb3
    envpool = unavailable_reason("envpool", acrobot)
    if installed("envpool"):
        assert envpool == "envpool has no equivalent of Acrobot-v1"
        assert unavailable_reason("envpool", cartpole) is None
    else:
        assert envpool == "envpool is not installed"


@pytest.mark.parametrize(
    "peer",
    ["gym-sync", pytest.param("sb3-dummy", marks=pytest.mark.skipif(not SB3, reason="no SB3"))],
)
def test_a_peer_is_built_over_the_env_and_reset_with_the_seed(peer) -> None:
    """After ``reset_envs`` with seed 5, each peer steps as a ``SyncVectorEnv`` reset with
    seed 5 does (env ``i`` seeded with ``5 + i``)."""
    reference = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    envs = build_peer(peer, resolve_env("CartPole-v1"), 3, seed=0)
    try:
        assert envs.num_envs == 3
        reference.reset(seed=5)
        reset_envs(envs, peer, 5)
        actions = np.array([0, 1, 1])
        np.testing.assert_array_equal(envs.step(actions)[0], reference.step(actions)[0])
    finally:
        envs.close()
        reference.close()


def test_an_unknown_peer_is_refused_naming_the_known_ones() -> None:
    assert set(PEERS) >= {"raw", "ceiling", "gym-sync", "envpool"}
    with pytest.raises(ValueError, match="unknown peer 'gym-fast'; known: raw, ceiling"):
        build_peer("gym-fast", resolve_env("CartPole-v1"), 2, seed=0)
