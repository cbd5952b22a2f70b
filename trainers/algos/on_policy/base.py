"""The on-policy side of A2C, PPO and PQN: their shared config, model, optimizer step and state.

:class:`OnPolicyAlgorithm` holds a model (an actor-critic, or PQN's Q-network: :meth:`make_model
<OnPolicyAlgorithm.make_model>`) and its optimizer, builds the sampler that
collects ``[T, B]`` rollout batches, and predicts; it writes and reads its checkpoint section
(model, optimizer, schedule). What one iteration is (collect a batch, anneal the learning rate,
update) is its :class:`~vecaccel.trainers.algos.on_policy.loop.OnPolicyLoop` and, asynchronously,
its :class:`~vecaccel.trainers.algos.on_policy.feed.RolloutFeed`; the loop around them (logging,
checkpoints, signals) is the runner's (:class:`~vecaccel.trainers.runners.sync.SyncRunner`).

Resume. Env state cannot be saved across processes, so a resumable run makes its own deterministic
restart points: at every checkpoint (``checkpoint_every`` updates) the runner resets every env with
a seed derived from ``(seed, updates)``, dropping running episodes (their transitions were already
trained on, bootstrapped as usual at the batch end), and the checkpoint saves the model, optimizer,
counters and the torch/NumPy/Python RNG states. A resumed run loads all of that and resets its envs
with the same derived seed, so on CPU (same thread count) it produces bit-identical parameters to
the run that was never interrupted.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import gymnasium as gym
import numpy as np

from vecaccel.envs.source import EnvSource
from vecaccel.trainers.algos.base import Algorithm
from vecaccel.trainers.checkpoints.format import check_env_matches
from vecaccel.trainers.checkpoints.reader import (
    check_checkpoint_algorithm,
    read_checkpoint,
    recorded_config,
    restore_header,
)
from vecaccel.trainers.checkpoints.space_serialization import space_from_dict
from vecaccel.trainers.config.settings import (
    RunConfig,
    check_rollout_config,
    lr_scale,
    resolve_device,
)
from vecaccel.trainers.envs.make import (
    agents_per_env,
    check_tensor_spaces,
    env_spaces,
)
from vecaccel.trainers.services import distributed
from vecaccel.trainers.services.seeding import restore_rank_rng_state

if TYPE_CHECKING:  # typing.Self is Python 3.11's
    from typing_extensions import Self

    from vecaccel.trainers.algos.training_loop import TrainingLoop

__all__ = ["OnPolicyAlgorithm", "OnPolicyConfig", "RolloutConfig", "scale_rollout_rewards"]


@dataclass
class RolloutConfig(RunConfig):
    """The settings of every algorithm that learns from ``[T, B]`` rollouts on this base (A2C,
    PPO, PQN); each field's docstring is its ``--help`` text."""

    checkpoint_every: int = 50
    """Updates between checkpoints written to run_dir/checkpoint.pt (0: only at the end)."""
    alternating: bool = False
    """action_server backend: two alternating halves of envs, so simulation overlaps the policy."""
    atari: bool | None = None
    """Force the Atari set-up on or off (default: detect from env_id)."""
    autoreset_mode: str = "SameStep"
    """Gymnasium autoreset mode of the envs; SameStep wastes no step on resets."""

    num_steps: int = 128
    """Steps per environment per rollout (T); the batch is num_envs * num_steps."""
    learning_rate: float = 2.5e-4
    """Learning rate at base_batch_size (before lr scaling)."""
    lr_scaling: str = "none"
    """Scale the learning rate with the batch: none, linear or sqrt in batch/base_batch_size."""
    base_batch_size: int = 1024
    """Batch size at which learning_rate was tuned (the reference of lr_scaling)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount factor."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""

    network: str = "auto"
    """Policy network: auto (Nature-CNN for uint8 images, the MinAtar network for MinAtar's
    grids, MLP otherwise), cnn, minatar or mlp."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """MLP hidden layer widths (separate actor and critic MLPs)."""
    activation: str = "tanh"
    """MLP activation: tanh or relu."""
    channels_last: bool = True
    """NHWC memory format for the CNN (faster convolutions on CPUs)."""
    bf16: str = "off"
    """bfloat16 autocast in the convolutional torso (Nature CNN or MinAtar's): off, on, or auto
    (on where the hardware has bf16 units)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rollout_config(self)


@dataclass
class OnPolicyConfig(RolloutConfig):
    """The settings A2C and PPO share: the rollout's, and those of an actor-critic's losses."""

    gae_lambda: float = 0.95
    """GAE lambda (1: plain n-step returns)."""
    norm_adv: bool = True
    """Normalise advantages (per minibatch)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient (the value loss is the mean squared error, as in SB3)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (continuous actions only; SB3's
    name)."""


class OnPolicyAlgorithm(Algorithm):
    """Model, optimizer, sampler and checkpoints of A2C, PPO and PQN; the loop is the runner's.

    Built as every algorithm is (:class:`~vecaccel.trainers.algos.base.Algorithm`):
    ``PPO(env, *, preset="auto", **config)``. With ``env=None`` and no spaces given, one env
    of ``env_id`` is made to read them.
    """

    config_cls: ClassVar[type] = OnPolicyConfig
    config: Any

    def config_values(
        self,
        env: Any,
        preset: str | None,
        explicit: dict[str, Any],
        base: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The preset's values and the keywords; an id given as ``env`` is the config's
        ``env_id``."""
        env_id = EnvSource.id_of(env)
        if env_id is not None:
            explicit["env_id"] = env_id
        return self.preset_values(env, preset, explicit, base)

    def _build(
        self,
        env: str | gym.vector.VectorEnv | None,
        observation_space: gym.Space[Any] | None,
        action_space: gym.Space[Any] | None,
    ) -> None:
        from vecaccel.trainers.nets.networks import check_observation_space

        cfg = self.config
        self.sampler: Any = None
        self.schedule_start_update = 0
        self.schedule_updates = 1
        self.last_episodes: Any = None
        self.signal_checkpoint = True
        if env is not None:
            self.attach_env(env)
            observation_space = self.envs.single_observation_space
            action_space = self.envs.single_action_space
        elif observation_space is None or action_space is None:
            observation_space, action_space = env_spaces(cfg.env_id, cfg.atari)
        self.observation_space = observation_space
        self.action_space = action_space
        # a space the model refuses (or any failure setting up) must not leave the envs it
        # built running
        try:
            check_tensor_spaces(type(self).__name__, observation_space, action_space)
            check_observation_space(observation_space)
            self.build_normalizer(observation_space)
            self.model = self.make_model(observation_space, action_space).to(self.device)
            # the effective batch of an update is the sum of every rank's batch; a PettingZoo
            # env's num_envs counts envs, each one row per agent
            rows = cfg.num_envs * agents_per_env(cfg.env_id)
            if self.envs is not None:
                rows = int(self.envs.num_envs)
            self.local_batch_size = rows * cfg.num_steps
            self.batch_size = self.local_batch_size * self.world_size
            self.lr_scale = lr_scale(
                self.batch_size, cfg.base_batch_size or self.batch_size, cfg.lr_scaling
            )
            self.learning_rate = cfg.learning_rate * self.lr_scale
            self.optimizer = self.make_optimizer(self.learning_rate)
            self.model_parameters = list(self.model.parameters())
            # eval() and train() walk every submodule twice per update; skip them for a model
            # whose layers all act the same in both modes
            self._switch_modes = _has_mode_dependent_layers(self.model)
            # the losses go through DistributedDataParallel when there are several ranks
            self.train_model = distributed.wrap_model(self.model, self.device)
            if self.envs is not None:
                self.make_sampler()
        except BaseException:
            self.close()
            raise

    # -- what each algorithm provides -----------------------------------------------------------

    def make_model(self, observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> Any:
        """The model the sampler acts with and the losses train, for these single-env spaces:
        an :class:`~vecaccel.trainers.nets.networks.ActorCritic` (A2C, PPO) unless the
        algorithm learns another (PQN: a Q-network)."""
        from vecaccel.trainers.nets.networks import ActorCritic, use_bf16

        cfg = self.config
        return ActorCritic(
            observation_space,
            action_space,
            network=cfg.network,
            hidden_sizes=tuple(cfg.hidden_sizes),
            activation=cfg.activation,
            log_std_init=cfg.log_std_init,
            channels_last=cfg.channels_last,
            bf16=use_bf16(cfg.bf16, self.device, observation_space),
        )

    @abc.abstractmethod
    def make_optimizer(self, learning_rate: float) -> Any:
        """Return the optimizer over ``self.model.parameters()``."""

    def _flat_optimizer_fits(self) -> bool:
        """Whether to keep the parameters in one flat buffer (``trainers/nets/optim.py``): for models
        without convolutions (MLPs), on one device with one dtype. Convolution weights keep
        their own layout (channels_last) and ``torch.optim``, whatever the run's options, so a
        checkpoint's optimizer state loads into any run of the same network."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return all(
            p.dim() < 4
            and p.is_contiguous()
            and p.device == params[0].device
            and p.dtype == params[0].dtype
            for p in params
        )

    def flat_batch(self, batch: Any) -> Any:
        """``batch`` with GAE advantages and returns, flattened to the rows the losses learn
        from: the step A2C and PPO share before their losses (see
        :func:`~vecaccel.trainers.algos.on_policy.advantages.flat_batch_with_advantages`)."""
        from vecaccel.trainers.algos.on_policy.advantages import flat_batch_with_advantages

        cfg = self.config
        return flat_batch_with_advantages(batch, self.model.value, cfg.gamma, cfg.gae_lambda)

    # -- env and sampler ------------------------------------------------------------------------

    def attach_env(self, env: str | gym.vector.VectorEnv) -> None:
        """Train on ``env``: an id (built on the config's backend) or a ready vector env."""
        cfg = self.config
        if EnvSource.id_of(env) is not None:
            options: dict[str, Any] = {}
            if cfg.backend == "action_server":
                options.update(device=str(self.device), alternating=cfg.alternating)
            elif cfg.alternating:
                raise ValueError("alternating=True needs backend='action_server'")
            env = self.make_envs(cfg.env_id, **options)
            self.owns_envs = True
            # a PettingZoo env's rows have no RecordEpisodeStatistics: each agent's return is
            # the sum of its rewards
            self._episode_stats = "rewards" if EnvSource.is_module_path(cfg.env_id) else "infos"
        else:
            if env.num_envs != cfg.num_envs:
                cfg.num_envs = int(env.num_envs)
            self._episode_stats = "auto"
        self.envs = env

    def to_model_actions(self, batch: Any) -> Any:
        """``batch`` with the model's actions: it holds the env's, which a ``Discrete(n, start)``
        space numbers from ``start``, while the losses index the model's outputs from 0."""
        start = self.action_start
        return batch._replace(actions=batch.actions - start) if start else batch

    def sampler_policy(self) -> Any:
        """The policy a sampler calls: the model, its actions moved to the env's numbering."""
        start = self.action_start
        return self.model if start == 0 else _ShiftedDiscretePolicy(self.model, start)

    def make_sampler(self) -> None:
        """Build the sampler collecting ``num_steps``-long batches from ``envs``."""
        import vecaccel

        self.sampler = vecaccel.Sampler(
            self.training_envs(),
            self.sampler_policy(),
            horizon=self.config.num_steps,
            device=self.device,
            seed=self.config.seed,
            episode_stats=self._episode_stats,
        )

    def reset_envs(self, seed: int | None = None) -> None:
        """Reset every env through the sampler (``None``: at :meth:`restart_seed`)."""
        self.sampler.reset(seed=self.restart_seed() if seed is None else seed)

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """Within ``with``, the model is in eval mode (if any layer of it cares)."""
        if not self._switch_modes:
            yield
            return
        self.model.eval()
        try:
            yield
        finally:
            self.model.train()

    def record_episodes(self, episodes: Any) -> None:
        """Keep the episodes that ended in the last batch (``last_episodes``, for callbacks)."""
        self.last_episodes = episodes

    # -- schedules ------------------------------------------------------------------------------

    def progress_remaining(self) -> float:
        """1 at the start of the learning-rate schedule, 0 at its end."""
        done = self.num_updates - self.schedule_start_update
        return max(0.0, 1.0 - done / self.schedule_updates)

    def apply_learning_rate(self, progress_remaining: float) -> float:
        """Set the optimizer's learning rate for this point of the schedule; returns it."""
        lr_now: float = self.learning_rate * (progress_remaining if self.config.anneal_lr else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_now
        return lr_now

    def set_target_steps(self, total_timesteps: int) -> None:
        """Make ``total_timesteps`` the run's total (a resumed run's new budget).

        The learning-rate schedule stretches to the new total; an unchanged total keeps the
        resumed run bit-identical to an uninterrupted one.
        """
        if total_timesteps == self.target_steps:
            return
        start_step = self.schedule_start_update * self.batch_size
        super().set_target_steps(total_timesteps)
        self.schedule_updates = max(
            1, math.ceil((self.target_steps - start_step) / self.batch_size)
        )

    def set_budget(self, total_timesteps: int | None) -> None:
        """Train ``total_timesteps`` more env steps from here, the learning rate annealing over
        them; ``None`` keeps the budget and schedule of the run this agent was loaded from."""
        super().set_budget(total_timesteps)
        if total_timesteps is not None:
            self.schedule_start_update = self.num_updates
            self.schedule_updates = max(1, math.ceil(int(total_timesteps) / self.batch_size))

    def end_after_batches(self, num_batches: int) -> None:
        """End the run in progress after ``num_batches`` more batches, its learning-rate
        schedule unchanged (a budget rounded to whole batches)."""
        self.target_steps = self.global_step + int(num_batches) * self.batch_size

    # -- the runners' interface -----------------------------------------------------------------

    def begin_run(self, total_timesteps: int | None, reset_num_timesteps: bool) -> TrainingLoop:
        """Begin a synchronous run: one update per rollout batch (see
        :class:`~vecaccel.trainers.algos.on_policy.loop.OnPolicyLoop`)."""
        from vecaccel.trainers.algos.on_policy.loop import OnPolicyLoop

        return OnPolicyLoop(self, total_timesteps, reset_num_timesteps)

    def async_feed(
        self,
        total_timesteps: int | None,
        *,
        reset_num_timesteps: bool,
        weight_sync_period: int,
        options: Any,
    ) -> Any:
        """Begin an asynchronous run on whole rollouts (see
        :class:`~vecaccel.trainers.algos.on_policy.feed.RolloutFeed`)."""
        from vecaccel.trainers.algos.on_policy.feed import RolloutFeed

        return RolloutFeed(
            self,
            total_timesteps,
            reset_num_timesteps=reset_num_timesteps,
            weight_sync_period=weight_sync_period,
            options=options,
        )

    # -- the checkpoint section -----------------------------------------------------------------

    checkpoint_key = "on_policy"
    async_help = (
        "a rollout process collects the next batch into a shared-memory double buffer while "
        "this process trains on the last one (policy lag logged as charts/policy_lag)"
    )
    async_fixed_lag_help = "collect batch n with the weights of update n-1 exactly"

    def checkpoint_section(self) -> dict[str, Any]:
        """The model, the optimizer and the learning-rate schedule."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule_start_update": int(self.schedule_start_update),
            "schedule_updates": int(self.schedule_updates),
        }

    @classmethod
    def from_checkpoint(cls, path: Path, env: Any, options: dict[str, Any]) -> Self:
        """Rebuilt without an env, then attached to ``env`` once the counters say where the run
        stands. ``options`` takes ``run_dir`` (where a continued run logs and checkpoints;
        default: nowhere) and ``restore_rng`` (the saved RNG states; default ``True``)."""
        overrides = dict(options)
        run_dir = overrides.pop("run_dir", None)
        restore_rng = bool(overrides.pop("restore_rng", True))
        state = read_checkpoint(path, resolve_device(overrides.get("device", "cpu")))
        check_checkpoint_algorithm(cls, state, path)
        values = recorded_config(state, overrides)
        values["run_dir"] = None if run_dir is None else os.fspath(run_dir)
        section = state[cls.checkpoint_key]
        names = {f.name for f in dataclasses.fields(cls.config_cls)}
        values = {key: value for key, value in values.items() if key in names}
        observation_space = space_from_dict(state["observation_space"])
        action_space = space_from_dict(state["action_space"])
        # the saved settings are the run's, with no preset applied over them
        recorded_preset = values.pop("preset", None)
        # the family's constructor: a subclass's own may take other arguments
        agent: Any = cls.__new__(cls)
        OnPolicyAlgorithm.__init__(
            agent,
            None,
            observation_space=observation_space,
            action_space=action_space,
            preset=None,
            **values,
        )
        agent.config.preset = recorded_preset
        agent.model.load_state_dict(section["model"])
        agent.optimizer.load_state_dict(section["optimizer"])
        restore_header(agent, state)
        agent.schedule_start_update = int(section["schedule_start_update"])
        agent.schedule_updates = int(section["schedule_updates"])
        if restore_rng:  # each rank's states, or rank 0's and the others re-seed (see there)
            restore_rank_rng_state(
                state["rng"],
                agent.config.seed,
                agent.global_step,
                rank_states=state.get("rank_rng"),
            )
        if env is not None:
            env_id = EnvSource.id_of(env)
            if env_id is not None:
                agent.config.env_id = env_id  # the id given, not the one recorded
            agent.attach_env(env)
            try:
                check_env_matches(
                    agent.config.env_id,
                    agent.envs.single_observation_space,
                    agent.envs.single_action_space,
                    observation_space,
                    action_space,
                )
            except ValueError:
                if agent.owns_envs:
                    agent.envs.close()
                raise
            agent.make_sampler()
            if agent.num_updates > 0:
                agent.reset_envs()
        return cast("Self", agent)

    # -- predict --------------------------------------------------------------------------------

    def act_for_predict(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Actions of the model for the batch ``obs``: sampled, or the most likely with
        ``deterministic``; within a ``Box`` action space's bounds, as SB3 clips them."""
        import torch

        tensor = torch.as_tensor(obs, device=self.device)
        self.model.eval()
        actions: np.ndarray = self.model.act(tensor, deterministic=deterministic).cpu().numpy()
        if self.action_start:
            actions = actions + self.action_start
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            actions = np.clip(actions, space.low, space.high).astype(actions.dtype, copy=False)
        return actions

    def close(self) -> None:
        """Close the env this trainer built."""
        super().close()
        self.sampler = None


class _ShiftedDiscretePolicy:
    """The sampler's policy for a ``Discrete(n, start)`` env with ``start != 0``: the model's
    actions ``0..n-1`` moved to the env's ``start..start+n-1``.

    The sampler sends the policy's actions to the env as they are and keeps them in the batch,
    so the shift happens here, and :meth:`OnPolicyAlgorithm.to_model_actions` undoes it on the
    batch before the losses index the model's outputs with it.
    """

    def __init__(self, model: Any, start: int) -> None:
        self.model = model
        self.start = int(start)

    def __call__(self, obs: Any) -> tuple[Any, Any]:
        actions, extras = self.model(obs)
        return actions + self.start, extras


def scale_rollout_rewards(normalizer: Any, batch: Any) -> None:
    """Scale the rewards of the sampler batch ``batch`` in place, row after row as the envs
    stepped (see :meth:`Normalizer.scale_rewards
    <vecaccel.trainers.nets.normalization.Normalizer.scale_rewards>`); nothing without reward
    normalisation. The episodes the sampler counted keep the env's own rewards."""
    if normalizer is None or normalizer.returns is None:
        return
    import torch

    done = (batch.terminated | batch.truncated).cpu().numpy()
    scaled = normalizer.scale_reward_rows(batch.rewards.cpu().numpy(), done)
    batch.rewards.copy_(torch.from_numpy(scaled))


def _has_mode_dependent_layers(model: Any) -> bool:
    """Whether a layer of ``model`` may act differently in train and eval mode.

    Only layer types known to ignore ``Module.training`` are exempt, so any other (dropout,
    batch norm, a new layer type) counts as mode-dependent.
    """
    from torch import nn

    from vecaccel.trainers.nets import networks

    mode_free = (
        nn.Linear,
        nn.Conv2d,
        nn.ReLU,
        nn.Tanh,
        nn.Flatten,
        nn.Identity,
        nn.Sequential,
        nn.ModuleList,
        nn.ParameterList,
        networks.ActorCritic,
        networks.TwinMLP,
        networks.MLP,
        networks.NatureCNN,
        networks.MinAtarNet,
    )
    return any(type(module) not in mode_free for module in model.modules())
