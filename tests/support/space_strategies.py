"""Hypothesis strategies for Gymnasium spaces, shared by the space tests."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from hypothesis import strategies as st


@st.composite
def boxes(
    draw,
    dtypes: list,
    min_dim: int = 1,
    int_span: int = 1000,
    float_lows: tuple = (-np.inf, -1.0, 0.0),
    float_highs: tuple = (np.inf, 1.0, 100.0),
):
    """A Box of one of ``dtypes``, of 0 to 3 dimensions of ``min_dim`` to 3 each.

    Integer bounds stay within ``int_span`` of 0: Gymnasium's own sampling overflows near the
    int64 limits.
    """
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    shape = draw(st.lists(st.integers(min_dim, 3), min_size=0, max_size=3).map(tuple))
    if dtype.kind == "b":
        return spaces.Box(0, 1, shape=shape, dtype=dtype)
    if dtype.kind == "f":
        low = draw(st.sampled_from(float_lows))
        high = draw(st.sampled_from(float_highs))
        return spaces.Box(low, high, shape=shape, dtype=dtype)
    info = np.iinfo(dtype)
    low = draw(st.integers(max(int(info.min), -int_span), min(int(info.max), int_span) - 1))
    high = draw(st.integers(low + 1, min(int(info.max), low + 2 * int_span)))
    return spaces.Box(low, high, shape=shape, dtype=dtype)


#: Leaves with no fixed size, as Gymnasium has them (a custom ``Space`` subclass is added by
#: :func:`payload_leaves`, which takes it as an argument: it lives with the toy envs).
@st.composite
def texts(draw):
    low = draw(st.integers(0, 2))
    return spaces.Text(draw(st.integers(max(low, 1), 5)), min_length=low, charset="abc xyz")


@st.composite
def graphs(draw):
    node = draw(st.sampled_from([spaces.Box(0, 1, (2,)), spaces.Discrete(3)]))
    edge = draw(st.sampled_from([None, spaces.Discrete(2), spaces.Box(-1, 1, (1,))]))
    return spaces.Graph(node, edge)


@st.composite
def sequences(draw, stack: bool | None = None):
    feature = draw(st.sampled_from([spaces.Discrete(4), spaces.Box(0, 1, (2,)), spaces.Text(3)]))
    if stack is None:
        stack = draw(st.booleans()) and not isinstance(feature, spaces.Text)
    return spaces.Sequence(feature, stack=stack)


@st.composite
def one_ofs(draw):
    options = draw(
        st.lists(
            st.sampled_from([spaces.Discrete(3), spaces.Box(0, 1, (2,)), spaces.Text(2)]),
            min_size=1,
            max_size=3,
        )
    )
    return spaces.OneOf(tuple(options))


def payload_leaves(custom: st.SearchStrategy | None = None) -> st.SearchStrategy:
    """Any leaf with no fixed size: ``Text``, ``Graph``, ``Sequence`` (stacked or not),
    ``OneOf``, and ``custom`` (a strategy of a space subclass vecaccel does not know)."""
    kinds = [texts(), graphs(), sequences(), one_ofs()]
    if custom is not None:
        kinds.append(custom)
    return st.one_of(*kinds)


def space_trees(leaves: st.SearchStrategy, max_leaves: int = 5) -> st.SearchStrategy:
    """``Dict``/``Tuple`` trees of ``leaves`` at any depth (a bare leaf included)."""
    keys = st.text(alphabet="abcdxyz_", min_size=1, max_size=3)
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, min_size=1, max_size=3).map(lambda s: spaces.Tuple(tuple(s))),
            st.dictionaries(keys, children, min_size=1, max_size=3).map(spaces.Dict),
        ),
        max_leaves=max_leaves,
    )
