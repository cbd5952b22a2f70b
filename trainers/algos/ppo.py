"""Proximal Policy Optimization (Schulman et al., 2017) on vecaccel's sampler.

Reads top to bottom like CleanRL's ``ppo_atari.py``: the config, then the update (GAE with
truncation bootstrapping, clipped surrogate, clipped value loss, entropy bonus, gradient
clipping). Collecting, logging and checkpoints are the runner's
(:class:`vecaccel.trainers.runners.sync.SyncRunner`).

Example:
    >>> from vecaccel.trainers import PPO
    >>> agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=8, seed=0)
    >>> _ = agent.learn(total_timesteps=32)
    >>> actions, _ = agent.predict(agent.envs.reset(seed=0)[0], deterministic=True)
    >>> actions.shape
    (2,)
    >>> agent.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm, OnPolicyConfig
from vecaccel.trainers.algos.on_policy.advantages import explained_variance
from vecaccel.trainers.config.presets import PPO_PRESETS
from vecaccel.trainers.nets.optim import FlatAdam
from vecaccel.trainers.services.distributed import all_reduce_mean

__all__ = ["PPO", "PPOConfig", "PRESETS"]


class Minibatch(NamedTuple):
    """The rows of one minibatch step (``mb_``, CleanRL's names)."""

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor


@dataclass
class PPOConfig(OnPolicyConfig):
    """Every PPO setting; each field's docstring is its ``--help`` text (the shared ones are
    :class:`~vecaccel.trainers.algos.on_policy.base.OnPolicyConfig`'s)."""

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


#: Named settings: ``PPO(env, preset=NAME)`` and ``vecaccel train ppo --preset NAME``
#: (they live with the others in :mod:`vecaccel.trainers.config.presets`).
PRESETS = PPO_PRESETS


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
        if self._flat_optimizer_fits():  # Adam on one flat buffer: see trainers/nets/optim.py
            return FlatAdam(self.model.parameters(), lr=learning_rate, eps=self.config.adam_eps)
        # fused: one kernel for the whole parameter list instead of a loop over tensors
        return torch.optim.Adam(
            self.model.parameters(), lr=learning_rate, eps=self.config.adam_eps, fused=True
        )

    def minibatch(self, rows: tuple[torch.Tensor, ...], index: Any) -> Minibatch:
        """The rows ``index`` picks (a slice: views; indices: a gather), advantages normalised
        over them as CleanRL and SB3 do."""
        obs, actions, log_probs, values, returns, advantages = (row[index] for row in rows)
        if self.config.norm_adv and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return Minibatch(obs, actions, log_probs, values, returns, advantages)

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
        rows = (b_obs, b_actions, b_logprobs, b_values, b_returns, b_advantages)
        # one minibatch, the whole batch: in order, as views, the same in every epoch
        whole = self.minibatch(rows, slice(None)) if minibatch_size >= n else None
        zero = torch.zeros((), device=b_obs.device)
        clipfrac_sum, minibatches = zero.clone(), 0
        approx_kl = old_approx_kl = pg_loss = v_loss = entropy_loss = zero
        for epoch in range(cfg.update_epochs):
            if whole is not None:
                epoch_minibatches: Any = (whole,)
            else:
                shuffled = torch.randperm(n, device=b_obs.device).split(minibatch_size)  # type: ignore[no-untyped-call]
                epoch_minibatches = (self.minibatch(rows, index) for index in shuffled)
            # KL and clip fraction: every minibatch for early stopping, else the last epoch's
            diagnose = cfg.target_kl is not None or epoch == cfg.update_epochs - 1
            for mb in epoch_minibatches:
                mb_advantages, mb_values, mb_returns = mb.advantages, mb.values, mb.returns
                new_logprob, entropy, new_value = self.train_model.evaluate(mb.obs, mb.actions)
                log_ratio = new_logprob - mb.log_probs
                ratio = log_ratio.exp()
                if diagnose:
                    with torch.no_grad():
                        old_approx_kl = (-log_ratio).mean()
                        approx_kl = ((ratio - 1) - log_ratio).mean()
                        clipfrac_sum += ((ratio - 1.0).abs() > clip_coef).float().mean()
                        entropy_loss = entropy.mean()
                        minibatches += 1

                # clipped surrogate objective
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

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
