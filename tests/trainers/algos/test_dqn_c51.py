"""C51: the projection against a plain loop over atoms (Algorithm 1 of Bellemare et al., 2017),
the update by hand, and its defaults across save and load.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers import C51
from vecaccel.trainers.algos.dqn import categorical_projection
from vecaccel.trainers.replay.buffer import ReplaySample

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


CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


# -- the update, by hand -----------------------------------------------------------------------


class _RecordingBuffer:
    def __init__(self) -> None:
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def update_priorities(self, indices, priorities) -> None:
        self.calls.append((np.asarray(indices), np.asarray(priorities)))


class _LinearDistributions(torch.nn.Module):
    """Logits ``[N, actions, atoms]`` linear in the observation."""

    def __init__(self, actions: int, atoms: int) -> None:
        super().__init__()
        self.actions, self.atoms = actions, atoms
        self.linear = torch.nn.Linear(4, actions * atoms, bias=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs).view(-1, self.actions, self.atoms)


def test_c51_update_targets_by_hand():
    """C51's train step on 5 atoms over [-2, 2]: a terminal transition puts all the target mass
    on the reward's atom; a uniform next distribution with r = 0.5 and discount 0.5 projects to
    [0, .1, .4, .4, .1]. The loss (and the priorities) are the cross-entropies to these."""
    agent = C51(None, v_min=-2.0, v_max=2.0, num_atoms=5, prioritized=True, device="cpu",
                torch_threads=1, max_grad_norm=0.0)  # fmt: skip
    online, target = _LinearDistributions(2, 5), _LinearDistributions(2, 5)
    with torch.no_grad():
        online.linear.weight.copy_(torch.randn(10, 4, generator=torch.Generator().manual_seed(0)))
        target.linear.weight.zero_()  # uniform next distributions
    agent.q_network = agent.train_network = online
    agent.target_network = target
    agent.optimizer = torch.optim.SGD(online.parameters(), lr=0.0)
    agent.support = torch.linspace(-2.0, 2.0, 5)
    agent.buffer = _RecordingBuffer()
    eye = np.eye(4, dtype=np.float32)
    batch = ReplaySample(
        obs=eye[[0, 1]],
        action=np.array([1, 0]),
        reward=np.array([1.0, 0.5], np.float32),
        next_obs=eye[[2, 3]],
        discount=np.array([0.0, 0.5], np.float32),
        indices=np.array([3, 4]),
        weights=np.ones(2, np.float32),
    )
    metrics = agent.update(batch)
    targets = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.1, 0.4, 0.4, 0.1]])
    with torch.no_grad():
        log_probs = torch.log_softmax(online(torch.as_tensor(eye[[0, 1]])), -1)
    cross_entropy = -(targets * log_probs[[0, 1], [1, 0]]).sum(-1)
    assert metrics["losses/td_loss"] == pytest.approx(float(cross_entropy.mean()), rel=1e-5)
    (indices, priorities), = agent.buffer.calls  # fmt: skip
    np.testing.assert_allclose(priorities, cross_entropy.numpy(), rtol=1e-5)


def test_c51_class_defaults_survive_load(tmp_path):
    """A C51 agent saved and loaded stays categorical, with its support."""
    agent = C51(None, v_min=-5.0, v_max=5.0, num_atoms=11, device="cpu")
    agent.observation_space, agent.action_space = CARTPOLE_OBS, gym.spaces.Discrete(2)
    agent.build_networks()
    agent.save(tmp_path / "c51.pt")
    loaded = C51.load(tmp_path / "c51.pt")
    assert loaded.config.categorical and loaded.support.shape == (11,)
    obs = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(loaded.predict(obs)[0], agent.predict(obs)[0])
