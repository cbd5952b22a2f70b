"""Generalized advantage estimation against a plain loop and hand computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.algos.on_policy.advantages import compute_gae

torch.set_num_threads(1)


# -- GAE, by hand -------------------------------------------------------------------------------


class _NotCpu(torch.Tensor):
    """A CPU tensor that reports another device, to run compute_gae's torch (accelerator)
    recursion without an accelerator; the CPU path is NumPy's."""

    @property
    def device(self):
        return torch.device("meta")


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_gae_truncation_bootstraps_from_final_obs_and_termination_from_zero_by_hand(path):
    """gamma 0.9, lambda 0.5. Env 0 truncated at t=1 with V(final_obs)=10; env 1 terminated
    at t=1. Worked by hand:
    env 0: d2 = 3 + .9*4 - 1.5 = 5.1; d1 = 2 + .9*10 - 1 = 10 (chain cut); d0 = 1 + .9 - .5 = 1.4,
           A0 = 1.4 + .45*10 = 5.9
    env 1: d2 = 1 + 3.6 - 2 = 2.6; d1 = 1 + 0 - 2 = -1; d0 = 1 + 1.8 - 2 = .8, A0 = .8 - .45 = .35
    """
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 2.0], [1.0, 2.0], [1.5, 2.0]])
    terminated = torch.tensor([[False, False], [False, True], [False, False]])
    truncated = torch.tensor([[False, False], [True, False], [False, False]])
    wrap = (lambda x: x) if path == "numpy" else (lambda x: x.as_subclass(_NotCpu))
    advantages, returns = compute_gae(
        wrap(rewards), wrap(values), wrap(torch.tensor([4.0, 4.0])), wrap(terminated),
        wrap(truncated), wrap(torch.tensor([10.0])), torch.tensor([[1, 0]]), 0.9, 0.5,
    )  # fmt: skip
    advantages = advantages.as_subclass(torch.Tensor)
    returns = returns.as_subclass(torch.Tensor)
    expected = torch.tensor([[5.9, 0.35], [10.0, -1.0], [5.1, 2.6]])
    torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(returns, expected + values, rtol=1e-6, atol=1e-5)


# -- GAE against a plain loop ------------------------------------------------------------------


def reference_gae(rewards, values, next_value, terminated, truncated, finals, gamma, lam):
    """Forward definition: A_t = sum_l (gamma*lam)^l delta_{t+l}, up to the episode's end."""
    T, B = rewards.shape
    advantages = np.zeros((T, B))
    for b in range(B):
        deltas = []
        for t in range(T):
            if terminated[t, b]:
                bootstrap = 0.0
            elif truncated[t, b]:
                bootstrap = finals[(t, b)]
            else:
                bootstrap = values[t + 1, b] if t + 1 < T else next_value[b]
            deltas.append(rewards[t, b] + gamma * bootstrap - values[t, b])
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                total += weight * deltas[k]
                if terminated[k, b] or truncated[k, b]:
                    break
                weight *= gamma * lam
            advantages[t, b] = total
    return advantages


@settings(max_examples=60, deadline=None)
@given(
    T=st.integers(1, 7),
    B=st.integers(1, 3),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
    data=st.data(),
)
def test_gae_matches_reference_loop(T, B, gamma, lam, data):
    floats = st.floats(-10, 10, allow_nan=False, width=32)
    rewards = np.array(data.draw(st.lists(floats, min_size=T * B, max_size=T * B))).reshape(T, B)
    values = np.array(data.draw(st.lists(floats, min_size=T * B, max_size=T * B))).reshape(T, B)
    next_value = np.array(data.draw(st.lists(floats, min_size=B, max_size=B)))
    flags = st.lists(st.sampled_from([0, 0, 0, 1, 2, 3]), min_size=T * B, max_size=T * B)
    kinds = np.array(data.draw(flags)).reshape(T, B)  # 1 terminated, 2 truncated, 3 both
    terminated = (kinds == 1) | (kinds == 3)
    truncated = (kinds == 2) | (kinds == 3)
    final_index = [
        (t, b) for t in range(T) for b in range(B) if truncated[t, b] and not terminated[t, b]
    ]
    final_values = np.array(
        data.draw(st.lists(floats, min_size=len(final_index), max_size=len(final_index)))
    )
    finals = dict(zip(final_index, final_values))

    advantages, returns = compute_gae(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(next_value, dtype=torch.float64),
        torch.tensor(terminated),
        torch.tensor(truncated),
        torch.tensor(final_values, dtype=torch.float64),
        torch.tensor(final_index, dtype=torch.int64).reshape(-1, 2),
        gamma,
        lam,
    )
    expected = reference_gae(rewards, values, next_value, terminated, truncated, finals, gamma, lam)
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(returns.numpy(), expected + values, rtol=1e-4, atol=1e-3)
