"""The comparisons behind ``check_backend``'s messages: the first difference between two
results named by its path, NaN equal to NaN, and a batch of Gymnasium's taken apart per env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from vecaccel.testing.compare import (
    batch_size_of,
    difference,
    item_of,
    leaf_problems,
    unbatch_info,
)


def test_equal_trees_have_no_difference_and_nan_equals_nan() -> None:
    tree = {"a": (np.array([1.0, np.nan]), 2), "b": [np.float32(np.nan)]}
    same = {"a": (np.array([1.0, np.nan]), 2), "b": [np.float32(np.nan)]}
    assert difference(same, tree, "obs") is None


def test_the_first_difference_is_named_by_its_path() -> None:
    expected = {"a": (np.zeros(2, np.float32), 1), "b": np.zeros(3)}
    assert difference({"a": (np.zeros(2, np.float32), 2), "b": np.zeros(3)}, expected, "x") == (
        "x['a'][1] is 2, expected 1"
    )
    found = difference({"a": (np.zeros(2, np.float64), 1), "b": np.zeros(3)}, expected, "x")
    assert found == (
        "x['a'][0] is an array of dtype float64 and shape (2,), expected an array of dtype "
        "float32 and shape (2,)"
    )
    assert "has keys ['a'], expected ['a', 'b']" in difference({"a": 1}, expected, "x")
    assert difference(np.int64(1), 1, "r") == "r is 1 (int64), expected 1 (int)"


def test_a_batch_is_taken_apart_per_env_as_gymnasium_batched_it() -> None:
    space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (2,)), "pair": gym.spaces.Tuple([gym.spaces.Discrete(3)] * 2)}
    )
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    items = [space.sample() for _ in range(3)]
    batch = gym.vector.utils.concatenate(
        space, items, gym.vector.utils.create_empty_array(space, 3)
    )
    assert batch_size_of(batch) == 3
    for i, item in enumerate(items):
        assert difference(item_of(space, batch, i), item, "item") is None
    infos: dict = {}
    infos = envs._add_info(infos, {"lives": 2, "stats": {"r": 1.5}}, 1)
    infos = envs._add_info(infos, {"lives": 5}, 2)
    assert unbatch_info(infos, 0) == {}
    assert unbatch_info(infos, 1) == {"lives": 2, "stats": {"r": 1.5}}
    assert unbatch_info(infos, 2) == {"lives": 5}
    assert leaf_problems(space, batch, 3, "obs") is None
    wrong = {"pos": batch["pos"].astype(np.float64), "pair": batch["pair"]}
    assert "obs['pos']" in leaf_problems(space, wrong, 3, "obs")
    envs.close()
