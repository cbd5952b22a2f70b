"""A2C: one RMSprop step per batch on the policy gradient, the value regression and the entropy
bonus, by hand and against SB3's A2C (one update, and whole runs given the same random draws),
and CartPole learning. What it shares with PPO (the family's base and loop):
``on_policy/test_base.py``, ``on_policy/test_loop.py``.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import best_rolling_return
from sb3_twins import (
    assert_one_update_matches_sb3,
    inverse_cdf_sample,
    learn_side_by_side,
    sb3_parameter_pairs,
    short_cartpole,
)

import vecaccel
from vecaccel.sampler import SampleBatch
from vecaccel.trainers import A2C

torch.set_num_threads(1)

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def test_one_update_is_one_rmsprop_step_on_the_losses_by_hand() -> None:
    """One step of 6 envs, every one terminal (returns = rewards, advantages = returns - the
    values the rollout recorded): the policy loss is -mean(A log pi(a|s)), the value loss
    mean((V(s) - R)^2), the entropy is reported without a bonus, and the parameters take one
    step of SB3's RMSprop (alpha 0.99, eps 1e-5) on their sum, the gradient norm clipped."""
    B = 6
    agent = A2C(None, env_id="CartPole-v1", observation_space=CARTPOLE_OBS,
                action_space=gym.spaces.Discrete(2), num_envs=B, num_steps=1, ent_coef=0.0,
                torch_threads=1, backend="serial", seed=0)  # fmt: skip
    group = agent.optimizer.param_groups[0]
    assert (group["alpha"], group["eps"]) == (0.99, 1e-5)  # SB3's A2C RMSprop
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(1, B, 4, generator=generator)
    actions = torch.tensor([[0, 1, 1, 0, 1, 0]])
    reference = copy.deepcopy(agent.model)
    with torch.no_grad():
        log_prob, entropy, value = agent.model.evaluate(obs[0], actions[0])
    old_value = value + torch.tensor([0.5, -0.5, 1.0, 0.0, 0.2, -1.0])
    rewards = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5, 1.5])
    batch = SampleBatch(
        obs=obs,
        actions=actions,
        rewards=rewards[None],
        terminated=torch.ones(1, B, dtype=torch.bool),
        truncated=torch.zeros(1, B, dtype=torch.bool),
        valid=torch.ones(1, B, dtype=torch.bool),
        extras={"log_prob": log_prob[None], "value": old_value[None]},
        next_obs=torch.zeros(B, 4),
        final_obs=torch.zeros(0, 4),
        final_index=torch.zeros(0, 2, dtype=torch.int64),
    )
    metrics = agent.update(batch)

    advantages = rewards - old_value
    assert metrics["losses/policy_loss"] == pytest.approx(
        float(-(advantages * log_prob).mean()), rel=1e-5, abs=1e-7
    )
    assert metrics["losses/value_loss"] == pytest.approx(float(((value - rewards) ** 2).mean()))
    assert metrics["losses/entropy"] == pytest.approx(float(entropy.mean()))
    assert agent.optimizer.steps == 1

    cfg = agent.config
    new_log_prob, _, new_value = reference.evaluate(obs[0], actions[0])
    loss = -(advantages * new_log_prob).mean() + cfg.vf_coef * F.mse_loss(new_value, rewards)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), cfg.max_grad_norm)
    for ours, theirs in zip(agent.model.parameters(), reference.parameters(), strict=True):
        # RMSprop's first step: v = (1 - alpha) g^2, p <- p - lr g / (sqrt(v) + eps)
        square_avg = (1 - cfg.rms_alpha) * theirs.grad**2
        step = cfg.learning_rate * theirs.grad / (square_avg.sqrt() + cfg.rms_eps)
        torch.testing.assert_close(ours, (theirs - step).detach(), rtol=1e-5, atol=1e-7)


# -- the same algorithm as SB3 -------------------------------------------------------------------


def test_update_matches_sb3() -> None:
    """From the same weights and rollout, one update gives SB3's advantages and parameters: the
    rollout's terminations and truncations (a 12-step time limit) cover SB3's truncation
    bootstrap against vecaccel's ``final_obs``, GAE, the losses and RMSprop."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    T, B, gamma, lam = 16, 4, 0.98, 0.8
    envs = vecaccel.make_vec([short_cartpole] * B, backend="serial", autoreset_mode="SameStep")
    shared = dict(gamma=gamma, gae_lambda=lam, ent_coef=0.01, learning_rate=1e-3)
    sb3_env = make_vec_env("CartPole-v1", n_envs=B)
    ours = A2C(envs, num_envs=B, num_steps=T, seed=0, torch_threads=1, **shared)
    theirs = sb3.A2C("MlpPolicy", sb3_env, n_steps=T, seed=0, device="cpu", **shared)
    try:
        assert_one_update_matches_sb3(ours, theirs, gamma, lam)
    finally:
        ours.close()
        sb3_env.close()


def test_training_tracks_sb3_exactly_given_the_same_random_draws(monkeypatch) -> None:
    """Whole runs, rollouts and updates, from the same weights, env seeds and uniform draws
    (SB3's action sampling switched to vecaccel's inverse CDF): the very same episodes, and the
    same parameters after 30 updates."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.distributions import CategoricalDistribution
    from stable_baselines3.common.env_util import make_vec_env

    monkeypatch.setattr(CategoricalDistribution, "sample", inverse_cdf_sample)

    # constant rates: vecaccel reads its schedules before a rollout (as CleanRL does), SB3
    # after it, an offset of one update that is no part of this comparison
    seed, B, T, updates = 3, 4, 5, 30
    sb3_env = make_vec_env("CartPole-v1", n_envs=B, seed=seed)
    shared = dict(gamma=0.99, gae_lambda=1.0, ent_coef=0.0, learning_rate=7e-4)
    ours = A2C("CartPole-v1", num_steps=T, backend="serial", num_envs=B, seed=seed,
               torch_threads=1, anneal_lr=False, **shared)  # fmt: skip
    theirs = sb3.A2C("MlpPolicy", sb3_env, n_steps=T, seed=seed, device="cpu", **shared)
    try:
        our_returns, sb3_returns = learn_side_by_side(ours, theirs, updates * T * B)
    finally:
        sb3_env.close()
    assert len(our_returns) > 5 and our_returns == sb3_returns
    for theirs_param, our_param in sb3_parameter_pairs(ours.model, theirs.policy):
        torch.testing.assert_close(theirs_param, our_param, rtol=1e-4, atol=1e-5)


# -- learning -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a2c_learns_cartpole() -> None:
    from vecaccel.trainers.algos.a2c import PRESETS

    agent = A2C(backend="serial", seed=1, torch_threads=1, log_every_steps=1, **PRESETS["cartpole"])
    try:
        agent.learn(total_timesteps=60_000)
    finally:
        agent.close()
    assert best_rolling_return(agent) >= 150
