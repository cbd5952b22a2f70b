"""PPO against references: SB3 and CleanRL updates, and losses computed by hand.

Each test gives both sides the same weights, batch and random draws and compares the update or
the loss: SB3's PPO, a CleanRL-style PPO with several minibatches, the atari preset against
CleanRL's ``ppo_atari.py`` loss, and the clipped surrogate and value loss by hand (A2C against
SB3's: ``test_a2c.py``).
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_twins import (
    assert_one_update_matches_sb3,
    inverse_cdf_sample,
    learn_side_by_side,
    sb3_parameter_pairs,
    short_cartpole,
)

import vecaccel
from vecaccel.sampler import SampleBatch
from vecaccel.trainers import PPO
from vecaccel.trainers.algos.on_policy.advantages import compute_gae
from vecaccel.trainers.nets.optim import FlatAdam

torch.set_num_threads(1)

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


# -- the same algorithm as SB3 -------------------------------------------------------------------


def test_update_matches_sb3():
    """From the same weights and rollout, one update gives SB3's advantages and parameters.

    The rollout has terminations and truncations (a 12-step time limit), so this covers
    SB3's truncation bootstrap (``reward += gamma * V(terminal_observation)``) against
    vecaccel's ``final_obs``, GAE, the losses, advantage normalisation, clipping, gradient
    clipping and the optimizer.
    """
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    T, B, gamma, lam = 16, 4, 0.98, 0.8
    envs = vecaccel.make_vec([short_cartpole] * B, backend="serial", autoreset_mode="SameStep")
    shared = dict(gamma=gamma, gae_lambda=lam, ent_coef=0.01, learning_rate=1e-3)
    sb3_env = make_vec_env("CartPole-v1", n_envs=B)
    ours = PPO(
        envs, num_envs=B, num_steps=T, update_epochs=3, num_minibatches=1,
        clip_vloss=False, clip_coef=0.2, seed=0, torch_threads=1, **shared,
    )  # fmt: skip
    theirs = sb3.PPO(
        "MlpPolicy", sb3_env, n_steps=T, batch_size=T * B, n_epochs=3, clip_range=0.2,
        seed=0, device="cpu", **shared,
    )  # fmt: skip
    try:
        assert_one_update_matches_sb3(ours, theirs, gamma, lam)
    finally:
        ours.close()
        sb3_env.close()


def test_training_tracks_sb3_exactly_given_the_same_random_draws(monkeypatch):
    """Whole runs, rollouts and updates, from the same weights, env seeds and uniform draws.

    SB3 samples its actions with ``torch.multinomial``, vecaccel by inverse CDF from
    ``torch.rand``: the same distribution, different random streams. With SB3's sampling
    switched to vecaccel's, both libraries give the very same episodes, so any difference in
    the env steps they need to learn is the luck of the random stream, nothing in the algorithm.
    """
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.distributions import CategoricalDistribution
    from stable_baselines3.common.env_util import make_vec_env

    monkeypatch.setattr(CategoricalDistribution, "sample", inverse_cdf_sample)

    # constant rates: vecaccel reads its schedules before a rollout (as CleanRL does), SB3
    # after it, an offset of one update that is no part of this comparison
    seed, B, T, updates = 3, 4, 16, 4
    sb3_env = make_vec_env("CartPole-v1", n_envs=B, seed=seed)
    shared = dict(gamma=0.98, gae_lambda=0.8, ent_coef=0.0, learning_rate=1e-3)
    ours = PPO(
        "CartPole-v1", num_steps=T, update_epochs=5, num_minibatches=1, clip_coef=0.2,
        clip_vloss=False, backend="serial", num_envs=B, seed=seed, torch_threads=1,
        anneal_lr=False, **shared,
    )  # fmt: skip
    theirs = sb3.PPO(
        "MlpPolicy", sb3_env, n_steps=T, batch_size=T * B, n_epochs=5, clip_range=0.2,
        seed=seed, device="cpu", **shared,
    )  # fmt: skip
    try:
        our_returns, sb3_returns = learn_side_by_side(ours, theirs, updates * T * B)
    finally:
        sb3_env.close()
    assert len(our_returns) > 5 and our_returns == sb3_returns
    for theirs_param, our_param in sb3_parameter_pairs(ours.model, theirs.policy):
        torch.testing.assert_close(theirs_param, our_param, rtol=1e-4, atol=1e-5)


# -- PPO with several minibatches against a CleanRL-style reference ------------------------------


def _reference_gae(rewards, values, next_value, terminated, truncated, finals, gamma, lam):
    T, B = rewards.shape
    adv = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        last = 0.0
        for t in reversed(range(T)):
            if terminated[t, b]:
                nv = 0.0
            elif truncated[t, b]:
                nv = finals[(t, b)]
            else:
                nv = values[t + 1, b] if t + 1 < T else next_value[b]
            delta = rewards[t, b] + gamma * nv - values[t, b]
            done = bool(terminated[t, b] or truncated[t, b])
            last = delta + (0.0 if done else gamma * lam * last)
            adv[t, b] = last
    return adv


def _synthetic_batch(agent, T=6, B=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, B, 3, generator=g)
    actions = torch.randint(0, 2, (T, B), generator=g)
    with torch.no_grad():
        logp, _, value = agent.model.evaluate(obs.reshape(-1, 3), actions.reshape(-1))
    # behaviour policy and values differ from the current ones, so clipping bites
    old_logp = (logp + 0.3 * torch.randn(T * B, generator=g)).reshape(T, B)
    old_value = (value + 0.5 * torch.randn(T * B, generator=g)).reshape(T, B)
    terminated = torch.zeros(T, B, dtype=torch.bool)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    terminated[2, 0] = terminated[4, 3] = True
    truncated[1, 1] = truncated[5, 2] = True
    final_index = torch.tensor([[1, 1], [5, 2]])
    final_obs = torch.randn(2, 3, generator=g)
    return SampleBatch(
        obs=obs,
        actions=actions,
        rewards=torch.randn(T, B, generator=g),
        terminated=terminated,
        truncated=truncated,
        valid=torch.ones(T, B, dtype=torch.bool),
        extras={"log_prob": old_logp, "value": old_value},
        next_obs=torch.randn(B, 3, generator=g),
        final_obs=final_obs,
        final_index=final_index,
    )


@pytest.mark.parametrize("target_kl", [None, 0.0], ids=["no-kl-stop", "kl-stop"])
def test_ppo_minibatch_update_matches_cleanrl_reference(target_kl, monkeypatch):
    """3 epochs x 4 minibatches of 6 from a 24-sample batch with terminations and
    truncations: per-minibatch advantage normalisation, clipped surrogate, clipped value loss
    (MSE, SB3's scale), entropy bonus, global grad-norm clip, Adam(eps=1e-5), each sample once
    per epoch, CleanRL's target_kl break after the epoch. Same minibatch permutations."""
    cfg = dict(gamma=0.97, gae_lambda=0.9, update_epochs=3, num_minibatches=4, clip_coef=0.2,
               clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
               learning_rate=3e-3, target_kl=target_kl)  # fmt: skip
    agent = PPO(None, env_id="CartPole-v1", observation_space=OBS,
                action_space=gym.spaces.Discrete(2), backend="serial", num_envs=4, num_steps=6,
                torch_threads=1, seed=0, **cfg)  # fmt: skip
    assert isinstance(agent.optimizer, FlatAdam)
    ref = copy.deepcopy(agent.model)
    batch = _synthetic_batch(agent)

    perms: list[torch.Tensor] = []
    randperm = torch.randperm

    def recording_randperm(*args, **kwargs):
        perm = randperm(*args, **kwargs)
        perms.append(perm.clone())
        return perm

    monkeypatch.setattr(torch, "randperm", recording_randperm)
    agent.update(batch, progress_remaining=1.0)
    monkeypatch.undo()

    # -- the reference, written from CleanRL's ppo.py --
    T, B = 6, 4
    n, mbs = T * B, 6
    for perm in perms:
        assert sorted(perm.tolist()) == list(range(n)), "each sample once per epoch"
    with torch.no_grad():
        finals_v = ref.value(batch.final_obs).double()
        next_v = ref.value(batch.next_obs).double()
    finals = {(1, 1): float(finals_v[0]), (5, 2): float(finals_v[1])}
    values = batch.extras["value"].double()
    adv = _reference_gae(batch.rewards.double(), values, next_v, batch.terminated,
                         batch.truncated, finals, cfg["gamma"], cfg["gae_lambda"])  # fmt: skip
    b_adv = adv.reshape(-1).float()
    b_ret = (adv + values).reshape(-1).float()
    b_obs, b_act = batch.obs.reshape(-1, 3), batch.actions.reshape(-1)
    b_logp, b_val = batch.extras["log_prob"].reshape(-1), batch.extras["value"].reshape(-1)
    opt = torch.optim.Adam(ref.parameters(), lr=cfg["learning_rate"], eps=1e-5)
    clip = cfg["clip_coef"]
    steps = 0
    for epoch in range(cfg["update_epochs"]):
        perm = perms[epoch]
        for start in range(0, n, mbs):
            mb = perm[start : start + mbs]
            newlogp, entropy, newv = ref.evaluate(b_obs[mb], b_act[mb])
            logratio = newlogp - b_logp[mb]
            ratio = logratio.exp()
            approx_kl = ((ratio - 1) - logratio).mean()
            a = b_adv[mb]
            a = (a - a.mean()) / (a.std() + 1e-8)
            pg = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_unclipped = (newv - b_ret[mb]) ** 2
            v_clipped = b_val[mb] + (newv - b_val[mb]).clamp(-clip, clip)
            v = torch.max(v_unclipped, (v_clipped - b_ret[mb]) ** 2).mean()
            loss = pg - cfg["ent_coef"] * entropy.mean() + cfg["vf_coef"] * v
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg["max_grad_norm"])
            opt.step()
            steps += 1
        if target_kl is not None and approx_kl > target_kl:
            break

    assert agent.optimizer.steps == steps, (
        f"expected {steps} optimizer steps (CleanRL's loop), vecaccel took {agent.optimizer.steps}"
    )
    for ours, theirs in zip(agent.model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-6)


