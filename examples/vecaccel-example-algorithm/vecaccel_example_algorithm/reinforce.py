"""REINFORCE with a learned baseline (Williams, 1992; Sutton & Barto, 2018, section 13.4).

The policy gradient ``∇ log π(a|s) · (G - V(s))``: ``G`` the discounted return from each step to
the end of its episode, ``V`` a learned state-value baseline that lowers the gradient's variance
without biasing it, fitted to ``G`` by least squares. A rollout of ``num_steps`` steps per env
cuts episodes: the return of a step whose episode goes on past the rollout is completed with
``V`` of the observation the rollout stops at (and a truncated episode's with ``V`` of its final
observation), so ``G`` is the Monte Carlo return wherever the episode ended in the rollout.

Everything around the update (the envs, the sampler, the loop, logging, checkpoints, resume,
``--async``, ``--nproc``) is the on-policy base's and the runners'.

Example:
    >>> from vecaccel_example_algorithm.reinforce import Reinforce
    >>> agent = Reinforce("CartPole-v1", backend="serial", num_envs=2, num_steps=16, seed=0,
    ...                   progress=False, tensorboard=False)
    >>> _ = agent.learn(64)
    >>> agent.global_step, agent.num_updates
    (64, 2)
    >>> agent.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm, OnPolicyConfig

__all__ = ["Reinforce", "ReinforceConfig"]


@dataclass
class ReinforceConfig(OnPolicyConfig):
    """Every REINFORCE setting; each field's docstring is its ``vecaccel train reinforce
    --help`` text (the shared ones are ``OnPolicyConfig``'s)."""

    num_envs: int = 8
    """Parallel environments (B)."""
    num_steps: int = 256
    """Steps per environment per update (T): long, so that most returns are whole episodes'."""
    learning_rate: float = 1e-3
    """Adam learning rate of the policy and the baseline."""
    base_batch_size: int = 2048
    """Batch size at which learning_rate was tuned (the reference of lr_scaling)."""
    gae_lambda: float = 1.0
    """1: Monte Carlo returns (REINFORCE); below 1 the returns lean on the baseline."""
    norm_adv: bool = True
    """Normalise G - V(s) over the batch (a variance reduction that keeps the direction)."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient (REINFORCE has none)."""
    vf_coef: float = 0.5
    """Weight of the baseline's squared error in the loss."""
    checkpoint_every: int = 20
    """Updates between checkpoints written to run_dir/checkpoint.pt (0: only at the end)."""
    log_every_steps: int = 2048
    """Env steps between metric rows (0: every update)."""


class Reinforce(OnPolicyAlgorithm):
    """REINFORCE with a learned baseline, one gradient step per rollout.

    Args:
        env: a Gymnasium id, a vector env, or ``None``; see ``OnPolicyAlgorithm``.
        **config: :class:`ReinforceConfig` fields.
    """

    algo_name = "reinforce"
    config_cls = ReinforceConfig
    config: ReinforceConfig

    def make_optimizer(self, learning_rate: float) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=learning_rate, eps=1e-5)

    def update(self, batch: Any, progress_remaining: float = 1.0) -> dict[str, float]:
        """One REINFORCE update: a single gradient step on the whole rollout."""
        cfg = self.config

        # G (the discounted return-to-go, gae_lambda=1) and V(s), flat over the batch's rows
        flat = self.flat_batch(batch)
        b_obs, b_actions, b_returns = flat.obs, flat.actions, flat.returns
        b_baseline = flat.values  # V(s) when the batch was collected: not differentiated

        log_prob, entropy, value = self.train_model.evaluate(b_obs, b_actions)
        b_advantages = b_returns - b_baseline
        if cfg.norm_adv and len(b_advantages) > 1:
            b_advantages = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)

        policy_loss = -(b_advantages * log_prob).mean()  # -E[log π(a|s) (G - V(s))]
        baseline_loss = F.mse_loss(value, b_returns)  # V(s) regressed on G
        loss = policy_loss + cfg.vf_coef * baseline_loss
        if cfg.ent_coef:
            loss = loss - cfg.ent_coef * entropy.mean()

        self.backward_step(loss, cfg.max_grad_norm)

        return {
            "losses/policy_loss": float(policy_loss.detach()),
            "losses/value_loss": float(baseline_loss.detach()),
            "losses/entropy": float(entropy.detach().mean()),
        }
