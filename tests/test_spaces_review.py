"""Review of the per-space layout, batching and action checking, backend by backend.

Every backend (``serial``, ``shm``, ``hybrid``, ``async``) runs beside Gymnasium's
``SyncVectorEnv`` with the same env functions and seeds; observations, rewards, flags and infos
must be identical. The envs below are module level so that ``spawn`` workers can import them.
"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from helpers_envs import assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from space_strategies import boxes

import vecaccel
from vecaccel.spaces import check_actions, item_reader, leaf_specs

NUM_ENVS = 3

BACKENDS: dict[str, dict] = {
    "serial": {},
    "shm": {"num_workers": 2, "context": "fork"},
    "hybrid": {"num_workers": 1, "inline_envs": 1, "context": "fork"},
    "async": {"num_workers": 2, "context": "fork"},
}
ALL_BACKENDS = list(BACKENDS)
PROCESS_BACKENDS = ["shm", "hybrid", "async"]


# ---------------------------------------------------------------------------------------------
# helpers


def _map_arrays(tree: Any, fn) -> Any:
    if isinstance(tree, np.ndarray):
        return fn(tree)
    if isinstance(tree, dict):
        return {key: _map_arrays(value, fn) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_map_arrays(value, fn) for value in tree)
    return tree


def _relayout(tree: Any, how: str) -> Any:
    """The same values in another memory layout (and Dict keys in reverse order)."""
    if isinstance(tree, dict):
        return {key: _relayout(tree[key], how) for key in reversed(list(tree))}
    if isinstance(tree, tuple):
        return tuple(_relayout(value, how) for value in tree)
    if isinstance(tree, np.ndarray) and tree.ndim:
        if how == "F":
            return np.asfortranarray(tree)
        if how == "strided":
            return np.repeat(tree[..., None], 2, axis=-1)[..., 1]  # a non-contiguous view
    return tree


def _reorder(tree: Any, order: np.ndarray) -> Any:
    """Put a batch returned in arrival order (async) back into env order."""
    return _map_arrays(tree, lambda array: array[order])


def make_backend(fns, backend: str, mode=AutoresetMode.NEXT_STEP, **extra):
    return vecaccel.make_vec(
        fns, backend=backend, autoreset_mode=mode, **BACKENDS[backend], **extra
    )


def vreset(env, backend: str, **kwargs):
    obs, infos = env.reset(**kwargs)
    if backend == "async":
        order = np.argsort(infos.pop("env_id"))
        obs, infos = _reorder(obs, order), _reorder(infos, order)
    return obs, infos


def vstep(env, backend: str, actions):
    if backend == "async":
        ids = np.arange(env.num_envs)
        env.send(actions, ids)
        obs, rew, term, trunc, infos = env.recv_ids(ids)
        infos = dict(infos)
        np.testing.assert_array_equal(infos.pop("env_id"), ids)
        return obs, rew, term, trunc, infos
    return env.step(actions)


@contextlib.contextmanager
def side_by_side(fns, backend: str, mode=AutoresetMode.NEXT_STEP, **extra):
    with contextlib.ExitStack() as stack:
        sync = SyncVectorEnv(fns, autoreset_mode=mode)
        stack.callback(sync.close)
        env = make_backend(fns, backend, mode, **extra)
        stack.callback(env.close)
        yield sync, env


# ---------------------------------------------------------------------------------------------
# envs


class SpaceEnv(gym.Env):
    """Emits seeded random observations of its space (in a chosen memory layout, Dict keys
    reversed), rich infos, and the flattened action it received; episodes end at random."""

    metadata = {"render_modes": []}

    def __init__(self, obs_space, act_space, layout: str = "C", p_end: float = 0.3):
        self.observation_space = obs_space
        self.action_space = act_space
        self._sampler = copy.deepcopy(obs_space)
        self.layout = layout
        self.p_end = p_end
        self.t = 0

    def _obs(self):
        return _relayout(self._sampler.sample(), self.layout)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sampler.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        info: dict[str, Any] = {"start": np.int16(self.np_random.integers(100))}
        if options:
            info["options"] = dict(options)
        return self._obs(), info

    def step(self, action):
        assert self.action_space.contains(action), (action, self.action_space)
        self.t += 1
        rng = self.np_random
        info: dict[str, Any] = {"act": spaces.flatten(self.action_space, action).astype(np.float64)}
        kind = int(rng.integers(6))
        if kind == 0:
            info["f32"] = np.float32(rng.random())
        elif kind == 1:
            info["nested"] = {"s": "x" * int(rng.integers(3)), "n": None, "deep": {"v": self.t}}
        elif kind == 2:
            info["arr"] = rng.random(2)
        elif kind == 3:
            info["flag"] = bool(rng.integers(2))
            info["none"] = None
        elif kind == 4:
            info["f32"] = np.float32(-1.0)
            info["label"] = f"t{self.t}"
        terminated = bool(rng.random() < self.p_end)
        truncated = self.t % 4 == 0
        return self._obs(), float(self.t) + 0.25, terminated, truncated, info


class ConstObsEnv(gym.Env):
    """Returns the given observation on reset and on every step."""

    def __init__(self, space, value):
        self.observation_space = space
        self.action_space = spaces.Discrete(2)
        self.value = value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return copy.deepcopy(self.value), {}

    def step(self, action):
        return copy.deepcopy(self.value), 0.0, False, False, {}


class ShortTupleEnv(gym.Env):
    """A ``Tuple(Box, Box)`` observation, except that step ``short_at`` returns only its first part."""

    def __init__(self, short_at: int = 2):
        box = spaces.Box(0, 100, (1,), np.float32)
        self.observation_space = spaces.Tuple((box, box))
        self.action_space = spaces.Discrete(2)
        self.short_at = short_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return (np.zeros(1, np.float32), np.zeros(1, np.float32)), {}

    def step(self, action):
        self.t += 1
        first = np.full(1, self.t, np.float32)
        if self.t == self.short_at:
            return (first,), 0.0, False, False, {}
        return (first, np.full(1, 10 * self.t, np.float32)), 0.0, False, False, {}


class PreviousActionEnv(gym.Env):
    """Observes the action of the *previous* step, kept as the env received it (a common
    pattern: action-rate penalties, last-action features)."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "box": spaces.Box(-10, 10, (2,), np.float32),
                "md": spaces.MultiDiscrete([5, 5]),
            }
        )
        self.action_space = self.observation_space
        self.prev = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.prev = {"box": np.zeros(2, np.float32), "md": np.zeros(2, np.int64)}
        return {k: np.array(v) for k, v in self.prev.items()}, {}

    def step(self, action):
        obs = {k: np.array(v) for k, v in self.prev.items()}
        self.prev = action  # kept by reference, as envs commonly do
        return obs, 0.0, False, False, {}


