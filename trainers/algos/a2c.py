"""Advantage Actor-Critic, synchronous and large-batch (Mnih et al., 2016; Stooke & Abbeel, 2018).

One gradient step per batch of ``num_envs * num_steps`` transitions: the policy gradient with
GAE advantages (``gae_lambda=1`` gives A2C's n-step returns, truncations bootstrapped from the
true final observation), a value regression and an entropy bonus, RMSprop, gradient clipping.

Example:
    >>> from vecaccel.trainers import A2C
    >>> agent = A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=5, seed=0)
    >>> _ = agent.learn(total_timesteps=20)
    >>> agent.global_step
    20
    >>> agent.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm, OnPolicyConfig
from vecaccel.trainers.algos.on_policy.advantages import explained_variance
from vecaccel.trainers.config.presets import A2C_PRESETS
from vecaccel.trainers.nets.optim import FlatRMSprop

__all__ = ["A2C", "A2CConfig", "PRESETS"]


@dataclass
class A2CConfig(OnPolicyConfig):
    """Every A2C setting; each field's docstring is its ``--help`` text (the shared ones are
    :class:`~vecaccel.trainers.algos.on_policy.base.OnPolicyConfig`'s)."""

    num_envs: int = 16
    """Parallel environments (B)."""
    checkpoint_every: int = 500
    """Updates between checkpoints written to run_dir/checkpoint.pt (0: only at the end)."""
    log_every_steps: int = 800
    """Env steps between metric rows (0: every update); a row is also written when an episode
    ended and at the end."""
    num_steps: int = 5
    """Steps per environment per update (T); the batch is num_envs * num_steps."""
    learning_rate: float = 7e-4
    """RMSprop learning rate at base_batch_size (before lr scaling)."""
    base_batch_size: int = 80
    """Batch size at which learning_rate was tuned (16 envs x 5 steps, the A2C default)."""
    gae_lambda: float = 1.0
    """GAE lambda (1: plain n-step returns, classic A2C)."""
    norm_adv: bool = False
    """Normalise advantages over the batch."""
    rms_alpha: float = 0.99
    """RMSprop smoothing constant."""
    rms_eps: float = 1e-5
    """RMSprop epsilon."""


#: Named settings: ``A2C(env, preset=NAME)`` and ``vecaccel train a2c --preset NAME``
#: (they live with the others in :mod:`vecaccel.trainers.config.presets`).
PRESETS = A2C_PRESETS


class A2C(OnPolicyAlgorithm):
    """Synchronous advantage actor-critic.

    Args:
        env: a Gymnasium id, a vector env, or ``None``; see ``OnPolicyAlgorithm``.
        **config: :class:`A2CConfig` fields (``run_dir``, ``progress`` and ``tensorboard``
            among them).
    """

    algo_name = "a2c"
    config_cls = A2CConfig
    presets = PRESETS
    config: A2CConfig

    def make_optimizer(self, learning_rate: float) -> Any:
        cfg = self.config
        if self._flat_optimizer_fits():  # RMSprop on one flat buffer: see trainers/nets/optim.py
            return FlatRMSprop(
                self.model.parameters(), lr=learning_rate, alpha=cfg.rms_alpha, eps=cfg.rms_eps
            )
        # foreach: a few multi-tensor ops per step; torch's CPU default loops over the tensors
        return torch.optim.RMSprop(
            self.model.parameters(),
            lr=learning_rate,
            alpha=cfg.rms_alpha,
            eps=cfg.rms_eps,
            foreach=True,
        )

    def update(self, batch: Any, progress_remaining: float = 1.0) -> dict[str, float]:
        """One A2C update: a single gradient step on the whole batch."""
        cfg = self.config

        flat = self.flat_batch(batch)  # GAE, then the rows the losses learn from
        b_obs, b_actions, b_advantages = flat.obs, flat.actions, flat.advantages
        b_returns, b_values = flat.returns, flat.values

        log_prob, entropy, value = self.train_model.evaluate(b_obs, b_actions)
        if cfg.norm_adv and len(b_advantages) > 1:
            b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
        pg_loss = -(b_advantages * log_prob).mean()
        v_loss = F.mse_loss(value, b_returns)
        entropy_loss = entropy.mean()
        loss = pg_loss + cfg.vf_coef * v_loss
        if cfg.ent_coef:  # a zero bonus would only add a backward pass through the entropy
            loss = loss - cfg.ent_coef * entropy_loss

        self.backward_step(loss, cfg.max_grad_norm)

        value_loss, policy_loss, entropy_mean = torch.stack(
            [v_loss.detach(), pg_loss.detach(), entropy_loss.detach()]
        ).tolist()
        return {
            "losses/value_loss": value_loss,
            "losses/policy_loss": policy_loss,
            "losses/entropy": entropy_mean,
            "losses/explained_variance": explained_variance(b_values, b_returns),
        }
