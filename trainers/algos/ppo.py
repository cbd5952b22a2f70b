"""Proximal Policy Optimization (Schulman et al., 2017) on vecaccel's sampler.

Reads top to bottom like CleanRL's ``ppo_atari.py``: the config, then the update (GAE with
truncation bootstrapping, clipped surrogate, clipped value loss, entropy bonus, gradient
clipping). Collecting, logging and checkpoints are the runner's
(:class:`vecaccel.trainers.runners.sync.SyncRunner`).

Example:
    >>> from vecaccel.trainers import PPO
    >>> agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=8, seed=0)
    >>> _ = agent.learn(total_steps=32)
    >>> actions, _ = agent.predict(agent.envs.reset(seed=0)[0], deterministic=True)
    >>> actions.shape
    (2,)
    >>> agent.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from vecaccel.trainers.advantages import explained_variance
from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm, OnPolicyConfig
from vecaccel.trainers.distributed import all_reduce_mean
from vecaccel.trainers.optim import FlatAdam

__all__ = ["PPO", "PPOConfig", "PRESETS"]


@dataclass
class PPOConfig(OnPolicyConfig):
    """Every PPO setting; each field's docstring is its ``--help`` text (the shared ones are
    :class:`~vecaccel.trainers.algos.on_policy.OnPolicyConfig`'s)."""

    adam_eps: float = 1e-5
    """Adam epsilon."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    update_epochs: int = 4
    """Passes over each batch."""
    clip_coef: float = 0.1
    """Surrogate clipping coefficient (epsilon)."""
    anneal_clip: bool = False
    """Anneal clip_coef linearly to 0 with the learning rate (SB3's lin_ schedules)."""
    clip_vloss: bool = True
    """Clip the value loss around the old values, with clip_coef."""
    target_kl: float | None = None
    """Stop the epochs early when the approximate KL exceeds this (None: never)."""


#: Named settings: ``PPO(env, preset=NAME)`` and ``vecaccel train ppo --preset NAME``; a run on
#: an env id one is made for starts from it unless told otherwise (``trainers/presets.py``).
PRESETS: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo's hyperparams/ppo.yml for CartPole-v1 (n_envs 8, n_steps 32,
    # batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0, lin_1e-3, lin_0.2)
    "cartpole": dict(
        env_id="CartPole-v1",
        num_envs=8,
        num_steps=32,
        num_minibatches=1,
        update_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=1e-3,
        anneal_lr=True,
        clip_coef=0.2,
        anneal_clip=True,
        clip_vloss=False,
        base_batch_size=256,
    ),
    # the standard Atari PPO (baselines, CleanRL ppo_atari.py): 8 envs x 128 steps
    "atari": dict(
        env_id="PongNoFrameskip-v4",
        num_envs=8,
        num_steps=128,
        learning_rate=2.5e-4,
        num_minibatches=4,
        update_epochs=4,
        clip_coef=0.1,
        ent_coef=0.01,
        # baselines and CleanRL weigh 0.5 x (0.5 x MSE); vecaccel's value loss is the plain MSE
        # (SB3's convention), so their weight on it is 0.25
        vf_coef=0.25,
        base_batch_size=1024,
        # bf16 autocast where the CPU/GPU has bf16 units: about 1.6x per update on Pong, and the
        # update changes by rounding only (tests/test_bf16.py)
        bf16="auto",
    ),
    # the seed paper's large-batch regime: many more envs per update, learning rate scaled
    # from the 1024-sample base (Stooke & Abbeel, 2018, section 4)
    "atari-large": dict(
        env_id="PongNoFrameskip-v4",
        num_envs=128,
        num_steps=128,
        learning_rate=2.5e-4,
        lr_scaling="sqrt",
        base_batch_size=1024,
        num_minibatches=16,
        update_epochs=4,
        clip_coef=0.1,
        ent_coef=0.01,
        vf_coef=0.25,  # CleanRL's value-loss weight, as in "atari"
        bf16="auto",
    ),
}