class ReusedInfoEnv(gym.Env):
    """Returns one info dict object, updated in place by ``step`` and ``reset``."""

    def __init__(self, length: int = 2):
        self.observation_space = spaces.Box(0, 100, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length = length
        self.info: dict[str, Any] = {}
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.info.clear()
        self.info["episode_steps"] = 0
        return np.zeros(1, np.float32), self.info

    def step(self, action):
        self.t += 1
        self.info["episode_steps"] = self.t
        obs = np.full(1, self.t, np.float32)
        return obs, 1.0, self.t == self.length, False, self.info


class FreeSpaceEnv(gym.Env):
    """Seeded samples of any space (Text, Sequence, Graph...), for the serial backend."""

    def __init__(self, obs_space, act_space):
        self.observation_space = obs_space
        self.action_space = act_space
        self._sampler = copy.deepcopy(obs_space)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sampler.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self._sampler.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        return self._sampler.sample(), 1.0, self.t % 3 == 0, False, {"action": action}


# ---------------------------------------------------------------------------------------------
# strategies: every leaf space, scalar and zero-size shapes, Dict keys in any order

BOX_DTYPES = [
    np.uint8,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
]


@st.composite
def discretes(draw):
    dtype = draw(st.sampled_from([np.int64, np.int32, np.int8]))
    return spaces.Discrete(draw(st.integers(1, 6)), start=draw(st.integers(-4, 4)), dtype=dtype)


@st.composite
def multi_discretes(draw):
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple))
    size = int(np.prod(shape))
    nvec = np.array(draw(st.lists(st.integers(1, 5), min_size=size, max_size=size)))
    start = np.array(draw(st.lists(st.integers(-3, 3), min_size=size, max_size=size)))
    return spaces.MultiDiscrete(nvec.reshape(shape), start=start.reshape(shape))


