"""The off-policy side of DQN, C51 and Rainbow: envs, replay buffer, target network, acting.

:class:`OffPolicyAlgorithm` is the twin of
:class:`~vecaccel.trainers.algos.on_policy.base.OnPolicyAlgorithm` (as SB3's
``OffPolicyAlgorithm`` is of its ``OnPolicyAlgorithm``). It owns what the family shares:

- the envs, in any autoreset mode: the collector hands over real transitions only, and a
  truncated episode bootstraps from its true final observation (those built from an id are
  ``SAME_STEP``, whose ``infos["final_obs"]`` holds it);
- the replay buffer (n-step targets are computed at sample time, prioritized replay optional);
- the online and target networks, the optimizer and the target update;
- **one** acting policy,
  :class:`~vecaccel.trainers.algos.off_policy.exploration.EpsilonGreedy` (on the expected
  return for distributional heads), and the env stepper that steps the envs with it;
- its checkpoint section (networks, optimizer, exploration, the replay buffer when asked), which
  it writes and reads.

A subclass holds its config, its network, its loss and ``update``. The loop is a runner's
(:class:`~vecaccel.trainers.runners.sync.SyncRunner` or
:class:`~vecaccel.trainers.runners.asynchronous.runner.AsyncRunner`), driving the family's
:class:`~vecaccel.trainers.algos.off_policy.loop.OffPolicyLoop` (which collects through
:meth:`OffPolicyAlgorithm.collect`) or its
:class:`~vecaccel.trainers.algos.off_policy.feed.ReplayFeed` (whose collector process steps a
:class:`~vecaccel.trainers.algos.off_policy.exploration.EnvStepper` of its own).

Example:
    >>> from vecaccel.trainers import DQN
    >>> from vecaccel.trainers.algos.off_policy import OffPolicyAlgorithm
    >>> isinstance(DQN(env=None), OffPolicyAlgorithm)
    True
"""

from __future__ import annotations

import abc
import copy
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
import torch

from vecaccel.envs.source import EnvSource
from vecaccel.trainers.algos.base import Algorithm
from vecaccel.trainers.algos.off_policy.exploration import EnvStepper, EpsilonGreedy, Transition
from vecaccel.trainers.checkpoints.format import check_env_matches
from vecaccel.trainers.checkpoints.reader import (
    check_checkpoint_algorithm,
    read_checkpoint,
    recorded_config,
    restore_header,
)
from vecaccel.trainers.checkpoints.space_serialization import space_from_dict
from vecaccel.trainers.checkpoints.writer import replay_entry, save_agent
from vecaccel.trainers.config.settings import config_from_dict, lr_scale, optimizer_settings
from vecaccel.trainers.envs.make import check_tensor_spaces
from vecaccel.trainers.nets.networks import check_observation_space
from vecaccel.trainers.replay.buffer import ReplayBuffer, replay_buffer_kwargs
from vecaccel.trainers.replay.files import restore_replay, write_replay
from vecaccel.trainers.replay.prioritized import PrioritizedReplayBuffer
from vecaccel.trainers.services import distributed
from vecaccel.trainers.services.schedules import linear_schedule
from vecaccel.trainers.services.seeding import restore_rank_rng_state, split_seed

if TYPE_CHECKING:  # typing.Self is Python 3.11's
    from typing_extensions import Self

    from vecaccel.trainers.algos.training_loop import TrainingLoop

__all__ = ["OffPolicyAlgorithm"]

#: the key of the seed of predict's generator, apart from exploration's
_PREDICT_STREAM = 0x9D


