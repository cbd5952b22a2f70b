"""The shared run config, one vocabulary of settings, and the checks every config runs.

Every algorithm's config dataclass subclasses :class:`RunConfig`, which holds what a run needs
whatever it trains: the env, the backend, seed and device, where and how often it logs and
checkpoints.

Example:
    >>> lr_scale(2048, 256, "sqrt")
    2.8284271247461903
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BF16_SETTINGS",
    "ENV_SOURCES",
    "ENV_SOURCE_ALIASES",
    "LR_SCALE_MODES",
    "NETWORKS",
    "RunConfig",
    "check_dqn_config",
    "check_rollout_config",
    "config_from_dict",
    "config_help",
    "env_source_name",
    "lr_scale",
    "resolve_device",
    "unknown_settings_message",
]

LR_SCALE_MODES = ("none", "linear", "sqrt")
#: the torsos a config's ``network`` names (:func:`vecaccel.trainers.nets.networks.make_encoder`)
NETWORKS = ("auto", "cnn", "minatar", "mlp")
#: a config's ``bf16``: autocast the convolutional torso never, always, or where it pays
#: (:func:`vecaccel.trainers.nets.networks.use_bf16`)
BF16_SETTINGS = ("off", "on", "auto")
#: the DQN family's ``optimizer``: Adam, or Nature DQN's centred RMSprop
DQN_OPTIMIZERS = ("adam", "rmsprop")
#: where the envs come from (``RunConfig.env_source``): Gymnasium's registry, or EnvPool's pools
ENV_SOURCES = ("gymnasium", "envpool")
#: other spellings of an env source: ``ale``, its name while it served only Atari games, which
#: checkpoints and command lines may still hold
ENV_SOURCE_ALIASES = {"ale": "gymnasium"}


def env_source_name(name: str) -> str:
    """The env source that ``name`` spells (:data:`ENV_SOURCES`, or one of its aliases).

    Example:
        >>> env_source_name("ale")
        'gymnasium'

    Raises:
        ValueError: for a name that is no env source's.
    """
    name = ENV_SOURCE_ALIASES.get(name, name)
    if name not in ENV_SOURCES:
        raise ValueError(f"env_source must be one of {', '.join(ENV_SOURCES)}, got {name!r}")
    return name


@dataclass
class RunConfig:
    """The settings of a run that every algorithm shares; each docstring is its ``--help``."""

    env_id: str = "CartPole-v1"
    """Gymnasium environment id (ALE ids get the standard Atari set-up)."""
    num_envs: int = 8
    """Parallel environments (B); every env step counts towards the step budget."""
    backend: str = "auto"
    """vecaccel backend that runs the environments (auto: chosen from one env's step cost;
    serial, shm, ...)."""
    backend_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options passed to the backend, checked by make_vec (ray: address, num_shards,
    shard_backend, shard_options...; shm: context, step_timeout_s...)."""
    vectorized: bool = False
    """Step one batched vector env per worker over its slice of the envs: the id's Gymnasium
    vector_entry_point (CartPole-v1), or EnvPool's pool with env_source=envpool. Such envs
    autoreset NextStep; the DQN family cannot train on them."""
    env_source: str = "gymnasium"
    """Where the envs come from: gymnasium (Gymnasium's registry; Atari games through the ALE
    with the standard wrappers) or envpool (EnvPool's C++ pools of Atari games and MuJoCo tasks,
    the same preprocessing, one pool per worker)."""
    num_workers: int = 0
    """Worker processes for process backends (0: the backend's default)."""
    seed: int = 1
    """Seed of the run (torch, NumPy, Python, and the environments)."""
    device: str = "auto"
    """Torch device for the networks and batches: auto (CUDA when available), cpu, cuda:0..."""
    torch_threads: int = 0
    """torch.set_num_threads for this process (0: automatic, the cores the env workers leave
    free, at least 1)."""
    run_dir: str | None = None
    """Directory for metrics, TensorBoard events, the learning curve and checkpoints (None:
    nothing is written)."""
    checkpoint_every: int = 0
    """Updates between checkpoints written to run_dir/checkpoint.pt (0: only at the end)."""
    reset_envs_at_checkpoint: bool = True
    """Reset the envs with a derived seed at each periodic checkpoint, so that a run resumed from
    it is bit-identical on CPU to one never interrupted (the running episodes are cut short)."""
    norm_obs: bool = False
    """Normalise observations by their running mean and variance, updated from every env's
    observations in the trainer's process, saved with the agent and applied by predict and
    eval (SB3's VecNormalize; floating-point Box observations only)."""
    norm_reward: bool = False
    """Divide rewards by the running standard deviation of the discounted return (SB3's
    VecNormalize); the logged episodic returns stay the env's own."""
    clip_obs: float = 10.0
    """Bound of a normalised observation (with norm_obs)."""
    clip_reward: float = 10.0
    """Bound of a scaled reward (with norm_reward)."""
    norm_gamma: float | None = None
    """Discount of the return whose variance scales the rewards (None: the algorithm's gamma)."""
    norm_epsilon: float = 1e-8
    """Added to the running variances before their square root (norm_obs, norm_reward)."""
    log_every_steps: int = 0
    """Env steps between metric rows (0: every update); a row is also written when an episode
    ended and at the end."""
    progress: bool | None = None
    """Show a live progress bar (None: when the run is interactive, its stderr a terminal or a
    notebook)."""
    tensorboard: bool = True
    """Write TensorBoard event files under run_dir."""
    eval_every: int = 0
    """Env steps between evaluations on envs of their own (0: none): eval_episodes
    deterministic episodes each, their mean and std logged as eval/..., the best agent kept
    as run_dir/best.pt."""
    eval_episodes: int = 10
    """Episodes of each evaluation (eval_every)."""
    track: bool = False
    """Log the run to Weights & Biases from rank 0: the config, every metric row against
    global_step, the learning curve and the run's videos (pip install 'vecaccel[track]')."""
    wandb_project_name: str = "vecaccel"
    """The Weights & Biases project of a tracked run."""
    wandb_entity: str | None = None
    """The Weights & Biases team or user of a tracked run (None: the login's default)."""
    preset: str | None = None
    """The preset the settings started from (None: the plain defaults). A record, kept in
    checkpoints: the algorithm's ``preset`` argument (``--preset``) is what applies one."""

    def __post_init__(self) -> None:
        if self.run_dir is not None:  # a Path would not pass the checkpoint's weights-only load
            self.run_dir = os.fspath(self.run_dir)
        for name, least, meaning in (
            ("num_envs", 1, ""),
            ("num_workers", 0, " (0: the backend's default)"),
            ("torch_threads", 0, " (0: automatic)"),
            ("checkpoint_every", 0, " (0: only at the end)"),
            ("log_every_steps", 0, " (0: every update)"),
            ("eval_every", 0, " (0: no evaluation)"),
            ("eval_episodes", 1, ""),
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < least:
                expected = "a positive integer" if least == 1 else f"an integer >= {least}{meaning}"
                raise ValueError(f"{name} must be {expected}, got {value!r}")
        self._check_env_settings()
        self._check_tracking()
        self._check_normalization()

    def _check_normalization(self) -> None:
        for name in ("norm_obs", "norm_reward"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        _check_real(
            self, "clip_obs", lambda x: x > 0, "a positive number (inf: no clipping)", False
        )
        _check_real(
            self, "clip_reward", lambda x: x > 0, "a positive number (inf: no clipping)", False
        )
        _check_real(self, "norm_epsilon", lambda x: x > 0, "a positive finite number")
        if self.norm_gamma is not None:
            _check_real(self, "norm_gamma", lambda x: 0 <= x <= 1, "None or a number in [0, 1]")

    def _check_tracking(self) -> None:
        if not isinstance(self.track, (bool, np.bool_)):
            raise ValueError(f"track must be True or False, got {self.track!r}")
        if not isinstance(self.wandb_project_name, str) or not self.wandb_project_name.strip():
            raise ValueError(
                f"wandb_project_name must be a non-empty string, got {self.wandb_project_name!r}"
            )
        if self.wandb_entity is not None and (
            not isinstance(self.wandb_entity, str) or not self.wandb_entity.strip()
        ):
            raise ValueError(
                f"wandb_entity must be None or a non-empty string, got {self.wandb_entity!r}"
            )

    def _check_env_settings(self) -> None:
        if not isinstance(self.backend_options, dict) or not all(
            isinstance(key, str) and key.isidentifier() for key in self.backend_options
        ):
            raise ValueError(
                "backend_options must be a dict of option names to values, got "
                f"{self.backend_options!r}"
            )
        self.backend_options = dict(self.backend_options)
        given = self.backend_options.get("num_workers")
        if self.num_workers > 0 and given is not None and given != self.num_workers:
            raise ValueError(
                f"num_workers={self.num_workers} and backend_options num_workers={given!r} "
                "disagree; give it once"
            )
        if not isinstance(self.vectorized, (bool, np.bool_)):
            raise ValueError(f"vectorized must be True or False, got {self.vectorized!r}")
        self.env_source = env_source_name(self.env_source)


def resolve_device(device: str) -> str:
    """``"auto"`` becomes ``"cuda"`` where CUDA is available, else ``"cpu"``; others pass.

    Example:
        >>> resolve_device("cpu")
        'cpu'
    """
    if str(device) != "auto":
        return str(device)
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def lr_scale(batch_size: int, base_batch_size: int, mode: str = "none") -> float:
    """Factor to multiply a learning rate tuned at ``base_batch_size`` by, at ``batch_size``.

    Args:
        batch_size: the batch actually used (A2C/PPO: ``num_envs * num_steps``).
        base_batch_size: the batch the base learning rate was tuned for.
        mode: ``"none"`` (1), ``"linear"`` (``batch/base``) or ``"sqrt"`` (``sqrt(batch/base)``).

    Returns:
        The scale factor.

    Raises:
        ValueError: for an unknown mode or a non-positive batch size.

    Example:
        >>> lr_scale(512, 32, "linear"), lr_scale(512, 32, "none")
        (16.0, 1.0)
    """
    if mode not in LR_SCALE_MODES:
        raise ValueError(f"unknown lr scaling mode {mode!r}; choose one of {LR_SCALE_MODES}")
    if batch_size <= 0 or base_batch_size <= 0:
        raise ValueError(
            f"batch sizes must be positive, got batch_size={batch_size}, "
            f"base_batch_size={base_batch_size}"
        )
    ratio = batch_size / base_batch_size
    if mode == "linear":
        return float(ratio)
    if mode == "sqrt":
        return math.sqrt(ratio)
    return 1.0


def check_rollout_config(cfg: Any) -> None:
    """Raise ``ValueError`` naming the field for a rollout algorithm's config (A2C, PPO, PQN)
    that cannot train (the shared fields are checked by :class:`RunConfig`)."""
    positive = ["num_steps", "base_batch_size"]
    positive += [name for name in ("num_minibatches", "update_epochs") if hasattr(cfg, name)]
    for name in positive:
        value = getattr(cfg, name)
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if hasattr(cfg, "num_minibatches") and cfg.num_minibatches > cfg.num_envs * cfg.num_steps:
        raise ValueError(
            f"num_minibatches={cfg.num_minibatches} is more than the batch of num_envs x "
            f"num_steps = {cfg.num_envs * cfg.num_steps} transitions"
        )
    for name in ("gamma", "gae_lambda"):
        if hasattr(cfg, name):
            _check_real(cfg, name, lambda x: 0.0 <= x <= 1.0, "in [0, 1]")
    _check_real(cfg, "learning_rate", lambda x: x > 0, "a positive finite number")
    for name in ("ent_coef", "vf_coef"):
        if hasattr(cfg, name):
            _check_real(cfg, name, lambda x: x >= 0, "a finite number >= 0")
    # inf is a clip that never bites; 0 would zero every gradient (there is no "off" value)
    _check_real(
        cfg, "max_grad_norm", lambda x: x > 0, "a positive number (inf: no clipping)", finite=False
    )
    if hasattr(cfg, "log_std_init"):
        _check_real(cfg, "log_std_init", lambda x: True, "a finite number")
    if hasattr(cfg, "clip_coef"):
        _check_real(cfg, "clip_coef", lambda x: x >= 0, "a finite number >= 0")
    if getattr(cfg, "target_kl", None) is not None:
        # 0 is valid: stop after the first epoch that moved the policy at all
        _check_real(cfg, "target_kl", lambda x: x >= 0, "None or a finite number >= 0")
    _check_optimizer_fields(cfg)
    if cfg.activation not in ("tanh", "relu"):
        raise ValueError(f"activation must be 'tanh' or 'relu', got {cfg.activation!r}")
    _check_torso(cfg)
    lr_scale(cfg.num_envs * cfg.num_steps, cfg.base_batch_size, cfg.lr_scaling)  # the mode


def _check_optimizer_fields(cfg: Any) -> None:
    """The optimizer settings a config has, of ``adam_eps``, ``rms_alpha`` and ``rms_eps``."""
    if hasattr(cfg, "adam_eps"):
        _check_real(cfg, "adam_eps", lambda x: x > 0, "a positive finite number")
    if hasattr(cfg, "rms_alpha"):
        _check_real(cfg, "rms_alpha", lambda x: 0 < x < 1, "in (0, 1)")
    if hasattr(cfg, "rms_eps"):
        _check_real(cfg, "rms_eps", lambda x: x > 0, "a positive finite number")


def _check_real(
    cfg: Any, name: str, valid: Callable[[float], bool], expected: str, finite: bool = True
) -> None:
    """Raise ``ValueError`` naming ``name`` unless the field is a real number (finite, unless
    ``finite`` is false; never NaN) for which ``valid`` holds."""
    value = getattr(cfg, name)
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not real or math.isnan(value) or (finite and not math.isfinite(value)) or not valid(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def config_help(config_cls: type) -> dict[str, str]:
    """Read the attribute docstrings of a dataclass (the string right after each field).

    Args:
        config_cls: a ``@dataclass`` whose fields are each followed by a string literal.

    Returns:
        ``{field_name: docstring}`` for every documented field.
    """
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(config_cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, following in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def config_from_dict(config_cls: type, values: dict[str, Any]) -> Any:
    """Build ``config_cls`` from a dict, ignoring keys it does not have (a checkpoint may hold more)."""
    names = {field.name for field in dataclasses.fields(config_cls)}
    return config_cls(**{key: value for key, value in values.items() if key in names})


def unknown_settings_message(owner: str, unknown: Sequence[str], names: Sequence[str]) -> str:
    """The one line for keyword settings ``owner`` (an algorithm's name) does not have: the
    setting each most likely meant; the list of its settings only where one has none close.

    Example:
        >>> names = ["learning_rate", "gamma", "num_envs"]
        >>> unknown_settings_message("PPO", ["learning_rat"], names)
        "unknown PPO setting 'learning_rat'; did you mean 'learning_rate'?"
        >>> unknown_settings_message("PPO", ["gama", "numenvs"], names)
        "unknown PPO settings 'gama', 'numenvs'; did you mean 'gamma' for 'gama', 'num_envs' for 'numenvs'?"
        >>> unknown_settings_message("PPO", ["gpu"], names)
        "unknown PPO setting 'gpu'; its settings: learning_rate, gamma, num_envs"
    """
    from vecaccel.errors import closest_name

    meant = {name: closest_name(name, names) for name in unknown}
    which = "setting" if len(unknown) == 1 else "settings"
    message = f"unknown {owner} {which} {', '.join(map(repr, unknown))}"
    if all(meant.values()):
        if len(unknown) == 1:
            return f"{message}; did you mean {meant[unknown[0]]!r}?"
        pairs = ", ".join(f"{right!r} for {wrong!r}" for wrong, right in meant.items())
        return f"{message}; did you mean {pairs}?"
    return f"{message}; its settings: {', '.join(names)}"


def _check_torso(cfg: Any) -> None:
    """The network settings both families share: ``network`` and ``bf16``."""
    if cfg.network not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {cfg.network!r}")
    if cfg.bf16 not in BF16_SETTINGS:
        raise ValueError(
            f"bf16 must be one of {', '.join(map(repr, BF16_SETTINGS))}, got {cfg.bf16!r}"
        )


def optimizer_settings(cfg: Any) -> dict[str, Any]:
    """The hyperparameters of a DQN-family optimizer that ``cfg`` sets, the learning rate
    aside: Adam's ``eps``, or centred RMSprop's ``alpha`` and ``eps``."""
    if cfg.optimizer == "rmsprop":
        return {"alpha": cfg.rms_alpha, "eps": cfg.rms_eps, "centered": True}
    return {"eps": cfg.adam_eps}


def check_dqn_config(cfg: Any) -> None:
    """Raise ``ValueError`` naming the field for a DQN-family config that cannot train (the
    shared fields are checked by :class:`RunConfig`)."""
    if cfg.vectorized or cfg.env_source == "envpool":
        setting = "vectorized=True" if cfg.vectorized else "env_source='envpool'"
        raise ValueError(
            f"{setting}: batched simulators autoreset NextStep (the step after an episode's end "
            "is a reset step whose action does nothing), and the DQN family's asynchronous "
            "sampler hands its steps over as SameStep transitions with infos['final_obs']; "
            "train this env without it, or with A2C or PPO"
        )
    if cfg.batch_size < 1 or cfg.base_batch_size < 1:
        raise ValueError("batch_size and base_batch_size must be positive")
    if cfg.replay_ratio <= 0:
        raise ValueError(f"replay_ratio must be positive, got {cfg.replay_ratio}")
    if cfg.optimizer not in DQN_OPTIMIZERS:
        raise ValueError(
            f"optimizer must be one of {', '.join(map(repr, DQN_OPTIMIZERS))}, "
            f"got {cfg.optimizer!r}"
        )
    _check_optimizer_fields(cfg)
    _check_torso(cfg)
    if cfg.loss not in ("huber", "mse"):
        raise ValueError(f"loss must be 'huber' or 'mse', got {cfg.loss!r}")
    if cfg.categorical and (cfg.num_atoms < 2 or not cfg.v_min < cfg.v_max):
        raise ValueError("categorical needs num_atoms >= 2 and v_min < v_max")
    if cfg.target_update_period < 1:
        raise ValueError("target_update_period must be at least 1 env step")
    # each of these is accepted by the maths but fails later, or silently: gamma > 1 makes
    # the targets diverge, tau <= 0 never moves the target network (or pushes it away), a
    # negative alpha or beta inverts prioritization or its correction, and a negative eps
    # makes a zero TD error a negative priority that the sum tree rejects mid-run
    if not 0.0 <= cfg.gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {cfg.gamma!r}")
    if not 0.0 < cfg.tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {cfg.tau!r}")
    if not cfg.priority_alpha >= 0.0:
        raise ValueError(f"priority_alpha must be non-negative, got {cfg.priority_alpha!r}")
    if not 0.0 <= cfg.priority_beta_start <= 1.0:
        raise ValueError(f"priority_beta_start must be in [0, 1], got {cfg.priority_beta_start!r}")
    if not cfg.priority_eps >= 0.0:
        raise ValueError(f"priority_eps must be non-negative, got {cfg.priority_eps!r}")
    if cfg.async_max_lead < 0:
        raise ValueError(f"async_max_lead must be non-negative, got {cfg.async_max_lead!r}")
    lr_scale(cfg.batch_size, cfg.base_batch_size, cfg.lr_scaling)  # validates the mode
