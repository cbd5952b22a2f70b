"""The DQN family's update against references and numbers computed by hand: TD targets, losses
and priorities of every variant against a small independent implementation, the target network
left alone by an update.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from helpers import SMALL_DQN, serial_cartpole

from vecaccel.trainers.algos.dqn import (
    DQN,
    categorical_projection,
)
from vecaccel.trainers.replay.buffer import ReplaySample

torch.set_num_threads(1)


# -- the update ---------------------------------------------------------------------------------


CONFIGS = [
    dict(),
    dict(double=True),
    dict(dueling=True, loss="mse"),
    dict(prioritized=True, double=True, priority_alpha=0.7),
    dict(categorical=True, v_min=-5.0, v_max=5.0, num_atoms=11),
    dict(categorical=True, double=True, dueling=True, prioritized=True, num_atoms=11),
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda c: "-".join(sorted(c)) or "dqn")
def test_train_step_matches_reference(overrides) -> None:
    """Loss (Double/Dueling/Huber/MSE/C51, importance-weighted) recomputed from copies of the
    networks; prioritized replay then holds (|error| + eps) ** alpha at the sampled indices."""
    envs = serial_cartpole()
    try:
        agent = DQN(env=envs, **SMALL_DQN, n_step=2, gamma=0.9, max_grad_norm=0, **overrides)
        agent.learn(100)
    finally:
        envs.close()
    cfg = agent.config
    torch.manual_seed(0)
    with torch.no_grad():  # a target network distinct from the online one
        for p in agent.target_network.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _, batch = agent.sample_batch(0.5)
    online, target = copy.deepcopy(agent.q_network), copy.deepcopy(agent.target_network)
    rows = torch.arange(len(batch.indices))
    obs, next_obs = torch.as_tensor(batch.obs), torch.as_tensor(batch.next_obs)
    actions = torch.as_tensor(batch.action).long()
    rewards, discounts = torch.as_tensor(batch.reward), torch.as_tensor(batch.discount)
    weights = torch.as_tensor(batch.weights)
    with torch.no_grad():
        if cfg.categorical:
            support = torch.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms)
            target_probs = torch.softmax(target(next_obs), -1)
            chooser = torch.softmax(online(next_obs), -1) if cfg.double else target_probs
            next_actions = (chooser * support).sum(-1).argmax(1)
            projected = categorical_projection(
                target_probs[rows, next_actions], rewards, discounts, support
            )
            per_sample = -(projected * torch.log_softmax(online(obs)[rows, actions], -1)).sum(-1)
            priorities = per_sample
        else:
            chooser = online(next_obs) if cfg.double else target(next_obs)
            next_actions = chooser.argmax(1)
            y = rewards + discounts * target(next_obs)[rows, next_actions]
            error = y - online(obs)[rows, actions]
            if cfg.loss == "huber":
                per_sample = torch.where(error.abs() < 1, 0.5 * error**2, error.abs() - 0.5)
            else:
                per_sample = error**2
            priorities = error.abs()
        expected_loss = float((weights * per_sample).mean())
    stats = agent.update(batch)
    assert stats["losses/td_loss"] == pytest.approx(expected_loss, rel=1e-5)
    if cfg.prioritized:
        last = {}
        for i, index in enumerate(batch.indices.tolist()):
            last[index] = float(priorities[i])
        indices = np.array(sorted(last))
        expected = (np.array([last[i] for i in indices]) + cfg.priority_eps) ** cfg.priority_alpha
        np.testing.assert_allclose(agent.buffer.tree[indices], expected, rtol=1e-5)
    # the online network moved, the target did not
    assert any(
        not torch.equal(a, b) for a, b in zip(online.parameters(), agent.q_network.parameters())
    )
    for a, b in zip(target.parameters(), agent.target_network.parameters()):
        assert torch.equal(a, b)


# -- DQN family: targets, loss, priorities (hand-computed) -------------------------------------


class _RecordingBuffer:
    def __init__(self) -> None:
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def update_priorities(self, indices, priorities) -> None:
        self.calls.append((np.asarray(indices), np.asarray(priorities)))


@pytest.mark.parametrize(
    "double, loss, expected_td",
    [(True, "mse", [9.0, 1.0]), (False, "mse", [18.0, 1.0]), (True, "huber", [9.0, 1.0])],
)
def test_dqn_target_loss_and_priorities_by_hand(double, loss, expected_td):
    """Linear Q-networks with known weights: the (double) target, the terminal cut, the
    importance-weighted loss and the priorities handed to the buffer, computed by hand."""
    agent = DQN(None, double=double, loss=loss, prioritized=True, device="cpu",
                torch_threads=1, max_grad_norm=0.0)  # fmt: skip
    online = torch.nn.Linear(4, 2, bias=False)
    target = torch.nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        # rows are actions: Q(s, a) = W[a] . s
        online.weight.copy_(torch.tensor([[1.0, 0.5, 3.0, 0.0], [0.0, 2.0, 1.0, 0.0]]))
        target.weight.copy_(torch.tensor([[0.0, 0.0, 10.0, 0.0], [0.0, 0.0, 20.0, 0.0]]))
    agent.q_network = agent.train_network = online
    agent.target_network = target
    agent.optimizer = torch.optim.SGD(online.parameters(), lr=0.0)
    agent.support = None
    agent.buffer = _RecordingBuffer()
    eye = np.eye(4, dtype=np.float32)
    batch = ReplaySample(
        obs=eye[[0, 1]],  # Q(s0, 0) = 1, Q(s1, 1) = 2
        action=np.array([0, 1]),
        reward=np.array([1.0, 3.0], np.float32),
        next_obs=eye[[2, 3]],  # online argmax at s0' is 0, target's is 1; s1' is terminal
        discount=np.array([0.9, 0.0], np.float32),
        indices=np.array([7, 11]),
        weights=np.array([1.0, 0.5], np.float32),
    )
    # double: 1 + 0.9 * Q_target(s0', argmax_online = 0) = 10; plain: 1 + 0.9 * max = 19
    metrics = agent.update(batch)
    td = np.array(expected_td)
    per_sample = td**2 if loss == "mse" else np.where(td <= 1, 0.5 * td**2, td - 0.5)
    assert metrics["losses/td_loss"] == pytest.approx(np.mean([1.0, 0.5] * per_sample))
    assert metrics["losses/q_values"] == pytest.approx(1.5)
    (indices, priorities), = agent.buffer.calls  # fmt: skip
    np.testing.assert_array_equal(indices, [7, 11])
    np.testing.assert_allclose(priorities, td, rtol=1e-6)
