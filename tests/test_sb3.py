"""The SB3 adapter against SB3's own vec-env contract (modelled on SB3's ``tests/test_vec_envs.py``).

Every check runs on the adapter over the ``serial`` and ``shm`` backends and, wherever a result
can be compared, side by side with ``DummyVecEnv`` on the same seeds and actions.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.env_util import make_atari_env, make_vec_env  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import (  # noqa: E402
    DummyVecEnv,
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
    VecVideoRecorder,
)

import vecaccel  # noqa: E402
from vecaccel.sb3 import SB3VecEnv, VecAccelEnv, to_sb3  # noqa: E402

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


# ---------------------------------------------------------------------------------------------
# test environments (top level, so that they pickle under every start method)


class CustomGymEnv(gym.Env):
    """SB3's test env, seeded through Gymnasium's RNG so that runs are reproducible."""

    def __init__(self, space: spaces.Space, render_mode: str | None = "rgb_array", ep_length=4):
        # each env samples from its own copy, so that no two envs share a random generator
        self.action_space = copy.deepcopy(space)
        self.observation_space = copy.deepcopy(space)
        self.current_step = 0
        self.ep_length = ep_length
        self.render_mode = render_mode

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.current_step = 0
        self._choose_next_state()
        return self.state, {}

    def step(self, action):
        reward = float(self.np_random.random())
        self._choose_next_state()
        self.current_step += 1
        terminated = truncated = self.current_step >= self.ep_length
        return self.state, reward, terminated, truncated, {}

    def _choose_next_state(self) -> None:
        self.state = self.observation_space.sample()

    def render(self):
        if self.render_mode == "rgb_array":
            return np.zeros((4, 4, 3))
        return None

    @staticmethod
    def custom_method(dim_0: int = 1, dim_1: int = 1) -> np.ndarray:
        return np.ones((dim_0, dim_1))


class ShuffledDictEnv(CustomGymEnv):
    """Returns its Dict observations with the keys in reverse order."""

    def _choose_next_state(self) -> None:
        sample = self.observation_space.sample()
        self.state = {key: sample[key] for key in reversed(list(sample))}


class StepEnv(gym.Env):
    """Observation = the step count: checks that ``terminal_observation`` is the right one."""

    def __init__(self, max_steps: int) -> None:
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(np.array([0]), np.array([999]), dtype=np.int64)
        self.max_steps = max_steps
        self.current_step = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.current_step = 0
        return np.array([self.current_step], dtype=np.int64), {}

    def step(self, action):
        prev_step = self.current_step
        self.current_step += 1
        terminated = truncated = self.current_step >= self.max_steps
        return np.array([prev_step], dtype=np.int64), 0.0, terminated, truncated, {}


class InfoEnv(gym.Env):
    """Random episode ends (terminated, truncated or both) and infos of many kinds.

    Infos carry ints, floats, bools, arrays, strings present only on some steps and nested
    dicts; reset infos echo the options, so every conversion of the adapter is exercised.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, max_steps: int = 6, render_mode: str | None = None) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.resets = 0
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.resets += 1
        self.steps = 0
        start = float((options or {}).get("start", 0.0))
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        obs[0] = start
        info: dict[str, Any] = {"resets": self.resets, "seeded": seed is not None}
        if options:
            info["options"] = dict(options)
        return obs, info

    def step(self, action):
        self.steps += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        reward = float(self.np_random.normal()) + int(action)
        terminated = bool(self.np_random.random() < 0.15)
        truncated = self.steps >= self.max_steps
        info: dict[str, Any] = {
            "steps": self.steps,
            "value": float(obs[0]),
            "flag": bool(obs[1] > 0),
            "vector": obs * 2,
            "nested": {"action": int(action), "deep": {"half": self.steps / 2}},
        }
        if obs[2] > 0.5:
            info["note"] = f"high {self.steps}"
        return obs, reward, terminated, truncated, info

    def render(self):
        return np.full((8, 6, 3), self.steps * 10, dtype=np.uint8)


class ImageEnv(CustomGymEnv):
    """An image env (uint8) that renders frames a video encoder accepts."""

    def __init__(self, shape=(12, 8, 3), render_mode: str | None = "rgb_array") -> None:
        space = spaces.Box(0, 255, shape, np.uint8)
        super().__init__(space, render_mode=render_mode, ep_length=5)
        self.action_space = spaces.Discrete(2)

    def render(self):
        return np.full((16, 16, 3), 10 * self.current_step, dtype=np.uint8)


class CrashEnv(InfoEnv):
    """Raises inside ``step`` after a few steps."""

    def __init__(self, crash_at: int | None) -> None:
        super().__init__(max_steps=100)
        self.crash_at = crash_at
        self.total_steps = 0

    def step(self, action):
        self.total_steps += 1
        if self.total_steps == self.crash_at:
            raise RuntimeError("boom from the env")
        return super().step(action)


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


class OptionsSeenEnv(StepEnv):
    """Reports in its reset info whether it was given options (``None`` or a dict)."""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {"options_is_none": options is None}


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
