"""The SB3 adapter against SB3's own vec-env contract (modelled on SB3's ``tests/test_vec_envs.py``).

Every check runs on the adapter over the process backends and ``serial`` and, wherever a result
can be compared, side by side with ``DummyVecEnv`` on the same seeds and actions.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import multiprocessing
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

pytest.importorskip("stable_baselines3")

from helpers import assert_same
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
    VecVideoRecorder,
)
from toy_envs import (
    CrashEnv,
    CurrentStepEnv,
    CustomGymEnv,
    DictObsEnv,
    FrameEnv,
    ImageEnv,
    InfoEnv,
    OptionsEnv,
    OptionsSeenEnv,
    SampledSpaceEnv,
    ShuffledDictEnv,
    StatefulInfoEnv,
    StepEnv,
)

import vecaccel
from vecaccel.sb3 import SB3VecEnv, VecAccelEnv, to_sb3
from vecaccel.testing.envs import CounterEnv, counter_fns

N_ENVS = 3

BACKENDS = ["serial", "shm", "hybrid"]


#: Backend options that keep the worker count small on a 2-core machine.
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    "serial": {},
    "shm": {"num_workers": 2},
    "hybrid": {"num_workers": 1},
}

VEC_ENV_WRAPPERS = [None, VecNormalize, VecFrameStack]


def make_adapter(env_fns: list[Callable[[], gym.Env]], backend: str, **kwargs: Any) -> VecAccelEnv:
    return VecAccelEnv(env_fns, backend=backend, **BACKEND_OPTIONS[backend], **kwargs)


def wrap(vec_env: VecEnv, wrapper: type | None) -> VecEnv:
    if wrapper is None:
        return vec_env
    if wrapper is VecFrameStack:
        return VecFrameStack(vec_env, n_stack=2)
    return wrapper(vec_env)


def make_custom(space: spaces.Space) -> gym.Env:
    return CustomGymEnv(space)


def make_monitored_custom(space: spaces.Space) -> gym.Env:
    return Monitor(CustomGymEnv(space))


def make_cartpole(max_episode_steps: int = 12) -> gym.Env:
    return Monitor(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))


BOX2 = spaces.Box(low=np.zeros(2, np.float32), high=np.ones(2, np.float32))

SPACES = {
    "discrete": spaces.Discrete(2),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "multibinary": spaces.MultiBinary(3),
    "continuous": BOX2,
}


# ---------------------------------------------------------------------------------------------
# comparing with DummyVecEnv


def assert_tree_equal(expected: Any, actual: Any, path: str = "") -> None:
    """Exact equality of nested dicts/tuples/lists/arrays; Monitor's wall-clock ``t`` skipped."""
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{path}: {type(actual)} is not a mapping"
        assert list(expected) == list(actual) or set(expected) == set(actual), (
            f"{path}: keys {sorted(map(str, expected))} != {sorted(map(str, actual))}"
        )
        for key in expected:
            if key == "t" and path.endswith("episode"):
                continue
            assert_tree_equal(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, (tuple, list)) and not isinstance(actual, np.ndarray):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert len(expected) == len(actual), path
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_tree_equal(e, a, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray) and expected.dtype == object:
        assert isinstance(actual, np.ndarray) and actual.shape == expected.shape, path
        for i, (e, a) in enumerate(zip(expected.ravel(), actual.ravel())):
            assert_tree_equal(e, a, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray) or isinstance(actual, np.ndarray):
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected), err_msg=path)
    else:
        assert expected == actual, f"{path}: {expected!r} != {actual!r}"


def sample_actions(space: spaces.Space, n: int) -> Any:
    items = [space.sample() for _ in range(n)]
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return items  # SB3 style: one action per env
    return np.array(items)