@st.composite
def multi_binaries(draw):
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    return spaces.MultiBinary(shape[0] if len(shape) == 1 else shape)


@st.composite
def dicts(draw, children):
    items = draw(
        st.lists(
            st.tuples(st.text(alphabet="abcdxyz_", min_size=1, max_size=3), children),
            min_size=1,
            max_size=3,
            unique_by=lambda kv: kv[0],
        )
    )
    how = draw(st.sampled_from(["sorted", "ordered", "unsorted"]))
    if how == "ordered":  # insertion order kept, whatever it is
        return spaces.Dict(OrderedDict(items))
    if how == "unsorted":
        return spaces.Dict(dict(items), sort_keys=False)
    return spaces.Dict(dict(items))


# zero-size dimensions too, and bounds nearer the dtypes' edges
leaf_spaces = st.one_of(
    boxes(
        BOX_DTYPES,
        min_dim=0,
        int_span=100,
        float_lows=(-np.inf, -2.0, 0.0),
        float_highs=(np.inf, 1.0, 50.0),
    ),
    discretes(),
    multi_discretes(),
    multi_binaries(),
)  # fmt: skip, multi_discretes(), multi_binaries())
space_trees = st.recursive(
    leaf_spaces,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda s: spaces.Tuple(tuple(s))),
        dicts(children),
    ),
    max_leaves=5,
)

PROPERTY_SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---------------------------------------------------------------------------------------------
# 1. random nested spaces through every backend, beside SyncVectorEnv


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@PROPERTY_SETTINGS
@given(
    obs_space=space_trees,
    act_space=space_trees,
    layout=st.sampled_from(["C", "F", "strided"]),
    mode=st.sampled_from([AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]),
    seed=st.integers(0, 2**20),
)
def test_random_spaces_match_sync(backend, obs_space, act_space, layout, mode, seed):
    fns = [partial(SpaceEnv, obs_space, act_space, layout)] * NUM_ENVS
    with side_by_side(fns, backend, mode) as (sync, env):
        assert env.single_observation_space == sync.single_observation_space
        assert env.single_action_space == sync.single_action_space
        assert env.observation_space == sync.observation_space
        assert env.action_space == sync.action_space
        assert_same(
            vreset(env, backend, seed=seed, options={"k": 1}),
            sync.reset(seed=seed, options={"k": 1}),
            "reset",
        )
        sync.action_space.seed(seed)
        for t in range(6):
            actions = sync.action_space.sample()
            expected = sync.step(actions)
            assert_same(vstep(env, backend, actions), expected, f"step {t}")


# ---------------------------------------------------------------------------------------------
# 2. large observations, non-contiguous, through autoresets (final_obs over the data pipe)


@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
def test_large_observations_and_final_obs(backend):
    obs_space = spaces.Dict(
        {
            "frame": spaces.Box(0, 255, (256, 256, 3), np.uint8),  # 192 KiB a frame
            "x": spaces.Box(-1, 1, (), np.float16),
        }
    )
    fns = [partial(SpaceEnv, obs_space, spaces.Discrete(3, start=-1), "strided", 0.5)] * NUM_ENVS
    with side_by_side(fns, backend, AutoresetMode.SAME_STEP) as (sync, env):
        assert_same(vreset(env, backend, seed=4), sync.reset(seed=4), "reset")
        sync.action_space.seed(1)
        ended = 0
        for t in range(5):
            actions = sync.action_space.sample()
            expected = sync.step(actions)
            ended += int((expected[2] | expected[3]).sum())
            assert_same(vstep(env, backend, actions), expected, f"step {t}")
        assert ended >= 2


