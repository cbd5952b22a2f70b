"""The DQN family: DQN, Double, Dueling, n-step, prioritized replay, C51 and ε-Rainbow.

The file reads top to bottom like a CleanRL script: the config, the presets, the schedules, the
C51 projection, then the agent whose :meth:`DQN.learn` is the whole training loop and whose
:meth:`DQN.train_step` is the whole loss and update.

The loop steps a vecaccel ``VectorEnv`` under ``AutoresetMode.SAME_STEP``, so every step is a real
transition and a truncated episode bootstraps from its true final observation
(``infos["final_obs"]``); the replay buffer computes n-step targets at sample time.

Training intensity is the *replay ratio*: transitions consumed by gradient updates per transition
collected (``updates × batch_size / env_steps``, after ``learning_starts``). It is a setting, the
loop enforces it exactly (to within one update), and the measured value is logged as
``charts/replay_ratio``. Batch size is free up to 2048 and beyond; the learning rate is scaled by
``lr_scaling`` in the ratio ``batch_size / base_batch_size`` (logged as ``charts/lr_scale``).

Checkpoints hold the replay buffer too (``checkpoint_replay``, in a ``.npz`` beside
``checkpoint.pt``), and each periodic one is a restart point where the envs are reset with a
derived seed, so on CPU a run resumed from it ends bit-identical to one never interrupted (see
:meth:`DQN.learn`).

Example:
    >>> import torch; torch.set_num_threads(1)
    >>> from vecaccel.trainers.dqn import DQN
    >>> agent = DQN(env="CartPole-v1", backend="serial", learning_starts=64, batch_size=16,
    ...             buffer_size=500, progress=False, tensorboard=False)
    >>> agent = agent.learn(200)
    >>> actions, _ = agent.predict(agent.envs.observation_space.sample())
    >>> actions.shape
    (1,)
    >>> agent.close()
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium.vector import AutoresetMode

from vecaccel.trainers import distributed
from vecaccel.trainers.common import (
    CheckpointError,
    RunLogger,
    SignalCheckpoint,
    TrainingInterrupted,
    action_start,
    check_env_matches,
    config_from_dict,
    configure_torch_threads,
    get_rng_state,
    load_checkpoint,
    lr_scale,
    make_env_for_training,
    restore_rank_rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
    split_seed,
    usable_device,
)
from vecaccel.trainers.models import QNetwork, check_observation_space
from vecaccel.trainers.replay import PrioritizedReplayBuffer, ReplayBuffer, ReplaySample

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
class DQNConfig:
    """Every setting of the DQN family; the defaults train DQN on CartPole."""

    seed: int = 1
    """Seed of the envs, the network initialisation, exploration and replay sampling."""
    num_envs: int = 1
    """Environments stepped together (each env step counts towards the step budget)."""
    backend: str = "serial"
    """vecaccel backend stepping the envs when ``env`` is an id (``serial``, ``shm``, ...)."""
    device: str = "auto"
    """Torch device for the networks: ``auto`` (CUDA when available), ``cpu``, ``cuda:0``..."""
    learning_rate: float = 2.5e-4
    """Adam learning rate at ``base_batch_size`` (scaled for other batch sizes by ``lr_scaling``)."""
    base_batch_size: int = 32
    """Batch size ``learning_rate`` was tuned for."""
    lr_scaling: str = "none"
    """How the learning rate follows the batch: ``none``, ``linear`` or ``sqrt`` in
    ``batch_size / base_batch_size``."""
    adam_eps: float = 1e-8
    """Adam's epsilon (1.5e-4 in Rainbow, 0.01/32 in C51)."""
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
    eval_epsilon: float = 0.0
    """Exploration rate of ``predict(deterministic=False)``."""
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
    """Torso: ``auto`` (Nature CNN for uint8 images, else MLP), ``cnn`` or ``mlp``."""
    hidden_sizes: tuple[int, ...] = (120, 84)
    """MLP widths."""
    frame_stack: int = 0
    """Frames stacked on axis 0 of each observation, stored once each in the replay buffer;
    0 detects it (``F`` for uint8 ``[F, H, W]`` observations, else 1), 1 stores observations
    whole."""
    channels_last: bool = False
    """NHWC convolutions (faster on many CPUs)."""
    bf16: bool = False
    """bfloat16 autocast in the CNN torso."""
    torch_threads: int = 0
    """Torch intra-op threads (0: automatic, the cores the env workers leave free, at least 1)."""
    log_interval: int = 1_000
    """Env steps between metric rows."""
    run_dir: str | os.PathLike[str] | None = None
    """Directory for metrics, TensorBoard events, the curve and checkpoints (None: none)."""
    tensorboard: bool = True
    """Write TensorBoard event files under ``run_dir``."""
    progress: bool = True
    """Show a live progress bar."""
    checkpoint_period: int = 0
    """Updates between checkpoints written to ``run_dir/checkpoint.pt`` (0: only at the end).
    Each is a restart point: see ``reset_envs_at_checkpoint``."""
    reset_envs_at_checkpoint: bool = True
    """At each periodic checkpoint close the open episodes and reset the envs with a seed derived
    from ``(seed, updates)``, as a resumed run does, so that on CPU a run resumed from it is
    bit-identical to one never interrupted (the running episodes are cut short)."""
    checkpoint_replay: bool = True
    """Write the replay buffer (contents, write positions, priorities, sampling RNG) beside each
    checkpoint written by :meth:`DQN.learn`, as ``checkpoint.replay-<step>-<id>.npz``, so that a
    resumed run does not refill it; turn off when it is too big to write often (Atari: GBs)."""
    async_weight_sync_period: int = 1
    """Asynchronous mode (``--async``): updates between copies of the weights to the sampler."""
    async_max_lead: int = 0
    """Asynchronous mode: env steps the sampler may run ahead of what the replay ratio allows
    (0: automatic, 16 updates' worth or one vector step, whichever is larger); a larger lead
    lets the two sides overlap better, a smaller one holds the ratio tighter early on."""

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        if self.run_dir is not None:  # a Path would not pass the checkpoint's weights-only load
            self.run_dir = os.fspath(self.run_dir)
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {self.num_envs!r}")
        if self.batch_size < 1 or self.base_batch_size < 1:
            raise ValueError("batch_size and base_batch_size must be positive")
        if self.replay_ratio <= 0:
            raise ValueError(f"replay_ratio must be positive, got {self.replay_ratio}")
        if self.loss not in ("huber", "mse"):
            raise ValueError(f"loss must be 'huber' or 'mse', got {self.loss!r}")
        if self.categorical and (self.num_atoms < 2 or not self.v_min < self.v_max):
            raise ValueError("categorical needs num_atoms >= 2 and v_min < v_max")
        if self.target_update_period < 1:
            raise ValueError("target_update_period must be at least 1 env step")
        # each of these is accepted by the maths but fails later, or silently: gamma > 1 makes
        # the targets diverge, tau <= 0 never moves the target network (or pushes it away), a
        # negative alpha or beta inverts prioritization or its correction, and a negative eps
        # makes a zero TD error a negative priority that the sum tree rejects mid-run
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma!r}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau!r}")
        if not self.priority_alpha >= 0.0:
            raise ValueError(f"priority_alpha must be non-negative, got {self.priority_alpha!r}")
        if not 0.0 <= self.priority_beta_start <= 1.0:
            raise ValueError(
                f"priority_beta_start must be in [0, 1], got {self.priority_beta_start!r}"
            )
        if not self.priority_eps >= 0.0:
            raise ValueError(f"priority_eps must be non-negative, got {self.priority_eps!r}")
        if self.async_weight_sync_period < 1:
            raise ValueError(
                f"async_weight_sync_period must be at least 1, got {self.async_weight_sync_period!r}"
            )
        if self.async_max_lead < 0:
            raise ValueError(f"async_max_lead must be non-negative, got {self.async_max_lead!r}")
        lr_scale(self.batch_size, self.base_batch_size, self.lr_scaling)  # validates the mode


