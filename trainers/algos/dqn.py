"""The DQN family: DQN, Double, Dueling, n-step, prioritized replay, C51 and ε-Rainbow.

The file reads top to bottom like a CleanRL script: the config, the C51 projection, then the
agent: its network and :meth:`DQN.update`, the whole loss and update. The envs, the replay
buffer (n-step targets computed at sample time), the target network and ε-greedy acting are
:class:`~vecaccel.trainers.algos.off_policy.base.OffPolicyAlgorithm`'s; the loop is a runner's
(:class:`~vecaccel.trainers.runners.sync.SyncRunner`, or
:class:`~vecaccel.trainers.runners.asynchronous.runner.AsyncRunner`).

Training intensity is the *replay ratio*: transitions consumed by gradient updates per transition
collected (``updates × batch_size / env_steps``, after ``learning_starts``). It is a setting, the
runner enforces it exactly (to within one update), and the measured value is logged as
``charts/replay_ratio``. Batch size is free up to 2048 and beyond; the learning rate is scaled by
``lr_scaling`` in the ratio ``batch_size / base_batch_size`` (logged as ``charts/lr_scale``).

Checkpoints hold the replay buffer too (``checkpoint_replay``, in a ``.npz`` beside
``checkpoint.pt``; see :mod:`vecaccel.trainers.checkpoints.writer`), and each periodic one is a
restart point where the envs are reset with a derived seed, so on CPU a run resumed from it ends
bit-identical to one never interrupted.

Example:
    >>> import torch; torch.set_num_threads(1)
    >>> from vecaccel.trainers.algos.dqn import DQN
    >>> agent = DQN(env="CartPole-v1", backend="serial", learning_starts=64, batch_size=16,
    ...             buffer_size=500, progress=False, tensorboard=False)
    >>> agent = agent.learn(200)
    >>> actions, _ = agent.predict(agent.envs.observation_space.sample())
    >>> actions.shape
    (1,)
    >>> agent.close()
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vecaccel.trainers.algos.off_policy import OffPolicyAlgorithm
from vecaccel.trainers.algos.off_policy.exploration import expected_q
from vecaccel.trainers.config.presets import DQN_PRESETS as PRESETS
from vecaccel.trainers.config.settings import RunConfig, check_dqn_config
from vecaccel.trainers.nets.networks import QNetwork, use_bf16
from vecaccel.trainers.replay.buffer import ReplaySample
from vecaccel.trainers.services.schedules import linear_schedule

__all__ = [
    "C51",
    "DQN",
    "DQNConfig",
    "PRESETS",
    "Rainbow",
    "categorical_projection",
    "linear_schedule",
]


# -- configuration ---------------------------------------------------------------------------


@dataclass
class DQNConfig(RunConfig):
    """Every setting of the DQN family; the defaults train DQN on CartPole."""

    num_envs: int = 1
    """Environments stepped together (each env step counts towards the step budget)."""
    log_every_steps: int = 1_000
    """Env steps between metric rows (0: every vector step)."""
    learning_rate: float = 2.5e-4
    """The optimizer's learning rate at ``base_batch_size`` (scaled for other batch sizes by
    ``lr_scaling``)."""
    base_batch_size: int = 32
    """Batch size ``learning_rate`` was tuned for."""
    lr_scaling: str = "none"
    """How the learning rate follows the batch: ``none``, ``linear`` or ``sqrt`` in
    ``batch_size / base_batch_size``."""
    adam_eps: float = 1e-8
    """Adam's epsilon (1.5e-4 in Rainbow, 0.01/32 in C51)."""
    optimizer: str = "adam"
    """``adam``, or ``rmsprop``: centred RMSprop, the optimizer of Nature DQN and of MinAtar's DQN
    (``rms_alpha``, ``rms_eps``)."""
    rms_alpha: float = 0.95
    """RMSprop's smoothing constant (Nature DQN's 0.95)."""
    rms_eps: float = 0.01
    """RMSprop's epsilon (Nature DQN's 0.01)."""
    batch_size: int = 32
    """Transitions per gradient update (up to 2048 and more)."""
    buffer_size: int = 10_000
    """Replay capacity in transitions (each finished episode also takes one slot)."""
    gamma: float = 0.99
    """Discount factor."""
    replay_ratio: float = 8.0
    """Transitions consumed by updates per transition collected (``updates × batch_size / env
    steps``), enforced after ``learning_starts``; 8 is Nature DQN's (batch 32 every 4 steps)."""
    learning_starts: int = 1_000
    """Env steps collected before the first update."""
    target_update_period: int = 500
    """Env steps between target-network updates."""
    tau: float = 1.0
    """Target update rate: 1 copies the online network; smaller values blend (Polyak)."""
    start_epsilon: float = 1.0
    """Exploration rate at the first step."""
    end_epsilon: float = 0.05
    """Exploration rate after the decay."""
    exploration_fraction: float = 0.5
    """Fraction of the step budget over which epsilon decays linearly."""
    exploration_steps: int = 0
    """Env steps of the epsilon decay; overrides ``exploration_fraction`` when positive."""
    eval_epsilon: float = 0.05
    """Exploration rate of ``predict(deterministic=False)`` (SB3's final exploration rate, and
    Nature DQN's in evaluation)."""
    double: bool = False
    """Double DQN: the online network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling heads: separate state-value and advantage streams."""
    n_step: int = 1
    """Length of the multi-step return (stops at episode ends)."""
    prioritized: bool = False
    """Proportional prioritized replay with importance-sampling weights."""
    priority_alpha: float = 0.5
    """Prioritization exponent (0 is uniform)."""
    priority_beta_start: float = 0.4
    """Importance-sampling exponent at the start, annealed linearly to 1 over the step budget."""
    priority_eps: float = 1e-6
    """Added to every priority so that no transition is never replayed."""
    categorical: bool = False
    """Learn return distributions on a fixed support (C51) instead of expected values."""
    num_atoms: int = 51
    """Atoms of the categorical support."""
    v_min: float = -10.0
    """Lowest value of the categorical support."""
    v_max: float = 10.0
    """Highest value of the categorical support."""
    loss: str = "huber"
    """TD loss of the expected-value variants: ``huber`` or ``mse``."""
    max_grad_norm: float = 10.0
    """Gradient-norm clipping threshold (0 disables clipping)."""
    network: str = "auto"
    """Torso: ``auto`` (Nature CNN for uint8 images, the MinAtar network for MinAtar's grids,
    else MLP), ``cnn``, ``minatar`` or ``mlp``."""
    hidden_sizes: tuple[int, ...] = (120, 84)
    """MLP widths."""
    frame_stack: int = 0
    """Frames stacked on axis 0 of each observation, stored once each in the replay buffer;
    0 detects it (``F`` for uint8 ``[F, H, W]`` observations, else 1), 1 stores observations
    whole."""
    channels_last: bool = False
    """NHWC convolutions (faster on many CPUs)."""
    bf16: str = "off"
    """bfloat16 autocast in the convolutional torso (Nature CNN or MinAtar's): off, on, or auto
    (on where the hardware has bf16 units)."""
    checkpoint_replay: bool = True
    """Write the replay buffer (contents, write positions, priorities, sampling RNG) beside each
    checkpoint written during ``learn``, as ``checkpoint.replay-<step>-<id>.npz``, so that a
    resumed run does not refill it; turn off when it is too big to write often (Atari: GBs)."""
    async_max_lead: int = 0
    """Asynchronous mode: twice the env steps of a chunk the sampler hands over (0: automatic,
    16 updates' worth or one vector step, whichever is larger); a larger lead lets the two sides
    overlap better, a smaller one acts on fresher weights."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        check_dqn_config(self)


# -- the C51 projection ----------------------------------------------------------------------


def categorical_projection(
    next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """Project the distribution of ``reward + discount * Z`` onto ``support`` (C51, Algorithm 1).

    Each atom ``z_j`` moves to ``Tz_j = clip(r + discount * z_j, v_min, v_max)`` and its probability
    is split between the two nearest atoms in proportion to the distances, all of it going to one
    atom when ``Tz_j`` falls exactly on it (Bellemare, Dabney & Munos, 2017).

    Args:
        next_probs: ``[N, atoms]`` probabilities of the next state's chosen action.
        rewards: ``[N]`` (n-step) returns.
        discounts: ``[N]`` ``gamma ** k``, 0 where the episode terminated.
        support: ``[atoms]`` evenly spaced atoms from ``v_min`` to ``v_max``.

    Returns:
        ``[N, atoms]`` target probabilities (each row sums to one).

    Example:
        >>> support = torch.tensor([0.0, 1.0, 2.0])
        >>> categorical_projection(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([0.5]),
        ...                        torch.tensor([1.0]), support)
        tensor([[0.0000, 0.5000, 0.5000]])
    """
    atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (atoms - 1)
    target_z = (rewards[:, None] + discounts[:, None] * support[None, :]).clamp(v_min, v_max)
    position = ((target_z - v_min) / delta).clamp(0, atoms - 1)
    lower = position.floor()
    upper = position.ceil()
    projected = torch.zeros_like(next_probs)
    projected.scatter_add_(1, lower.long(), next_probs * (upper - position))
    projected.scatter_add_(1, upper.long(), next_probs * (position - lower))
    # on an atom both weights above are zero: that atom takes the whole probability
    projected.scatter_add_(1, lower.long(), next_probs * (lower == upper).to(next_probs.dtype))
    return projected


# -- the agent -------------------------------------------------------------------------------


class DQN(OffPolicyAlgorithm):
    """Deep Q-learning over a vecaccel vector env, with every DQN-family option.

    ``DQN(env, *, preset="auto", **config)`` with :class:`DQNConfig` fields, as every
    algorithm is built (:class:`~vecaccel.trainers.algos.base.Algorithm`). The envs, the replay
    buffer, the target network, ε-greedy acting, ``learn``, saving and loading are
    :class:`~vecaccel.trainers.algos.off_policy.base.OffPolicyAlgorithm`'s; this class holds the
    network and the loss.
    """

    algo_name = "dqn"
    loads_family = True
    config_cls = DQNConfig
    config: DQNConfig
    presets = PRESETS
    loss_keys = ("losses/td_loss", "losses/q_values", "losses/grad_norm")

    def make_q_network(self) -> torch.nn.Module:
        """The Q-network: dueling heads, and one output per atom for a categorical one."""
        cfg = self.config
        return QNetwork(
            self.observation_space,
            int(self.action_space.n),
            network=cfg.network,
            hidden_sizes=cfg.hidden_sizes,
            activation="relu",
            dueling=cfg.dueling,
            num_atoms=cfg.num_atoms if cfg.categorical else 1,
            channels_last=cfg.channels_last,
            bf16=use_bf16(cfg.bf16, self.device, self.observation_space),
        )

    def make_support(self) -> torch.Tensor | None:
        """``num_atoms`` evenly spaced atoms from ``v_min`` to ``v_max`` for C51's head."""
        cfg = self.config
        if not cfg.categorical:
            return None
        return torch.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms, device=self.device)

    # -- the update ---------------------------------------------------------------------------

    def update(self, batch: ReplaySample, progress_remaining: float = 1.0) -> dict[str, float]:
        """One gradient update on ``batch``; returns the losses and statistics to log.

        ``progress_remaining`` is unused: the DQN family's learning rate is constant (its ε and
        β schedules follow the env steps).
        """
        cfg = self.config
        device = self.device
        b_obs = torch.as_tensor(batch.obs, device=device)
        # the replay holds the env's actions; the network's outputs are numbered from 0
        b_actions = torch.as_tensor(batch.action, device=device).long()
        if self.action_start:
            b_actions = b_actions - self.action_start
        b_returns = torch.as_tensor(batch.reward, device=device)
        b_discounts = torch.as_tensor(batch.discount, device=device)
        b_next_obs = torch.as_tensor(batch.next_obs, device=device)
        b_weights = torch.as_tensor(batch.weights, device=device)
        rows = torch.arange(b_obs.shape[0], device=device)

        with torch.no_grad():
            next_target = self.target_network(b_next_obs)
            if cfg.categorical:
                next_target_probs = torch.softmax(next_target, dim=-1)
                next_target_q = (next_target_probs * self.support).sum(-1)
            else:
                next_target_q = next_target
            if cfg.double:
                next_actions = expected_q(self.q_network(b_next_obs), self.support).argmax(dim=1)
            else:
                next_actions = next_target_q.argmax(dim=1)
            if cfg.categorical:
                target_probs = categorical_projection(
                    next_target_probs[rows, next_actions], b_returns, b_discounts, self.support
                )
            else:
                td_target = b_returns + b_discounts * next_target_q[rows, next_actions]

        out = self.train_network(b_obs)[rows, b_actions]
        if cfg.categorical:
            log_probs = torch.log_softmax(out, dim=-1)
            per_sample = -(target_probs * log_probs).sum(-1)  # cross-entropy to the projection
            priorities = per_sample.detach()
            q_taken = (log_probs.exp() * self.support).sum(-1).detach()
        else:
            td_error = td_target - out
            if cfg.loss == "huber":
                per_sample = F.huber_loss(out, td_target, reduction="none", delta=1.0)
            else:
                per_sample = td_error.pow(2)
            priorities = td_error.detach().abs()
            q_taken = out.detach()
        loss = (b_weights * per_sample).mean()

        grad_norm = self.backward_step(loss, cfg.max_grad_norm)
        if cfg.prioritized:
            self.buffer.update_priorities(batch.indices, priorities.cpu().numpy())
        return {
            "losses/td_loss": float(loss.detach()),
            "losses/q_values": float(q_taken.mean()),
            "losses/grad_norm": float(grad_norm),
        }


class C51(DQN):
    """Categorical DQN (Bellemare et al., 2017): 51 atoms on [-10, 10], cross-entropy loss.

    Example:
        >>> C51(env=None).config.categorical
        True
    """

    algo_name = "c51"
    loads_family = False
    defaults = dict(categorical=True, adam_eps=0.01 / 32)


class Rainbow(DQN):
    """ε-Rainbow: Double + Dueling + 3-step + prioritized + C51, ε-greedy instead of noisy nets.

    Example:
        >>> config = Rainbow(env=None).config
        >>> config.double, config.dueling, config.n_step, config.prioritized, config.categorical
        (True, True, 3, True, True)
    """

    algo_name = "rainbow"
    loads_family = False
    defaults = dict(
        double=True,
        dueling=True,
        n_step=3,
        prioritized=True,
        categorical=True,
        adam_eps=1.5e-4,
    )