def test_spawn_workers_import_the_envs():
    space = spaces.Dict(
        {"b": spaces.MultiBinary([2, 2]), "a": spaces.Tuple((spaces.Discrete(2, start=3),))}
    )
    fns = [partial(SpaceEnv, space, space, "F")] * 2
    sync = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    env = vecaccel.make_vec(
        fns, backend="shm", num_workers=1, context="spawn", autoreset_mode=AutoresetMode.SAME_STEP
    )
    with contextlib.closing(sync), contextlib.closing(env):
        assert_same(env.reset(seed=9), sync.reset(seed=9))
        sync.action_space.seed(0)
        for t in range(4):
            actions = sync.action_space.sample()
            assert_same(env.step(actions), sync.step(actions), f"step {t}")


# ---------------------------------------------------------------------------------------------
# 3. layout, batching and item access agree with gymnasium.vector.utils


@settings(max_examples=120, deadline=None, derandomize=True)
@given(space=space_trees, n=st.integers(1, 4), seed=st.integers(0, 2**20))
def test_layout_and_action_items_match_gymnasium_utils(space, n, seed):
    batched_space = batch_space(space, n)
    empty = create_empty_array(space, n)
    specs = leaf_specs(space, n)

    def compare(spec, array):
        if isinstance(array, np.ndarray):
            assert spec == (array.shape, array.dtype)
        elif isinstance(array, dict):
            assert list(spec) == list(array)
            for key in array:
                compare(spec[key], array[key])
        else:
            assert len(spec) == len(array)
            for s, a in zip(spec, array):
                compare(s, a)

    compare(specs, empty)
    space.seed(seed)
    items = [space.sample() for _ in range(n)]
    batch = concatenate(space, items, create_empty_array(space, n))
    assert batched_space.contains(batch)
    checked = check_actions(space, batch, n)
    read = item_reader(checked)
    for i, expected in enumerate(iterate(batched_space, batch)):
        got = read(i)
        assert_same(_map_arrays(got, np.asarray), _map_arrays(expected, np.asarray), f"item {i}")
        assert space.contains(got)


# ---------------------------------------------------------------------------------------------
# 4. actions must not change under an env that keeps them


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_action_kept_by_env_is_not_overwritten_by_next_step(backend):
    """Gymnasium hands each env its own action; an env that keeps it (to observe or penalise
    the previous action) must still see that action one step later, not the next one."""
    fns = [PreviousActionEnv] * NUM_ENVS
    with side_by_side(fns, backend) as (sync, env):
        assert_same(vreset(env, backend, seed=0), sync.reset(seed=0), "reset")
        for t in range(3):
            actions = {
                "box": np.full((NUM_ENVS, 2), t + 1, np.float32),
                "md": np.full((NUM_ENVS, 2), (t + 1) % 5, np.int64),
            }
            expected = sync.step(copy.deepcopy(actions))
            got = vstep(env, backend, copy.deepcopy(actions))
            assert_same(got, expected, f"step {t}")


# ---------------------------------------------------------------------------------------------
# 5. observations an env returns wrongly


WRONG_DTYPE_OBS = [
    # (space, value): SyncVectorEnv refuses to cast these (casting="same_kind")
    (spaces.Box(0, 255, (2,), np.uint8), np.array([0.5, 300.7])),  # would become [0, 44]
    (spaces.Discrete(3), 1.7),  # would become 1
]