# Atari settings of Stooke & Abbeel (2018), "Accelerated Methods for Deep RL": the Nature-DQN
# agent at replay ratio 8 with Adam, DQN at batch 512 and Categorical DQN at batch 2048, the
# learning rate scaled from its batch-32 value, and ε-Rainbow (Rainbow without noisy nets, so
# with ε-greedy exploration). Budgets are 50M env steps (200M frames) on 8 GPUs in the paper.
_ATARI_COMMON: dict[str, Any] = dict(
    num_envs=16,
    backend="shm",
    buffer_size=1_000_000,
    gamma=0.99,
    replay_ratio=8.0,
    learning_starts=80_000,
    target_update_period=40_000,
    start_epsilon=1.0,
    end_epsilon=0.01,
    exploration_steps=1_000_000,
    eval_epsilon=0.001,
    max_grad_norm=10.0,
    network="cnn",
    frame_stack=4,
    log_interval=10_000,
)

# tuned to solve CartPole-v1 within a CI budget on 2 CPU cores
_CARTPOLE: dict[str, Any] = dict(
    learning_rate=3.5e-4,
    base_batch_size=32,
    lr_scaling="sqrt",  # 3.5e-4 at batch 32 is 9.9e-4 at batch 256
    batch_size=256,
    buffer_size=20_000,
    replay_ratio=32.0,  # one update of 256 every 8 env steps
    learning_starts=500,
    target_update_period=500,
    exploration_fraction=0.15,
    end_epsilon=0.02,
    double=True,
    n_step=3,
    hidden_sizes=(128, 128),
    loss="mse",
)

#: Named settings, applied with ``DQN(env, preset="atari-dqn", **overrides)``.
PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": _CARTPOLE,
    # the settings above (Double, 3-step) with a categorical head: plain 1-step C51 did not
    # reach 475 in 60k steps. CartPole's discounted returns (at most 100 at gamma 0.99) need a
    # support on [0, 100], not Atari's clipped [-10, 10] (``loss`` applies to expected values only)
    "cartpole-c51": dict(_CARTPOLE, categorical=True, v_min=0.0, v_max=100.0),
    # ε-Rainbow with the settings above: Double, Dueling, 3-step, prioritized, C51 on [0, 100]
    "cartpole-rainbow": dict(
        _CARTPOLE,
        dueling=True,
        prioritized=True,
        priority_alpha=0.5,
        categorical=True,
        v_min=0.0,
        v_max=100.0,
    ),
    "atari-dqn": dict(
        _ATARI_COMMON,
        batch_size=512,
        base_batch_size=32,
        learning_rate=1e-4,
        lr_scaling="sqrt",
        adam_eps=1.5e-4,
        double=True,
    ),
    "atari-c51": dict(
        _ATARI_COMMON,
        categorical=True,
        batch_size=2048,
        base_batch_size=32,
        learning_rate=2.5e-4,
        lr_scaling="sqrt",
        adam_eps=0.01 / 32,
    ),
    "atari-rainbow": dict(
        _ATARI_COMMON,
        double=True,
        dueling=True,
        n_step=3,
        prioritized=True,
        priority_alpha=0.5,
        categorical=True,
        batch_size=512,
        base_batch_size=32,
        learning_rate=6.25e-5,
        lr_scaling="sqrt",
        adam_eps=1.5e-4,
    ),
}


