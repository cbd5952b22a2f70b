"""Spaces: shared-memory layout round-trips, action checking, and random space trees on every
backend beside ``SyncVectorEnv``.
"""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from functools import partial
from typing import Any

import numpy as np
import pytest
from backend_matrix import backend_of, options_for, select
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from helpers import assert_same, reorder_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from space_strategies import boxes
from toy_envs import (
    ConstObsEnv,
    EchoEnv,
    FreeSpaceEnv,
    PreviousActionEnv,
    ReusedInfoEnv,
    ShortTupleEnv,
    SpaceEnv,
)

import vecaccel
from vecaccel.spaces import (
    ALIGNMENT,
    check_actions,
    item_reader,
    leaf_specs,
    nbytes_of,
    read_item,
    views_from_buffer,
    write_item,
)

BOX_DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.uint8,
    np.int16,
    np.int32,
    np.int64,
    np.uint32,
    np.bool_,
]


@st.composite
def discretes(draw):
    return spaces.Discrete(draw(st.integers(1, 10)), start=draw(st.integers(-5, 5)))


@st.composite
def multi_discretes(draw):
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple))
    nvec = draw(
        st.lists(st.integers(1, 6), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))
    )
    start = draw(st.integers(-3, 3))
    nvec = np.array(nvec, dtype=np.int64).reshape(shape)
    return spaces.MultiDiscrete(nvec, start=np.full(shape, start, dtype=np.int64))


@st.composite
def multi_binaries(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2))
    return spaces.MultiBinary(shape[0] if len(shape) == 1 else shape)


leaf_spaces = st.one_of(boxes(BOX_DTYPES), discretes(), multi_discretes(), multi_binaries())

keys = st.text(alphabet="abcdefgh_", min_size=1, max_size=4)

space_trees = st.recursive(
    leaf_spaces,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda s: spaces.Tuple(tuple(s))),
        st.dictionaries(keys, children, min_size=1, max_size=3).map(spaces.Dict),
    ),
    max_leaves=6,
)


def samples(space: spaces.Space, n: int, seed: int) -> list:
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def leaves(tree):
    if isinstance(tree, np.ndarray):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from leaves(value)
    else:
        for value in tree:
            yield from leaves(value)


# ---------------------------------------------------------------------------------------------
# layout -> write -> read