def make_optimizer(cfg: Any, parameters: Any, learning_rate: float) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names over ``parameters``."""
    settings = optimizer_settings(cfg)
    if cfg.optimizer == "rmsprop":
        # foreach: a few multi-tensor ops per step; torch's CPU default loops over the tensors
        return torch.optim.RMSprop(parameters, lr=learning_rate, foreach=True, **settings)
    parameters = list(parameters)
    try:  # the fused kernel cuts the per-parameter overhead that dominates small networks
        return torch.optim.Adam(parameters, lr=learning_rate, fused=True, **settings)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(parameters, lr=learning_rate, **settings)


class OffPolicyAlgorithm(Algorithm):
    """Envs, replay buffer, networks, acting and checkpoints of the DQN family.

    Built as every algorithm is (:class:`~vecaccel.trainers.algos.base.Algorithm`):
    ``DQN(env, *, preset="auto", **config)``. ``env`` is a Gymnasium id (``num_envs`` copies on
    ``backend``) or a ``gymnasium.vector.VectorEnv`` in any autoreset mode, or ``None`` for an
    agent that predicts (or is
    trained by the asynchronous runner, whose collector process has the envs).

    Attributes:
        config: the settings in force.
        q_network: the online network; ``target_network`` its lagged copy.
        policy: the acting policy (ε-greedy on ``q_network``).
        stepper: the :class:`~vecaccel.trainers.algos.off_policy.exploration.EnvStepper` stepping
            ``envs`` (``None`` without envs).
        rng: the generator of exploration (and of nothing else).
        episode_log: ``(env_step, return, length)`` of every finished episode.
        buffer: the replay buffer (made by the first run).
        loop_state: the runner's counters at the last checkpoint (saved with it).
    """

    config: Any
    #: the losses every update reports, reduced over ranks even on a rank that has none yet
    loss_keys: tuple[str, ...] = ()

    def config_values(
        self,
        env: Any,
        preset: str | None,
        explicit: dict[str, Any],
        base: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The preset's values and the keywords."""
        return self.preset_values(env, preset, explicit, base=base)

    def _build(
        self,
        env: str | gym.vector.VectorEnv | None,
        observation_space: gym.Space[Any] | None,
        action_space: gym.Space[Any] | None,
    ) -> None:
        self.stepper: EnvStepper | None = None
        if env is not None:
            self.attach_env(env)
            self.observation_space = self.envs.single_observation_space
            self.action_space = self.envs.single_action_space
        if env is None and observation_space is not None and action_space is not None:
            check_tensor_spaces(type(self).__name__, observation_space, action_space)
            self.observation_space, self.action_space = observation_space, action_space
        self.rng = np.random.default_rng(self.config.seed)
        # predict's own generator: a callback that predicts leaves exploration's draws alone
        self.predict_rng = np.random.default_rng(split_seed(self.config.seed, _PREDICT_STREAM))
        self.episode_log: list[tuple[int, float, float]] = []
        self.buffer: ReplayBuffer | None = None
        self.measured_replay_ratio: float | None = None
        self.loop_state: dict[str, Any] | None = None
        # a loaded agent's exact-resume state, and the replay file its checkpoint names (read
        # when a buffer is made for it), both taken by the next run
        self._resume: dict[str, Any] | None = None
        self._pending_replay: tuple[Path, dict[str, Any]] | None = None
        if self.observation_space is not None:
            self.build_networks()

    # -- what each algorithm provides -----------------------------------------------------------

    @abc.abstractmethod
    def make_q_network(self) -> torch.nn.Module:
        """The online network for ``observation_space`` and ``action_space``."""

    def make_support(self) -> torch.Tensor | None:
        """The support of a categorical head (``None``: the network outputs Q-values)."""
        return None

    # -- set-up -------------------------------------------------------------------------------

    def attach_env(self, env: str | gym.vector.VectorEnv) -> None:
        """Train on ``env``: an id (built on the config's backend, ``SAME_STEP``) or a ready
        vector env in any autoreset mode (see
        :class:`~vecaccel.trainers.algos.off_policy.exploration.EnvStepper`)."""
        self.env_id = EnvSource.id_of(env)
        if self.env_id is not None:
            self.envs = self.make_envs(self.env_id)
            self.owns_envs = True
        else:
            self.envs = env
            self.env_id = getattr(env.spec, "id", None)
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
        if self.observation_space is not None:  # a loaded agent: its networks are built
            self.stepper = EnvStepper(self.training_envs(), self.policy)

    def attach_spaces(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        env_id: str | None = None,
    ) -> None:
        """Build the networks for these single-env spaces, without envs (they may live in
        another process, as the asynchronous runner's sampler)."""
        check_tensor_spaces(type(self).__name__, observation_space, action_space)
        self.observation_space, self.action_space = observation_space, action_space
        if env_id is not None:
            self.env_id = env_id
        self.build_networks()

    def build_networks(self) -> None:
        """The online and target networks, the optimizer, the support and the acting policy,
        for the spaces set."""
        cfg = self.config
        self.build_normalizer(self.observation_space)
        self.q_network = self.make_q_network().to(self.device)
        self.target_network = copy.deepcopy(self.q_network)
        self.target_network.requires_grad_(False)
        # the effective batch of an update is the sum of every rank's batch
        self.lr_scale = lr_scale(
            cfg.batch_size * self.world_size, cfg.base_batch_size, cfg.lr_scaling
        )
        self.learning_rate = cfg.learning_rate * self.lr_scale
        self.optimizer = make_optimizer(cfg, self.q_network.parameters(), self.learning_rate)
        self.model_parameters = list(self.q_network.parameters())
        # the loss goes through DistributedDataParallel when there are several ranks
        self.train_network = distributed.wrap_model(self.q_network, self.device)
        # wrapping broadcasts rank 0's parameters into the online network only: the target is
        # copied from it again, or every rank would compute its TD targets with its own randomly
        # initialised target network until the first target update (load() then overwrites
        # both with the checkpoint's, which is the same on every rank)
        self.target_network.load_state_dict(self.q_network.state_dict())
        support = self.make_support()
        self.support = None if support is None else support.to(self.device)
        self.policy = EpsilonGreedy(
            self.q_network,
            int(self.action_space.n),
            self.action_start,
            self.support,
            self.device,
        )
        if self.envs is not None:
            self.stepper = EnvStepper(self.training_envs(), self.policy)

    def buffer_kwargs(self, num_envs: int) -> dict[str, Any]:
        """The replay buffer's arguments (of this agent's buffer and of the asynchronous
        runner's shared one, so that their checkpointed buffers fit each other)."""
        return replay_buffer_kwargs(self.config, self.observation_space, num_envs)

    def make_buffer(self, num_envs: int) -> ReplayBuffer:
        """An empty replay buffer for ``num_envs`` envs, uniform or prioritized per the config."""
        cls = PrioritizedReplayBuffer if self.config.prioritized else ReplayBuffer
        return cls(self.observation_space, self.action_space, **self.buffer_kwargs(num_envs))

    # -- acting and collecting ----------------------------------------------------------------

    def act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        """ε-greedy actions of the env's space for the batch ``obs`` (see :attr:`policy`)."""
        return self.policy(obs, epsilon, self.rng)

    def act_for_predict(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Greedy actions for the batch ``obs``, or with probability ``eval_epsilon`` random
        ones (drawn from ``predict_rng``)."""
        epsilon = 0.0 if deterministic else self.config.eval_epsilon
        return self.policy(obs, epsilon, self.predict_rng)

    def epsilon(self, step: int, horizon: int) -> float:
        """The exploration rate at env step ``step`` of a ``horizon``-step run."""
        cfg = self.config
        duration = cfg.exploration_steps or int(cfg.exploration_fraction * horizon)
        return linear_schedule(cfg.start_epsilon, cfg.end_epsilon, duration, step)

    @property
    def last_obs(self) -> np.ndarray | None:
        """The observations the envs are at, where the next run goes on from."""
        return None if self.stepper is None else self.stepper.obs

    def start_episodes(self, seed: int | None) -> None:
        """Reset the envs (``seed``: as ``envs.reset``) and close the replay buffer's open
        episodes, so that no transition links the old episodes to the new ones."""
        self.buffer.end_episodes()
        self.stepper.reset(seed)

    def collect(self, epsilon: float) -> tuple[Transition, list[tuple[float, float]]]:
        """One ε-greedy vector step into the replay buffer: the transition and the
        ``(return, length)`` of the episodes it ended.

        A multi-agent env's rows whose agent is not live are no transitions: not stored.
        """
        transition, finished = self.stepper.step(epsilon, self.rng)
        if self.normalizer is None:
            self.buffer.add(*transition[:6], active=transition.active)
        else:  # the rewards learnt from are scaled; the transition keeps the env's own
            done = transition.terminated | transition.truncated
            reward = self.normalizer.scale_rewards(transition.reward, done)
            self.buffer.add(*transition[:2], reward, *transition[3:6], active=transition.active)
        return transition, finished

    # -- the update's other half ----------------------------------------------------------------

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

    # -- what the runner keeps between runs -----------------------------------------------------

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

    def restore_exploration(self, saw_episode_info: bool, rng_state: dict[str, Any]) -> None:
        """Continue a loaded run's exploration exactly: its generator's state, and whether its
        envs reported ``info["episode"]`` (then only that counts episodes)."""
        self.stepper.episodes.saw_info = bool(saw_episode_info)
        self.rng.bit_generator.state = rng_state

    def set_buffer(self, buffer: Any) -> None:
        """Store and sample transitions in ``buffer`` from now on (the asynchronous runner's
        shared one, say)."""
        self.buffer = buffer

    def set_loop_state(self, state: dict[str, Any]) -> None:
        """Record the runner's loop counters (a
        :class:`~vecaccel.trainers.runners.state.RunState` as plain data) for the checkpoints."""
        self.loop_state = dict(state)

    def set_measured_replay_ratio(self, ratio: float | None) -> None:
        """Record the replay ratio the run in progress measured (see :attr:`replay_ratio`)."""
        self.measured_replay_ratio = ratio

    @property
    def replay_ratio(self) -> float | None:
        """The replay ratio measured over the last run (None before learning)."""
        return self.measured_replay_ratio

    # -- the runners' interface -----------------------------------------------------------------

    def begin_run(self, total_timesteps: int | None, reset_num_timesteps: bool) -> TrainingLoop:
        """Begin a synchronous run: a vector step into the replay buffer per iteration, then
        the updates the replay ratio allows (see
        :class:`~vecaccel.trainers.algos.off_policy.loop.OffPolicyLoop`)."""
        from vecaccel.trainers.algos.off_policy.loop import OffPolicyLoop

        return OffPolicyLoop(self, total_timesteps, reset_num_timesteps)

    def async_feed(
        self,
        total_timesteps: int | None,
        *,
        reset_num_timesteps: bool,
        weight_sync_period: int,
        options: Any,
    ) -> Any:
        """Begin an asynchronous run on chunks of steps for the replay buffer (see
        :class:`~vecaccel.trainers.algos.off_policy.feed.ReplayFeed`)."""
        from vecaccel.trainers.algos.off_policy.feed import ReplayFeed

        return ReplayFeed(
            self,
            total_timesteps,
            reset_num_timesteps=reset_num_timesteps,
            weight_sync_period=weight_sync_period,
            options=options,
        )

    def prepare_async(self) -> None:
        """Without spaces yet, build the networks for those of one env of ``env_id`` (the
        envs the collector process builds; under torchrun the agent has joined the process
        group: its model is then data-parallel)."""
        if self.observation_space is not None or self.config.env_id is None:
            return
        from vecaccel.trainers.envs.make import env_spaces

        env_id = self.config.env_id
        self.attach_spaces(*env_spaces(env_id), env_id=env_id)

    # -- saving and loading -------------------------------------------------------------------

    checkpoint_key = "off_policy"
    async_help = (
        "a collector process steps the envs and hands the steps over in chunks while this "
        "process trains from its replay buffer, the replay ratio enforced by throttling both"
    )
    async_fixed_lag_help = (
        "the collector collects chunks of half --async-max-lead env steps, each with the "
        "weights of two chunks before, and this process adds them to the replay buffer in order"
    )
    has_replay = True

    def checkpoint_section(self) -> dict[str, Any]:
        """The networks, the optimizer, the exploration generator and the runner's loop
        counters when a run recorded them."""
        section = {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "exploration_rng": self.rng.bit_generator.state,
        }
        if self.loop_state is not None:
            section["loop"] = dict(self.loop_state)
        return section

    def checkpoint_target_steps(self) -> int | None:
        """The horizon of the loop counters recorded: a run continues from them alone."""
        return None if self.loop_state is None else int(self.loop_state["horizon"])

    def gather_rank_checkpoint(
        self, path: Path, replay: bool
    ) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
        """With ``replay`` on several ranks, every rank writes its own replay buffer beside
        ``path`` (each holds different experience) and the entries naming them are gathered,
        with each rank's generators."""
        if self.world_size == 1 or not replay or self.buffer is None:
            return None, None
        token = f"{self.global_step}-r{distributed.rank()}-{secrets.token_hex(4)}"
        entry = replay_entry(self, write_replay(self.buffer, path, token), token)
        return None, distributed.all_gather_object(entry)

    @classmethod
    def from_checkpoint(cls, path: Path, env: Any, options: dict[str, Any]) -> Self:
        """Rebuilt with its networks, optimizer, generators and loop counters; the replay file
        the checkpoint names is read by the next run (``options``: ``load_replay``, default
        ``True``, and config fields to change)."""
        overrides = dict(options)
        load_replay = bool(overrides.pop("load_replay", True))
        state = read_checkpoint(path)
        check_checkpoint_algorithm(cls, state, path)
        values = recorded_config(state, overrides)
        section = state[cls.checkpoint_key]
        config = config_from_dict(cls.config_cls, values)
        saved_optimizer = state["config"].get("optimizer", "adam")
        if config.optimizer != saved_optimizer:
            raise ValueError(
                f"optimizer={config.optimizer!r}: {path} holds the state of {saved_optimizer!r}, "
                f"which the other cannot continue; load it with optimizer={saved_optimizer!r}"
            )
        # built for the saved spaces: a loaded agent makes no env of its id, which need not be
        # registered in this process
        agent: Any = cls(
            env=None,
            config=config,
            observation_space=space_from_dict(state["observation_space"]),
            action_space=space_from_dict(state["action_space"]),
        )
        agent.env_id = state["config"].get("env_id")
        agent.q_network.load_state_dict(section["q_network"])
        agent.target_network.load_state_dict(section["target_network"])
        agent.optimizer.load_state_dict(section["optimizer"])
        # load_state_dict brings back the saved param_groups, hyperparameters included; the
        # config in force (overrides, or a batch size that rescales the rate) decides them, and
        # the optimizer's moments alone carry over. DQN has no lr schedule, so the rate is constant.
        for group in agent.optimizer.param_groups:
            group["lr"] = agent.learning_rate
            group.update(optimizer_settings(config))
        restore_header(agent, state)
        rng_state, exploration_rng, replay = _restore_rank_streams(agent, state, load_replay)
        if replay is not None:
            # a replay entry without the buffer's n_step or alpha takes the saved config's
            saved = state["config"]
            replay = {"n_step": saved.get("n_step"), "alpha": saved.get("priority_alpha"), **replay}
        resume = None
        if "loop" in section:  # a checkpoint without loop state: learn() starts afresh
            agent.loop_state = dict(section["loop"])
            resume = {
                **section["loop"],
                "rng": rng_state,
                "agent_rng": exploration_rng,
                "exact": replay is not None,
            }
        agent.set_resume_point(path, replay, resume)
        if env is not None:
            agent.attach_env(env)
            if replay is not None:  # read now, so that a bad replay file fails here
                agent.buffer = agent.make_buffer(agent.envs.num_envs)
                agent.restore_replay(agent.buffer)
        return cast("Self", agent)

    def save_with_replay(
        self, path: str | Path, rank_replays: list[dict[str, Any]] | None = None
    ) -> Path:
        """:meth:`save`, and the replay buffer to ``<stem>.replay-<step>-<id>.npz`` beside
        ``path`` (its name and a matching id are recorded in the checkpoint). Replay files no
        longer named by the checkpoint at ``path`` are deleted once it is written.

        Args:
            path: the checkpoint file.
            rank_replays: (several ranks) the replay files every rank has written already,
                with its generators' states, in rank order; the checkpoint names them all.
        """
        return save_agent(self, Path(path), replay=True, rank_replays=rank_replays)

    def close(self) -> None:
        """Close the envs this agent built."""
        super().close()
        self.stepper = None