# -- schedules and the C51 projection --------------------------------------------------------


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """``start`` moving linearly to ``end`` over ``duration`` steps, then ``end``.

    Example:
        >>> linear_schedule(1.0, 0.1, 100, 50)
        0.55
    """
    if duration <= 0:
        return end
    return end + (start - end) * max(0.0, 1.0 - t / duration)


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


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class DQN:
    """Deep Q-learning over a vecaccel vector env, with every DQN-family option.

    Args:
        env: a Gymnasium id (built with :func:`make_env_for_training`, ``num_envs`` copies on
            ``backend``) or a ``gymnasium.vector.VectorEnv`` created with
            ``autoreset_mode=AutoresetMode.SAME_STEP``; ``None`` only for a loaded agent used to
            predict.
        config: a full :class:`DQNConfig`; keyword arguments override its fields.
        preset: a name in :data:`PRESETS` applied before ``**overrides``.
        **overrides: :class:`DQNConfig` fields.

    Attributes:
        config: the settings in force.
        q_network: the online network; ``target_network`` its lagged copy.
        global_step: env steps collected so far; ``num_updates`` gradient updates done.
        episode_log: ``(env_step, return, length)`` of every finished episode.
    """

    #: field values this class uses by default, before ``preset`` and overrides
    defaults: dict[str, Any] = {}

    def __init__(
        self,
        env: str | gym.vector.VectorEnv | None = None,
        config: DQNConfig | None = None,
        preset: str | None = None,
        **overrides: Any,
    ) -> None:
        values = dataclasses.asdict(config) if config is not None else dict(self.defaults)
        if preset is not None:
            if preset not in PRESETS:
                raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
            values.update(PRESETS[preset])
        values.update(overrides)
        unknown = set(values) - {f.name for f in dataclasses.fields(DQNConfig)}
        if unknown:
            raise TypeError(f"unknown {type(self).__name__} settings: {sorted(unknown)}")
        self.config = cfg = DQNConfig(**values)
        # under torchrun: join the process group; each rank gets its own seed (envs, exploration)
        if distributed.init_from_env(str(_resolve_device(cfg.device))):
            cfg.device = distributed.local_device(str(_resolve_device(cfg.device)))
            cfg.seed = distributed.rank_seed(cfg.seed)
        self.world_size = distributed.world_size()
        self.is_main = distributed.is_main_process()
        configure_torch_threads(cfg.torch_threads, cfg.backend, cfg.num_envs)
        seed_everything(cfg.seed)
        self.device = _resolve_device(cfg.device)
        self.envs: gym.vector.VectorEnv | None = None
        self.env_id: str | None = None
        self._owns_envs = False
        self.observation_space: gym.spaces.Space | None = None
        self.action_space: gym.spaces.Space | None = None
        if env is not None:
            self._attach_env(env)
            self.observation_space = self.envs.single_observation_space
            self.action_space = self.envs.single_action_space
        self.rng = np.random.default_rng(cfg.seed)
        self.global_step = 0
        self.num_updates = 0
        self.episode_log: list[tuple[int, float, float]] = []
        self.buffer: ReplayBuffer | None = None
        self._measured_replay_ratio: float | None = None
        self.logger: RunLogger | None = None
        self._obs: np.ndarray | None = None
        self._episode_return = np.zeros(0)
        self._episode_length = np.zeros(0)
        self._saw_episode_info = False
        # the loop's own counters at the last checkpoint (saved with it) and, in a loaded agent,
        # those of the checkpoint it came from, which the next learn() continues exactly
        self._loop_state: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None
        # a replay file named by a checkpoint loaded without an env, read when learn() needs it
        self._pending_replay: tuple[Path, dict[str, Any]] | None = None
        # trained by the async runner (a sampler process beside this one); saved in checkpoints,
        # so that `vecaccel train --resume` goes on the same way, with the same options
        self.async_run = False
        self.async_options: dict[str, Any] = {}
        if self.observation_space is not None:
            self._build_networks()

    # -- set-up -------------------------------------------------------------------------------

    def _attach_env(self, env: str | gym.vector.VectorEnv) -> None:
        cfg = self.config
        self.env_id = env if isinstance(env, str) else getattr(env.spec, "id", None)
        if isinstance(env, str):
            self.envs = make_env_for_training(
                env, cfg.num_envs, backend=cfg.backend, seed=cfg.seed, autoreset_mode="SameStep"
            )
            self._owns_envs = True
        else:
            mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
            if mode is not AutoresetMode.SAME_STEP and mode != AutoresetMode.SAME_STEP.value:
                raise ValueError(
                    f"{type(self).__name__} needs a vector env created with "
                    f"autoreset_mode=AutoresetMode.SAME_STEP (got {mode}), so that every step is "
                    "a transition and truncated episodes bootstrap from infos['final_obs']"
                )
            self.envs = env
        space = self.envs.single_action_space
        try:
            if not isinstance(space, gym.spaces.Discrete):
                raise TypeError(f"{type(self).__name__} needs a Discrete action space, got {space}")
            check_observation_space(self.envs.single_observation_space)
            if self.observation_space is not None:  # a loaded agent: its network must fit
                check_env_matches(
                    self.env_id,
                    self.envs.single_observation_space,
                    space,
                    self.observation_space,
                    self.action_space,
                )
        except (TypeError, ValueError):
            if self._owns_envs:
                self.envs.close()
                self.envs = None
            raise

    def _build_networks(self) -> None:
        cfg = self.config
        num_actions = int(self.action_space.n)
        self.q_network = QNetwork(
            self.observation_space,
            num_actions,
            network=cfg.network,
            hidden_sizes=cfg.hidden_sizes,
            activation="relu",
            dueling=cfg.dueling,
            num_atoms=cfg.num_atoms if cfg.categorical else 1,
            channels_last=cfg.channels_last,
            bf16=cfg.bf16,
        ).to(self.device)
        self.target_network = copy.deepcopy(self.q_network)
        self.target_network.requires_grad_(False)
        # the effective batch of an update is the sum of every rank's batch
        self.lr_scale = lr_scale(
            cfg.batch_size * self.world_size, cfg.base_batch_size, cfg.lr_scaling
        )
        self.learning_rate = cfg.learning_rate * self.lr_scale
        try:  # the fused kernel cuts the per-parameter overhead that dominates small networks
            self.optimizer = torch.optim.Adam(
                self.q_network.parameters(), lr=self.learning_rate, eps=cfg.adam_eps, fused=True
            )
        except (RuntimeError, TypeError):
            self.optimizer = torch.optim.Adam(
                self.q_network.parameters(), lr=self.learning_rate, eps=cfg.adam_eps
            )
        # the loss goes through DistributedDataParallel when there are several ranks
        self.train_network = distributed.wrap_model(self.q_network, self.device)
        # wrapping broadcasts rank 0's parameters into the online network only: the target is
        # copied from it again, or every rank would compute its TD targets with its own randomly
        # initialised target network until the first target update (load() then overwrites
        # both with the checkpoint's, which is the same on every rank)
        self.target_network.load_state_dict(self.q_network.state_dict())
        self.support = (
            torch.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms, device=self.device)
            if cfg.categorical
            else None
        )

    def _frame_stack(self) -> int:
        if self.config.frame_stack > 0:
            return self.config.frame_stack
        space = self.observation_space
        image = isinstance(space, gym.spaces.Box) and space.dtype == np.uint8
        return int(space.shape[0]) if image and len(space.shape) == 3 else 1

    def _buffer_kwargs(self, num_envs: int) -> dict[str, Any]:
        """The replay buffer's arguments (here and in the async runner's shared buffer, so that
        their checkpointed buffers fit each other)."""
        cfg = self.config
        kwargs: dict[str, Any] = dict(
            capacity=max(cfg.buffer_size, num_envs * (cfg.n_step + self._frame_stack() + 8)),
            num_envs=num_envs,
            n_step=cfg.n_step,
            gamma=cfg.gamma,
            frame_stack=self._frame_stack(),
            seed=cfg.seed,
        )
        if cfg.prioritized:
            kwargs.update(alpha=cfg.priority_alpha, eps=cfg.priority_eps)
        return kwargs

    def _make_buffer(self) -> ReplayBuffer:
        cls = PrioritizedReplayBuffer if self.config.prioritized else ReplayBuffer
        kwargs = self._buffer_kwargs(self.envs.num_envs)
        return cls(self.observation_space, self.action_space, **kwargs)

    # -- acting -------------------------------------------------------------------------------

    @property
    def _action_start(self) -> int:
        return action_start(getattr(self, "action_space", None))

    def _q_values(self, network: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
        out = network(obs)
        if self.support is None:
            return out
        return (torch.softmax(out, dim=-1) * self.support).sum(-1)

    @torch.no_grad()
    def _act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        """ε-greedy actions of the env's space: ``Discrete(n, start)`` acts in
        ``start..start+n-1`` while the network's outputs are numbered from 0."""
        n = obs.shape[0]
        explore = self.rng.random(n) < epsilon
        actions = self.rng.integers(0, int(self.action_space.n), size=n)
        if not explore.all():
            q = self._q_values(self.q_network, torch.as_tensor(obs, device=self.device))
            greedy = q.argmax(dim=1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        return actions + self._action_start

    def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
        """Actions for ``obs`` (one observation or a batch), as SB3's ``predict``.

        Args:
            obs: an observation or a ``[N, *obs_shape]`` batch.
            deterministic: greedy actions; otherwise ε-greedy with ``eval_epsilon``.

        Returns:
            ``(actions, None)``; a single action for a single observation.
        """
        obs = np.asarray(obs)
        single = obs.shape == tuple(self.observation_space.shape)
        batch = obs[None] if single else obs
        epsilon = 0.0 if deterministic else self.config.eval_epsilon
        actions = self._act(batch, epsilon)
        return (actions[0] if single else actions), None

    def epsilon(self, step: int, horizon: int) -> float:
        """The exploration rate at env step ``step`` of a ``horizon``-step run."""
        cfg = self.config
        duration = cfg.exploration_steps or int(cfg.exploration_fraction * horizon)
        return linear_schedule(cfg.start_epsilon, cfg.end_epsilon, duration, step)

    # -- the update ---------------------------------------------------------------------------

    def sample_batch(self, progress: float) -> tuple[float, Any]:
        """A training batch from the replay buffer, ``progress`` (0 to 1) into the run.

        Returns:
            ``(beta, batch)``: prioritized replay's importance-sampling exponent, annealed from
            ``priority_beta_start`` to 1 over the run (unused without ``prioritized``), and the
            batch.
        """
        cfg = self.config
        beta = cfg.priority_beta_start + (1.0 - cfg.priority_beta_start) * min(1.0, progress)
        if cfg.prioritized:
            return beta, self.buffer.sample(cfg.batch_size, beta=beta)
        return beta, self.buffer.sample(cfg.batch_size)

    def train_step(self, batch: ReplaySample) -> dict[str, float]:
        """One gradient update on ``batch``; returns the losses and statistics to log."""
        cfg = self.config
        device = self.device
        b_obs = torch.as_tensor(batch.obs, device=device)
        # the replay holds the env's actions; the network's outputs are numbered from 0
        b_actions = torch.as_tensor(batch.action, device=device).long()
        if self._action_start:
            b_actions = b_actions - self._action_start
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
                next_actions = self._q_values(self.q_network, b_next_obs).argmax(dim=1)
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

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(
                self.q_network.parameters(), cfg.max_grad_norm, foreach=True
            )
            if cfg.max_grad_norm > 0
            else torch.zeros(())
        )
        self.optimizer.step()
        if cfg.prioritized:
            self.buffer.update_priorities(batch.indices, priorities.cpu().numpy())
        return {
            "losses/td_loss": float(loss.detach()),
            "losses/q_values": float(q_taken.mean()),
            "losses/grad_norm": float(grad_norm),
        }

    def _update_target(self) -> None:
        tau = self.config.tau
        with torch.no_grad():
            for target, online in zip(
                self.target_network.parameters(), self.q_network.parameters()
            ):
                if tau >= 1.0:
                    target.copy_(online)
                else:
                    target.lerp_(online, tau)

    # -- the loop -----------------------------------------------------------------------------

    def _record_episodes(self, reward, done, infos) -> list[tuple[float, float]]:
        """Returns and lengths of the episodes that ended this step.

        ``info["episode"]`` of ``RecordEpisodeStatistics`` (real game scores for Atari, across
        lives) is preferred; envs without it are measured from the rewards seen.
        """
        self._episode_return += reward
        self._episode_length += 1
        finished: list[tuple[float, float]] = []
        final_info = infos.get("final_info", {})
        stats = final_info.get("episode") if isinstance(final_info, dict) else None
        if stats is not None:
            self._saw_episode_info = True
            mask = final_info.get("_episode", np.ones(len(done), dtype=bool))
            for i in np.flatnonzero(mask):
                finished.append((float(stats["r"][i]), float(stats["l"][i])))
        elif not self._saw_episode_info:
            for i in np.flatnonzero(done):
                finished.append((float(self._episode_return[i]), float(self._episode_length[i])))
        self._episode_return[done] = 0.0
        self._episode_length[done] = 0
        return finished

    def learn(
        self,
        total_steps: int | None = None,
        reset_num_timesteps: bool = True,
        callback: Callable[[DQN], bool | None] | None = None,
    ) -> DQN:
        """Collect ``total_steps`` env steps, training as the replay ratio prescribes.

        Resume. Env state cannot be saved, so with ``run_dir`` and ``checkpoint_period`` set
        each periodic checkpoint is a restart point (``reset_envs_at_checkpoint``): the open
        episodes are closed in the replay buffer, the envs are reset with a seed derived from
        ``(seed, updates)``, and the checkpoint then saves the networks, optimizer, counters,
        schedules, every RNG state and the replay buffer. A loaded agent resets its envs with
        the same seed and continues the saved run, so on CPU (same thread count) it ends with
        bit-identical parameters to a run that was never interrupted. The checkpoint written when
        ``learn`` ends (or is stopped by SIGINT/SIGTERM) continues the run too, not identically;
        an error raised inside the loop writes none, leaving the last restart point in place.
        Under ``torchrun`` every rank saves its own replay buffer; a run resumed on as many ranks
        gives each rank its own back (on another number, every rank starts from rank 0's).

        Args:
            total_steps: env steps to collect in this call; ``None`` finishes the run of the
                checkpoint this agent was loaded from.
            reset_num_timesteps: start the step count (and so the ε and β schedules and
                ``learning_starts``) from zero, as SB3 does; ``False`` continues them. A loaded
                agent given ``False`` and the steps its run had left continues that run exactly.
            callback: called with the agent after every vector step (and its updates);
                returning ``False`` stops training early, as SB3's callbacks do.

        Returns:
            ``self``.

        Raises:
            ValueError: ``total_steps`` is ``None`` but there is no unfinished loaded run.
        """
        cfg = self.config
        if self.envs is None:
            raise RuntimeError("this agent has no env: pass env= when creating or loading it")
        resume, self._resume = self._resume, None
        self.async_run, self.async_options = False, {}
        if total_steps is None:
            if resume is None or self.global_step >= resume["horizon"]:
                raise ValueError(
                    "learn() needs total_steps unless it continues the unfinished run of a "
                    "loaded checkpoint"
                )
            total_steps, reset_num_timesteps = resume["horizon"] - self.global_step, False
        exact = (
            resume is not None
            and resume["exact"]
            and not reset_num_timesteps
            and self.global_step + int(total_steps) == resume["horizon"]
        )
        envs = self.envs
        num_envs = envs.num_envs
        world = self.world_size
        # steps and batches are counted over all ranks; each rank adds num_envs per vector step
        steps_per_vector_step = num_envs * world
        effective_batch = cfg.batch_size * world
        if reset_num_timesteps:
            self.global_step = 0
            self.num_updates = 0
        new_buffer = self.buffer is None
        if new_buffer:
            self.buffer = self._make_buffer()
            if self._pending_replay is not None:
                self._read_replay(*self._pending_replay)
                new_buffer = False
        self._pending_replay = None
        if reset_num_timesteps or self._obs is None:
            # a second learn() keeps the buffer (as SB3 does), so it closes the open episodes
            self.buffer.end_episodes()
            if self._obs is not None:
                seed = None
            elif self.global_step == 0:
                seed = cfg.seed
            else:  # a loaded agent restarts where the checkpoint's run restarted its envs
                seed = self._restart_seed()
            self._obs, _ = envs.reset(seed=seed)
            self._episode_return = np.zeros(num_envs)
            self._episode_length = np.zeros(num_envs, dtype=np.int64)
        start_step = self.global_step
        horizon = start_step + int(total_steps)
        # updates start once the buffer holds learning_starts steps (and enough to sample)
        warmup = cfg.learning_starts if (reset_num_timesteps or new_buffer) else 0
        warmup = max(warmup, steps_per_vector_step * (cfg.n_step + self.buffer.frame_stack + 1))
        learn_from = start_step + warmup
        updates_at_start = self.num_updates
        beta = cfg.priority_beta_start
        next_log = start_step + cfg.log_interval
        last_target_update = self.global_step
        if exact:
            assert resume is not None
            learn_from = resume["learn_from"]
            updates_at_start = resume["updates_at_start"]
            beta = resume["beta"]
            next_log = resume["next_log"]
            last_target_update = resume["last_target_update"]
            self._saw_episode_info = resume["saw_episode_info"]
            # after the envs are made and reset, whatever that drew from the global generators
            set_rng_state(resume["rng"])
            self.rng.bit_generator.state = resume["agent_rng"]
        main = self.is_main
        logger = RunLogger(
            cfg.run_dir if main else None,  # rank 0 alone logs and checkpoints
            horizon,
            use_tensorboard=cfg.tensorboard and main,
            progress=cfg.progress and main,
            resume_step=None if reset_num_timesteps else start_step,
        )
        self.logger = logger
        logger.log(
            start_step,
            {"charts/learning_rate": self.learning_rate, "charts/lr_scale": self.lr_scale},
        )
        recent_losses: list[dict[str, float]] = []
        finished: list[tuple[float, float]] = []
        start_time = time.perf_counter()
        obs = self._obs
        restart_points = cfg.run_dir is not None and cfg.checkpoint_period > 0
        restart_due = False

        def loop_state() -> dict[str, Any]:
            return {
                "horizon": horizon,
                "learn_from": learn_from,
                "updates_at_start": updates_at_start,
                "beta": beta,
                "next_log": next_log,
                "last_target_update": last_target_update,
                "saw_episode_info": self._saw_episode_info,
            }

        guard = SignalCheckpoint().__enter__()
        vector_steps = 0
        save_on_exit = False
        try:
            while self.global_step < horizon:
                epsilon = self.epsilon(self.global_step, horizon)
                actions = self._act(obs, epsilon)
                next_obs, reward, terminated, truncated, infos = envs.step(actions)
                done = terminated | truncated
                self.buffer.add(obs, actions, reward, terminated, truncated, infos.get("final_obs"))
                obs = next_obs
                self.global_step += steps_per_vector_step
                vector_steps += 1
                for episode_return, length in self._record_episodes(reward, done, infos):
                    self.episode_log.append((self.global_step, episode_return, length))
                    finished.append((episode_return, length))

                # enforce the replay ratio: updates × batch ≤ ratio × steps since learning began
                if self.global_step > learn_from:
                    due = int(cfg.replay_ratio * (self.global_step - learn_from) // effective_batch)
                    while self.num_updates - updates_at_start < due:
                        beta, batch = self.sample_batch(self.global_step / horizon)
                        recent_losses.append(self.train_step(batch))
                        self.num_updates += 1
                        if cfg.checkpoint_period and self.num_updates % cfg.checkpoint_period == 0:
                            restart_due = restart_points
                    self._measured_replay_ratio = (
                        (self.num_updates - updates_at_start)
                        * effective_batch
                        / (self.global_step - learn_from)
                    )
                if self.global_step - last_target_update >= cfg.target_update_period:
                    last_target_update = self.global_step
                    if self.num_updates > 0:
                        self._update_target()

                if self.global_step >= next_log or self.global_step >= horizon:
                    next_log += cfg.log_interval
                    elapsed = time.perf_counter() - start_time
                    learned_steps = self.global_step - learn_from
                    metrics: dict[str, float | None] = {
                        "charts/SPS": (self.global_step - start_step) / max(elapsed, 1e-9),
                        "charts/epsilon": epsilon,
                        "charts/updates": self.num_updates,
                        "charts/replay_ratio": self.replay_ratio if learned_steps > 0 else None,
                        "charts/learning_rate": self.learning_rate,
                    }
                    if finished:
                        metrics["charts/episodic_return"] = float(np.mean([r for r, _ in finished]))
                        metrics["charts/episodic_length"] = float(np.mean([n for _, n in finished]))
                        metrics["charts/episodes"] = len(finished)
                    if recent_losses:
                        for key in recent_losses[0]:
                            metrics[key] = float(np.mean([m[key] for m in recent_losses]))
                    if cfg.prioritized and self.num_updates:
                        metrics["charts/beta"] = beta
                    if world > 1:  # every rank reaches this step: reduce over ranks
                        metrics = self._reduce_metrics(metrics, len(finished))
                    logger.log(self.global_step, metrics)
                    finished, recent_losses = [], []
                if callback is not None and callback(self) is False:
                    break
                stop = guard.requested
                if world > 1 and vector_steps % 64 == 0:  # agree at the same step on all ranks
                    stop = distributed.all_reduce_any(stop, device=self.device)
                elif world > 1:
                    stop = False
                if stop:
                    raise TrainingInterrupted(guard.signal_name or "SIGTERM", self.global_step)
                if restart_due:
                    restart_due = False
                    if self.global_step < horizon:
                        obs = self._restart_point(obs, loop_state())
            save_on_exit = True
        except TrainingInterrupted:
            save_on_exit = True
            if cfg.run_dir is not None and main:
                logger.write(
                    f"{guard.signal_name}: checkpoint saved to "
                    f"{Path(cfg.run_dir) / 'checkpoint.pt'} at step {self.global_step}"
                )
            raise
        finally:
            guard.__exit__(None, None, None)
            self._obs = obs
            self._loop_state = loop_state()
            # an error leaves the last checkpoint in place: it is a restart point to resume from
            if save_on_exit and cfg.run_dir is not None:
                self._checkpoint(replay=cfg.checkpoint_replay)
            logger.close()
        return self

    def _restart_seed(self) -> int:
        return split_seed(self.config.seed, self.num_updates)

    def _restart_point(self, obs: np.ndarray, loop_state: dict[str, Any]) -> np.ndarray:
        """Reset the envs at a seed a resumed run can reproduce, then write the checkpoint."""
        cfg = self.config
        if cfg.reset_envs_at_checkpoint:
            self.buffer.end_episodes()
            obs, _ = self.envs.reset(seed=self._restart_seed())
            self._episode_return[:] = 0.0
            self._episode_length[:] = 0
        self._obs = obs
        self._loop_state = loop_state
        self._checkpoint(replay=cfg.checkpoint_replay)
        return obs

    def _reduce_metrics(self, metrics: dict[str, Any], episodes: int) -> dict[str, Any]:
        keys = (
            "charts/episodic_return",
            "charts/episodic_length",
            "charts/episodes",
            "losses/td_loss",
            "losses/q_values",
            "losses/grad_norm",
        )
        full = {key: metrics.get(key) for key in keys} | metrics
        reduced = distributed.reduce_metrics(
            full,
            weights={"charts/episodic_return": episodes, "charts/episodic_length": episodes},
            sums=("charts/episodes",),
            device=self.device,
        )
        reduced["charts/world_size"] = float(self.world_size)
        return reduced

    @property
    def replay_ratio(self) -> float | None:
        """The replay ratio measured over the last :meth:`learn` call (None before learning)."""
        return self._measured_replay_ratio

    # -- saving and loading -------------------------------------------------------------------

    def _checkpoint(self, replay: bool = False) -> None:
        """Write ``run_dir/checkpoint.pt``; on several ranks every rank must call this.

        With ``replay`` on several ranks, every rank writes its own replay buffer (each holds
        different experience) and rank 0 names them all in the checkpoint, with each rank's
        random generators, once they are written.
        """
        path = Path(self.config.run_dir) / "checkpoint.pt"
        ranks = None
        if replay and self.world_size > 1 and self.buffer is not None:
            from vecaccel.trainers import distributed

            token = f"{self.global_step}-r{distributed.rank()}-{secrets.token_hex(4)}"
            ranks = distributed.all_gather_object(
                self._replay_entry(_write_replay(self.buffer, path, token), token)
            )
        if not self.is_main:
            return
        if ranks is not None:
            self.save(path, rank_replays=ranks)
        else:
            self.save(path, replay=replay)

    def _replay_entry(self, file: Path, token: str) -> dict[str, Any]:
        return {
            "file": file.name,
            "token": token,
            "buffer": type(self.buffer).__name__,
            "n_step": self.buffer.n_step,
            # a prioritized tree holds priority ** alpha (see PrioritizedReplayBuffer.restored)
            "alpha": getattr(self.buffer, "alpha", None),
            "rng": self.buffer.rng.bit_generator.state,
            "agent_rng": self.rng.bit_generator.state,
            "global_rng": get_rng_state(),  # this rank's torch, NumPy and Python states
        }

    def save(
        self,
        path: str | Path,
        replay: bool = False,
        rank_replays: list[dict[str, Any]] | None = None,
    ) -> Path:
        """Write the config, networks, optimizer, counters and RNG states (atomically).

        Args:
            path: the checkpoint file.
            replay: also write the replay buffer, to ``<stem>.replay-<step>-<id>.npz`` beside
                ``path`` (its name and a matching id are recorded in the checkpoint); without
                it (as in SB3) a loaded agent refills its buffer. Replay files no longer named
                by the checkpoint at ``path`` are deleted once it is written.
            rank_replays: (several ranks) the replay files every rank has written already,
                with its generators' states, in rank order; the checkpoint names them all.

        Returns:
            The checkpoint's path.
        """
        space = self.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"saving supports Box observation spaces, got {space}")
        path = Path(path)
        state = {
            "algorithm": type(self).__name__,
            "env_id": self.env_id,
            "config": {
                k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self.config).items()
            },
            "observation": {
                "shape": list(space.shape),
                "dtype": str(np.dtype(space.dtype)),
                "low": torch.as_tensor(np.asarray(space.low, dtype=np.float64)),
                "high": torch.as_tensor(np.asarray(space.high, dtype=np.float64)),
            },
            "num_actions": int(self.action_space.n),
            "action_start": int(self.action_space.start),
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
            "num_updates": self.num_updates,
            "rng": get_rng_state(),
            "agent_rng": self.rng.bit_generator.state,
            "async": bool(self.async_run),
            "async_options": dict(self.async_options),
        }
        if self._loop_state is not None:
            state["loop"] = dict(self._loop_state)
        keep: set[str] = set()
        if rank_replays is not None:
            state["replay"] = dict(rank_replays[0])  # what a single process loads
            state["rank_replays"] = [dict(entry) for entry in rank_replays]
            keep = {entry["file"] for entry in rank_replays}
        elif replay and self.buffer is not None:
            token = f"{self.global_step}-{secrets.token_hex(4)}"
            state["replay"] = self._replay_entry(_write_replay(self.buffer, path, token), token)
            keep = {state["replay"]["file"]}
        written = save_checkpoint(path, state)
        # older replay files, and the partial one of a save that was killed, are of no use now
        stem = glob.escape(path.stem)
        for pattern in (f"{stem}.replay-*.npz", f".{stem}.replay-*.npz.*.tmp"):
            for stale in path.parent.glob(pattern):
                if stale.name not in keep:
                    stale.unlink(missing_ok=True)
        return written

    @classmethod
    def load(
        cls,
        path: str | Path,
        env: str | gym.vector.VectorEnv | None = None,
        load_replay: bool = True,
        **overrides: Any,
    ) -> DQN:
        """Rebuild an agent saved by :meth:`save`.

        A checkpoint written with its replay buffer by :meth:`learn` (``checkpoint_replay``)
        is a restart point: ``learn()`` without ``total_steps`` (or ``learn(remaining,
        reset_num_timesteps=False)``) then continues its run exactly.

        Args:
            path: the checkpoint file, or the run directory holding ``checkpoint.pt``.
            env: an env to go on training or to evaluate in (optional for ``predict``).
            load_replay: read the replay buffer saved with the checkpoint (when it has one);
                ``False`` starts with an empty buffer instead.
            **overrides: config fields to change (``device``, ``run_dir``, ...).

        Raises:
            CheckpointError: the file is corrupt or truncated, or (with ``env``) the replay file
                it names is missing, corrupt or from another checkpoint.
        """
        path = Path(path)
        if path.is_dir():
            path = path / "checkpoint.pt"
        state = load_checkpoint(path)
        algorithm = state.get("algorithm")
        if algorithm is None or (cls is not DQN and algorithm != cls.__name__):
            raise CheckpointError(
                f"{path} holds a {algorithm or state.get('algo')!r} checkpoint, not "
                f"{cls.__name__!r}"
            )
        values = {**state["config"], **overrides}
        if "device" not in overrides and "device" in values:
            values["device"] = usable_device(values["device"])
        config = config_from_dict(DQNConfig, values)
        agent = cls.__new__(cls)
        DQN.__init__(agent, env=None, config=config)
        observation = state["observation"]
        dtype = np.dtype(observation["dtype"])
        agent.observation_space = gym.spaces.Box(
            observation["low"].numpy().astype(dtype),
            observation["high"].numpy().astype(dtype),
            tuple(observation["shape"]),
            dtype,
        )
        # older checkpoints have no start: they could only have trained with 0
        agent.action_space = gym.spaces.Discrete(
            state["num_actions"], start=int(state.get("action_start", 0))
        )
        agent.env_id = state.get("env_id")
        agent._build_networks()
        agent.q_network.load_state_dict(state["q_network"])
        agent.target_network.load_state_dict(state["target_network"])
        agent.optimizer.load_state_dict(state["optimizer"])
        # load_state_dict brings back the saved param_groups, hyperparameters included; the
        # config in force (overrides, or a batch size that rescales the rate) decides them, and
        # the Adam moments alone carry over. DQN has no lr schedule, so the rate is constant.
        for group in agent.optimizer.param_groups:
            group["lr"] = agent.learning_rate
            group["eps"] = config.adam_eps
        agent.global_step = int(state["global_step"])
        agent.num_updates = int(state["num_updates"])
        agent.async_run = bool(state.get("async", False))
        agent.async_options = dict(state.get("async_options", {}))
        # every rank's global states where the checkpoint has them (rank replays), else rank
        # 0's: rank 0 restores them, a rank r > 0 re-seeds from (its seed, r, the checkpoint's
        # counters) so that the ranks keep distinct streams, as in a fresh run
        resume_point = (agent.global_step, agent.num_updates)
        ranks = state.get("rank_replays")
        rank_states = None
        if ranks is not None and all("global_rng" in entry for entry in ranks):
            rank_states = [entry["global_rng"] for entry in ranks]
        rng_state = restore_rank_rng_state(
            state["rng"], agent.config.seed, *resume_point, rank_states=rank_states
        )
        agent.rng.bit_generator.state = state["agent_rng"]
        replay = state.get("replay") if load_replay else None
        rank = distributed.rank()
        if ranks is not None and len(ranks) == agent.world_size:
            # each rank of a run on as many ranks goes on with its own experience
            entry = ranks[rank]
            agent.rng.bit_generator.state = entry["agent_rng"]
            state["agent_rng"] = entry["agent_rng"]
            if replay is not None:
                replay = entry
        elif rank > 0:
            # rank 0's exploration and replay-sampling generators (the checkpoint has none of
            # this rank's): re-seeded like the global ones, or this rank would explore and
            # draw its batches exactly as rank 0 does
            agent.rng = np.random.default_rng(
                split_seed(agent.config.seed, 0xE5, rank, *resume_point)
            )
            state["agent_rng"] = agent.rng.bit_generator.state
            if replay is not None:
                sampling = np.random.default_rng(
                    split_seed(agent.config.seed, 0xB5, rank, *resume_point)
                )
                replay = {**replay, "rng": sampling.bit_generator.state}
        if replay is not None:
            # older checkpoints do not name the buffer's n_step or alpha; they were the config's
            saved = state["config"]
            replay = {"n_step": saved.get("n_step"), "alpha": saved.get("priority_alpha"), **replay}
            agent._pending_replay = (path, replay)
        if "loop" in state:  # older checkpoints have no loop state: learn() starts afresh
            agent._loop_state = dict(state["loop"])
            agent._resume = {
                **state["loop"],
                "rng": rng_state,
                "agent_rng": state["agent_rng"],
                "exact": replay is not None,
            }
        if env is not None:
            agent._attach_env(env)
            if replay is not None:  # read now, so that a bad replay file fails here
                agent.buffer = agent._make_buffer()
                agent._read_replay(path, replay)
                agent._pending_replay = None
        return agent

    def _read_replay(self, checkpoint: Path, replay: dict[str, Any]) -> None:
        self._read_replay_into(self.buffer, checkpoint, replay)

    @staticmethod
    def _read_replay_into(buffer: ReplayBuffer, checkpoint: Path, replay: dict[str, Any]) -> None:
        """Fill ``buffer`` (the async runner's shared one, or this agent's) from a checkpoint."""
        file = checkpoint.parent / replay["file"]
        if type(buffer).__name__ != replay["buffer"]:
            raise CheckpointError(
                f"checkpoint {checkpoint} holds a {replay['buffer']}, but this agent's config "
                f"makes a {type(buffer).__name__}"
            )
        _read_replay(buffer, file, replay["token"], checkpoint)
        buffer.rng.bit_generator.state = replay["rng"]
        # n_step may be overridden on load, which changes which slots can be sampled, and
        # priority_alpha, which changes the priorities a prioritized tree holds
        buffer.restored(replay.get("n_step"), replay.get("alpha"))

    def close(self) -> None:
        """Close the envs this agent created."""
        if self._owns_envs and self.envs is not None:
            self.envs.close()