@settings(max_examples=150, deadline=None)
@given(space=space_trees, n=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_layout_write_read_round_trip(space, n, seed):
    spec = leaf_specs(space, n)
    buffer = bytearray(nbytes_of(spec) + ALIGNMENT)
    base = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    views, end = views_from_buffer(spec, buffer)
    assert end <= len(buffer)
    for view in leaves(views):
        assert (view.ctypes.data - base) % ALIGNMENT == 0  # every array starts on a cache line

    values = samples(space, n, seed)
    for i, value in enumerate(values):
        write_item(space, views, i, value)
    for i, value in enumerate(values):  # nothing overwrote anything: the arrays are disjoint
        item = read_item(views, i)
        expected = concatenate(space, [value], create_empty_array(space, 1))
        assert_same(
            _unbatch_first(item),
            _unbatch_first(read_item(expected, 0)),
            f"slot {i}",
        )
    # the views are exactly what Gymnasium batches, dtypes included
    batched = concatenate(space, values, create_empty_array(space, n))
    assert_same(views, batched, "batched views")
    assert batch_space(space, n).contains(views)


def _unbatch_first(tree):
    """Turn numpy scalars read from slot ``i`` into 0-d arrays so dtypes compare strictly."""
    if isinstance(tree, dict):
        return {k: _unbatch_first(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_unbatch_first(v) for v in tree)
    return np.asarray(tree)


# ---------------------------------------------------------------------------------------------
# check_actions


@settings(max_examples=150, deadline=None)
@given(space=space_trees, n=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_check_actions_round_trip(space, n, seed):
    batched = concatenate(space, samples(space, n, seed), create_empty_array(space, n))
    checked = check_actions(space, batched, n)
    assert_same(checked, batched)


@settings(max_examples=100, deadline=None)
@given(space=space_trees, n=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_check_actions_returns_space_dtypes_from_lists(space, n, seed):
    """Python lists (and other dtypes of the same kind) come back as arrays of the space's dtype."""
    batched = concatenate(space, samples(space, n, seed), create_empty_array(space, n))
    as_lists = _to_lists(batched)
    checked = check_actions(space, as_lists, n)
    assert_same(checked, batched)


def _to_lists(tree):
    if isinstance(tree, dict):
        return {k: _to_lists(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_to_lists(v) for v in tree)
    return tree.tolist()


BAD_ACTIONS = [
    # (space, bad batch of 3, the env index the message must name or None)
    (spaces.Discrete(3), np.array([0, 3, 1]), 1),
    (spaces.Discrete(3, start=-1), np.array([-1, 1, -2]), 2),
    (spaces.MultiDiscrete([2, 3]), np.array([[0, 0], [1, 2], [0, 3]]), 2),
    (spaces.MultiDiscrete([2, 3]), np.array([[0, -1], [1, 2], [0, 0]]), 0),
    (spaces.MultiBinary(2), np.array([[0, 1], [2, 0], [1, 1]]), 1),
    (spaces.MultiBinary(2), np.array([[0, 1], [1, 0], [1, -1]]), 2),
    (spaces.Discrete(3), np.array([0.0, 1.0, 2.0]), None),  # floats for a Discrete
    (spaces.Discrete(3), np.array([0, 1]), None),  # wrong batch size
    (spaces.Box(-1, 1, (2,), np.float32), np.zeros((3, 3)), None),  # wrong shape
    (spaces.Box(-1, 1, (2,), np.float32), np.zeros((3, 2), dtype=np.complex64), None),
    (spaces.Box(0, 9, (2,), np.int32), np.zeros((3, 2), dtype=np.float64), None),
    (spaces.Box(0, 9, (2,), np.int32), np.array([["a", "b"]] * 3), None),  # strings
    (spaces.Box(0, 255, (1,), np.uint8), np.array([[1], [300], [2]]), 1),  # does not fit
    (spaces.Box(0, 9, (1,), np.int8), np.array([[1], [2], [-200]]), 2),  # does not fit
]


@pytest.mark.parametrize("space, actions, env_index", BAD_ACTIONS, ids=str)
def test_bad_actions_raise_value_error(space, actions, env_index):
    with pytest.raises(ValueError) as info:
        check_actions(space, actions, 3)
    message = str(info.value)
    assert str(space) in message, message
    if env_index is not None:
        assert f"env {env_index}" in message, message


def test_bad_action_in_nested_space_names_the_leaf():
    space = spaces.Dict({"a": spaces.Tuple((spaces.Box(-1, 1, (1,)), spaces.Discrete(2)))})
    actions = {"a": (np.zeros((2, 1), np.float32), np.array([0, 5]))}
    with pytest.raises(ValueError) as info:
        check_actions(space, actions, 2)
    message = str(info.value)
    assert "Discrete(2)" in message and "env 1" in message and "'a'" in message, message
    with pytest.raises(ValueError):
        check_actions(space, {"b": actions["a"]}, 2)  # wrong key
    with pytest.raises(ValueError):
        check_actions(space, {"a": actions["a"][:1]}, 2)  # wrong arity


def test_check_actions_env_ids_label_the_env():
    with pytest.raises(ValueError, match="env 7"):
        check_actions(spaces.Discrete(2), np.array([0, 2]), 2, env_ids=[4, 7])


# ---------------------------------------------------------------------------------------------
# through the shm backend: an env echoing its action as its observation


def _echo_envs(space, n, backend="shm", **options):
    return vecaccel.make_vec([partial(EchoEnv, space)] * n, backend=backend, **options)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(space=space_trees, n=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_actions_round_trip_through_shm(space, n, seed):
    with contextlib.closing(_echo_envs(space, n, num_workers=2)) as envs:
        assert envs.single_observation_space == space
        obs, _ = envs.reset(seed=seed)
        assert envs.observation_space.contains(obs)
        for step in range(2):
            actions = concatenate(
                space, samples(space, n, seed + step), create_empty_array(space, n)
            )
            obs, rew, term, trunc, infos = envs.step(actions)
            assert_same(obs, actions, f"step {step}")
            assert infos == {}


def test_shm_rejects_bad_actions_and_stays_usable(leak_check):
    space = spaces.Dict(
        {
            "d": spaces.Discrete(3, start=1),
            "m": spaces.MultiDiscrete([2, 4]),
            "b": spaces.MultiBinary(2),
            "x": spaces.Box(-1, 1, (2,), np.float32),
        }
    )
    with contextlib.closing(_echo_envs(space, 3, num_workers=2)) as envs:
        envs.reset(seed=0)
        good = envs.action_space.sample()
        bad_cases = {
            "d": (np.array([1, 2, 4]), "env 2"),
            "m": (np.array([[0, 0], [2, 0], [1, 3]]), "env 1"),
            "b": (np.array([[0, 1], [1, 1], [0, 7]]), "env 2"),
            "x": (np.zeros((3, 5), np.float32), "shape"),
        }
        for key, (value, needle) in bad_cases.items():
            actions = {**good, key: value}
            with pytest.raises(ValueError) as info:
                envs.step(actions)
            assert needle in str(info.value)
            assert str(space[key]) in str(info.value)
        with pytest.raises(ValueError):
            envs.step({k: v for k, v in good.items() if k != "x"})  # missing key
        obs, *_ = envs.step(good)
        assert_same(obs, good)


NUM_ENVS = 3

#: every backend that takes and returns NumPy arrays, under fork
ALL_BACKENDS = select(tensors=False)

PROCESS_BACKENDS = select(worker_processes=True, tensors=False)


def in_arrival_order(backend: str) -> bool:
    """Whether ``backend`` returns its envs as they finish, naming them in ``info["env_id"]``."""
    return backend_of(backend).partial_batches


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


def _reorder(tree: Any, order: np.ndarray) -> Any:
    """Put a batch returned in arrival order (async) back into env order."""
    return _map_arrays(tree, lambda array: array[order])


def make_backend(fns, backend: str, mode=AutoresetMode.NEXT_STEP, **extra):
    return vecaccel.make_vec(
        fns, backend=backend, autoreset_mode=mode, **options_for(backend, context="fork"), **extra
    )


def vreset(env, backend: str, **kwargs):
    obs, infos = env.reset(**kwargs)
    if in_arrival_order(backend):
        order = np.argsort(infos.pop("env_id"))
        obs, infos = _reorder(obs, order), _reorder(infos, order)
    return obs, infos


def vstep(env, backend: str, actions):
    if in_arrival_order(backend):
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
# strategies: every leaf space, scalar and zero-size shapes, Dict keys in any order

EDGE_BOX_DTYPES = [
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
def edge_discretes(draw):
    dtype = draw(st.sampled_from([np.int64, np.int32, np.int8]))
    return spaces.Discrete(draw(st.integers(1, 6)), start=draw(st.integers(-4, 4)), dtype=dtype)


@st.composite
def edge_multi_discretes(draw):
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple))
    size = int(np.prod(shape))
    nvec = np.array(draw(st.lists(st.integers(1, 5), min_size=size, max_size=size)))
    start = np.array(draw(st.lists(st.integers(-3, 3), min_size=size, max_size=size)))
    return spaces.MultiDiscrete(nvec.reshape(shape), start=start.reshape(shape))


@st.composite
def edge_multi_binaries(draw):
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    return spaces.MultiBinary(shape[0] if len(shape) == 1 else shape)


@st.composite
def edge_dicts(draw, children):
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
edge_leaf_spaces = st.one_of(
    boxes(
        EDGE_BOX_DTYPES,
        min_dim=0,
        int_span=100,
        float_lows=(-np.inf, -2.0, 0.0),
        float_highs=(np.inf, 1.0, 50.0),
    ),
    edge_discretes(),
    edge_multi_discretes(),
    edge_multi_binaries(),
)  # fmt: skip, edge_multi_discretes(), edge_multi_binaries())

edge_space_trees = st.recursive(
    edge_leaf_spaces,
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda s: spaces.Tuple(tuple(s))),
        edge_dicts(children),
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
    obs_space=edge_space_trees,
    act_space=edge_space_trees,
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
@given(space=edge_space_trees, n=st.integers(1, 4), seed=st.integers(0, 2**20))
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
        ids = infos["env_id"] if in_arrival_order(backend) else np.arange(NUM_ENVS)

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
        if in_arrival_order(backend):
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
# 8. spaces without a fixed layout: every backend matches Sync
#    (tests/vecaccel/spaces/test_payload.py covers each kind, nested, in every autoreset mode and
#    start method)


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


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=str)
@pytest.mark.parametrize("obs_space, act_space", FREE_SPACES, ids=lambda s: type(s).__name__)
def test_spaces_without_layout_match_sync(obs_space, act_space, mode, backend):
    fns = [partial(FreeSpaceEnv, obs_space, act_space)] * NUM_ENVS
    with side_by_side(fns, backend, mode) as (sync, env):
        obs, infos = env.reset(seed=3)
        if in_arrival_order(backend):
            order = np.argsort(infos.pop("env_id"))
            obs, infos = reorder_batch(env.single_observation_space, obs, order), infos
            infos = _reorder(infos, order)
        assert_same((obs, infos), sync.reset(seed=3), "reset")
        sync.action_space.seed(3)
        for t in range(5):
            actions = sync.action_space.sample()
            assert_same(vstep(env, backend, actions), sync.step(actions), f"step {t}")


def test_layout_of_spaces_without_layout_is_refused_by_leaf_specs_naming_the_space():
    """``leaf_specs`` lays out fixed spaces only (what plugins with their own buffers use);
    ``vecaccel.spaces.payload.layout_specs`` lays out any space."""
    with pytest.raises(TypeError, match=r"Text\(") as info:
        leaf_specs(spaces.Dict({"t": spaces.Text(3)}), 2)
    assert "layout_specs" in str(info.value)