def _restore_rank_streams(
    agent: Any, state: dict[str, Any], load_replay: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """Set a loaded off-policy agent's generators from ``state``, rank by rank.

    Returns:
        The global RNG states now in force and the exploration generator's state (for an
        exact resume), and the replay entry this rank reads, if any (``None`` with
        ``load_replay=False`` or when the checkpoint has none).
    """
    section = state[OffPolicyAlgorithm.checkpoint_key]
    # every rank's global states where the checkpoint has them, else rank 0's: rank 0
    # restores them, a rank r > 0 re-seeds from (its seed, r, the checkpoint's counters) so
    # that the ranks keep distinct streams, as in a fresh run
    resume_point = (agent.global_step, agent.num_updates)
    rng_state = restore_rank_rng_state(
        state["rng"], agent.config.seed, *resume_point, rank_states=state.get("rank_rng")
    )
    exploration_rng = section["exploration_rng"]
    agent.rng.bit_generator.state = exploration_rng
    replay = section.get("replay") if load_replay else None
    ranks = section.get("rank_replays")
    rank = distributed.rank()
    if ranks is not None and len(ranks) == agent.world_size:
        # each rank of a run on as many ranks goes on with its own experience
        entry = ranks[rank]
        exploration_rng = entry["agent_rng"]
        agent.rng.bit_generator.state = exploration_rng
        if replay is not None:
            replay = entry
    elif rank > 0:
        # rank 0's exploration and replay-sampling generators (the checkpoint has none of
        # this rank's): re-seeded like the global ones, or this rank would explore and
        # draw its batches exactly as rank 0 does
        agent.rng = np.random.default_rng(split_seed(agent.config.seed, 0xE5, rank, *resume_point))
        exploration_rng = agent.rng.bit_generator.state
        if replay is not None:
            sampling = np.random.default_rng(
                split_seed(agent.config.seed, 0xB5, rank, *resume_point)
            )
            replay = {**replay, "rng": sampling.bit_generator.state}
    return rng_state, exploration_rng, replay