def run_side_by_side(
    env_fns: list[Callable[[], gym.Env]],
    backend: str,
    steps: int,
    *,
    seed: int = 0,
    wrapper: Callable[[VecEnv], VecEnv] | None = None,
    autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
    batched_infos: bool = False,
) -> dict[str, int]:
    """Step ``DummyVecEnv`` and the adapter with the same seeds and actions; compare everything.

    With ``batched_infos`` the backend reports Gymnasium's batched infos (as a third-party
    backend without ``supports_per_env_infos`` does) and the adapter splits them.
    """
    reference: VecEnv = DummyVecEnv(env_fns)
    if batched_infos:
        envs = vecaccel.make_vec(
            env_fns, backend=backend, autoreset_mode=autoreset_mode, **BACKEND_OPTIONS[backend]
        )
        envs.supports_per_env_infos = False
        adapter: VecEnv = to_sb3(envs)
        assert not envs.per_env_infos
    else:
        adapter = make_adapter(env_fns, backend, autoreset_mode=autoreset_mode)
        assert adapter._per_env_infos  # the envs' dicts, no batch-and-split
        assert not adapter.vec_env.per_env_infos  # only during the adapter's own calls
    if wrapper is not None:
        reference, adapter = wrapper(reference), wrapper(adapter)
    seen = {"dones": 0, "terminated": 0, "truncated": 0}
    try:
        assert reference.seed(seed) == adapter.seed(seed)
        assert_tree_equal(reference.reset(), adapter.reset(), "reset obs")
        assert_tree_equal(
            reference.unwrapped.reset_infos, adapter.unwrapped.reset_infos, "reset_infos"
        )
        action_space = copy.deepcopy(reference.action_space)
        action_space.seed(seed)
        for step in range(steps):
            actions = sample_actions(action_space, reference.num_envs)
            ref_obs, ref_rewards, ref_dones, ref_infos = reference.step(actions)
            obs, rewards, dones, infos = adapter.step(actions)
            where = f"step {step}"
            assert_tree_equal(ref_obs, obs, f"{where} obs")
            np.testing.assert_allclose(rewards, ref_rewards, rtol=1e-6, err_msg=where)
            assert dones.dtype == np.bool_
            np.testing.assert_array_equal(dones, ref_dones, err_msg=where)
            assert isinstance(infos, (list, tuple)) and len(infos) == reference.num_envs
            assert_tree_equal(list(ref_infos), list(infos), f"{where} infos")
            assert_tree_equal(
                reference.unwrapped.reset_infos, adapter.unwrapped.reset_infos, f"{where} resets"
            )
            for done, info in zip(dones, infos):
                if done:
                    seen["dones"] += 1
                    seen["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
    finally:
        reference.close()
        adapter.close()
    return seen


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
# step-by-step equality with DummyVecEnv


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_dummy_vec_env_cartpole(backend: str) -> None:
    """CartPole (Monitor-wrapped, short time limit): obs, rewards, dones, infos identical."""
    env_fns = [functools.partial(make_cartpole, limit) for limit in (10, 30, 500)]
    seen = run_side_by_side(env_fns, backend, 100, seed=7)
    assert seen["terminated"] > 0 and seen["truncated"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_dummy_vec_env_infos(backend: str) -> None:
    """Every kind of info value, sparse keys, nested dicts and reset infos come through."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(4)]
    seen = run_side_by_side(env_fns, backend, 40, seed=11)
    assert seen["terminated"] > 0 and seen["truncated"] > 0


@pytest.mark.parametrize("autoreset_mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_dummy_vec_env_from_batched_infos(backend: str, autoreset_mode) -> None:
    """A backend that only batches its infos Gymnasium-style gives SB3 the same per-env dicts."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(4)]
    seen = run_side_by_side(
        env_fns, backend, 40, seed=11, autoreset_mode=autoreset_mode, batched_infos=True
    )
    assert seen["terminated"] > 0 and seen["truncated"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_env_infos_are_the_batched_infos_unbatched(backend: str) -> None:
    """With ``per_env_infos`` a backend returns ``{}`` and each env's own info dict instead."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(4)]
    options = dict(autoreset_mode=AutoresetMode.SAME_STEP, **BACKEND_OPTIONS[backend])
    batched = vecaccel.make_vec(env_fns, backend=backend, **options)
    per_env = vecaccel.make_vec(env_fns, backend=backend, **options)
    per_env.per_env_infos = True
    try:
        assert per_env.supports_per_env_infos
        expected, _ = batched.reset(seed=3)
        obs, infos = per_env.reset(seed=3)
        assert infos == {}
        assert_tree_equal(expected, obs, "reset obs")
        rng = np.random.default_rng(0)
        for step in range(30):
            actions = rng.integers(0, 2, size=4)
            *_, batched_infos = batched.step(actions)
            *_, infos = per_env.step(actions)
            assert infos == {}
            rebuilt: dict[str, Any] = {}
            for index, info in per_env.last_infos:
                rebuilt = per_env._add_info(rebuilt, info, index)
            assert_tree_equal(batched_infos, rebuilt, f"step {step} infos")
    finally:
        batched.close()
        per_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_disabled_autoreset_mode(backend: str) -> None:
    """An env made with autoreset_mode=DISABLED is reset by the adapter, same results."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(N_ENVS)]
    seen = run_side_by_side(env_fns, backend, 30, seed=1, autoreset_mode=AutoresetMode.DISABLED)
    assert seen["dones"] > 0
    envs = vecaccel.make_vec(
        env_fns, backend=backend, autoreset_mode=AutoresetMode.DISABLED, **BACKEND_OPTIONS[backend]
    )
    adapter = to_sb3(envs)
    assert isinstance(adapter, SB3VecEnv) and adapter.vec_env is envs
    adapter.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_next_step_mode_is_refused(backend: str) -> None:
    envs = vecaccel.make_vec(
        [functools.partial(InfoEnv)] * 2,
        backend=backend,
        autoreset_mode=AutoresetMode.NEXT_STEP,
        **BACKEND_OPTIONS[backend],
    )
    with pytest.raises(ValueError, match="SAME_STEP"):
        to_sb3(envs)
    envs.close()
    with pytest.raises(ValueError, match="SAME_STEP"):
        make_adapter([InfoEnv] * 2, backend, autoreset_mode="NextStep")


@pytest.mark.parametrize("backend", ["async", "action_server"])
def test_async_backends_are_refused(backend: str) -> None:
    """Backends that return envs in the order they finish cannot give SB3's per-index steps."""
    with pytest.raises(ValueError, match="shm"):
        make_vec_env(
            "CartPole-v1",
            n_envs=2,
            vec_env_cls=VecAccelEnv,
            vec_env_kwargs={"backend": backend, "num_workers": 1},
        )


def test_to_sb3_refuses_foreign_vector_envs() -> None:
    envs = gym.vector.SyncVectorEnv([InfoEnv], autoreset_mode=AutoresetMode.SAME_STEP)
    with pytest.raises(TypeError, match="make_vec"):
        to_sb3(envs)
    envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_options_applied_once_and_per_env(backend: str) -> None:
    """``set_options`` applies at the next reset only; per-env options reach their own env."""
    env_fns = [InfoEnv] * N_ENVS
    reference = DummyVecEnv(env_fns)
    adapter = make_adapter(env_fns, backend)
    try:
        for venv in (reference, adapter):
            venv.seed(4)
            venv.set_options({"start": 0.5})
        assert_tree_equal(reference.reset(), adapter.reset())
        assert adapter.reset_infos[0]["options"] == {"start": 0.5}
        assert [info["seeded"] for info in adapter.reset_infos] == [True] * N_ENVS
        assert_tree_equal(reference.reset_infos, adapter.reset_infos)

        obs = adapter.reset()  # options and seeds were cleared
        reference.reset()
        assert "options" not in adapter.reset_infos[0]
        assert not adapter.reset_infos[0]["seeded"]
        assert not np.allclose(obs[:, 0], 0.5)

        per_env = [{"start": 0.25}, {}, {"start": -0.75}]
        for venv in (reference, adapter):
            venv.seed(9)
            venv.set_options(per_env)
        assert_tree_equal(reference.reset(), adapter.reset())
        assert_tree_equal(reference.reset_infos, adapter.reset_infos)
        assert adapter.reset_infos[2]["options"] == {"start": -0.75}
    finally:
        reference.close()
        adapter.close()


def test_set_options_wrong_length_raises_value_error() -> None:
    """A per-env options list of the wrong length is refused where it is given, naming both
    lengths (``DummyVecEnv`` raises ``IndexError`` at the next reset for a short one)."""
    adapter = make_adapter([InfoEnv] * N_ENVS, "serial")
    try:
        for options in ([{"start": 1.0}], [{}] * (N_ENVS + 1)):
            with pytest.raises(ValueError, match=rf"list of {N_ENVS} .* length {len(options)}"):
                adapter.set_options(options)
        adapter.reset()
        assert all("options" not in info for info in adapter.reset_infos)  # nothing was kept
        adapter.set_options(({"start": 0.5},) * N_ENVS)  # any sequence of the right length
        assert adapter.reset()[:, 0].tolist() == [0.5] * N_ENVS
    finally:
        adapter.close()


@pytest.mark.parametrize("backend", ["serial", "shm"])
def test_reset_mask_options_for_gymnasium_users_unchanged(backend: str) -> None:
    """The adapter resets done envs with ``options=None``; Gymnasium's
    ``reset(options={"reset_mask": m})`` still gives the envs what is left of the dict, ``{}``,
    as ``SyncVectorEnv`` does."""
    env_fns = [functools.partial(OptionsSeenEnv, 3)] * 2
    sync = gym.vector.SyncVectorEnv(env_fns)
    envs = vecaccel.make_vec(env_fns, backend=backend, **BACKEND_OPTIONS[backend])
    try:
        mask = np.array([False, True])
        for venv in (sync, envs):
            _, infos = venv.reset(seed=0)
            assert infos["options_is_none"].tolist() == [True, True]
            _, infos = venv.reset(options={"reset_mask": mask})
            assert infos["options_is_none"].tolist() == [False, False]
            assert infos["_options_is_none"].tolist() == [False, True]
    finally:
        sync.close()
        envs.close()


@pytest.mark.parametrize("backend", ["serial", "hybrid"])
def test_wrapped_env_keeps_gymnasium_infos(backend: str) -> None:
    """``to_sb3`` does not switch the user's env to per-env infos: between the adapter's calls
    (and during a step the adapter left in flight) the env returns Gymnasium's batched infos,
    and the adapter's infos stay right."""
    envs = vecaccel.make_vec(
        [InfoEnv] * 2, backend=backend, autoreset_mode="SameStep", **BACKEND_OPTIONS[backend]
    )
    adapter = to_sb3(envs)
    try:
        adapter.reset()
        *_, infos = adapter.step(np.array([0, 1]))
        assert infos[1]["nested"]["action"] == 1
        assert not envs.per_env_infos
        _, batched = envs.reset(seed=1)
        assert batched["_resets"].tolist() == [True, True]  # Gymnasium's batched form
        adapter.step_async(np.array([1, 2]))
        assert envs.get_attr("max_steps") == (6, 6)  # shm finishes the step in flight first
        _, _, _, infos = adapter.step_wait()
        assert [info["nested"]["action"] for info in infos] == [1, 2]
    finally:
        adapter.close()


def test_failed_init_leaves_the_env_as_it_was() -> None:
    envs = vecaccel.make_vec([InfoEnv] * 2, backend="serial")  # NEXT_STEP: refused
    try:
        with pytest.raises(ValueError, match="NEXT_STEP"):
            to_sb3(envs)
        assert not envs.per_env_infos
        _, infos = envs.reset(seed=0)
        assert infos["resets"].tolist() == [1, 1]
    finally:
        envs.close()


def test_start_method_is_subproc_vec_envs_name_for_context() -> None:
    """``vec_env_kwargs={"start_method": ...}`` written for ``SubprocVecEnv`` works."""
    vec_env = make_vec_env(
        "CartPole-v1",
        n_envs=2,
        vec_env_cls=VecAccelEnv,
        vec_env_kwargs={"backend": "shm", "num_workers": 1, "start_method": "spawn"},
    )
    try:
        assert vec_env.vec_env.pool.ctx.get_start_method() == "spawn"
        assert vec_env.reset().shape == (2, 4)
    finally:
        vec_env.close()
    with pytest.raises(ValueError, match="disagree"):
        VecAccelEnv([InfoEnv] * 2, backend="shm", start_method="spawn", context="fork")


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_async_step_wait(backend: str) -> None:
    vec_env = make_adapter([functools.partial(StepEnv, 3)] * 2, backend)
    vec_env.reset()
    vec_env.step_async(np.zeros(2, dtype=int))
    obs, rewards, dones, infos = vec_env.step_wait()
    assert obs.tolist() == [[0], [0]] and rewards.tolist() == [0.0, 0.0]
    assert dones.tolist() == [False, False]
    assert infos == [{"TimeLimit.truncated": False}] * 2
    vec_env.close()
    assert vec_env.vec_env.closed


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


# ---------------------------------------------------------------------------------------------
# SB3's wrappers on top


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_normalize_same_as_dummy(backend: str) -> None:
    env_fns = [functools.partial(make_cartpole, 10)] * N_ENVS
    seen = run_side_by_side(env_fns, backend, 30, seed=3, wrapper=VecNormalize)
    assert seen["dones"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape,channels_order,stacked_axis",
    [
        ((12, 8, 3), None, -1),
        ((3, 12, 8), None, 1),
        ((12, 8, 3), "last", -1),
        ((12, 8, 3), "first", 1),
    ],
)
def test_vec_frame_stack(backend: str, shape, channels_order, stacked_axis) -> None:
    """Both channel orders, terminal observations stacked too, as DummyVecEnv."""
    env_fns = [functools.partial(ImageEnv, shape)] * 2

    def stack(venv: VecEnv) -> VecEnv:
        return VecFrameStack(venv, n_stack=2, channels_order=channels_order)

    with warnings.catch_warnings():
        # e.g. "VecFrameStack wrapping a VecEnv without terminal_observation info"
        warnings.simplefilter("error")
        seen = run_side_by_side(env_fns, backend, 11, seed=0, wrapper=stack)
    assert seen["dones"] > 0
    vec_env = stack(make_adapter(env_fns, backend))
    obs = vec_env.reset()
    expected = list((2, *shape))
    expected[stacked_axis] *= 2
    assert list(obs.shape) == expected
    vec_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_monitor_and_transpose(backend: str) -> None:
    env_fns = [functools.partial(ImageEnv, (12, 8, 3))] * 2

    def wrapper(venv: VecEnv) -> VecEnv:
        return VecTransposeImage(VecMonitor(venv))

    seen = run_side_by_side(env_fns, backend, 11, seed=0, wrapper=wrapper)
    assert seen["dones"] > 0
    vec_env = wrapper(make_adapter(env_fns, backend))
    assert vec_env.reset().shape == (2, 3, 12, 8)
    episodes = []
    for _ in range(5):
        obs, _, dones, infos = vec_env.step(np.zeros(2, dtype=int))
    for done, info in zip(dones, infos):
        assert done
        assert info["terminal_observation"].shape == (3, 12, 8)
        episodes.append(info["episode"])
    assert [episode["l"] for episode in episodes] == [5, 5]
    vec_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_video_recorder(backend: str, tmp_path) -> None:
    pytest.importorskip("moviepy")
    vec_env = make_adapter([ImageEnv] * N_ENVS, backend)
    images = vec_env.get_images()
    assert len(images) == N_ENVS and images[0].shape == (16, 16, 3)
    assert vec_env.render().shape == (32, 32, 3)  # tiled 2 x 2
    recorder = VecVideoRecorder(
        vec_env, str(tmp_path), record_video_trigger=lambda step: step == 0, video_length=6
    )
    recorder.reset()
    for _ in range(8):
        recorder.step(np.zeros(N_ENVS, dtype=int))
    recorder.close()
    videos = list(tmp_path.glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_images_warns_without_rgb_array(backend: str) -> None:
    vec_env = make_adapter([functools.partial(InfoEnv, 5, None)] * 2, backend)
    with pytest.warns(UserWarning):
        assert vec_env.get_images() == [None, None]
    with pytest.warns(UserWarning):
        assert vec_env.render() is None
    vec_env.close()


# ---------------------------------------------------------------------------------------------
# vec_env_cls for make_vec_env / make_atari_env


@pytest.mark.parametrize("backend", BACKENDS)
def test_make_vec_env_vec_env_cls(backend: str) -> None:
    kwargs = {"backend": backend, **BACKEND_OPTIONS[backend]}
    vec_env = make_vec_env(
        "CartPole-v1", n_envs=2, seed=0, vec_env_cls=VecAccelEnv, vec_env_kwargs=kwargs
    )
    reference = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    assert isinstance(vec_env, VecAccelEnv)
    assert vec_env.env_is_wrapped(Monitor) == [True, True]
    np.testing.assert_array_equal(vec_env.reset(), reference.reset())
    vec_env.close()
    reference.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_make_atari_env_vec_env_cls(backend: str) -> None:
    pytest.importorskip("ale_py")
    kwargs = {"backend": backend, **BACKEND_OPTIONS[backend]}
    vec_env = make_atari_env(
        "PongNoFrameskip-v4", n_envs=2, seed=0, vec_env_cls=VecAccelEnv, vec_env_kwargs=kwargs
    )
    vec_env = VecTransposeImage(VecFrameStack(vec_env, n_stack=4))
    reference = VecTransposeImage(
        VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=2, seed=0), n_stack=4)
    )
    assert_tree_equal(reference.reset(), vec_env.reset())
    assert vec_env.observation_space.shape == (4, 84, 84)
    for _ in range(10):
        actions = np.array([2, 3])
        assert_tree_equal(list(reference.step(actions)[:3]), list(vec_env.step(actions)[:3]))
    vec_env.close()
    reference.close()


def test_spawned_workers_register_atari_ids() -> None:
    """Under ``spawn`` the workers start fresh: SB3's env functions still find ALE ids."""
    pytest.importorskip("ale_py")
    vec_env = make_atari_env(
        "PongNoFrameskip-v4",
        n_envs=2,
        seed=0,
        vec_env_cls=VecAccelEnv,
        vec_env_kwargs={"backend": "shm", "context": "spawn", "num_workers": 1},
    )
    assert vec_env.env_is_wrapped(Monitor) == [True, True]
    assert vec_env.reset().shape == (2, 84, 84, 1)
    _, _, dones, infos = vec_env.step(np.array([0, 1]))
    assert dones.tolist() == [False, False] and "lives" in infos[0]
    vec_env.close()


# ---------------------------------------------------------------------------------------------
# the SB3 adapter beside DummyVecEnv

SB3_BACKENDS = {"serial": {}, "shm": {"num_workers": 2}}


@pytest.fixture
def sb3():
    """Stable-Baselines3's pieces, imported only here (spawned workers import this module)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common import vec_env

    from vecaccel.sb3 import VecAccelEnv

    return vec_env, VecAccelEnv


def adapter(sb3, env_fns, backend: str, **kwargs: Any):
    _, vec_accel_env = sb3
    return vec_accel_env(list(env_fns), backend=backend, **SB3_BACKENDS[backend], **kwargs)


@contextlib.contextmanager
def side_by_side(sb3, env_fns, backend: str) -> Iterator[tuple[Any, Any]]:
    """SB3's ``DummyVecEnv`` and the adapter over ``backend``, on the same env functions."""
    vec_env_module, _ = sb3
    reference = vec_env_module.DummyVecEnv(list(env_fns))
    try:
        venv = adapter(sb3, env_fns, backend)
    except BaseException:
        reference.close()
        raise
    try:
        yield reference, venv
    finally:
        reference.close()
        venv.close()


def assert_tree_close(expected: Any, actual: Any, where: str) -> None:
    if isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_tree_close(expected[key], actual[key], f"{where}[{key!r}]")
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7, err_msg=where)


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_step_async_twice_steps_each_env_once(sb3, backend):
    """``DummyVecEnv`` keeps the last actions and steps every env once; the adapter may refuse
    the second ``step_async``, but must not step the envs twice and drop a step's results."""
    vec_env_module, _ = sb3
    with side_by_side(sb3, counter_fns(2), backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
            env.step_async(np.zeros(2, dtype=np.int64))
            with contextlib.suppress(RuntimeError):
                env.step_async(np.ones(2, dtype=np.int64))
            obs, rewards, dones, _ = env.step_wait()
            assert obs.ravel().tolist() == [1, 1], type(env).__name__
            assert env.get_attr("steps") == [1, 1], type(env).__name__


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_returned_observations_survive_the_next_step(sb3, backend):
    """SB3's algorithms keep ``_last_obs`` across ``env.step`` (the replay buffer stores it as the
    transition's obs after the step), so every SB3 VecEnv returns fresh arrays. A backend made
    with ``copy=False`` returns views that the next step overwrites: the adapter must copy
    them, or refuse ``copy=False``."""
    vec_env_module, _ = sb3
    fns = [CounterEnv] * 2
    try:
        venv = adapter(sb3, fns, backend, copy=False)
    except ValueError:
        return  # refused: fine
    reference = vec_env_module.DummyVecEnv(fns)
    try:
        for env in (reference, venv):
            env.reset()
            first, *_ = env.step(np.zeros(2, dtype=np.int64))
            kept = first.copy()
            env.step(np.zeros(2, dtype=np.int64))
            np.testing.assert_array_equal(first, kept, err_msg=type(env).__name__)
    finally:
        reference.close()
        venv.close()


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_render_tiles_as_dummy_vec_env(sb3, backend):
    vec_env_module, _ = sb3
    fns = [functools.partial(FrameEnv, i) for i in range(3)]
    with side_by_side(sb3, fns, backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
            env.step(np.zeros(3, dtype=np.int64))
        images = venv.get_images()
        expected = reference.get_images()
        assert len(images) == 3
        for got, want in zip(images, expected):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(venv.render("rgb_array"), reference.render("rgb_array"))
        np.testing.assert_array_equal(venv.render(), reference.render())
        assert venv.render_mode == reference.render_mode == "rgb_array"


@pytest.mark.parametrize("wrapper", ["normalize", "frame_stack"])
@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_dict_observations_through_wrappers(sb3, backend, wrapper):
    """Dict observations through ``VecNormalize``/``VecFrameStack``: obs, rewards, dones,
    terminal observations and ``reset_infos`` as on ``DummyVecEnv``."""
    vec_env_module, _ = sb3

    def wrap(env):
        if wrapper == "normalize":
            return vec_env_module.VecNormalize(env)
        return vec_env_module.VecFrameStack(env, n_stack=2)

    fns = [DictObsEnv] * 2
    reference = wrap(vec_env_module.DummyVecEnv(fns))
    venv = wrap(adapter(sb3, fns, backend))
    try:
        for env in (reference, venv):
            env.seed(5)
        assert_tree_close(reference.reset(), venv.reset(), "reset")
        assert venv.unwrapped.reset_infos == reference.unwrapped.reset_infos
        rng = np.random.default_rng(0)
        dones_seen = 0
        for t in range(12):
            actions = rng.integers(0, 2, size=2)
            ref_obs, ref_rew, ref_dones, ref_infos = reference.step(actions)
            obs, rew, dones, infos = venv.step(actions)
            assert_tree_close(ref_obs, obs, f"step {t} obs")
            np.testing.assert_allclose(rew, ref_rew, rtol=1e-6)
            np.testing.assert_array_equal(dones, ref_dones)
            for ref_info, info in zip(ref_infos, infos):
                assert sorted(info) == sorted(ref_info)
                assert info["TimeLimit.truncated"] == ref_info["TimeLimit.truncated"]
                if "terminal_observation" in ref_info:
                    assert_tree_close(
                        ref_info["terminal_observation"],
                        info["terminal_observation"],
                        f"step {t} terminal_observation",
                    )
            assert venv.unwrapped.reset_infos == reference.unwrapped.reset_infos
            dones_seen += int(dones.sum())
        assert dones_seen > 0
    finally:
        reference.close()
        venv.close()


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_env_method_and_get_attr_indices_as_dummy_vec_env(sb3, backend):
    vec_env_module, _ = sb3
    fns = [functools.partial(FrameEnv, i) for i in range(3)]
    with side_by_side(sb3, fns, backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
        for indices in (None, -1, [2, 0], [-3], np.array([1, 2]), range(0, 3, 2)):
            assert venv.get_attr("index", indices=indices) == reference.get_attr(
                "index", indices=indices
            ), indices
        assert venv.get_attr("index", indices=np.int64(-2)) == [1]  # DummyVecEnv: TypeError
        results = venv.env_method("reset", indices=[np.int64(-1), 0], seed=4, options=None)
        expected = reference.env_method("reset", indices=[-1, 0], seed=4, options=None)
        assert_same([r[1] for r in results], [e[1] for e in expected], "reset infos")
        venv.set_attr("t", 7, indices=[-1])
        reference.set_attr("t", 7, indices=[-1])
        assert venv.get_attr("t") == reference.get_attr("t") == [0, 0, 7]
        with pytest.raises(AttributeError):
            venv.get_attr("no_such_attribute", indices=[1])
        with pytest.raises(IndexError):
            venv.env_method("render", indices=[3])


ONE_WORKER_OPTIONS: dict[str, dict[str, Any]] = {
    "serial": {},
    "shm": {"num_workers": 1},
    "hybrid": {"num_workers": 1},
}

ONE_WORKER_BACKENDS = list(ONE_WORKER_OPTIONS)


def make_quiet_adapter(env_fns, backend: str, **kwargs: Any) -> VecAccelEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch-oversubscription warning on small machines
        return VecAccelEnv(env_fns, backend=backend, **ONE_WORKER_OPTIONS[backend], **kwargs)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=10)


@pytest.mark.parametrize("backend", ONE_WORKER_BACKENDS)
def test_step_infos_do_not_alias_env_state(backend: str) -> None:
    """The step infos SB3 receives are copies, not the env's own objects.

    ``DummyVecEnv.step_wait`` returns ``deepcopy(self.buf_infos)``: infos kept from step 1 (a
    callback's ``self.locals["infos"]``, a logging buffer) still say step 1 after step 3. The
    serial backend and hybrid's inline envs, which could hand over the env's dict itself with
    ``per_env_infos``, must do the same, or the kept infos would change as the env runs on.
    """
    fns = [StatefulInfoEnv] * 2
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend)
    try:
        reference.reset()
        adapter.reset()
        ref_kept = [reference.step(np.array([0, 0]))[3] for _ in range(3)]
        kept = [adapter.step(np.array([0, 0]))[3] for _ in range(3)]
        expected = [[info["t"] for info in infos] for infos in ref_kept]
        got = [[info["t"] for info in infos] for infos in kept]
        assert got == expected == [[1, 1], [2, 2], [3, 3]], (
            f"infos['t'] kept from steps 1-3: DummyVecEnv {expected}, adapter {got} (the "
            "adapter returned the env's own info dict, later steps overwrote it)"
        )
        got_pos = [infos[0]["pos"][0] for infos in kept]
        assert got_pos == [1.0, 2.0, 3.0], (
            f"infos[0]['pos'] kept from steps 1-3 should be [1.0, 2.0, 3.0] as with "
            f"DummyVecEnv, got {got_pos} (an array the env updates in place)"
        )
    finally:
        reference.close()
        adapter.close()


@pytest.mark.parametrize("backend", ["serial", "shm"])
def test_disabled_mode_autoreset_passes_no_options(backend: str) -> None:
    """With autoreset_mode=DISABLED the adapter's autoreset gives the env ``options=None``.

    ``DummyVecEnv`` resets a done env with ``env.reset()`` (``options=None``); the adapter calls
    ``vec_env.reset(options={"reset_mask": dones})``, and the backend must not pass on what is
    left of that dict, ``{}``: an env that reads options whenever they are not None
    (``OptionsEnv``) would fail in the middle of training.
    """
    fns = [functools.partial(StatefulInfoEnv, 2)] * 2
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend, autoreset_mode="Disabled")
    try:
        for venv in (reference, adapter):
            venv.reset()
            venv.step(np.array([0, 0]))
            _, _, dones, _ = venv.step(np.array([0, 0]))
            assert dones.all()
        assert reference.reset_infos == [{"options_is_none": True}] * 2
        assert adapter.reset_infos == reference.reset_infos, (
            f"after an autoreset DummyVecEnv's reset_infos are {reference.reset_infos}, the "
            f"adapter's {adapter.reset_infos}: the env got options={{}} instead of None"
        )
    finally:
        reference.close()
        adapter.close()

    adapter = make_quiet_adapter([OptionsEnv] * 2, backend, autoreset_mode="Disabled")
    try:
        adapter.reset()
        adapter.step(np.array([0, 0]))
        try:
            adapter.step(np.array([0, 0]))  # episode ends: the adapter resets the envs
        except vecaccel.WorkerError as error:
            pytest.fail(f"autoreset of an env that reads options when given: {error}")
    finally:
        adapter.close()


@pytest.mark.parametrize(
    "backend, per_env",
    [
        ("serial", [{"start": 1.0}, {}, {"start": 2.0}]),
        ("shm", [{"start": 1.0}, {}, {"start": 2.0}]),
        ("serial", [None, {"start": 1.0}, None]),
    ],
    ids=["empty-dict-serial", "empty-dict-shm", "none-entries-serial"],
)
def test_per_env_falsy_options_mean_no_options(backend: str, per_env: list) -> None:
    """A falsy per-env entry (``{}`` or ``None``) means no options, as ``DummyVecEnv.reset``
    passes ``options`` only where the entry is truthy: the adapter's per-group masked reset
    must neither give the env ``options={}`` nor raise TypeError (``{**None, ...}``).
    """
    fns = [OptionsEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend)
    try:
        reference.set_options(per_env)
        expected = reference.reset()
        adapter.set_options(per_env)
        try:
            obs = adapter.reset()
        except (vecaccel.WorkerError, TypeError) as error:
            pytest.fail(
                f"DummyVecEnv resets the envs without options with options=None (obs "
                f"{expected.ravel().tolist()}); the adapter raised {type(error).__name__}: {error}"
            )
        np.testing.assert_array_equal(obs, expected)
        assert adapter.reset_infos == reference.reset_infos
    finally:
        reference.close()
        adapter.close()


def test_set_options_short_list_is_not_applied_to_every_env() -> None:
    """A per-env options list shorter than num_envs is not applied to every env.

    ``DummyVecEnv.reset`` raises IndexError for env 1 of ``set_options([{"start": 1.0}])``
    with 3 envs. The adapter must not read it as a single options group and reset *every* env
    with env 0's options. Its ``set_options`` raises ``ValueError`` at once (where the wrong
    list is given, rather than at a reset that may come much later), so both calls are in the
    ``try``.
    """
    fns = [OptionsEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, "serial")
    try:
        reference.set_options([{"start": 1.0}])
        with pytest.raises(IndexError):
            reference.reset()
        try:
            adapter.set_options([{"start": 1.0}])
            obs = adapter.reset()
        except (IndexError, ValueError):
            return  # refused, as DummyVecEnv refuses it
        assert obs[1:, 0].tolist() == [0.0, 0.0], (
            "options given for env 0 only reached envs 1 and 2 too: reset obs "
            f"{obs.ravel().tolist()} (DummyVecEnv raises IndexError instead)"
        )
    finally:
        reference.close()
        adapter.close()


def test_to_sb3_leaves_the_wrapped_vector_env_a_gymnasium_vector_env() -> None:
    """``to_sb3(envs)`` leaves the user's own Gymnasium vector env as it was: switching
    ``envs.per_env_infos`` on would make it return ``{}`` infos from then on (its reset/step
    contract would change silently, e.g. for an evaluation loop run on ``envs`` directly)."""
    envs = vecaccel.make_vec([OptionsEnv] * 2, backend="serial", autoreset_mode="SameStep")
    try:
        _, before = envs.reset(seed=0, options={"start": 1.0})
        assert "options" in before
        adapter = to_sb3(envs)
        adapter.reset()
        _, after = envs.reset(seed=0, options={"start": 1.0})
        assert after.keys() == before.keys(), (
            f"envs.reset() infos before to_sb3: keys {sorted(before)}, after: {after!r}"
        )
    finally:
        envs.close()


@pytest.mark.parametrize("backend", ONE_WORKER_BACKENDS)
def test_indices_like_dummy_vec_env(backend: str) -> None:
    """Empty lists, ranges, numpy int arrays, tuples, negative and out-of-range indices."""
    fns = [CurrentStepEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend)
    try:
        for indices in ([], range(1, 3), np.array([2, 0]), (0,), [-3], -1, None):
            for venv in (reference, adapter):
                venv.set_attr("current_step", 0)
                venv.set_attr("current_step", 7, indices=indices)
            assert adapter.get_attr("current_step") == reference.get_attr("current_step")
            assert adapter.get_attr("current_step", indices) == reference.get_attr(
                "current_step", indices
            )
            assert adapter.env_method("double", 4, indices=indices) == reference.env_method(
                "double", 4, indices=indices
            )
            assert adapter.env_is_wrapped(gym.Wrapper, indices) == reference.env_is_wrapped(
                gym.Wrapper, indices
            )
        for bad in (3, [5], -4):
            with pytest.raises(IndexError):
                adapter.get_attr("current_step", bad)
    finally:
        reference.close()
        adapter.close()


@pytest.mark.parametrize("backend", ONE_WORKER_BACKENDS)
@pytest.mark.parametrize("mode", ["SameStep", "Disabled"])
def test_terminal_obs_dict_tuple_are_copies_with_copy_false(backend: str, mode: str) -> None:
    """Returned obs and ``terminal_observation`` (Dict and Tuple) never change afterwards, with
    ``copy=False`` backends too, and equal DummyVecEnv's."""
    box = spaces.Box(-1, 1, (2,), np.float32)
    for space in (
        spaces.Dict({"a": box, "b": spaces.Discrete(3)}),
        spaces.Tuple((box, spaces.MultiBinary(2))),
    ):
        fns = [functools.partial(SampledSpaceEnv, space)] * 2
        reference = DummyVecEnv(fns)
        adapter = make_quiet_adapter(fns, backend, autoreset_mode=mode, copy=False)
        try:
            results = {}
            for name, venv in (("dummy", reference), ("adapter", adapter)):
                venv.seed(3)
                live, snapshots = [], []
                for step in range(5):
                    out = venv.reset() if step == 0 else venv.step(np.array([0, 1]))
                    live.append(out)
                    snapshots.append(copy.deepcopy(out))
                assert repr(live) == repr(snapshots), f"{name}: returned data changed later"
                results[name] = snapshots
            terminal = [
                [info.get("terminal_observation") for info in out[3]]
                for out in results["adapter"][1:]
            ]
            expected = [
                [info.get("terminal_observation") for info in out[3]]
                for out in results["dummy"][1:]
            ]
            assert repr(terminal).replace("np.int64(", "(") == repr(expected).replace(
                "np.int64(", "("
            )
        finally:
            reference.close()
            adapter.close()


def test_vec_normalize_save_load_and_double_close(tmp_path) -> None:
    """VecNormalize statistics save/load onto a fresh adapter; close() twice is harmless, calls
    after close raise; nothing is left behind."""
    before = {p.pid for p in multiprocessing.active_children()}
    venv = VecNormalize(make_quiet_adapter([cartpole] * 2, "shm"))
    venv.seed(0)
    venv.reset()
    for _ in range(15):
        venv.step(np.array([0, 1]))
    path = tmp_path / "vn.pkl"
    venv.save(str(path))
    loaded = VecNormalize.load(str(path), make_quiet_adapter([cartpole] * 2, "shm"))
    np.testing.assert_array_equal(loaded.obs_rms.mean, venv.obs_rms.mean)
    assert loaded.reset().shape == (2, 4)
    venv.close()
    venv.close()
    loaded.close()
    with pytest.raises(RuntimeError):
        loaded.step(np.array([0, 1]))
    left = {p.pid for p in multiprocessing.active_children()} - before
    assert not left, f"worker processes left behind: {left}"