# -- the atari preset against CleanRL's ppo_atari.py -----------------------------------------------


def test_atari_preset_loss_is_cleanrl_ppo_atari_loss(monkeypatch):
    """PRESETS["atari"] is documented as "the standard Atari PPO (baselines, CleanRL
    ppo_atari.py)". Both write ``v_loss = 0.5 * mean(max(...))`` and ``vf_coef=0.5``, so the
    value term weighs 0.25 x MSE. vecaccel's value loss is the plain MSE (SB3's convention), so
    the preset's ``vf_coef`` is 0.25: with 0.5 it would put twice CleanRL's weight on the value
    term of a shared torso (and reach the 0.5 grad-norm clip sooner).

    The reference below is CleanRL's loss with CleanRL's own ``vf_coef=0.5``, not the preset's
    (which would ask for 0.125 x MSE: half CleanRL's weight)."""
    from vecaccel.trainers.algos.ppo import PRESETS

    preset = PRESETS["atari"]
    settings = {k: preset[k] for k in ("clip_coef", "ent_coef", "vf_coef", "learning_rate")}
    agent = PPO(None, env_id="CartPole-v1", observation_space=OBS,
                action_space=gym.spaces.Discrete(2), backend="serial", num_envs=4, num_steps=6,
                update_epochs=1, num_minibatches=1, torch_threads=1, seed=0, preset=None,
                **settings)  # fmt: skip
    batch = _synthetic_batch(agent)
    ref = copy.deepcopy(agent.model)
    losses = []
    monkeypatch.setattr(
        agent, "backward_step", lambda loss, clip: losses.append(float(loss.detach()))
    )
    agent.update(batch, progress_remaining=1.0)

    with torch.no_grad():
        next_v = ref.value(batch.next_obs)
        finals = ref.value(batch.final_obs)
        adv, ret = compute_gae(batch.rewards, batch.extras["value"], next_v, batch.terminated,
                               batch.truncated, finals, batch.final_index, 0.99, 0.95)  # fmt: skip
        newlogp, entropy, newv = ref.evaluate(batch.obs.reshape(-1, 3), batch.actions.reshape(-1))
        a, ret = adv.reshape(-1), ret.reshape(-1)
        a = (a - a.mean()) / (a.std() + 1e-8)
        old_v = batch.extras["value"].reshape(-1)
        ratio = (newlogp - batch.extras["log_prob"].reshape(-1)).exp()
        c = settings["clip_coef"]
        pg = torch.max(-a * ratio, -a * ratio.clamp(1 - c, 1 + c)).mean()
        v_clipped = old_v + (newv - old_v).clamp(-c, c)
        v_loss = 0.5 * torch.max((newv - ret) ** 2, (v_clipped - ret) ** 2).mean()  # CleanRL
        cleanrl_vf_coef = 0.5  # ppo_atari.py's default
        cleanrl = pg - settings["ent_coef"] * entropy.mean() + cleanrl_vf_coef * v_loss
    assert losses[0] == pytest.approx(float(cleanrl), rel=1e-5), (
        f"the atari preset's loss should be CleanRL ppo_atari's ({float(cleanrl):.6f}); got "
        f"{losses[0]:.6f}, whose value term is {settings['vf_coef']} x MSE instead of "
        f"{cleanrl_vf_coef} x 0.5 x MSE"
    )


