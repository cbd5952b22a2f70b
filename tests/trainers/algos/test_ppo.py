"""PPO: the Atari CNN smoke run, CartPole learning, and Gaussian actions: the batch keeps the
raw samples with their log-probabilities while the env gets them clipped, in the shape of the
action space (the update against CleanRL, SB3 and hand computations: ``test_ppo_reference.py``;
what it shares with A2C: ``on_policy/test_base.py``, ``on_policy/test_loop.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import best_rolling_return
from toy_envs import (
    BOUNDED_ACTIONS_SEEN,
    BoundedActionEnv,
    MatrixActionEnv,
    WideBoxEnv,
)

import vecaccel
from vecaccel.trainers import PPO

torch.set_num_threads(1)


# -- smoke ------------------------------------------------------------------------------------


def test_atari_cnn_smoke():
    pytest.importorskip("ale_py")
    agent = PPO(
        "BreakoutNoFrameskip-v4",
        backend="serial",
        num_envs=2,
        num_steps=4,
        num_minibatches=2,
        update_epochs=1,
        channels_last=True,
        bf16="on",
        seed=0,
    )
    try:
        assert agent.env.single_observation_space.shape == (4, 84, 84)
        assert agent.model.shared and agent.model.encoder.bf16
        agent.learn(total_timesteps=16)
        actions, state = agent.predict(agent.sampler.last_obs[0].numpy(), deterministic=True)
    finally:
        agent.close()
    assert state is None and np.asarray(actions).shape == ()


def test_pendulum_trains_with_normalised_observations_and_rewards():
    """A few thousand steps of Gaussian PPO on Pendulum, both normalisations on: the
    statistics count every env's step and move off their start, and the rollouts hold
    observations and rewards within their bounds."""
    agent = PPO("Pendulum-v1", backend="serial", num_envs=4, num_steps=64, num_minibatches=4,
                update_epochs=2, norm_obs=True, norm_reward=True, clip_obs=5.0, seed=0,
                torch_threads=1, progress=False, tensorboard=False)  # fmt: skip
    batches = []
    update = agent.update

    def keep(batch, progress_remaining=1.0):
        batches.append((batch.obs.clone(), batch.rewards.clone()))
        return update(batch, progress_remaining)

    agent.update = keep  # type: ignore[method-assign]
    try:
        agent.learn(2048)
    finally:
        agent.close()
    normalizer = agent.normalizer
    assert agent.num_updates == 8 and len(batches) == 8
    assert normalizer.obs.count == normalizer.returns.count == 2048
    # cos, sin and angular velocity: not the zero mean and unit variance they started from
    assert not np.allclose(normalizer.obs.mean, 0.0) and not np.allclose(normalizer.obs.var, 1.0)
    assert normalizer.returns.var > 1.0  # returns of rewards down to -16 a step
    obs = torch.cat([o for o, _ in batches])
    rewards = torch.cat([r for _, r in batches])
    assert float(obs.abs().max()) <= 5.0 and float(rewards.abs().max()) <= 10.0
    assert all(np.isfinite(p.detach().numpy()).all() for p in agent.model.parameters())


# -- learning -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ppo_learns_cartpole():
    from vecaccel.trainers.algos.ppo import PRESETS

    agent = PPO(backend="serial", seed=1, torch_threads=1, **PRESETS["cartpole"])
    try:
        agent.learn(total_timesteps=40_000)
    finally:
        agent.close()
    assert best_rolling_return(agent) >= 300


# -- continuous actions -----------------------------------------------------------------------


def test_box_batch_keeps_unclipped_actions_with_their_gaussian_log_prob():
    """The stored action is the raw sample (outside [-0.5, 0.5] here) and the stored log-prob
    is log N(a; mu, sigma) of that raw sample, by hand from the network's mean and log_std."""
    envs = vecaccel.make_vec([WideBoxEnv] * 2, backend="serial", autoreset_mode="SameStep")
    agent = PPO(envs, num_envs=2, num_steps=8, torch_threads=1, seed=0)
    try:
        with torch.no_grad():
            agent.model.log_std.fill_(0.5)
        batch = agent.sampler.collect()
        actions = batch.actions.reshape(-1, 2)
        assert (actions.abs() > 0.5).any(), "the test needs samples outside the bounds"
        with torch.no_grad():
            mean = agent.model.actor_head(agent.model._features(batch.obs.reshape(-1, 3))[0])
        var = math.exp(0.5) ** 2
        by_hand = (-((actions - mean) ** 2) / (2 * var) - 0.5 - 0.5 * math.log(2 * math.pi)).sum(-1)
        torch.testing.assert_close(batch.extras["log_prob"].reshape(-1), by_hand, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    finally:
        envs.close()


def test_log_std_init_sets_the_gaussians_starting_spread(tmp_path):
    """SB3's ``log_std_init``: the policy starts with std e^-2 on Pendulum, so the raw samples
    stray from the mean by that much; a checkpoint keeps the setting, and the default is 0."""
    envs = vecaccel.make_vec("Pendulum-v1", num_envs=2, backend="serial", autoreset_mode="SameStep")
    agent = PPO(envs, num_envs=2, num_steps=256, log_std_init=-2.0, torch_threads=1, seed=0)
    try:
        torch.testing.assert_close(agent.model.log_std.detach(), torch.tensor([-2.0]))
        batch = agent.sampler.collect()
        with torch.no_grad():
            mean = agent.model.actor_head(agent.model._features(batch.obs.reshape(-1, 3))[0])
        spread = (batch.actions.reshape(-1, 1) - mean).std().item()
        assert spread == pytest.approx(math.exp(-2.0), rel=0.1)
        agent.save(tmp_path / "ppo.pt")
    finally:
        envs.close()
    assert PPO.load(tmp_path / "ppo.pt").config.log_std_init == -2.0
    assert PPO(None, env_id="Pendulum-v1", torch_threads=1).model.log_std.tolist() == [0.0]


def test_multi_axis_box_actions_have_the_space_shape():
    """SB3 reshapes the Gaussian's flat sample to ``action_space.shape``; vecaccel's
    ActorCritic returns ``[N, prod(shape)]`` and never reshapes, so the sampler's clip to
    ``low``/``high`` (shape (2, 2)) and ``predict`` fail to broadcast."""
    envs = vecaccel.make_vec([MatrixActionEnv] * 2, backend="serial", autoreset_mode="SameStep")
    try:
        agent = PPO(envs, num_envs=2, num_steps=4, update_epochs=1, torch_threads=1, seed=0)
        try:
            action, _ = agent.predict(np.zeros(3, np.float32), deterministic=True)
        except ValueError as exc:
            pytest.fail(f"predict on a Box(2, 2) action space should give a (2, 2) action, "
                        f"raised ValueError: {exc}")  # fmt: skip
        assert np.shape(action) == (2, 2), f"expected a (2, 2) action, got {np.shape(action)}"
        try:
            agent.learn(8)
        except ValueError as exc:
            pytest.fail(f"PPO on a Box(2, 2) action space should train, raised: {exc}")
    finally:
        envs.close()


def test_sampled_box_actions_reach_the_env_clipped_to_its_bounds():
    """CleanRL (``ClipAction``) and SB3 (``np.clip`` before ``env.step``) hand the env actions
    within its Box, while the buffer keeps the unclipped sample for the log-probability.
    vecaccel does the same: with std e^1 most raw Gaussian samples are outside [-1, 1], and an
    env that does not clip (or charges a control cost on the action) must not see them."""
    BOUNDED_ACTIONS_SEEN.clear()
    envs = vecaccel.make_vec([BoundedActionEnv] * 2, backend="serial", autoreset_mode="SameStep")
    agent = PPO(envs, backend="serial", num_envs=2, num_steps=8, update_epochs=1,
                torch_threads=1, seed=0)  # fmt: skip
    with torch.no_grad():
        agent.model.log_std.fill_(1.0)
    try:
        agent.learn(16)
    finally:
        envs.close()
    seen = np.concatenate(BOUNDED_ACTIONS_SEEN)
    assert len(seen) == 16
    assert np.all(seen >= -1.0) and np.all(seen <= 1.0), seen.max()
