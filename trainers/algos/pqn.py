"""PQN: parallelised Q-learning from large rollouts (Gallici et al., "Simplifying Deep Temporal
Difference Learning", ICLR 2025).

Q-learning without a replay buffer or a target network: ``N`` envs step ``T`` times ε-greedily,
the λ-returns of that rollout are computed backwards with the Q-network's own max at each
bootstrap, and ``E`` epochs of minibatch steps regress ``Q(s, a)`` onto them. LayerNorm in the
Q-network (``layer_norm``) is what keeps this stable without a target network. The file reads
top to bottom like purejaxql's ``pqn_minatar.py``: the config, the λ-returns, the network that
acts, then :meth:`PQN.update`.

Its data flow is the on-policy family's (a ``[T, B]`` rollout, one update per rollout, nothing
kept between them), so PQN sits on
:class:`~vecaccel.trainers.algos.on_policy.base.OnPolicyAlgorithm` with a Q-network for a model:
the sampler, the loop, the asynchronous rollout feed, data-parallel ranks and the checkpoint are
that base's. Its ε follows the update schedule as the learning rate does, and is a buffer of the
model, so that the asynchronous rollout process acts with the ε the weights it received carry.

As purejaxql: RAdam, the learning rate annealed linearly, gradients clipped by global norm, the
loss half the squared error. Two choices differ: a truncated episode's last step bootstraps from
its true final observation (purejaxql treats every episode end as terminal), and the learning
rate anneals once per update rather than once per minibatch step.

Example:
    >>> import torch; torch.set_num_threads(1)
    >>> from vecaccel.trainers import PQN
    >>> agent = PQN("CartPole-v1", backend="serial", num_envs=4, num_steps=8, num_minibatches=2,
    ...             hidden_sizes=(32,), seed=0, progress=False, tensorboard=False)
    >>> _ = agent.learn(64)
    >>> agent.num_updates, agent.config.layer_norm
    (2, True)
    >>> actions, _ = agent.predict(agent.envs.reset(seed=0)[0], deterministic=True)
    >>> actions.shape
    (4,)
    >>> agent.close()
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm, RolloutConfig
from vecaccel.trainers.algos.on_policy.advantages import learning_rows
from vecaccel.trainers.config.presets import PQN_PRESETS as PRESETS
from vecaccel.trainers.nets.networks import QNetwork, use_bf16
from vecaccel.trainers.services.seeding import split_seed

__all__ = ["PQN", "PQNConfig", "PRESETS", "EpsilonGreedyQ", "q_lambda_returns"]

#: the key of the seed of predict's generator, apart from the run's streams
_PREDICT_STREAM = 0x9E


# -- configuration ---------------------------------------------------------------------------


@dataclass
class PQNConfig(RolloutConfig):
    """Every PQN setting; each field's docstring is its ``--help`` text (the rollout's are
    :class:`~vecaccel.trainers.algos.on_policy.base.RolloutConfig`'s). The defaults are
    purejaxql's MinAtar setting (``pqn_minatar.yaml``)."""

    num_envs: int = 128
    """Parallel environments (N)."""
    num_steps: int = 32
    """Steps per environment per rollout (T); the batch is num_envs * num_steps."""
    update_epochs: int = 2
    """Passes over each rollout (E)."""
    num_minibatches: int = 32
    """Minibatches per epoch."""
    q_lambda: float = 0.65
    """λ of the λ-returns: 0 gives one-step Q-learning targets, 1 Monte Carlo returns
    bootstrapped at the rollout's end."""
    learning_rate: float = 5e-4
    """RAdam's learning rate at base_batch_size (before lr scaling), annealed with anneal_lr."""
    base_batch_size: int = 4096
    """Batch size at which learning_rate was tuned (128 envs x 32 steps)."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    loss: str = "mse"
    """TD loss: mse (half the squared error, purejaxql's) or huber (delta 1)."""
    start_epsilon: float = 1.0
    """Exploration rate of the first rollout."""
    end_epsilon: float = 0.05
    """Exploration rate after the decay."""
    exploration_fraction: float = 0.1
    """Fraction of the run's updates over which epsilon decays linearly."""
    eval_epsilon: float = 0.05
    """Exploration rate of ``predict(deterministic=False)`` (the DQN family's)."""
    layer_norm: bool = True
    """A LayerNorm after each hidden layer of the Q-network, before its activation."""
    network: str = "auto"
    """Q-network torso: auto (Nature CNN for uint8 images, the MinAtar network for MinAtar's
    grids, MLP otherwise), cnn, minatar or mlp."""
    hidden_sizes: tuple[int, ...] = (128, 128)
    """MLP widths of the Q-network."""
    activation: str = "relu"
    """MLP activation: relu or tanh."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        for name in ("q_lambda", "start_epsilon", "end_epsilon", "eval_epsilon"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
        if not 0.0 <= self.exploration_fraction <= 1.0:
            raise ValueError(
                f"exploration_fraction must lie in [0, 1], got {self.exploration_fraction!r}"
            )
        if self.loss not in ("mse", "huber"):
            raise ValueError(f"loss must be 'mse' or 'huber', got {self.loss!r}")


# -- the λ-returns ---------------------------------------------------------------------------


def q_lambda_returns(
    rewards: torch.Tensor,
    next_max_q: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    q_lambda: float,
) -> torch.Tensor:
    """The λ-returns of a ``[T, B]`` rollout, computed backwards from its last step.

    ``G_t = r_t + γ (1 - terminated_t) [(1 - λ_t) max_a Q(s_{t+1}, a) + λ_t G_{t+1}]``, where
    ``λ_t`` is λ, or 0 where the episode ended at ``t`` (``G_{t+1}`` is then another episode's),
    and after the last row ``G_T = max_a Q(s_T, a)``. So a terminal step's return is its reward,
    and a truncated one bootstraps from the max-Q of its true final observation.

    Args:
        rewards: ``[T, B]``.
        next_max_q: ``[T, B]`` ``max_a Q(s_{t+1}, a)``, ``s_{t+1}`` the true final observation
            at a truncation (its value at a terminal step is never read).
        terminated: ``[T, B]`` bool.
        truncated: ``[T, B]`` bool.
        gamma: discount.
        q_lambda: λ.

    Returns:
        ``[T, B]`` float32 targets.

    Example:
        >>> rewards = torch.tensor([[1.0], [1.0]])
        >>> next_max_q = torch.tensor([[2.0], [4.0]])
        >>> no = torch.zeros(2, 1, dtype=torch.bool)
        >>> q_lambda_returns(rewards, next_max_q, no, no, gamma=0.5, q_lambda=0.5)
        tensor([[2.2500],
                [3.0000]])
    """
    rewards, next_max_q = rewards.float(), next_max_q.float()
    not_terminal = (~terminated).float()
    lambdas = (~(terminated | truncated)).float() * q_lambda
    returns = torch.empty_like(rewards)
    following = next_max_q[-1]  # G_T: the rollout's own end bootstraps fully
    for t in range(rewards.shape[0] - 1, -1, -1):
        mixed = (1.0 - lambdas[t]) * next_max_q[t] + lambdas[t] * following
        following = rewards[t] + gamma * not_terminal[t] * mixed
        returns[t] = following
    return returns


# -- the network that acts -------------------------------------------------------------------


class EpsilonGreedyQ(nn.Module):
    """A Q-network and the exploration rate it acts with (a buffer, so it travels with the
    weights): ``forward`` gives the Q-values the loss trains, :meth:`explore` the actions.

    Args:
        q_network: maps ``[N, *obs_shape]`` observations to ``[N, A]`` Q-values.
        num_actions: ``A``.
        action_start: ``start`` of the ``Discrete`` action space (the env numbers its actions
            from it, the Q-values from 0).
        epsilon: the exploration rate to start with.

    Example:
        >>> model = EpsilonGreedyQ(torch.nn.Linear(4, 3), num_actions=3, epsilon=0.0)
        >>> actions, extras = model.explore(torch.zeros(2, 4))
        >>> actions.shape, sorted(extras)
        (torch.Size([2]), ['max_q'])
    """

    epsilon: torch.Tensor

    def __init__(
        self, q_network: nn.Module, num_actions: int, action_start: int = 0, epsilon: float = 1.0
    ) -> None:
        super().__init__()
        self.q_network = q_network
        self.num_actions = int(num_actions)
        self.action_start = int(action_start)
        self.register_buffer("epsilon", torch.tensor(float(epsilon)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[N, A]`` Q-values."""
        q: torch.Tensor = self.q_network(obs)
        return q

    def explore(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The sampler's policy: each env's action random with probability ``epsilon``, else
        the greedy one (in the env's numbering), and ``{"max_q": max_a Q(obs, a)}``, the
        bootstrap of the step before."""
        q = self(obs)
        max_q, greedy = q.max(dim=1)
        n = q.shape[0]
        explore = torch.rand(n, device=q.device) < self.epsilon
        random = torch.randint(0, self.num_actions, (n,), device=q.device)
        actions = torch.where(explore, random, greedy) + self.action_start
        return actions, {"max_q": max_q}


# -- the agent -------------------------------------------------------------------------------


class PQN(OnPolicyAlgorithm):
    """Parallelised Q-learning: λ-returns of ε-greedy rollouts, no replay, no target network.

    ``PQN(env, *, preset="auto", **config)`` with :class:`PQNConfig` fields, as every algorithm
    is built (:class:`~vecaccel.trainers.algos.base.Algorithm`); envs with a ``Discrete`` action
    space. The sampler, the loop, checkpoints and the asynchronous feed are
    :class:`~vecaccel.trainers.algos.on_policy.base.OnPolicyAlgorithm`'s.
    """

    algo_name = "pqn"
    config_cls = PQNConfig
    config: PQNConfig
    presets = PRESETS

    def make_model(self, observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> Any:
        """The Q-network (with LayerNorm per ``layer_norm``) and the ε it acts with."""
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"PQN needs a Discrete action space, got {action_space}")
        cfg = self.config
        q_network = QNetwork(
            observation_space,
            int(action_space.n),
            network=cfg.network,
            hidden_sizes=cfg.hidden_sizes,
            activation=cfg.activation,
            channels_last=cfg.channels_last,
            bf16=use_bf16(cfg.bf16, self.device, observation_space),
            layer_norm=cfg.layer_norm,
        )
        start = int(action_space.start)
        return EpsilonGreedyQ(q_network, int(action_space.n), start, cfg.start_epsilon)

    def make_optimizer(self, learning_rate: float) -> Any:
        # foreach: a few multi-tensor ops per step; torch's CPU default loops over the tensors
        return torch.optim.RAdam(self.model.parameters(), lr=learning_rate, foreach=True)

    def sampler_policy(self) -> Any:
        """ε-greedy actions of the model, in the env's numbering (:meth:`EpsilonGreedyQ.explore`)."""
        return self.model.explore

    def epsilon(self, progress_remaining: float) -> float:
        """The exploration rate at this point of the update schedule: ``start_epsilon`` moving
        linearly to ``end_epsilon`` over the first ``exploration_fraction`` of the updates."""
        cfg = self.config
        if cfg.exploration_fraction <= 0:
            return cfg.end_epsilon
        left = max(0.0, 1.0 - (1.0 - progress_remaining) / cfg.exploration_fraction)
        return cfg.end_epsilon + (cfg.start_epsilon - cfg.end_epsilon) * left

    def apply_learning_rate(self, progress_remaining: float) -> float:
        """Set the learning rate and ε for this point of the schedule; returns the rate.

        Both loops set the rate here before the rollout it trains on is acted (the asynchronous
        one before the update whose weights the next rollout takes), and ε follows the same
        update schedule, as purejaxql's; it goes into the model's buffer in place, so that the
        weights published to a rollout process carry it.
        """
        self.model.epsilon.fill_(self.epsilon(progress_remaining))
        return super().apply_learning_rate(progress_remaining)

    @functools.cached_property
    def predict_rng(self) -> np.random.Generator:
        """``predict``'s generator: a callback that predicts leaves the run's draws alone."""
        return np.random.default_rng(split_seed(self.config.seed, _PREDICT_STREAM))

    def act_for_predict(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Greedy actions for the batch ``obs``, or with probability ``eval_epsilon`` random
        ones (drawn from :attr:`predict_rng`)."""
        epsilon = 0.0 if deterministic else self.config.eval_epsilon
        with torch.no_grad(), self.acting():
            q = self.model(torch.as_tensor(obs, device=self.device))
        actions = q.argmax(dim=1).cpu().numpy()
        if epsilon > 0:
            n = len(actions)
            random = self.predict_rng.integers(0, self.model.num_actions, size=n)
            actions = np.where(self.predict_rng.random(n) < epsilon, random, actions)
        env_actions: np.ndarray = actions + self.action_start
        return env_actions

    # -- the update ---------------------------------------------------------------------------

    @torch.no_grad()
    def next_max_q(self, batch: Any) -> torch.Tensor:
        """``[T, B]`` ``max_a Q(s_{t+1}, a)`` of every step: the next row's, recorded when it
        was acted on (by the weights that collected the rollout, as purejaxql's); after the last
        row, the batch's ``next_obs``'s; at a truncation, its true final observation's."""
        max_q = batch.extras["max_q"].float()
        last = self.model(batch.next_obs).max(dim=1).values
        next_max_q = torch.cat([max_q[1:], last[None]])
        if len(batch.final_index):
            index = batch.final_index
            next_max_q[index[:, 0], index[:, 1]] = self.model(batch.final_obs).max(dim=1).values
        return next_max_q

    def update(self, batch: Any, progress_remaining: float = 1.0) -> dict[str, float]:
        """One PQN update: the rollout's λ-returns, then ``update_epochs`` passes of minibatch
        regression of ``Q(s, a)`` onto them."""
        cfg = self.config
        terminated = batch.terminated
        if batch.active is not None:  # a row whose next row's agent is absent has no successor
            ends = torch.zeros_like(terminated)
            ends[:-1] = ~batch.active[1:]
            terminated = terminated | (ends & ~batch.truncated)
        returns = q_lambda_returns(
            batch.rewards,
            self.next_max_q(batch),
            terminated,
            batch.truncated,
            cfg.gamma,
            cfg.q_lambda,
        )

        # the rows to learn from, flat: no NEXT_STEP reset step, no absent agent's row
        rows = learning_rows(batch)
        keep = None if rows is None else rows.reshape(-1).nonzero().squeeze(1)

        def flat(x: torch.Tensor) -> torch.Tensor:
            x = x.reshape(-1, *x.shape[2:])
            return x if keep is None else x[keep]

        b_obs, b_actions, b_returns = flat(batch.obs), flat(batch.actions).long(), flat(returns)

        n = b_obs.shape[0]
        minibatch_size = max(1, n // cfg.num_minibatches)
        loss_sum = torch.zeros((), device=b_obs.device)
        q_sum = torch.zeros((), device=b_obs.device)
        grad_norm = torch.zeros(())
        steps = 0
        for _ in range(cfg.update_epochs):
            if minibatch_size >= n:  # one minibatch, the whole batch, in order
                minibatches: Any = (slice(None),)
            else:
                minibatches = torch.randperm(n, device=b_obs.device).split(minibatch_size)  # type: ignore[no-untyped-call]
            for index in minibatches:
                mb_obs, mb_actions, mb_returns = b_obs[index], b_actions[index], b_returns[index]
                q_taken = self.train_model(mb_obs).gather(1, mb_actions[:, None]).squeeze(1)
                if cfg.loss == "huber":
                    loss = F.huber_loss(q_taken, mb_returns, delta=1.0)
                else:
                    loss = 0.5 * (q_taken - mb_returns).pow(2).mean()

                grad_norm = self.backward_step(loss, cfg.max_grad_norm)
                loss_sum += loss.detach()
                q_sum += q_taken.detach().mean()
                steps += 1

        # one conversion for all the statistics: each .item() would be a sync on an accelerator
        td_loss, q_values, norm = torch.stack(
            [loss_sum / steps, q_sum / steps, grad_norm.to(loss_sum.device).float()]
        ).tolist()
        return {
            "losses/td_loss": td_loss,
            "losses/q_values": q_values,
            "losses/grad_norm": norm,
            "losses/lambda_return": float(b_returns.mean()),
            "charts/epsilon": float(self.model.epsilon),
        }