@pytest.mark.parametrize(
    "space, value", WRONG_DTYPE_OBS, ids=["float-for-uint8", "float-for-discrete"]
)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_observation_of_wrong_kind_is_an_error_not_a_silent_cast(backend, space, value):
    fns = [partial(ConstObsEnv, space, value)] * 2
    sync = SyncVectorEnv(fns)
    with contextlib.closing(sync), pytest.raises(TypeError):
        sync.reset(seed=0)  # the reference refuses the observation
    env = make_backend(fns, backend)
    with contextlib.closing(env):
        try:
            obs, _ = env.reset(seed=0)
        except (TypeError, ValueError, RuntimeError):
            return  # refused, as it should be (WorkerError is a RuntimeError)
        pytest.fail(f"{backend} accepted {value!r} for {space} and returned {obs!r}")


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_tuple_observation_missing_a_part_is_an_error(backend):
    """A Tuple observation with a part missing must not leave the last step's part in place."""
    fns = [ShortTupleEnv] * 2
    sync = SyncVectorEnv(fns)
    with contextlib.closing(sync):
        sync.reset(seed=0)
        sync.step(np.array([0, 0]))
        with pytest.raises(IndexError):
            sync.step(np.array([0, 0]))
    env = make_backend(fns, backend)
    with contextlib.closing(env):
        vreset(env, backend, seed=0)
        vstep(env, backend, np.array([0, 0]))
        try:
            obs = vstep(env, backend, np.array([0, 0]))[0]
        except (IndexError, ValueError, RuntimeError):
            return
        pytest.fail(f"{backend} returned {obs!r} for a 1-tuple observation of a 2-tuple space")


# ---------------------------------------------------------------------------------------------
# 6. autoreset: final_info as the step returned it


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_same_step_final_info_is_the_ended_steps_info(backend):
    """SAME_STEP's final_info is the info of the step that ended the episode, even when the
    env's reset then updates that dict in place (SyncVectorEnv batches it before the reset)."""
    fns = [ReusedInfoEnv] * 2
    with side_by_side(fns, backend, AutoresetMode.SAME_STEP) as (sync, env):
        assert_same(vreset(env, backend, seed=0), sync.reset(seed=0), "reset")
        for t in range(4):
            actions = np.array([0, 1])
            expected = sync.step(actions)
            got = vstep(env, backend, actions)
            if expected[2].any():
                np.testing.assert_array_equal(expected[4]["final_info"]["episode_steps"], [2, 2])
            assert_same(got, expected, f"step {t}")


# ---------------------------------------------------------------------------------------------
# 7. action checking in the caller


def _bad_action_cases():
    space = spaces.Dict(
        {
            "d": spaces.Discrete(3, start=-1),
            "m": spaces.MultiDiscrete([[2, 3], [4, 2]], start=[[1, 0], [-2, 5]]),
            "b": spaces.MultiBinary([2, 2]),
            "x": spaces.Box(-1, 1, (2,), np.float32),
            "u": spaces.Box(0, 255, (), np.uint8),
        }
    )
    return space


