"""Random space trees: shared-memory layout round-trips, action checking, and the shm backend."""

from __future__ import annotations

import contextlib
from functools import partial

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array
from helpers_envs import EchoEnv, assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from space_strategies import boxes

import vecaccel
from vecaccel.spaces import (
    ALIGNMENT,
    check_actions,
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


def leaf_spaces_of(space):
    if isinstance(space, spaces.Dict):
        for sub in space.spaces.values():
            yield from leaf_spaces_of(sub)
    elif isinstance(space, spaces.Tuple):
        for sub in space.spaces:
            yield from leaf_spaces_of(sub)
    else:
        yield space


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
