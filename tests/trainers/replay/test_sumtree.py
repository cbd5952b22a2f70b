"""Properties of the batch sum tree behind prioritized replay."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.replay.sumtree import SumTree

torch.set_num_threads(1)

priorities = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def trees_with_updates(draw: st.DrawFn) -> tuple[int, list[tuple[np.ndarray, np.ndarray]]]:
    capacity = draw(st.integers(1, 70))
    index = st.integers(0, capacity - 1)
    batches = draw(
        st.lists(
            st.lists(st.tuples(index, priorities), min_size=1, max_size=20), min_size=1, max_size=6
        )
    )
    updates = [
        (np.array([i for i, _ in b], dtype=np.int64), np.array([p for _, p in b])) for b in batches
    ]
    return capacity, updates


def _apply(tree: SumTree, capacity: int, updates) -> np.ndarray:
    """Apply the batches to the tree and to a plain array updated one item at a time."""
    reference = np.zeros(capacity)
    for indices, values in updates:
        tree.update(indices, values)
        for i, p in zip(indices, values):
            reference[i] = p
    return reference


@settings(max_examples=150, deadline=None)
@given(trees_with_updates())
def test_total_and_leaves_match_sequential_updates(case) -> None:
    capacity, updates = case
    tree = SumTree(capacity)
    reference = _apply(tree, capacity, updates)
    np.testing.assert_array_equal(tree.priorities(), reference)
    assert tree.total() == pytest.approx(reference.sum(), rel=1e-12, abs=1e-9)
    positive = reference[reference > 0]
    assert tree.min() == (positive.min() if positive.size else np.inf)
    # every internal node is the sum of its children (update consistency)
    internal = np.arange(1, tree.size)
    np.testing.assert_allclose(
        tree._sum[internal], tree._sum[2 * internal] + tree._sum[2 * internal + 1], rtol=1e-12
    )


@settings(max_examples=150, deadline=None)
@given(trees_with_updates(), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30))
def test_find_matches_prefix_sum_search(case, fractions) -> None:
    capacity, updates = case
    tree = SumTree(capacity)
    reference = _apply(tree, capacity, updates)
    if reference.sum() == 0:
        with pytest.raises(ValueError, match="zero"):
            tree.find(np.array([0.0]))
        return
    values = np.array(fractions) * tree.total()
    found = tree.find(values)
    assert np.all(reference[found] > 0), "a zero-priority leaf was returned"
    cumulative = np.cumsum(reference)
    expected = np.searchsorted(cumulative, values, side="right")
    # away from segment boundaries (where rounding may go either way) it is the exact leaf
    interior = np.array(
        [
            min(abs(v - c) for c in np.concatenate([[0.0], cumulative]))
            > 1e-9 * (1 + reference.sum())
            for v in values
        ]
    )
    inside = interior & (expected < capacity)
    np.testing.assert_array_equal(found[inside], expected[inside])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=2, max_size=12), st.booleans())
def test_sampling_is_proportional(weights, stratified) -> None:
    weights = np.array(weights)
    if weights.sum() < 1e-3:
        weights[0] = 1.0
    tree = SumTree(len(weights))
    tree.update(np.arange(len(weights)), weights)
    rng = np.random.default_rng(0)
    draws = 40_000
    counts = np.bincount(tree.sample(draws, rng, stratified=stratified), minlength=len(weights))
    expected = weights / weights.sum()
    assert np.all(counts[weights == 0] == 0)
    # five standard deviations of a binomial count
    tolerance = 5 * np.sqrt(draws * expected * (1 - expected)) + 1
    assert np.all(np.abs(counts - draws * expected) <= tolerance)


def test_duplicate_indices_last_write_wins() -> None:
    tree = SumTree(5)
    tree.update(np.array([2, 2, 3, 2]), np.array([1.0, 5.0, 2.0, 7.0]))
    assert tree[np.array([2, 3])].tolist() == [7.0, 2.0]
    assert tree.total() == 9.0


def test_invalid_updates_raise() -> None:
    tree = SumTree(3)
    with pytest.raises(IndexError):
        tree.update(np.array([3]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([np.nan]))


def test_values_past_total_never_hit_empty_leaves() -> None:
    tree = SumTree(6)
    tree.update(np.array([0, 2]), np.array([0.1, 0.2]))
    found = tree.find(np.array([0.3, 0.3 + 1e-12, 5.0, 0.1]))
    assert set(found.tolist()) <= {0, 2}
    assert found[-1] == 2


def test_array_factory_is_used() -> None:
    made = []

    def factory(shape, dtype):
        array = np.zeros(shape, dtype)
        made.append(array)
        return array

    tree = SumTree(4, factory)
    tree.update(np.array([1]), np.array([3.0]))
    assert len(made) == 2 and made[0][1] == 3.0
    assert tree.nbytes == SumTree.estimate_nbytes(4)


def test_sumtree_single_leaf_and_stratified_coverage() -> None:
    tree = SumTree(1)
    tree.update(np.array([0]), np.array([2.5]))
    assert tree.total() == 2.5 and tree.min() == 2.5
    assert tree.sample(5, np.random.default_rng(0)).tolist() == [0] * 5
    tree = SumTree(7)
    tree.update(np.arange(7), np.ones(7))
    # stratified: one draw per equal segment, so 7 draws over 7 equal leaves hit every leaf once
    drawn = tree.sample(7, np.random.default_rng(1), stratified=True)
    assert sorted(drawn.tolist()) == list(range(7))
    tree.update(np.array([3]), np.array([0.0]))
    assert tree.min() == 1.0 and tree.total() == 6.0
    assert 3 not in tree.sample(1000, np.random.default_rng(2)).tolist()