class PPO(OnPolicyAlgorithm):
    """PPO with the clipped surrogate objective.

    Args:
        env: a Gymnasium id, a vector env, or ``None``; see ``OnPolicyAlgorithm``.
        **config: :class:`PPOConfig` fields (``run_dir``, ``progress`` and ``tensorboard``
            among them).
    """

    algo_name = "ppo"
    config_cls = PPOConfig
    presets = PRESETS
    config: PPOConfig

    def make_optimizer(self, learning_rate: float) -> Any:
        if self._flat_optimizer_fits():  # Adam on one flat buffer: see trainers/optim.py
            return FlatAdam(self.model.parameters(), lr=learning_rate, eps=self.config.adam_eps)
        # fused: one kernel for the whole parameter list instead of a loop over tensors
        return torch.optim.Adam(
            self.model.parameters(), lr=learning_rate, eps=self.config.adam_eps, fused=True
        )

    def update(self, batch: Any, progress_remaining: float = 1.0) -> dict[str, float]:
        """One PPO update: ``update_epochs`` passes of minibatch steps over ``batch``."""
        cfg = self.config
        clip_coef = cfg.clip_coef * (progress_remaining if cfg.anneal_clip else 1.0)

        # GAE (truncations bootstrapped from their true final observations), then the batch
        # flattened to the rows the losses learn from
        flat = self.flat_batch(batch)
        b_obs, b_actions, b_logprobs = flat.obs, flat.actions, flat.log_probs
        b_values, b_advantages, b_returns = flat.values, flat.advantages, flat.returns

        n = b_obs.shape[0]
        minibatch_size = max(1, n // cfg.num_minibatches)
        # one minibatch is the whole batch: no shuffle, no gathers (the mean is the same), and
        # its advantages are normalised once for every epoch
        whole_batch = minibatch_size >= n
        if whole_batch and cfg.norm_adv and n > 1:
            b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
        b_neg_advantages = -b_advantages
        zero = torch.zeros((), device=b_obs.device)
        clipfrac_sum, minibatches = zero.clone(), 0
        approx_kl = old_approx_kl = pg_loss = v_loss = entropy_loss = zero
        for epoch in range(cfg.update_epochs):
            if whole_batch:
                batches: Any = (None,)
            else:
                batches = torch.randperm(n, device=b_obs.device).split(minibatch_size)
            # KL and clip fraction: every minibatch for early stopping, else the last epoch's
            diagnose = cfg.target_kl is not None or epoch == cfg.update_epochs - 1
            for mb in batches:
                if mb is None:
                    mb_obs, mb_actions, mb_logprobs = b_obs, b_actions, b_logprobs
                    mb_values, mb_returns = b_values, b_returns
                    mb_neg_advantages = b_neg_advantages
                else:
                    mb_obs, mb_actions, mb_logprobs = b_obs[mb], b_actions[mb], b_logprobs[mb]
                    mb_values, mb_returns, mb_advantages = (
                        b_values[mb],
                        b_returns[mb],
                        b_advantages[mb],
                    )
                    if cfg.norm_adv and len(mb) > 1:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                            mb_advantages.std() + 1e-8
                        )
                    mb_neg_advantages = -mb_advantages
                new_logprob, entropy, new_value = self.train_model.evaluate(mb_obs, mb_actions)
                log_ratio = new_logprob - mb_logprobs
                ratio = log_ratio.exp()
                if diagnose:
                    with torch.no_grad():
                        old_approx_kl = (-log_ratio).mean()
                        approx_kl = ((ratio - 1) - log_ratio).mean()
                        clipfrac_sum += ((ratio - 1.0).abs() > clip_coef).float().mean()
                        entropy_loss = entropy.mean()
                        minibatches += 1

                # clipped surrogate objective
                pg_loss = torch.max(
                    mb_neg_advantages * ratio,
                    mb_neg_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef),
                ).mean()

                # value loss, optionally clipped around the values the batch was collected with
                if cfg.clip_vloss:
                    v_loss_unclipped = (new_value - mb_returns) ** 2
                    v_clipped = mb_values + torch.clamp(
                        new_value - mb_values, -clip_coef, clip_coef
                    )
                    v_loss = torch.max(v_loss_unclipped, (v_clipped - mb_returns) ** 2).mean()
                else:
                    v_loss = F.mse_loss(new_value, mb_returns)

                loss = pg_loss + cfg.vf_coef * v_loss
                if cfg.ent_coef:  # a zero bonus would only add a backward pass through it
                    loss = loss - cfg.ent_coef * entropy.mean()

                self.backward_step(loss, cfg.max_grad_norm)

            if cfg.target_kl is not None:
                kl = float(approx_kl)
                if self.world_size > 1:  # every rank must stop at the same epoch
                    kl = all_reduce_mean([kl], device=self.device)[0]
                if kl > cfg.target_kl:
                    break

        # one conversion for all the statistics: each .item() would be a sync on an accelerator
        value_loss, policy_loss, entropy_mean, old_kl, new_kl, clipfrac = torch.stack(
            [
                v_loss.detach(),
                pg_loss.detach(),
                entropy_loss,
                old_approx_kl,
                approx_kl,
                clipfrac_sum,
            ]
        ).tolist()
        return {
            "losses/value_loss": value_loss,
            "losses/policy_loss": policy_loss,
            "losses/entropy": entropy_mean,
            "losses/old_approx_kl": old_kl,
            "losses/approx_kl": new_kl,
            "losses/clipfrac": clipfrac / max(1, minibatches),
            "losses/explained_variance": explained_variance(b_values, b_returns),
            "charts/clip_coef": clip_coef,
        }
