"""Periodic evaluation during training: when it runs, what it logs, and the best agent kept."""

from __future__ import annotations

import csv

import pytest
import torch

from vecaccel.trainers import DQN, PPO
from vecaccel.trainers.runners.evaluation import BEST_NAME

torch.set_num_threads(1)


def _ppo(**options):
    return PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=16, torch_threads=1,
               progress=False, tensorboard=False, seed=2, **options)  # fmt: skip


def test_evaluations_come_every_n_steps_and_are_logged(tmp_path):
    agent = _ppo(eval_every=64, eval_episodes=2, run_dir=str(tmp_path))
    try:
        agent.learn(160)
    finally:
        agent.close()
    assert [step for step, _ in agent.evaluations] == [64, 128]
    rows = [
        row for row in csv.DictReader(open(tmp_path / "metrics.csv")) if row["eval/mean_reward"]
    ]
    assert [int(row["step"]) for row in rows] == [64, 128]
    for (_, metrics), row in zip(agent.evaluations, rows):
        assert float(row["eval/mean_reward"]) == pytest.approx(metrics["eval/mean_reward"])
        assert metrics["eval/std_reward"] >= 0 and metrics["eval/mean_ep_length"] >= 8
    best = max(metrics["eval/mean_reward"] for _, metrics in agent.evaluations)
    assert agent.evaluations[-1][1]["eval/best_mean_reward"] == best == agent.best_eval_reward
    loaded = PPO.load(tmp_path / BEST_NAME)
    try:
        assert loaded.global_step in (64, 128)
    finally:
        loaded.close()


def _trained(**options):
    """An agent trained 96 steps (each agent seeds the global generators when it is made: one
    is made and trained before the next)."""
    agent = _ppo(**options)
    try:
        agent.learn(96)
    finally:
        agent.close()
    return agent


def test_evaluation_is_deterministic_and_leaves_training_as_it_was():
    plain = _trained()
    evaluated = _trained(eval_every=32, eval_episodes=2)
    for a, b in zip(plain.model.parameters(), evaluated.model.parameters()):
        assert torch.equal(a, b)
    assert _trained(eval_every=32, eval_episodes=2).evaluations == evaluated.evaluations


def test_the_dqn_family_and_the_async_runner_evaluate_too(tmp_path):
    agent = DQN("CartPole-v1", backend="serial", num_envs=2, learning_starts=8, batch_size=8,
                buffer_size=200, eval_every=20, eval_episodes=1, torch_threads=1,
                progress=False, tensorboard=False)  # fmt: skip
    try:
        agent.learn(40)
    finally:
        agent.close()
    assert [step for step, _ in agent.evaluations] == [20, 40]
    runner = _ppo(eval_every=64, eval_episodes=1)
    try:
        runner.learn(128, mode="async", context="fork")
    finally:
        runner.close()
    assert [step for step, _ in runner.evaluations] == [64, 128]


def test_settings_that_cannot_evaluate_are_refused():
    with pytest.raises(ValueError, match="eval_every must be an integer >= 0"):
        _ppo(eval_every=-1)
    with pytest.raises(ValueError, match="eval_episodes must be a positive integer"):
        _ppo(eval_every=10, eval_episodes=0)
