"""The caller's records of its shards: the envs a shard holds, how a message names it, the spaces
shard 0 described, and the error of a lost shard. No Ray is started here."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from vecaccel.plugins.ray.records import Shard, ShardLost, ShardSpaces


def test_a_shard_holds_its_block_of_envs_and_is_named_with_them() -> None:
    shard = Shard(index=1, start=4, stop=7, node="10.0.0.2")
    assert shard.env_indices == [4, 5, 6]
    assert shard.describe() == "shard 1 (envs 4..6, node 10.0.0.2)"
    assert Shard(index=0, start=0, stop=1).describe() == "shard 0 (envs 0..0, node ?)"


def test_each_record_owes_nothing_when_made_and_keeps_its_own_env_functions() -> None:
    first, second = Shard(0, 0, 2), Shard(1, 2, 4)
    assert (first.pending, first.result, first.restart_result, first.actor) == (None,) * 4
    first.env_fns.append(lambda: gym.make("CartPole-v1"))
    assert second.env_fns == []


def test_the_spaces_are_those_shard_0_described() -> None:
    described = {
        "observation_space": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
        "action_space": gym.spaces.Discrete(2),
        "metadata": {"render_modes": ["rgb_array"]},
        "render_mode": "rgb_array",
        "spec": gym.spec("CartPole-v1"),
    }
    spaces = ShardSpaces(described)
    assert spaces.observation_space == described["observation_space"]
    assert spaces.action_space == gym.spaces.Discrete(2)
    assert (spaces.metadata, spaces.render_mode) == (described["metadata"], "rgb_array")
    assert spaces.spec.id == "CartPole-v1"


def test_a_lost_shard_is_an_error_that_carries_its_record() -> None:
    shard = Shard(index=2, start=4, stop=6, node="n2")
    error = ShardLost(f"{shard.describe()} overran step_timeout_s", shard)
    assert (
        error.shard is shard and str(error) == "shard 2 (envs 4..5, node n2) overran step_timeout_s"
    )
