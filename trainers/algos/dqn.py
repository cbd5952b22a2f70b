"""The DQN family: DQN, Double, Dueling, n-step, prioritized replay, C51 and ε-Rainbow.

The file reads top to bottom like a CleanRL script: the config, the C51 projection, then the
agent whose :meth:`DQN.update` is the whole loss and update. The loop
is the runner's (:class:`~vecaccel.trainers.runners.sync.SyncRunner`): it steps a vecaccel
``VectorEnv`` under ``AutoresetMode.SAME_STEP``, so every step is a real transition and a
truncated episode bootstraps from its true final observation (``infos["final_obs"]``); the
replay buffer computes n-step targets at sample time.

Training intensity is the *replay ratio*: transitions consumed by gradient updates per transition
collected (``updates × batch_size / env_steps``, after ``learning_starts``). It is a setting, the
runner enforces it exactly (to within one update), and the measured value is logged as
``charts/replay_ratio``. Batch size is free up to 2048 and beyond; the learning rate is scaled by
``lr_scaling`` in the ratio ``batch_size / base_batch_size`` (logged as ``charts/lr_scale``).

Checkpoints hold the replay buffer too (``checkpoint_replay``, in a ``.npz`` beside
``checkpoint.pt``; see ``dqn_checkpoint``), and each periodic one is a restart point where the
envs are reset with a derived seed, so on CPU a run resumed from it ends bit-identical to one
never interrupted.

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

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium.vector import AutoresetMode

from vecaccel.trainers import distributed
from vecaccel.trainers.algos.base import Algorithm, Callback
from vecaccel.trainers.algos.dqn_checkpoint import load_dqn, save_dqn, write_run_checkpoint
from vecaccel.trainers.checkpoint import check_env_matches
from vecaccel.trainers.config import RunConfig, check_dqn_config, lr_scale
from vecaccel.trainers.envs import check_tensor_spaces
from vecaccel.trainers.episodes import EpisodeStats
from vecaccel.trainers.models import QNetwork, check_observation_space
from vecaccel.trainers.presets import AUTO
from vecaccel.trainers.presets import DQN_PRESETS as PRESETS
from vecaccel.trainers.replay.buffer import ReplayBuffer, ReplaySample, replay_buffer_kwargs
from vecaccel.trainers.replay.files import restore_replay
from vecaccel.trainers.replay.prioritized import PrioritizedReplayBuffer
from vecaccel.trainers.schedules import linear_schedule

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
    checkpoint_replay: bool = True
    """Write the replay buffer (contents, write positions, priorities, sampling RNG) beside each
    checkpoint written during ``learn``, as ``checkpoint.replay-<step>-<id>.npz``, so that a
    resumed run does not refill it; turn off when it is too big to write often (Atari: GBs)."""
    async_weight_sync_period: int = 1
    """Asynchronous mode (``--async``): updates between copies of the weights to the sampler."""
    async_max_lead: int = 0
    """Asynchronous mode: env steps the sampler may run ahead of what the replay ratio allows
    (0: automatic, 16 updates' worth or one vector step, whichever is larger); a larger lead
    lets the two sides overlap better, a smaller one holds the ratio tighter early on."""

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


class DQN(Algorithm):
    """Deep Q-learning over a vecaccel vector env, with every DQN-family option.

    Args:
        env: a Gymnasium id (``num_envs`` copies on ``backend``) or a
            ``gymnasium.vector.VectorEnv`` created with ``autoreset_mode=AutoresetMode.SAME_STEP``;
            ``None`` only for a loaded agent used to predict.
        config: a full :class:`DQNConfig`; keyword arguments override its fields.
        preset: a name in :data:`PRESETS` applied before ``**overrides`` (and over ``config``);
            ``"auto"``, ``None`` and ``"none"`` as in :meth:`Algorithm.preset_values`.
        **overrides: :class:`DQNConfig` fields (``checkpoint_period`` and ``log_interval`` are
            accepted for ``checkpoint_every`` and ``log_every_steps``).

    Attributes:
        config: the settings in force.
        q_network: the online network; ``target_network`` its lagged copy.
        global_step: env steps collected so far; ``num_updates`` gradient updates done.
        episode_log: ``(env_step, return, length)`` of every finished episode.
        buffer: the replay buffer (made by the first ``learn``).
        last_obs: the observations the envs are at, where the next ``learn`` goes on from.
        loop_state: the runner's counters at the last checkpoint (saved with it).
    """

    algo_name = "dqn"
    family = "off_policy"
    config_cls = DQNConfig
    config: DQNConfig
    presets = PRESETS
    #: the losses every update reports, reduced over ranks even on a rank that has none yet
    loss_keys = ("losses/td_loss", "losses/q_values", "losses/grad_norm")

    def __init__(
        self,
        env: str | gym.vector.VectorEnv | None = None,
        config: DQNConfig | None = None,
        preset: str | None = AUTO,
        **overrides: Any,
    ) -> None:
        base = None if config is None else dataclasses.asdict(config)
        values = self.preset_values(env, preset, overrides, base=base)
        unknown = set(values) - {f.name for f in dataclasses.fields(DQNConfig)}
        if unknown:
            raise TypeError(f"unknown {type(self).__name__} settings: {sorted(unknown)}")
        self._setup(values)
        if env is not None:
            self.attach_env(env)
            self.observation_space = self.envs.single_observation_space
            self.action_space = self.envs.single_action_space
        self.rng = np.random.default_rng(self.config.seed)
        self.episode_log: list[tuple[int, float, float]] = []
        self.buffer: ReplayBuffer | None = None
        self.measured_replay_ratio: float | None = None
        self.last_obs: np.ndarray | None = None
        #: the returns and lengths of the episodes running in each env
        self.episode_stats = EpisodeStats()
        self.loop_state: dict[str, Any] | None = None
        # a loaded agent's exact-resume state, and the replay file its checkpoint names (read
        # when a buffer is made for it), both taken by the next run
        self._resume: dict[str, Any] | None = None
        self._pending_replay: tuple[Path, dict[str, Any]] | None = None
        if self.observation_space is not None:
            self.build_networks()

    # -- set-up -------------------------------------------------------------------------------

    def attach_env(self, env: str | gym.vector.VectorEnv) -> None:
        """Train on ``env``: an id (built on the config's backend) or a ``SAME_STEP`` vector env."""
        self.env_id = env if isinstance(env, str) else getattr(env.spec, "id", None)
        if isinstance(env, str):
            self.envs = self.make_envs(env)
            self.owns_envs = True
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
            check_tensor_spaces(type(self).__name__, self.envs.single_observation_space, space)
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
            if self.owns_envs:
                self.envs.close()
                self.envs = None
            raise

    def attach_spaces(
        self, observation_space: gym.Space, action_space: gym.Space, env_id: str | None = None
    ) -> None:
        """Build the networks for these single-env spaces, without envs (they may live in
        another process, as the asynchronous runner's sampler)."""
        check_tensor_spaces(type(self).__name__, observation_space, action_space)
        self.observation_space, self.action_space = observation_space, action_space
        if env_id is not None:
            self.env_id = env_id
        self.build_networks()

    def build_networks(self) -> None:
        """The online and target networks, the optimizer and the support, for the spaces set."""
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

    def buffer_kwargs(self, num_envs: int) -> dict[str, Any]:
        """The replay buffer's arguments (of this agent's buffer and of the asynchronous
        runner's shared one, so that their checkpointed buffers fit each other)."""
        return replay_buffer_kwargs(self.config, self.observation_space, num_envs)

    def make_buffer(self, num_envs: int) -> ReplayBuffer:
        """An empty replay buffer for ``num_envs`` envs, uniform or prioritized per the config."""
        cls = PrioritizedReplayBuffer if self.config.prioritized else ReplayBuffer
        return cls(self.observation_space, self.action_space, **self.buffer_kwargs(num_envs))

    # -- acting -------------------------------------------------------------------------------

    def _q_values(self, network: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
        out = network(obs)
        if self.support is None:
            return out
        return (torch.softmax(out, dim=-1) * self.support).sum(-1)

    @torch.no_grad()
    def act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        """ε-greedy actions of the env's space: ``Discrete(n, start)`` acts in
        ``start..start+n-1`` while the network's outputs are numbered from 0."""
        n = obs.shape[0]
        explore = self.rng.random(n) < epsilon
        actions = self.rng.integers(0, int(self.action_space.n), size=n)
        if not explore.all():
            q = self._q_values(self.q_network, torch.as_tensor(obs, device=self.device))
            greedy = q.argmax(dim=1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        return actions + self.action_start

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
        actions = self.act(batch, epsilon)
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

    def train_step(self, batch: ReplaySample) -> dict[str, float]:
        """:meth:`update` (its earlier name)."""
        return self.update(batch)

    def update_target(self) -> None:
        """Move the target network to the online one (a copy, or a ``tau`` blend)."""
        tau = self.config.tau
        with torch.no_grad():
            for target, online in zip(
                self.target_network.parameters(), self.q_network.parameters()
            ):
                if tau >= 1.0:
                    target.copy_(online)
                else:
                    target.lerp_(online, tau)

    # -- what the runner keeps between iterations ----------------------------------------------

    def take_resume_state(self) -> dict[str, Any] | None:
        """The exact-resume state of the checkpoint this agent was loaded from (its loop
        counters and RNG states), once: the first run after loading takes it."""
        resume, self._resume = self._resume, None
        return resume

    def restore_replay(self, buffer: ReplayBuffer) -> bool:
        """Fill ``buffer`` from the replay file of the checkpoint this agent was loaded from, if
        it names one not yet read; whether it did.

        Raises:
            CheckpointError: the file is missing or corrupt, or does not fit ``buffer``.
        """
        pending, self._pending_replay = self._pending_replay, None
        if pending is None:
            return False
        restore_replay(buffer, *pending)
        return True

    @property
    def replay_ratio(self) -> float | None:
        """The replay ratio measured over the last run (None before learning)."""
        return self.measured_replay_ratio

    def learn(
        self,
        total_steps: int | None = None,
        reset_num_timesteps: bool = True,
        callback: Callback | None = None,
    ) -> DQN:
        """Collect ``total_steps`` env steps, training as the replay ratio prescribes.

        With ``run_dir`` and ``checkpoint_every`` set, each periodic checkpoint is a restart
        point (see the module docstring): a loaded agent continues its run from there, on CPU
        bit-identical to a run never interrupted. The checkpoint written when ``learn`` ends
        (or is stopped by SIGINT/SIGTERM) continues the run too, not identically; an error
        raised inside the loop writes none. Under ``torchrun`` every rank saves its own replay
        buffer; a run resumed on as many ranks gives each rank its own back.

        Args:
            total_steps: env steps to collect in this call; ``None`` finishes the run of the
                checkpoint this agent was loaded from.
            reset_num_timesteps: start the step count (and so the ε and β schedules and
                ``learning_starts``) from zero, as SB3 does; ``False`` continues them.
            callback: ``callback(agent, metrics)`` after every vector step (``metrics``: the row
                logged there, or ``{}``; ``callback(agent)`` works too); returning ``False``
                stops training early, as SB3's callbacks do.

        Returns:
            ``self``.

        Raises:
            ValueError: ``total_steps`` is ``None`` but there is no unfinished loaded run.
        """
        from vecaccel.trainers.runners.sync import SyncRunner

        SyncRunner(self).run(total_steps, callback, reset_num_timesteps)
        return self

    # -- saving and loading -------------------------------------------------------------------

    def write_checkpoint(self, run_dir: Path | None, replay: bool = False) -> Path | None:
        """Write ``run_dir/checkpoint.pt`` on rank 0 (other ranks may pass ``None``); on
        several ranks every rank must call this.

        With ``replay`` on several ranks, every rank writes its own replay buffer (each holds
        different experience) and rank 0 names them all in the checkpoint, with each rank's
        random generators, once they are written.
        """
        return write_run_checkpoint(self, run_dir, replay)

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
        return save_dqn(self, Path(path), replay, rank_replays)

    @classmethod
    def load(
        cls,
        path: str | Path,
        env: str | gym.vector.VectorEnv | None = None,
        load_replay: bool = True,
        **overrides: Any,
    ) -> DQN:
        """Rebuild an agent saved by :meth:`save`.

        A checkpoint written with its replay buffer during :meth:`learn` (``checkpoint_replay``)
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
        return load_dqn(cls, Path(path), env, load_replay, overrides)

    def set_resume_point(
        self,
        checkpoint: Path,
        replay: dict[str, Any] | None,
        resume: dict[str, Any] | None,
    ) -> None:
        """Remember what a loaded checkpoint holds for the next run: the replay file it names
        (read into the next buffer made) and its exact-resume state (loop counters, RNG states).
        """
        self._pending_replay = None if replay is None else (checkpoint, replay)
        self._resume = resume


class C51(DQN):
    """Categorical DQN (Bellemare et al., 2017): 51 atoms on [-10, 10], cross-entropy loss.

    Example:
        >>> C51(env=None).config.categorical
        True
    """

    algo_name = "c51"
    defaults = dict(categorical=True, adam_eps=0.01 / 32)


class Rainbow(DQN):
    """ε-Rainbow: Double + Dueling + 3-step + prioritized + C51, ε-greedy instead of noisy nets.

    Example:
        >>> config = Rainbow(env=None).config
        >>> config.double, config.dueling, config.n_step, config.prioritized, config.categorical
        (True, True, 3, True, True)
    """

    algo_name = "rainbow"
    defaults = dict(
        double=True,
        dueling=True,
        n_step=3,
        prioritized=True,
        categorical=True,
        adam_eps=1.5e-4,
    )
