"""The control commands of a worker pool (``reset``, ``call``, ``set_attr``) on real worker
processes: each reaches exactly the envs it names, in the workers that hold them, with results
in the order asked, and a failing env is reported by index while the others stay usable."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import vecaccel


def _spec_id(env: gym.Env) -> str:
    return env.spec.id


@pytest.fixture
def envs(leak_check):
    envs = vecaccel.make_vec("CartPole-v1", 5, backend="shm", num_workers=2)
    yield envs
    envs.close()


def test_call_and_set_attr_reach_the_named_envs_across_workers(envs) -> None:
    envs.reset(seed=0)
    envs.set_attr_indices("tag", ["a", "b", "c"], [4, 0, 2])
    assert envs.call_indices("get_wrapper_attr", [0, 2, 4], "tag") == ("b", "c", "a")
    with pytest.raises(vecaccel.WorkerError) as caught:
        envs.call_indices("get_wrapper_attr", [1, 3], "tag")
    assert sorted(caught.value.env_indices) == [1, 3]
    # the pool is still usable: the failed command left no reply behind
    assert envs.call_indices(_spec_id, [3, 1]) == ("CartPole-v1", "CartPole-v1")
    obs, *_ = envs.step(np.zeros(5, dtype=np.int64))
    assert obs.shape == (5, 4)


def test_seeded_resets_repeat_per_env_and_masked_resets_keep_the_others(envs) -> None:
    first, _ = envs.reset(seed=[10, 11, 12, 13, 14])
    again, _ = envs.reset(seed=[10, 11, 12, 13, 14])
    np.testing.assert_array_equal(first, again)
    reference = [gym.make("CartPole-v1").reset(seed=s)[0] for s in range(10, 15)]
    np.testing.assert_array_equal(first, np.stack(reference))
    stepped, *_ = envs.step(np.ones(5, dtype=np.int64))
    before = stepped.copy()
    envs.reset(
        seed=[10, None, None, None, None],
        options={"reset_mask": np.array([True, False, False, False, False])},
    )
    # CartPole's state, in float64, is what its float32 observation is made from
    states = np.stack(envs.call_indices("get_wrapper_attr", [0, 1, 2, 3, 4], "state"))
    states = states.astype(np.float32)
    np.testing.assert_array_equal(states[0], reference[0])
    np.testing.assert_array_equal(states[1:], before[1:])
