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
