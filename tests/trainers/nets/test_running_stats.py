"""The running mean and variance: after any sequence of batches they are NumPy's over every
sample seen, and merging moments is merging samples."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.nets.running_stats import RunningMeanStd

SHAPES = st.sampled_from([(), (1,), (3,), (2, 2)])


@st.composite
def batches(draw) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """A sample shape and batches of random sizes (empty ones too) of values of any scale."""
    shape = draw(SHAPES)
    seed = draw(st.integers(0, 2**32 - 1))
    sizes = draw(st.lists(st.integers(0, 40), min_size=1, max_size=8))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    offset = draw(st.floats(-1e3, 1e3))
    rng = np.random.default_rng(seed)
    return shape, [offset + scale * rng.standard_normal((n, *shape)) for n in sizes]


@settings(max_examples=60, deadline=None)
@given(batches())
def test_statistics_are_numpys_over_all_samples(case) -> None:
    shape, parts = case
    stats = RunningMeanStd(shape)
    for part in parts:
        stats.update(part)
    seen = np.concatenate([part.reshape(-1, *shape) for part in parts])
    assert stats.count == len(seen)
    if len(seen) == 0:  # nothing seen: the identity of a normalisation
        assert np.all(stats.mean == 0.0) and np.all(stats.var == 1.0)
        return
    spread = float(np.abs(seen).max()) + 1.0
    np.testing.assert_allclose(stats.mean, seen.mean(axis=0), rtol=1e-9, atol=1e-12 * spread)
    np.testing.assert_allclose(stats.var, seen.var(axis=0), rtol=1e-7, atol=1e-9 * spread**2)


@settings(max_examples=40, deadline=None)
@given(batches(), st.integers(0, 8))
def test_merging_moments_is_merging_their_samples(case, split) -> None:
    """Two processes' moments merged (as the ranks' and the sampler's are) equal the moments of
    all their samples seen in one process."""
    shape, parts = case
    split = min(split, len(parts))
    mine, theirs, together = RunningMeanStd(shape), RunningMeanStd(shape), RunningMeanStd(shape)
    for part in parts[:split]:
        mine.update(part)
    for part in parts[split:]:
        theirs.update(part)
    for part in parts:
        together.update(part)
    mine.merge_from(theirs)
    assert mine.count == together.count
    np.testing.assert_allclose(mine.mean, together.mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(mine.var, together.var, rtol=1e-7, atol=1e-7)


def test_the_statistics_are_views_of_one_buffer_written_in_place() -> None:
    """What another process writes into the buffer is what the statistics say (the async
    sampler receives them so), and a copy or a pickle is independent of the original."""
    stats = RunningMeanStd((2,))
    buffer = stats.data
    stats.update(np.array([[1.0, 2.0], [3.0, 6.0]]))
    assert stats.data is buffer
    buffer[:] = [5.0, 6.0, 4.0, 9.0, 10.0]
    assert stats.mean.tolist() == [5.0, 6.0] and stats.var.tolist() == [4.0, 9.0]
    assert stats.count == 10.0
    for twin in (stats.copy(), pickle.loads(pickle.dumps(stats))):
        twin.update(np.zeros((1, 2)))
        assert twin.count == 11.0 and stats.count == 10.0
    stats.reset()
    assert stats.count == 0.0 and stats.var.tolist() == [1.0, 1.0]


def test_an_empty_batch_or_no_moments_change_nothing() -> None:
    stats = RunningMeanStd((3,))
    stats.update(np.ones((2, 3)))
    before = stats.data.copy()
    stats.update(np.zeros((0, 3)))
    stats.merge(np.full(3, 7.0), np.full(3, 2.0), 0)
    np.testing.assert_array_equal(stats.data, before)