# -- replay files ----------------------------------------------------------------------------

_REPLAY_TOKEN = "__checkpoint_token__"


def _write_replay(buffer: ReplayBuffer, checkpoint: Path, token: str) -> Path:
    """Write every array of ``buffer`` to an uncompressed ``.npz`` beside ``checkpoint``, atomically.

    The arrays are streamed into the archive in chunks (no copy of a GB-sized buffer); zip's
    CRC-32 of every member lets :func:`_read_replay` detect corruption.
    """
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    path = checkpoint.parent / f"{checkpoint.stem}.replay-{token}.npz"
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **{_REPLAY_TOKEN: np.array(token)}, **buffer.arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def _read_replay(buffer: ReplayBuffer, path: Path, token: str, checkpoint: Path) -> None:
    """Read a file written by :func:`_write_replay` straight into ``buffer``'s arrays.

    Raises:
        CheckpointError: the file is missing, truncated or corrupt, was written for another
            checkpoint, or does not fit the buffer.
    """
    import zipfile

    hint = "; load with load_replay=False to continue with an empty replay buffer"
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {checkpoint} needs its replay file {path}, which is missing{hint}"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            with archive.open(f"{_REPLAY_TOKEN}.npy") as member:
                saved_token = str(np.load(member, allow_pickle=False))
            if saved_token != token:
                raise CheckpointError(
                    f"replay file {path} belongs to another checkpoint than {checkpoint} "
                    f"(id {saved_token}, expected {token}){hint}"
                )
            for name, array in buffer.arrays.items():
                with archive.open(f"{name}.npy") as member:
                    version = np.lib.format.read_magic(member)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, fortran_order, dtype = read_header(member)
                    if shape != array.shape or dtype != array.dtype or fortran_order:
                        raise CheckpointError(
                            f"replay file {path}: {name} is {dtype}{list(shape)}, the buffer's is "
                            f"{array.dtype}{list(array.shape)} (was the config changed?){hint}"
                        )
                    target = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
                    done = 0
                    while done < len(target):  # reading to the end checks the member's CRC-32
                        count = member.readinto(target[done : done + (64 << 20)])
                        if not count:
                            raise EOFError(f"{name} ends after {done} of {len(target)} bytes")
                        done += count
                    member.read()
                    if not array.flags.c_contiguous:
                        array[...] = np.frombuffer(target, dtype).reshape(shape)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"replay file {path} of checkpoint {checkpoint} is truncated or corrupt: "
            f"{type(exc).__name__}: {exc}{hint}"
        ) from exc


class C51(DQN):
    """Categorical DQN (Bellemare et al., 2017): 51 atoms on [-10, 10], cross-entropy loss.

    Example:
        >>> C51(env=None).config.categorical
        True
    """

    defaults = dict(categorical=True, adam_eps=0.01 / 32)


class Rainbow(DQN):
    """ε-Rainbow: Double + Dueling + 3-step + prioritized + C51, ε-greedy instead of noisy nets.

    Example:
        >>> config = Rainbow(env=None).config
        >>> config.double, config.dueling, config.n_step, config.prioritized, config.categorical
        (True, True, 3, True, True)
    """

    defaults = dict(
        double=True,
        dueling=True,
        n_step=3,
        prioritized=True,
        categorical=True,
        adam_eps=1.5e-4,
    )