def _good_actions(space, n, seed=0):
    batched = batch_space(space, n)
    batched.seed(seed)
    return batched.sample()


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_bad_actions_raise_in_the_caller_naming_env_and_space(backend):
    space = _bad_action_cases()
    fns = [partial(SpaceEnv, spaces.Box(0, 1, (1,), np.float32), space)] * NUM_ENVS
    with side_by_side(fns, backend) as (sync, env):
        obs, infos = env.reset(seed=1)
        sync.reset(seed=1)
        good = _good_actions(space, NUM_ENVS)
        # the env index the message names: the position's env (async: the env ids it holds)
        ids = infos["env_id"] if backend == "async" else np.arange(NUM_ENVS)

        def bad(key, value):
            return {**good, key: value}

        cases = [
            ("d", np.array([-1, 2, 0]), 1),  # one past the top (start -1, n 3)
            ("d", np.array([-2, 0, 0]), 0),  # one below start
            ("m", np.array([[[1, 0], [-2, 5]], [[1, 0], [-2, 5]], [[3, 0], [-2, 5]]]), 2),
            ("m", np.array([[[1, 0], [-2, 5]], [[1, 0], [-2, 7]], [[1, 0], [-2, 5]]]), 1),
            ("b", np.array([[[0, 1], [1, 0]], [[0, 1], [1, 2]], [[0, 0], [0, 0]]]), 1),
            ("u", np.array([1, 2, 256]), 2),
        ]
        for key, value, position in cases:
            with pytest.raises(ValueError) as info:
                env.step(bad(key, value))
            message = str(info.value)
            assert f"env {int(ids[position])}" in message, message
            assert str(space[key]) in message, message
        for key, value in [
            ("d", np.array([0.0, 1.0, 0.0])),  # floats for a Discrete
            ("x", np.zeros((NUM_ENVS, 3), np.float32)),  # wrong shape
            ("b", np.zeros((NUM_ENVS, 4), np.int8)),  # flat for a 2-d MultiBinary
            ("x", np.array([["a", "b"]] * NUM_ENVS)),  # strings
        ]:
            with pytest.raises(ValueError) as info:
                env.step(bad(key, value))
            assert str(space[key]) in str(info.value), str(info.value)
        # nothing was sent: the envs step on as the reference does
        if backend == "async":
            env.send(good, ids)
            env.recv_ids(ids)
        else:
            expected = sync.step(good)
            assert_same(env.step(good), expected, "good step after bad ones")


def test_bfloat16_torch_actions_are_accepted_like_float16():
    """A policy under bfloat16 autocast returns bfloat16 tensors; float16 ones are cast to the
    space's dtype, bfloat16 ones should be too (or refused with ValueError), not TypeError."""
    torch = pytest.importorskip("torch")
    space = spaces.Box(-1, 1, (2,), np.float32)
    values = torch.tensor([[0.5, -0.25], [1.0, 0.0]])
    half = check_actions(space, values.to(torch.float16), 2)
    assert half.dtype == np.float32
    checked = check_actions(space, values.to(torch.bfloat16), 2)
    np.testing.assert_array_equal(checked, values.numpy())
    assert checked.dtype == np.float32


# ---------------------------------------------------------------------------------------------
# 8. spaces without a fixed layout: serial matches Sync, shm refuses them clearly


FREE_SPACES = [
    (spaces.Text(5), spaces.Text(4)),
    (spaces.Sequence(spaces.Box(0, 1, (2,))), spaces.Sequence(spaces.Discrete(3, start=1))),
    (spaces.Sequence(spaces.Box(0, 1, (2,)), stack=True), spaces.Discrete(2)),
    (spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(3)), spaces.MultiBinary(2)),
    (
        spaces.Dict({"t": spaces.Text(3), "b": spaces.Box(0, 1, (2,))}),
        spaces.Dict({"t": spaces.Text(3), "d": spaces.Discrete(4, start=1)}),
    ),
]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=str)
@pytest.mark.parametrize("obs_space, act_space", FREE_SPACES, ids=lambda s: type(s).__name__)
def test_spaces_without_layout_on_serial_match_sync(obs_space, act_space, mode):
    fns = [partial(FreeSpaceEnv, obs_space, act_space)] * NUM_ENVS
    with side_by_side(fns, "serial", mode) as (sync, env):
        assert_same(env.reset(seed=3), sync.reset(seed=3), "reset")
        sync.action_space.seed(3)
        for t in range(5):
            actions = sync.action_space.sample()
            assert_same(env.step(actions), sync.step(actions), f"step {t}")


def test_spaces_without_layout_are_refused_by_shm_naming_the_space():
    fns = [partial(FreeSpaceEnv, spaces.Dict({"t": spaces.Text(3)}), spaces.Discrete(2))] * 2
    with pytest.raises(TypeError, match=r"Text\(") as info:
        vecaccel.make_vec(fns, backend="shm", num_workers=1)
    assert "serial" in str(info.value)
