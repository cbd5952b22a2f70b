"""The on-policy family's side of the synchronous loop: one update per rollout batch, on every
backend, the learning rate annealed per update as CleanRL does, a metric row every
``log_every_steps`` env steps, the run's CSV and checkpoint.
"""

from __future__ import annotations

import csv

import pytest
import torch

import vecaccel
from vecaccel.trainers import A2C, PPO

torch.set_num_threads(1)

ALGORITHMS = [PPO, A2C]

TINY = dict(num_envs=2, num_steps=8, num_workers=2, seed=0, torch_threads=1)


def parameters(agent) -> list[torch.Tensor]:
    return [p.detach().clone() for p in agent.model.parameters()]


def backend_params() -> list:
    params = []
    for name in sorted(vecaccel.list_backends()):
        marks = []
        if name == "async":
            marks = [pytest.mark.skip(reason="steps a subset of envs per call; no [T, B] batch")]
        elif name == "ray":
            marks = [
                pytest.mark.skip(reason="tests/plugins/ray/test_vec_env.py trains on its cluster")
            ]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_smoke_every_backend(algo, backend, tmp_path):
    agent = algo("CartPole-v1", backend=backend, run_dir=tmp_path, tensorboard=False, **TINY)
    try:
        before = parameters(agent)
        agent.learn(total_timesteps=48)
    finally:
        agent.close()
    assert agent.global_step == 48
    assert any(not torch.equal(a, b) for a, b in zip(before, parameters(agent)))
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert (
        rows
        and {
            "charts/SPS",
            "stats/env_share",
            "stats/policy_share",
            "losses/value_loss",
            "losses/policy_loss",
        }
        <= rows[0].keys()
    )
    assert (tmp_path / "checkpoint.pt").exists()


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_lr_anneals_linearly_per_update_as_cleanrl(algo):
    """CleanRL: lr_i = lr * (1 - i / num_iterations), i = 0..N-1, set before the rollout."""
    seen = []
    agent = algo("CartPole-v1", backend="serial", num_envs=2, num_steps=4, torch_threads=1,
                 seed=0, learning_rate=1e-3, anneal_lr=True,
                 **({"update_epochs": 1, "num_minibatches": 1} if algo is PPO else {}))  # fmt: skip
    try:
        agent.learn(
            40,  # 5 updates of 8
            callback=lambda a, m: seen.append(
                (m["charts/learning_rate"], a.optimizer.param_groups[0]["lr"], a.optimizer.steps)
            ),
        )
    finally:
        agent.close()
    expected = [1e-3 * (1 - i / 5) for i in range(5)]
    assert [s[0] for s in seen] == pytest.approx(expected)
    assert [s[1] for s in seen] == pytest.approx(expected)
    assert [s[2] for s in seen] == [1, 2, 3, 4, 5], "one optimizer step per rollout"


def test_on_policy_logs_every_log_every_steps():
    agent = A2C("CartPole-v1", backend="serial", num_envs=1, num_steps=4, log_every_steps=12)
    try:
        agent.learn(4 * 12)
        steps = [row["step"] for row in agent.logger.history]
        # every third update, and any update in which an episode ended
        assert {12, 24, 36, 48} <= set(steps)
    finally:
        agent.close()
