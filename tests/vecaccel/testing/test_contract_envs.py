"""The small envs ``check_backend`` runs on: seeded trajectories that repeat, observations in
their nested spaces, the irregular infos they promise, a render, episodes that end at random and
at the time limit, and vector env functions whose slices seed as one vector env of all the
envs."""

from __future__ import annotations

import pickle

import numpy as np
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.testing.compare import difference
from vecaccel.testing.contract_envs import (
    SyncVectorEnvFn,
    env_value,
    make_cartpole,
    make_dict_tuple,
)


def _trajectory(seed: int, action_seed: int, steps: int) -> list:
    env = make_dict_tuple(max_episode_steps=5)
    env.action_space.seed(action_seed)
    out = [env.reset(seed=seed)]
    for _ in range(steps):
        result = env.step(env.action_space.sample())
        out.append(result)
        assert env.observation_space.contains(result[0])
        if result[2] or result[3]:
            out.append(env.reset())
    env.close()
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), action_seed=st.integers(0, 1000))
def test_the_dict_tuple_env_repeats_its_trajectory_for_a_seed(seed, action_seed) -> None:
    first = _trajectory(seed, action_seed, 12)
    assert difference(_trajectory(seed, action_seed, 12), first, "trajectory") is None


def test_the_dict_tuple_env_has_irregular_infos_a_render_and_both_endings() -> None:
    env = make_dict_tuple(max_episode_steps=7, render_mode="rgb_array")
    _, info = env.reset(seed=3, options={"tag": "x"})
    env.action_space.seed(3)
    assert info["tag"] == "x" and info["start"].shape == (2,)
    frame = env.render()
    assert frame.shape == (6, 4, 3) and frame.dtype == np.uint8
    endings = {"terminated": 0, "truncated": 0}
    keys: set[str] = set()
    for _ in range(200):
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        keys |= set(info)
        t = info["t"]
        assert ("even" in info) == (t % 2 == 0) and ("nested" in info) == (t % 3 == 0)
        assert isinstance(reward, float)
        if terminated or truncated:
            endings["terminated" if terminated else "truncated"] += 1
            env.reset()
    env.close()
    assert keys == {"t", "even", "nested"}
    assert endings["terminated"] > 0 and endings["truncated"] > 0, endings
    assert make_dict_tuple().render() is None  # no render mode, no frame


def test_the_cartpole_has_infos_of_several_types_and_a_time_limit() -> None:
    env = make_cartpole(max_episode_steps=3)
    _, info = env.reset(seed=0)
    assert info["reset_count"] == np.int32(7)
    for count in (1, 2, 3):
        _, _, terminated, truncated, info = env.step(0)
        assert info["count"] == count and ("label" in info) == (count % 2 == 1)
        if count % 2:
            assert info["odd"] == np.float32(count) / 2 and info["label"] == f"step-{count}"
    assert truncated or terminated
    env.close()
    plain = make_cartpole(infos=False)
    assert plain.reset(seed=0)[1] == {}
    plain.close()


def test_env_value_reads_through_the_wrappers() -> None:
    env = make_dict_tuple()
    assert env_value(env) == 0 and env_value(env, 2) == 2
    env.unwrapped.value = 5
    assert env_value(env, 1) == 6 and env.unwrapped.add(3) == 8
    env.close()


def test_a_vector_env_function_seeds_its_slices_as_one_vector_env_of_all() -> None:
    build = pickle.loads(pickle.dumps(SyncVectorEnvFn(make_cartpole, AutoresetMode.SAME_STEP)))
    whole, first, second = build(4), build(1), build(3)
    try:
        assert whole.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
        obs, _ = whole.reset(seed=10)
        sliced = np.concatenate([first.reset(seed=10)[0], second.reset(seed=11)[0]])
        np.testing.assert_array_equal(obs, sliced)
    finally:
        for envs in (whole, first, second):
            envs.close()
