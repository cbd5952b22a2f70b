"""The C51 projection against a plain loop over atoms (Algorithm 1 of Bellemare et al., 2017)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.dqn import categorical_projection

torch.set_num_threads(1)


def reference_projection(
    probs: np.ndarray, rewards: np.ndarray, discounts: np.ndarray, v_min: float, v_max: float
) -> np.ndarray:
    """Algorithm 1, one transition and one atom at a time."""
    batch, atoms = probs.shape
    delta = (v_max - v_min) / (atoms - 1)
    out = np.zeros_like(probs)
    for i in range(batch):
        for j in range(atoms):
            z = v_min + j * delta
            tz = min(v_max, max(v_min, rewards[i] + discounts[i] * z))
            b = min((tz - v_min) / delta, atoms - 1)  # b <= N - 1 exactly, rounding aside
            lower, upper = math.floor(b), math.ceil(b)
            if lower == upper:
                out[i, lower] += probs[i, j]
            else:
                out[i, lower] += probs[i, j] * (upper - b)
                out[i, upper] += probs[i, j] * (b - lower)
    return out


@st.composite
def projection_cases(draw: st.DrawFn):
    atoms = draw(st.integers(2, 51))
    batch = draw(st.integers(1, 6))
    v_min = draw(st.floats(-50, 10, allow_nan=False))
    v_max = v_min + draw(st.floats(0.5, 60, allow_nan=False))
    weights = draw(
        st.lists(
            st.lists(st.floats(0, 1, allow_nan=False), min_size=atoms, max_size=atoms),
            min_size=batch,
            max_size=batch,
        )
    )
    probs = np.array(weights) + 1e-3
    probs /= probs.sum(axis=1, keepdims=True)
    # rewards from far below v_min to far above v_max, atoms landing exactly on atoms included
    delta = (v_max - v_min) / (atoms - 1)
    reward = st.one_of(
        st.floats(v_min - 30, v_max + 30, allow_nan=False),
        st.integers(-atoms, atoms).map(lambda k: k * delta),
    )
    rewards = np.array(draw(st.lists(reward, min_size=batch, max_size=batch)))
    discount = st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1, allow_nan=False))
    discounts = np.array(draw(st.lists(discount, min_size=batch, max_size=batch)))
    return probs, rewards, discounts, v_min, v_max


@settings(max_examples=300, deadline=None)
@given(projection_cases())
def test_projection_matches_reference_loop(case) -> None:
    probs, rewards, discounts, v_min, v_max = case
    atoms = probs.shape[1]
    support = torch.linspace(v_min, v_max, atoms, dtype=torch.float64)
    projected = categorical_projection(
        torch.tensor(probs), torch.tensor(rewards), torch.tensor(discounts), support
    ).numpy()
    expected = reference_projection(probs, rewards, discounts, v_min, v_max)
    # an atom landing within rounding of a grid point splits off a rounding-sized mass at most
    np.testing.assert_allclose(projected.sum(axis=1), 1.0, rtol=1e-9)
    assert projected.min() >= -1e-12
    np.testing.assert_allclose(projected, expected, atol=1e-6)


def test_projection_float32_and_exact_cases() -> None:
    support = torch.linspace(-10, 10, 41)  # atoms 0.5 apart, exact in binary
    probs = torch.softmax(torch.randn(4, 41, generator=torch.Generator().manual_seed(0)), -1)
    rewards = torch.tensor([0.0, 1.0, 100.0, -100.0])
    discounts = torch.tensor([1.0, 0.0, 0.99, 0.99])
    projected = categorical_projection(probs, rewards, discounts, support)
    assert projected.dtype == torch.float32
    torch.testing.assert_close(projected.sum(-1), torch.ones(4))
    # discount 1, reward 0: the distribution is unchanged
    torch.testing.assert_close(projected[0], probs[0])
    # terminal: all the mass on the reward (1.0 is atom 22, exactly)
    assert projected[1, 22].item() == pytest.approx(1.0)
    # clipped to the edges of the support
    assert projected[2, -1].item() == pytest.approx(1.0)
    assert projected[3, 0].item() == pytest.approx(1.0)
    np.testing.assert_allclose(
        projected.double().numpy(),
        reference_projection(
            probs.double().numpy(), rewards.double().numpy(), discounts.double().numpy(), -10, 10
        ),
        atol=1e-5,
    )
