"""The pieces every backend builds on: seeds, reset masks and info batching as Gymnasium's
``SyncVectorEnv`` has them, and env functions that fail or return a vector env refused with
one error type wherever they run."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from vecaccel.errors import WorkerError
from vecaccel.vec_env import (
    add_info,
    batch_infos,
    make_env,
    normalize_seeds,
    parse_autoreset_mode,
    reset_mask_only,
    split_reset_mask,
)


def test_seeds_expand_as_gymnasium_expands_them() -> None:
    assert normalize_seeds(None, 2) == [None, None]
    assert normalize_seeds(np.int64(5), 3) == [5, 6, 7]
    assert normalize_seeds([1, None], 2) == [1, None]
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
    with pytest.raises(ValueError) as theirs:
        sync.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError) as ours:
        normalize_seeds([1, 2, 3], 2)
    assert str(ours.value) == str(theirs.value)
    sync.close()


@pytest.mark.parametrize(
    "mask",
    [
        [True, False],  # a list, not an array
        np.array([True]),  # the wrong shape
        np.array([1, 0]),  # the wrong dtype
        np.array([False, False]),  # nothing to reset
    ],
    ids=["list", "shape", "dtype", "empty"],
)
def test_bad_reset_masks_are_refused_as_sync_vector_env_refuses_them(mask) -> None:
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=gym.vector.AutoresetMode.DISABLED
    )
    sync.reset(seed=0)
    with pytest.raises((TypeError, ValueError)) as theirs:
        sync.reset(options={"reset_mask": mask})
    with pytest.raises(type(theirs.value)) as ours:
        split_reset_mask({"reset_mask": mask}, 2)
    assert str(ours.value) == str(theirs.value)
    sync.close()


def test_a_mask_only_reset_passes_no_options_to_the_envs() -> None:
    mask = np.array([False, True])
    reset_mask, options = split_reset_mask({"reset_mask": mask, "level": 2}, 2)
    assert reset_mask is mask and options == {"level": 2}
    assert split_reset_mask(reset_mask_only(mask), 2)[1] is None
    assert split_reset_mask({"reset_mask": mask}, 2)[1] == {}
    assert split_reset_mask(None, 2) == (None, None)


def test_infos_batch_as_gymnasium_batches_them() -> None:
    per_env = [
        {"lives": 3, "pos": np.array([1.0, 2.0]), "nested": {"x": 1.5}},
        {},
        {"lives": 1, "name": "b", "final_obs": np.zeros(2)},
    ]
    sync = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3)
    expected: dict = {}
    for i, info in enumerate(per_env):
        if info:
            expected = sync._add_info(expected, info, i)
    ours = batch_infos(list(enumerate(per_env)), 3)
    assert sorted(ours) == sorted(expected)
    for key in ("lives", "_lives", "pos", "_pos", "name", "_name", "_final_obs"):
        np.testing.assert_array_equal(ours[key], expected[key])
    np.testing.assert_array_equal(ours["nested"]["x"], expected["nested"]["x"])
    assert ours["final_obs"][2] is per_env[2]["final_obs"]
    assert add_info({}, {"r": 1.0}, 0, size=1)["r"].dtype == np.float64
    sync.close()


def test_env_functions_fail_with_one_error_type() -> None:
    def broken() -> gym.Env:
        raise OSError("no display")

    with pytest.raises(WorkerError) as caught:
        make_env(broken, 3)
    assert list(caught.value.env_indices) == [3]
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(TypeError, match="vectorized=True"):
        make_env(lambda: gym.make_vec("CartPole-v1", 2), 0)
    assert make_env(lambda: gym.make("CartPole-v1"), 0).spec.id == "CartPole-v1"


def test_autoreset_modes_are_named_as_gymnasium_names_them() -> None:
    assert parse_autoreset_mode("SameStep") is gym.vector.AutoresetMode.SAME_STEP
    with pytest.raises(ValueError, match="valid: NextStep, SameStep, Disabled"):
        parse_autoreset_mode("same_step")
