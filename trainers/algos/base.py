"""The base every algorithm shares: its config, device, counters and the envs it trains on.

An algorithm holds its config, its networks and optimizer, its loss and ``update``, and its
state for checkpoints; it has no loop over env steps. A runner (:class:`SyncRunner
<vecaccel.trainers.runners.sync.SyncRunner>`, or the asynchronous one) owns the loop and calls the
public methods documented here, the same for every algorithm: a runner knows no family. Each
family's base implements that interface (``begin_run``, ``async_feed``, the checkpoint section):
:class:`~vecaccel.trainers.algos.on_policy.base.OnPolicyAlgorithm` (A2C, PPO) updates from rollout
batches its sampler collects, :class:`~vecaccel.trainers.algos.off_policy.base.OffPolicyAlgorithm`
(DQN, C51, Rainbow) from replay samples of the transitions its env stepper stores.

The public API is declared here once, in SB3's shape, for all five algorithms: the constructor
``Algo(env, *, preset="auto", **config)``, :meth:`Algorithm.learn`, :meth:`Algorithm.predict`,
:meth:`Algorithm.save` and :meth:`Algorithm.load`; a family supplies the parts behind them
(``_build``, ``act_for_predict``). So are the gradient step every update takes,
:meth:`Algorithm.backward_step`, and the checkpoint, one format whose header
:mod:`vecaccel.trainers.checkpoints.writer` writes, with the family's section
(:meth:`Algorithm.checkpoint_section`, :meth:`Algorithm.from_checkpoint`).

Example:
    >>> from vecaccel.trainers import PPO, DQN
    >>> from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm
    >>> issubclass(PPO, OnPolicyAlgorithm), issubclass(DQN, OnPolicyAlgorithm)
    (True, False)
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym
import numpy as np

from vecaccel.envs.source import EnvSource
from vecaccel.trainers.checkpoints.reader import load_agent
from vecaccel.trainers.checkpoints.writer import save_agent, write_run_checkpoint
from vecaccel.trainers.config.presets import AUTO
from vecaccel.trainers.config.settings import RunConfig, resolve_device, unknown_settings_message
from vecaccel.trainers.envs.make import action_start, make_envs_for_config
from vecaccel.trainers.envs.normalized import normalized_envs
from vecaccel.trainers.nets.normalization import Normalizer, make_normalizer
from vecaccel.trainers.services import distributed
from vecaccel.trainers.services.logger import is_interactive
from vecaccel.trainers.services.seeding import get_rng_state, seed_everything, split_seed
from vecaccel.trainers.services.threads import (
    START_SAMPLE_SECONDS,
    AdaptiveThreads,
    configure_torch_threads,
)
from vecaccel.trainers.services.tracking import require_wandb
from vecaccel.worker.cpus import CpuLoad

if TYPE_CHECKING:  # typing.Self is Python 3.11's
    from typing_extensions import Self

    from vecaccel.trainers.algos.training_loop import TrainingLoop

__all__ = ["Algorithm", "Callback"]

#: ``callback(agent, metrics)``, called by the runner after every iteration of its loop (see
#: :mod:`vecaccel.trainers.runners.callbacks`); returning ``False`` stops training.
#: One-parameter callables ``callback(agent)`` work too, and so do SB3's ``BaseCallback``\ s.
Callback = Callable[..., "bool | None"]


class Algorithm(abc.ABC):
    """What every algorithm holds, its public API, and the interface a runner drives it through.

    Attributes:
        config: the settings in force (a :class:`~vecaccel.trainers.config.settings.RunConfig` subclass).
        device: the torch device of the networks.
        world_size: ranks of a ``torchrun`` job (1 otherwise); ``is_main`` is rank 0.
        envs: the vector env trained on, or ``None`` (a loaded agent used to predict, or one
            whose envs live in an asynchronous collector process).
        global_step: env steps collected so far, over all ranks.
        num_updates: gradient updates done so far.
        target_steps: the step total of the run in progress, or ``None`` before one.
        logger: the :class:`~vecaccel.trainers.services.logger.RunLogger` of the last run, if any.
        elapsed_before: seconds of training before this process took over (a resumed run).
        normalizer: the observation and reward normalisation of ``norm_obs`` and
            ``norm_reward`` (a :class:`~vecaccel.trainers.nets.normalization.Normalizer`; ``None``
            when both are off), whose statistics are saved and loaded with the agent.
        async_run: whether the asynchronous runner trained this agent last; with
            ``async_options`` it is saved in checkpoints, so that a resumed run goes on alike.
    """

    algo_name: ClassVar[str] = ""
    #: whether :meth:`load` takes the checkpoint of any algorithm of the family (DQN's loads C51's
    #: and Rainbow's, whose configs say what they are)
    loads_family: ClassVar[bool] = False
    config_cls: ClassVar[type] = RunConfig
    #: config values this class uses by default, before a preset and the keywords given
    defaults: ClassVar[dict[str, Any]] = {}
    #: the named settings ``preset=NAME`` applies (which env ids each suits: trainers/config/presets.py)
    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(
        self,
        env: str | gym.vector.VectorEnv | None = None,
        *,
        preset: str | None = AUTO,
        observation_space: gym.Space[Any] | None = None,
        action_space: gym.Space[Any] | None = None,
        **config: Any,
    ) -> None:
        """Build the algorithm, its envs and its networks.

        Args:
            env: a Gymnasium id (``num_envs`` copies on the config's ``backend``), a ready
                vector env, or ``None`` (an agent that predicts, or whose envs the asynchronous
                runner's collector process builds from ``env_id``).
            preset: the named settings to start from (the class's ``presets``): ``"auto"``
                (the default) takes the one made for the env id given (``env``, or ``env_id``
                with ``env=None``), if any; ``None`` or ``"none"`` the plain defaults. The name
                applied is kept in ``config.preset``.
            observation_space: the single-env observation space of an agent built without
                ``env`` (the networks are built for it).
            action_space: likewise, the single-env action space.
            **config: fields of the algorithm's config dataclass, each winning over the
                preset's; ``config=`` a whole config object to start from instead of the
                class defaults.
        """
        whole = config.pop("config", None)
        base = None if whole is None else dataclasses.asdict(whole)
        self._setup(self.config_values(env, preset, config, base))
        if env is None and (observation_space is None or action_space is None):
            # an agent without envs or spaces makes its envs from env_id later, maybe in another
            # process: a misspelled id is the env layer's one line here, in the caller
            EnvSource.check_id(self.config.env_id)
        self._build(env, observation_space, action_space)

    def config_values(
        self,
        env: Any,
        preset: str | None,
        explicit: dict[str, Any],
        base: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The config values of a new agent (see :meth:`preset_values`); a family adds its
        checks or earlier setting names here."""
        return self.preset_values(env, preset, explicit, base)

    @abc.abstractmethod
    def _build(
        self,
        env: str | gym.vector.VectorEnv | None,
        observation_space: gym.Space[Any] | None,
        action_space: gym.Space[Any] | None,
    ) -> None:
        """The family's part of construction, once the config is set: envs and networks."""

    @classmethod
    def preset_values(
        cls,
        env: Any,
        preset: str | None,
        explicit: dict[str, Any],
        base: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The config values of a new agent: ``base`` (default: the class defaults), then the
        preset's, then the ``explicit`` keywords, with the preset's name under ``"preset"``.

        ``preset="auto"`` takes the preset made for the env id trained on, when the caller names
        one (``env`` as a string, or ``env_id`` with ``env=None``), and none over a full config
        (``base``); a ready vector env gets none, its wrappers and size being the caller's.
        ``None`` or ``"none"``: the plain defaults.
        """
        from vecaccel.trainers.config.presets import AUTO, apply_preset

        if base is not None and preset == AUTO:  # a whole config is explicit
            return {**base, **explicit}
        env_id = explicit.get("env_id") if env is None else EnvSource.id_of(env)
        defaults = cls.defaults if base is None else base
        return apply_preset(cls.algo_name, cls.presets, defaults, preset, env_id, explicit)

    def _setup(self, values: dict[str, Any]) -> None:
        """Build the config from ``values`` and everything that
        depends only on it: the process group under ``torchrun``, threads, seeds, device."""
        names = [field.name for field in dataclasses.fields(self.config_cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise TypeError(unknown_settings_message(type(self).__name__, unknown, names))
        self.config = self.config_cls(**values)
        cfg = self.config
        device = resolve_device(cfg.device)
        # under torchrun: join the process group; each rank gets its own seed (envs, sampling)
        if distributed.init_from_env(device):
            cfg.device = device = distributed.local_device(device)
            cfg.seed = distributed.rank_seed(cfg.seed)
        self.world_size = distributed.world_size()
        self.is_main = distributed.is_main_process()
        # the cores other processes keep busy, measured once (0.1 s) for automatic threads
        self.others_at_start = (
            CpuLoad.measure(START_SAMPLE_SECONDS) if cfg.torch_threads <= 0 else 0.0
        )
        configure_torch_threads(
            cfg.torch_threads, cfg.backend, cfg.num_envs, cfg.num_workers,
            others=self.others_at_start,
        )  # fmt: skip
        seed_everything(cfg.seed)
        import torch

        self.device = torch.device(device)
        self.envs: Any = None
        self.owns_envs = False
        self.observation_space: gym.Space[Any] | None = None
        self.action_space: gym.Space[Any] | None = None
        self.global_step = 0
        self.num_updates = 0
        self.target_steps: int | None = None
        self.logger: Any = None
        self.elapsed_before = 0.0
        self.async_run = False
        self.async_options: dict[str, Any] = {}
        self.normalizer: Normalizer | None = None  # made with the spaces
        self._training_envs: Any = None
        #: the periodic evaluations of this agent's runs: ``(step, eval/... metrics)``
        self.evaluations: list[tuple[int, dict[str, float]]] = []
        self.best_eval_reward: float | None = None

    # -- the run's settings, read from the config ----------------------------------------------

    @property
    def run_dir(self) -> Path | None:
        """Where metrics, TensorBoard events, the curve and checkpoints go (``None``: nowhere)."""
        return None if self.config.run_dir is None else Path(self.config.run_dir)

    @run_dir.setter
    def run_dir(self, value: str | os.PathLike[str] | None) -> None:
        self.config.run_dir = None if value is None else os.fspath(value)

    @property
    def progress(self) -> bool:
        """Whether ``learn`` shows a progress bar: the config's ``progress``, or where that is
        ``None``, whether the run is interactive (:func:`is_interactive`)."""
        if self.config.progress is None:
            return is_interactive()
        return bool(self.config.progress)

    @progress.setter
    def progress(self, value: bool | None) -> None:
        self.config.progress = None if value is None else bool(value)

    @property
    def tensorboard(self) -> bool:
        """Whether ``learn`` writes TensorBoard event files (with a ``run_dir``)."""
        return bool(self.config.tensorboard)

    @tensorboard.setter
    def tensorboard(self, value: bool) -> None:
        self.config.tensorboard = bool(value)

    @property
    def env_id(self) -> str | None:
        """The id of the env trained on (``None`` for a vector env without a spec)."""
        env_id: str | None = self.config.env_id
        return env_id

    @env_id.setter
    def env_id(self, value: str | None) -> None:
        self.config.env_id = value

    @property
    def action_start(self) -> int:
        """``start`` of a ``Discrete`` action space: the env numbers its actions from it, the
        networks' outputs from 0."""
        return action_start(self.action_space)

    # -- envs ----------------------------------------------------------------------------------

    @property
    def env(self) -> Any:
        """The vector env it trains on (``envs``; SB3's name), ``None`` without one."""
        return self.envs

    def make_envs(self, env_id: str, **options: Any) -> gym.vector.VectorEnv:
        """The training envs of ``env_id`` on the config's backend with its
        ``backend_options`` (which win over ``options``), ``SameStep`` autoreset unless the
        config says otherwise (batched simulators: ``NextStep``, their only mode)."""
        return make_envs_for_config(self.config, env_id, **options)

    def build_normalizer(self, observation_space: gym.Space[Any]) -> None:
        """Make the normaliser the config asks for (``norm_obs``, ``norm_reward``), for the
        single-env ``observation_space``: statistics of the run like the weights, synced over
        the ranks (see :mod:`vecaccel.trainers.nets.normalization`)."""
        self.normalizer = make_normalizer(self.config, observation_space, self.world_size)

    def training_envs(self) -> Any:
        """``envs`` as training steps them: behind the normalisation when it is on."""
        self._training_envs = normalized_envs(self.envs, self.normalizer, self._training_envs)
        return self._training_envs

    def restart_seed(self) -> int:
        """The seed a restart point resets the envs with: a function of the run's seed and
        the update count, so that a run resumed there resets them alike."""
        return split_seed(self.config.seed, self.num_updates)

    # -- what a runner calls ---------------------------------------------------------------------

    def set_budget(self, total_timesteps: int | None) -> None:
        """Train ``total_timesteps`` more env steps from here; ``None`` keeps the budget of the run
        this agent was loaded from.

        Raises:
            ValueError: ``total_timesteps`` is ``None`` and there is no unfinished run to continue.
        """
        if total_timesteps is None:
            if self.target_steps is None or self.global_step >= self.target_steps:
                raise ValueError(
                    "learn() needs total_timesteps unless it continues the unfinished run of a "
                    "loaded checkpoint"
                )
            return
        self.target_steps = self.global_step + int(total_timesteps)

    def set_target_steps(self, total_timesteps: int) -> None:
        """Make ``total_timesteps`` the run's total (a resumed run's new budget); an unchanged
        total continues the loaded run exactly."""
        self.target_steps = int(total_timesteps)

    def adaptive_threads(self, reserved: int = 0, phases: bool = False) -> AdaptiveThreads:
        """What keeps torch's threads at the cores the machine leaves free while this run goes
        (``reserved``: cores kept for another part of the run, an async run's collector;
        ``phases``: a synchronous run, whose updates may take the env workers' cores)."""
        cfg = self.config
        return AdaptiveThreads(
            cfg.torch_threads, cfg.backend, cfg.num_envs, cfg.num_workers, reserved,
            others=getattr(self, "others_at_start", None), phases=phases,
        )  # fmt: skip

    def record_progress(self, steps: int = 0, updates: int = 0) -> None:
        """Count ``steps`` more env steps (over all ranks) and ``updates`` more updates."""
        self.global_step += int(steps)
        self.num_updates += int(updates)

    def start_logging(self, logger: Any) -> None:
        """Make ``logger`` (a :class:`~vecaccel.trainers.services.logger.RunLogger`) the run's
        logger, and give it the run's settings: TensorBoard's hyperparameters, and with
        ``track`` a Weights & Biases run on rank 0.

        Raises:
            ModuleNotFoundError: ``track`` is on and wandb is not installed.
        """
        self.logger = logger
        cfg = self.config
        settings = {
            "algo": self.algo_name,
            "total_timesteps": logger.total_timesteps,
            **dataclasses.asdict(cfg),
        }
        logger.log_hparams(settings)
        if cfg.track and self.is_main:
            try:
                logger.start_tracking(settings, cfg.wandb_project_name, cfg.wandb_entity)
            except BaseException:
                logger.close()  # the bar and the CSV of a run that does not start
                raise

    def end_run(self, elapsed_s: float) -> None:
        """The run in progress ended after ``elapsed_s`` seconds of training in all (a
        resumed run's time included): saved in later checkpoints."""
        self.elapsed_before = float(elapsed_s)

    def reset_counters(self) -> None:
        """Count env steps and updates from zero again (a new run on a trained agent)."""
        self.global_step = 0
        self.num_updates = 0

    def set_run_mode(self, async_options: dict[str, Any] | None) -> None:
        """Record how the run in progress trains: ``None`` synchronously, else asynchronously
        with these options. Checkpoints save it, so that a resumed run goes on alike."""
        self.async_run = async_options is not None
        self.async_options = dict(async_options or {})

    # -- the interface the runners drive, implemented by each family's base ---------------------

    @abc.abstractmethod
    def begin_run(self, total_timesteps: int | None, reset_num_timesteps: bool) -> TrainingLoop:
        """Begin a synchronous run of ``total_timesteps`` more env steps (``None``: finish a
        loaded run's budget): the counters, budget and envs set, and the family's loop that
        collects, optimises and reports, which the
        :class:`~vecaccel.trainers.runners.sync.SyncRunner` drives.

        Raises:
            ValueError: ``total_timesteps`` is ``None`` and there is no unfinished run to
                continue.
        """

    @abc.abstractmethod
    def async_feed(
        self,
        total_timesteps: int | None,
        *,
        reset_num_timesteps: bool,
        weight_sync_period: int,
        options: Any,
    ) -> Any:
        """Begin an asynchronous run: the family's
        :class:`~vecaccel.trainers.runners.asynchronous.loop.AsyncFeed`, which owns the
        process that collects for it and makes the updates from what that process hands over.

        Args:
            total_timesteps: env steps to collect, over all ranks (``None``: finish a loaded
                run's budget).
            reset_num_timesteps: count env steps and updates from zero.
            weight_sync_period: updates between weight copies to the collector process.
            options: how that process runs (a
                :class:`~vecaccel.trainers.runners.asynchronous.process.CollectorOptions`).
        """

    def prepare_async(self) -> None:  # noqa: B027 - most families need nothing
        """Get ready for an asynchronous run whose envs live in another process (build the
        networks from one env of ``env_id`` when this agent has none yet)."""

    #: the key of the family's section in the checkpoint
    checkpoint_key: ClassVar[str] = ""
    #: what the asynchronous mode does, for ``vecaccel train ALGO --help``
    async_help: ClassVar[str] = "a collector process steps the envs while this one trains"
    #: what a fixed policy lag means in the asynchronous mode, for the same help
    async_fixed_lag_help: ClassVar[str] = "act with the weights of a fixed earlier update"
    #: whether the algorithm keeps a replay buffer (saved beside its checkpoints)
    has_replay: ClassVar[bool] = False

    @abc.abstractmethod
    def checkpoint_section(self) -> dict[str, Any]:
        """The family's section of the checkpoint: what it restores beyond the header."""

    def checkpoint_target_steps(self) -> int | None:
        """The step total a loaded checkpoint's run continues to (``None``: none)."""
        return self.target_steps

    def gather_rank_checkpoint(
        self, path: Path, replay: bool
    ) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
        """On several ranks, what a checkpoint at ``path`` gathers from every rank (a collective
        every rank calls): their global RNG states, and the entries of the replay files each
        wrote (``replay``); ``(None, None)`` for what it does not gather."""
        if self.world_size > 1:
            return distributed.all_gather_object(get_rng_state()), None
        return None, None

    @classmethod
    @abc.abstractmethod
    def from_checkpoint(cls, path: Path, env: Any, options: dict[str, Any]) -> Self:
        """A ``cls`` agent rebuilt from the checkpoint file at ``path`` (see :meth:`load`):
        the header read with :mod:`vecaccel.trainers.checkpoints.reader`, then the family's
        section.

        Raises:
            CheckpointError: the file cannot be read, or holds another algorithm's checkpoint.
        """

    @abc.abstractmethod
    def update(self, batch: Any, progress_remaining: float = 1.0) -> dict[str, float]:
        """One update from ``batch``; returns ``losses/...`` metrics.

        Args:
            batch: on-policy, a sampler batch in the networks' action numbering; off-policy, a
                :class:`~vecaccel.trainers.replay.buffer.ReplaySample`.
            progress_remaining: 1 at the start of the run's schedule, 0 at its end.
        """

    def write_checkpoint(self, run_dir: Path | None, replay: bool = False) -> Path | None:
        """Write ``run_dir/checkpoint.pt`` on rank 0; on several ranks every rank calls this at
        the same point (``run_dir`` may be ``None`` off rank 0), and the ranks' random streams
        (the DQN family: with ``replay``, their replay buffers) are gathered into it, so that a
        run resumed on as many ranks continues each rank exactly. ``replay``: the DQN family
        writes its replay buffer too. Returns the path written, if any."""
        return write_run_checkpoint(self, run_dir, replay)

    #: the parameters the optimizer trains, as a list (clipping then makes no generator per step)
    model_parameters: list[Any]
    #: the family's optimizer over ``model_parameters`` (``torch.optim`` or a flat one)
    optimizer: Any

    def backward_step(self, loss: Any, max_grad_norm: float) -> Any:
        """The gradient step of every algorithm: zero the gradients, backpropagate ``loss``,
        clip their norm to ``max_grad_norm`` (0: no clipping), step the optimizer.

        Returns:
            The gradient norm before clipping (a tensor; 0 without clipping).

        Raises:
            FloatingPointError: the gradient is not finite (a NaN or infinite loss), before the
                step would make every parameter NaN.
        """
        import torch

        from vecaccel.trainers.nets.optim import FlatOptimizer

        optimizer = self.optimizer
        flat = isinstance(optimizer, FlatOptimizer)
        if flat:
            optimizer.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm <= 0:  # no norm computed: a non-finite loss is what makes it so
            norm, checked = torch.zeros(()), loss.detach()
        elif flat:
            norm = checked = optimizer.clip_grad_norm_(max_grad_norm)
        else:
            norm = checked = torch.nn.utils.clip_grad_norm_(
                self.model_parameters, max_grad_norm, foreach=True
            )
        # One sync per step, on a value computed anyway: a NaN or infinite loss makes it
        # non-finite, and Adam/RMSprop would then turn every parameter NaN and training would
        # go on silently. The norm is of the all-reduced gradients, so on several ranks every
        # rank decides alike.
        if not bool(torch.isfinite(checked)):
            raise FloatingPointError(
                f"{self.algo_name.upper()} update {self.num_updates} (global step "
                f"{self.global_step}): non-finite loss {float(loss.detach()):g} (gradient norm "
                f"{float(norm):g}); this optimizer step was not taken. A NaN or infinite "
                "reward or observation from the env is the usual cause."
            )
        optimizer.step()
        return norm

    # -- the public API, the same for every algorithm (SB3's shape) -----------------------------

    def learn(
        self,
        total_timesteps: int | None = None,
        callback: Any = None,
        *,
        reset_num_timesteps: bool = True,
        progress_bar: bool | None = None,
        mode: str = "sync",
        **async_options: Any,
    ) -> Self:
        """Train for ``total_timesteps`` more env steps.

        With ``run_dir`` and ``checkpoint_every`` set, each periodic checkpoint is a restart
        point: a loaded agent continues its run from there, on CPU bit-identical to a run never
        interrupted (synchronous mode). The checkpoint written when ``learn`` ends (or SIGINT or
        SIGTERM stops it) continues the run too.

        Args:
            total_timesteps: env steps to collect, over all ranks (on-policy: rounded up to
                whole batches, the learning rate annealing over them); ``None`` finishes the
                run of the checkpoint this agent was loaded from.
            callback: called once per collect-then-update iteration, for every algorithm:
                ``callback(agent, metrics)`` (or ``callback(agent)``), returning ``False`` to
                stop; or an SB3 ``BaseCallback`` (or a list of them), whose hooks run where
                SB3 runs them. See :mod:`vecaccel.trainers.runners.callbacks`; in asynchronous
                mode once per turn of the optimiser's loop.
            reset_num_timesteps: count env steps and updates (and so the schedules and
                ``learning_starts``) from zero, as SB3 does; ``False`` continues them. A loaded
                run finished with ``total_timesteps=None`` always continues.
            progress_bar: show a progress bar for this run (``None``: the config's
                ``progress``).
            mode: ``"sync"`` (:class:`~vecaccel.trainers.runners.sync.SyncRunner`: collect,
                then update, in this process) or ``"async"``
                (:class:`~vecaccel.trainers.runners.asynchronous.runner.AsyncRunner`: a
                collector process collects while this one updates; the agent needs ``env_id``).
            **async_options: with ``mode="async"``, the options of :meth:`AsyncRunner.run
                <vecaccel.trainers.runners.asynchronous.runner.AsyncRunner.run>`
                (``fixed_lag``, ``context``, ...).

        Returns:
            ``self``.

        Raises:
            ValueError: ``total_timesteps`` is ``None`` but there is no unfinished loaded run,
                or ``mode`` is neither ``"sync"`` nor ``"async"``.
            ModuleNotFoundError: ``track`` is on and wandb is not installed (``pip install
                'vecaccel[track]'``), before anything is written.
            RuntimeError: ``track`` is on, the W&B run would go online and wandb finds no
                credentials (``wandb login``, ``WANDB_API_KEY``), before anything is written.
        """
        from vecaccel.trainers.runners import run_in_mode

        if self.config.track and self.is_main:
            # before the run opens its files, which would make run_dir refuse the next try
            require_wandb("track=True")
        progress = self.config.progress
        if progress_bar is not None:
            self.config.progress = bool(progress_bar)
        try:
            run_in_mode(
                self,
                mode,
                total_timesteps,
                callback=callback,
                reset_num_timesteps=reset_num_timesteps,
                **async_options,
            )
        finally:
            self.config.progress = progress
        return self

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, None]:
        """Actions for one observation or a batch with a leading env axis, as SB3's ``predict``;
        with ``norm_obs`` the observations are normalised by the run's statistics first (which
        predicting never changes).

        Args:
            observation: one observation, or a batch of them.
            state: unused (no recurrent policies); SB3's argument.
            episode_start: unused; SB3's argument.
            deterministic: the policy's most likely action; otherwise A2C and PPO sample from
                the policy and the DQN family acts ε-greedily with ``eval_epsilon``.

        Returns:
            ``(actions, None)``: a NumPy array of the env's actions, one action for one
            observation.
        """
        obs = np.asarray(observation)
        shape = getattr(self.observation_space, "shape", None)
        single = shape is not None and obs.shape == tuple(shape)
        batch = obs[None] if single else obs
        if self.normalizer is not None:  # with the statistics as they are, counting nothing
            batch = self.normalizer.normalize_obs(batch)
        actions = self.act_for_predict(batch, bool(deterministic))
        return (actions[0] if single else actions), None

    @abc.abstractmethod
    def act_for_predict(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """The env's actions for the ``[N, *obs_shape]`` batch ``obs`` (see :meth:`predict`)."""

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save a checkpoint (atomically) that :meth:`load` restores and training resumes from;
        returns its path. The DQN family saves without its replay buffer, which a loaded agent
        refills as in SB3 (``save_with_replay`` writes it too)."""
        return save_agent(self, Path(path))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        env: str | gym.vector.VectorEnv | None = None,
        *,
        device: str | None = None,
        **options: Any,
    ) -> Self:
        """Rebuild an agent saved by :meth:`save` (or written into a run directory), in the
        current checkpoint layout or an earlier one.

        Args:
            path: the checkpoint file, or the run directory holding ``checkpoint.pt``.
            env: an env to go on training or to evaluate in (``None``: none, or built from the
                config by ``learn``).
            device: the torch device of the networks (``None``: the saved one where it exists
                here, else the CPU).
            **options: config fields to change (``run_dir``, ``backend``, ...), and the
                family's loading options: ``restore_rng`` (A2C, PPO: the saved RNG states, for
                an exact resume; default ``True``) and ``load_replay`` (the DQN family: the
                replay buffer saved with the checkpoint; default ``True``).

        Returns:
            The restored agent.

        Raises:
            CheckpointError: the file is corrupt or truncated, holds another algorithm or a
                checkpoint version newer than this vecaccel reads, or (with ``env``) names a
                replay file that is missing or from another checkpoint.
        """
        if device is not None:
            options["device"] = device
        agent: Self = load_agent(cls, Path(path), env, options)
        return agent

    @property
    def num_timesteps(self) -> int:
        """Env steps collected so far (``global_step``), under SB3's name."""
        return self.global_step

    def get_env(self) -> Any:
        """The vector env trained on (``None`` without one), as SB3's ``get_env``."""
        return self.envs

    def get_vec_normalize_env(self) -> None:
        """``None``: no SB3 ``VecNormalize`` wraps the envs (SB3's callbacks ask)."""
        return None

    def close(self) -> None:
        """Close the envs this agent built."""
        if self.envs is not None and self.owns_envs:
            self.envs.close()
        self.envs = None
