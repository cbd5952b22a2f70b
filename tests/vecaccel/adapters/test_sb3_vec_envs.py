"""SB3's own vec-env tests (modelled on SB3's ``tests/test_vec_envs.py``) on the adapter, and
errors passing through it unchanged.

Every check runs on the adapter over the process backends and ``serial`` and, wherever a
result can be compared, side by side with ``DummyVecEnv`` on the same seeds and actions.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from sb3_helpers import (
    BACKENDS,
    BOX2,
    N_ENVS,
    SPACES,
    VEC_ENV_WRAPPERS,
    make_adapter,
    make_custom,
    make_monitored_custom,
    run_side_by_side,
    wrap,
)
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecFrameStack,
    VecNormalize,
)
from toy_envs import (
    CrashEnv,
    InfoEnv,
    ShuffledDictEnv,
    StepEnv,
)

import vecaccel

# ---------------------------------------------------------------------------------------------
# SB3's test_vec_envs.py, on the adapter


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vec_env_wrapper", VEC_ENV_WRAPPERS)
def test_vecenv_custom_calls(backend: str, vec_env_wrapper: type | None) -> None:
    """Methods and attributes of the sub-envs, with indices (negative ones and subsets)."""
    env_fn = functools.partial(make_custom, BOX2)
    vec_env = wrap(make_adapter([env_fn] * N_ENVS, backend), vec_env_wrapper)

    vec_env.seed(0)
    array_explicit_mode = vec_env.render(mode="rgb_array")
    array_implicit_mode = vec_env.render()
    assert np.array_equal(array_implicit_mode, array_explicit_mode)
    with pytest.warns(UserWarning):
        vec_env.render(mode="something_else")

    env_method_results = vec_env.env_method("custom_method", 1, indices=None, dim_1=2)
    setattr_results = []
    for env_idx in range(N_ENVS):
        setattr_results.append(vec_env.set_attr("current_step", env_idx, indices=env_idx))
    getattr_results = vec_env.get_attr("current_step")

    assert len(env_method_results) == N_ENVS
    assert len(setattr_results) == N_ENVS
    assert len(getattr_results) == N_ENVS
    for env_idx in range(N_ENVS):
        assert (env_method_results[env_idx] == np.ones((1, 2))).all()
        assert setattr_results[env_idx] is None
        assert getattr_results[env_idx] == env_idx

    env_method_subset = vec_env.env_method("custom_method", 1, indices=[0, 2], dim_1=3)
    assert len(env_method_subset) == 2
    assert all((result == np.ones((1, 3))).all() for result in env_method_subset)

    assert vec_env.set_attr("current_step", 42, indices=None) is None
    assert vec_env.get_attr("current_step") == [42 for _ in range(N_ENVS)]

    vec_env.reset()
    assert vec_env.set_attr("current_step", 12, indices=[0, 1]) is None
    assert vec_env.get_attr("current_step") == [12, 12] + [0] * (N_ENVS - 2)
    assert vec_env.get_attr("current_step", indices=[0, 1]) == [12, 12]
    assert vec_env.get_attr("current_step", indices=[0, 2]) == [12, 0]

    vec_env.reset()
    assert vec_env.set_attr("current_step", 12, indices=[0, -1]) is None
    assert vec_env.get_attr("current_step") == [12] + [0] * (N_ENVS - 2) + [12]
    assert vec_env.get_attr("current_step", indices=[-1]) == [12]
    assert vec_env.get_attr("current_step", indices=-2) == [0]
    assert vec_env.get_attr("current_step", indices=np.array([2, 0])) == [12, 12]
    assert vec_env.get_attr("current_step", indices=[]) == []

    # env_method on a subset touches only that subset
    vec_env.reset()
    vec_env.env_method("step", 0.5 * np.ones(2), indices=[-1])
    assert vec_env.get_attr("current_step") == [0] * (N_ENVS - 1) + [1]

    with pytest.raises(IndexError):
        vec_env.get_attr("current_step", indices=[N_ENVS])
    with pytest.raises(IndexError):
        vec_env.set_attr("current_step", 1, indices=-N_ENVS - 1)
    vec_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_attr_has_attr(backend: str) -> None:
    env_fns = [functools.partial(make_custom, BOX2)] * N_ENVS
    vec_env = make_adapter(env_fns, backend)
    reference = DummyVecEnv(env_fns)
    assert vec_env.has_attr("current_step") and reference.has_attr("current_step")
    assert not vec_env.has_attr("no_such_attribute")
    assert not reference.has_attr("no_such_attribute")
    with pytest.raises(AttributeError):
        vec_env.get_attr("no_such_attribute")
    # methods come back uncalled, as from DummyVecEnv
    assert callable(vec_env.get_attr("custom_method", indices=0)[0])
    assert vec_env.get_attr("render_mode") == reference.get_attr("render_mode")
    assert vec_env.render_mode == "rgb_array"
    assert vec_env.num_envs == N_ENVS
    assert vec_env.observation_space == reference.observation_space
    assert vec_env.action_space == reference.action_space
    vec_env.close()
    reference.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("vec_env_wrapper", VEC_ENV_WRAPPERS)
def test_vecenv_terminal_obs(backend: str, vec_env_wrapper: type | None) -> None:
    """'terminal_observation' is in the info dict exactly at episode ends, and is the last obs."""
    step_nums = [i + 5 for i in range(N_ENVS)]
    vec_env = wrap(
        make_adapter([functools.partial(StepEnv, n) for n in step_nums], backend), vec_env_wrapper
    )
    zero_acts = np.zeros((N_ENVS,), dtype=int)
    prev_obs_b = vec_env.reset()
    for step_num in range(1, max(step_nums) + 1):
        obs_b, _, done_b, info_b = vec_env.step(zero_acts)
        assert len(obs_b) == N_ENVS
        assert len(done_b) == N_ENVS
        assert len(info_b) == N_ENVS
        for prev_obs, obs, done, info, final_step_num in zip(
            prev_obs_b, obs_b, done_b, info_b, step_nums
        ):
            assert done == (step_num == final_step_num)
            if not done:
                assert "terminal_observation" not in info
            else:
                terminal_obs = info["terminal_observation"]
                assert np.all(prev_obs < terminal_obs)
                assert np.all(obs < prev_obs)
                if not isinstance(vec_env, VecNormalize):
                    assert np.all(prev_obs + 1 == terminal_obs)
                    assert np.all(obs == 0)
        prev_obs_b = obs_b
    vec_env.close()


def check_vecenv_spaces(vec_env: VecEnv, space: spaces.Space, obs_assert) -> None:
    obs = vec_env.reset()
    obs_assert(obs)
    dones = [False] * N_ENVS
    while not any(dones):
        actions = [vec_env.action_space.sample() for _ in range(N_ENVS)]
        obs, _rewards, dones, infos = vec_env.step(actions)
        obs_assert(obs)
    for info in infos:
        obs_assert_single = info["terminal_observation"]
        assert space.contains(obs_assert_single)
    vec_env.close()


def check_vecenv_obs(obs: np.ndarray, space: spaces.Space) -> None:
    assert obs.shape[0] == N_ENVS
    for value in obs:
        assert space.contains(value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("space", list(SPACES.values()), ids=list(SPACES))
def test_vecenv_single_space(backend: str, space: spaces.Space) -> None:
    vec_env = make_adapter([functools.partial(make_custom, space)] * N_ENVS, backend)
    check_vecenv_spaces(vec_env, space, lambda obs: check_vecenv_obs(obs, space))
    # and step for step as DummyVecEnv does
    run_side_by_side([functools.partial(make_custom, space)] * N_ENVS, backend, 6, seed=5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vecenv_dict_spaces(backend: str) -> None:
    space = spaces.Dict(SPACES)

    def obs_assert(obs) -> None:
        assert isinstance(obs, dict)
        assert list(obs.keys()) == list(space.spaces.keys())
        for key, values in obs.items():
            check_vecenv_obs(values, space.spaces[key])

    vec_env = make_adapter([functools.partial(make_custom, space)] * N_ENVS, backend)
    check_vecenv_spaces(vec_env, space, obs_assert)
    # observations whose keys come in another order than the space's
    vec_env = make_adapter([functools.partial(ShuffledDictEnv, space)] * N_ENVS, backend)
    check_vecenv_spaces(vec_env, space, obs_assert)
    run_side_by_side([functools.partial(ShuffledDictEnv, space)] * N_ENVS, backend, 6, seed=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vecenv_tuple_spaces(backend: str) -> None:
    space = spaces.Tuple(tuple(SPACES.values()))

    def obs_assert(obs) -> None:
        assert isinstance(obs, tuple)
        assert len(obs) == len(space.spaces)
        for values, inner_space in zip(obs, space.spaces):
            check_vecenv_obs(values, inner_space)

    vec_env = make_adapter([functools.partial(make_custom, space)] * N_ENVS, backend)
    check_vecenv_spaces(vec_env, space, obs_assert)
    run_side_by_side([functools.partial(make_custom, space)] * N_ENVS, backend, 6, seed=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_env_is_wrapped(backend: str) -> None:
    env_fns = [functools.partial(make_custom, BOX2), functools.partial(make_monitored_custom, BOX2)]
    vec_env = make_adapter(env_fns, backend)
    assert vec_env.env_is_wrapped(Monitor) == [False, True]
    assert vec_env.env_is_wrapped(Monitor, indices=[-1]) == [True]
    assert vec_env.env_is_wrapped(Monitor, indices=0) == [False]
    assert vec_env.env_is_wrapped(gym.Wrapper) == [False, True]
    stacked = VecFrameStack(vec_env, n_stack=2)
    assert stacked.env_is_wrapped(Monitor) == [False, True]
    stacked.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_seed_then_two_resets_same_obs(backend: str) -> None:
    """``seed(3)`` followed by a reset, twice, gives the same obs; per-env seeds differ."""
    vec_env = make_adapter([functools.partial(make_custom, BOX2)] * N_ENVS, backend)
    vec_env.seed(3)
    obs = vec_env.reset()
    vec_env.seed(3)
    new_obs = vec_env.reset()
    assert np.allclose(new_obs, obs)
    assert not np.allclose(obs[0], obs[1]) and not np.allclose(obs[1], obs[2])
    # the seed was applied once, then cleared: a third reset draws new obs
    assert not np.allclose(vec_env.reset(), obs)
    reference = DummyVecEnv([functools.partial(make_custom, BOX2)] * N_ENVS)
    reference.seed(3)
    np.testing.assert_array_equal(reference.reset(), obs)
    reference.close()
    vec_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_seeding(backend: str) -> None:
    """``seed()`` without a value still gives every env its own seed."""
    vec_env = make_adapter([functools.partial(make_custom, BOX2)] * N_ENVS, backend)
    vec_env.seed()
    obs = vec_env.reset()
    _, rewards, _, _ = vec_env.step(np.array([vec_env.action_space.sample()] * N_ENVS))
    assert not np.allclose(obs[0], obs[1])
    assert not np.allclose(rewards[0], rewards[1])
    assert not np.allclose(obs[1], obs[2])
    assert not np.allclose(rewards[1], rewards[2])
    vec_env.close()


# ---------------------------------------------------------------------------------------------
# errors pass through unchanged


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_actions_raise_value_error(backend: str) -> None:
    vec_env = make_adapter([InfoEnv] * 2, backend)
    vec_env.reset()
    with pytest.raises(ValueError, match="env 1"):
        vec_env.step(np.array([0, 7]))
    with pytest.raises(ValueError):
        vec_env.step(np.array([0, 1, 2]))
    vec_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_worker_errors_pass_through(backend: str) -> None:
    vec_env = make_adapter(
        [functools.partial(CrashEnv, None), functools.partial(CrashEnv, 3)], backend
    )
    vec_env.reset()
    with pytest.raises(vecaccel.WorkerError) as excinfo:
        for _ in range(5):
            vec_env.step(np.array([0, 0]))
    assert excinfo.value.env_indices == (1,)
    assert "boom from the env" in str(excinfo.value) + str(excinfo.value.remote_traceback)
    vec_env.close()
