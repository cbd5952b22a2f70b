"""Periodic evaluation during training: when it runs, what it logs, and the best agent kept."""

from __future__ import annotations

import csv

import pytest
import torch

from vecaccel.trainers import DQN, PPO
from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
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


@pytest.mark.parametrize(("saved_best", "rewritten"), [(500.0, False), (-1.0, True)])
def test_a_resumed_run_replaces_best_pt_only_with_a_better_agent(saved_best, rewritten, tmp_path):
    """The best evaluation is in the checkpoint: a resumed run compares its evaluations with it.
    CartPole-v1's returns lie in [8, 500], so no evaluation beats a saved best of 500 and every
    one beats -1."""
    agent = _ppo(eval_every=32, eval_episodes=2, run_dir=str(tmp_path))
    try:
        agent.learn(64)
    finally:
        agent.close()
    checkpoint = tmp_path / CHECKPOINT_NAME
    state = load_checkpoint(checkpoint)
    assert state["best_eval_reward"] == agent.best_eval_reward is not None
    assert PPO.load(checkpoint).best_eval_reward == agent.best_eval_reward
    state["best_eval_reward"] = saved_best
    save_checkpoint(checkpoint, state)
    best_before = (tmp_path / BEST_NAME).read_bytes()

    resumed = PPO.load(tmp_path, env="CartPole-v1", run_dir=str(tmp_path))
    assert resumed.best_eval_reward == saved_best
    try:
        resumed.learn(32, reset_num_timesteps=False)
    finally:
        resumed.close()
    assert [step for step, _ in resumed.evaluations] == [96]
    assert ((tmp_path / BEST_NAME).read_bytes() != best_before) is rewritten
    mean = resumed.evaluations[-1][1]["eval/mean_reward"]
    assert resumed.best_eval_reward == (mean if rewritten else saved_best)
    best_step = load_checkpoint(tmp_path / BEST_NAME)["global_step"]
    assert best_step == 96 if rewritten else best_step in (32, 64)


def test_a_checkpoint_without_a_best_evaluation_loads_with_none(tmp_path):
    """A checkpoint without ``best_eval_reward`` (an earlier release's) has no best yet: the
    first evaluation of a run resumed from it writes ``best.pt``."""
    agent = _ppo()
    try:
        agent.learn(32)
        agent.best_eval_reward = 123.0
        state = load_checkpoint(agent.save(tmp_path / "agent.pt"))
    finally:
        agent.close()
    del state["best_eval_reward"]
    assert PPO.load(save_checkpoint(tmp_path / "old.pt", state)).best_eval_reward is None