# -- PPO: clipped surrogate and clipped value loss (hand-computed) ----------------------------


def test_ppo_clipped_surrogate_and_value_loss_by_hand():
    """One epoch, one minibatch, every step terminal (so returns = rewards): the policy and
    value losses equal CleanRL's formulas evaluated on the same numbers."""
    clip = 0.2
    agent = PPO(None, env_id="CartPole-v1", observation_space=CARTPOLE_OBS,
                action_space=gym.spaces.Discrete(2), update_epochs=1, num_minibatches=1,
                clip_coef=clip, clip_vloss=True, ent_coef=0.0, torch_threads=1,
                backend="serial", seed=0)  # fmt: skip
    B = 6
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(1, B, 4, generator=generator)
    actions = torch.tensor([[0, 1, 0, 1, 1, 0]])
    with torch.no_grad():
        new_logprob, _, new_value = agent.model.evaluate(obs[0], actions[0])
    # behaviour log-probs: ratios e^0.5, e^-0.5, 1, e^0.1, e^-0.3, e^0.25
    shifts = torch.tensor([-0.5, 0.5, 0.0, -0.1, 0.3, -0.25])
    old_logprob = (new_logprob - shifts)[None]
    # old values: some far from the current ones, so the value clip bites
    old_value = (new_value + torch.tensor([1.0, -1.0, 0.05, 0.0, 0.5, -0.3]))[None]
    rewards = torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.0, -1.0]])
    batch = SampleBatch(
        obs=obs,
        actions=actions,
        rewards=rewards,
        terminated=torch.ones(1, B, dtype=torch.bool),
        truncated=torch.zeros(1, B, dtype=torch.bool),
        valid=torch.ones(1, B, dtype=torch.bool),
        extras={"log_prob": old_logprob, "value": old_value},
        next_obs=torch.zeros(B, 4),
        final_obs=torch.zeros(0, 4),
        final_index=torch.zeros(0, 2, dtype=torch.int64),
    )
    metrics = agent.update(batch, progress_remaining=1.0)

    returns = rewards[0].double()
    advantages = returns - old_value[0].double()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = shifts.double().exp()
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)).mean()
    v_new, v_old = new_value.double(), old_value[0].double()
    v_clipped = v_old + (v_new - v_old).clamp(-clip, clip)
    v_loss = torch.max((v_new - returns) ** 2, (v_clipped - returns) ** 2).mean()
    assert metrics["losses/policy_loss"] == pytest.approx(float(pg), rel=1e-5, abs=1e-6)
    assert metrics["losses/value_loss"] == pytest.approx(float(v_loss), rel=1e-5)
    clipped = ((ratio - 1).abs() > clip).double().mean()
    assert metrics["losses/clipfrac"] == pytest.approx(float(clipped))
