"""Machinery every vecaccel trainer shares: logging, checkpoints, seeding, LR scaling, env set-up.

The algorithm files (``ppo.py``, ``a2c.py``, ``dqn.py``) import from here and keep their own
loss and update in view, CleanRL style; nothing here knows about a particular algorithm.

Example:
    >>> lr_scale(2048, 256, "sqrt")
    2.8284271247461903
"""

from __future__ import annotations

import abc
import csv
import dataclasses
import io
import math
import os
import random
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "AtariEnvFactory",
    "action_start",
    "CheckpointError",
    "SignalCheckpoint",
    "TrainingInterrupted",
    "EpisodicLifeEnv",
    "RunLogger",
    "config_from_dict",
    "config_help",
    "get_rng_state",
    "is_atari_id",
    "load_checkpoint",
    "lr_scale",
    "make_env_for_training",
    "restore_rank_rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
    "split_seed",
]

LR_SCALE_MODES = ("none", "linear", "sqrt")


# -- seeding and RNG state -------------------------------------------------------------------


def configure_torch_threads(
    requested: int, backend: str, num_envs: int, num_workers: int = 0
) -> int:
    """Set torch's intra-op threads; return the number in force.

    ``requested > 0`` is applied as given. ``0`` (automatic) leaves the cores that the env
    workers use to them: with a process backend whose workers fill every core, torch's default
    of one thread per core makes its OpenMP threads spin on the workers' cores, which was
    measured here to slow PPO on CartPole about 3x (61 s against 20 s to 100k steps).

    Example:
        >>> configure_torch_threads(1, "serial", 8)
        1
    """
    import torch

    from vecaccel.worker import usable_cpus

    if requested > 0:
        threads = requested
    elif backend == "serial":
        return torch.get_num_threads()
    else:
        cpus = usable_cpus()
        workers = num_workers if num_workers > 0 else min(num_envs, cpus)
        threads = max(1, cpus - workers)
    torch.set_num_threads(threads)
    return threads


def check_on_policy_config(cfg: Any) -> None:
    """Raise ``ValueError`` naming the field for an A2C/PPO config that cannot train."""
    positive = ["num_envs", "num_steps", "base_batch_size"]
    positive += [name for name in ("num_minibatches", "update_epochs") if hasattr(cfg, name)]
    for name in positive:
        value = getattr(cfg, name)
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if cfg.num_workers < 0:
        raise ValueError(
            f"num_workers must be >= 0 (0: the backend's default), got {cfg.num_workers}"
        )
    if hasattr(cfg, "num_minibatches") and cfg.num_minibatches > cfg.num_envs * cfg.num_steps:
        raise ValueError(
            f"num_minibatches={cfg.num_minibatches} is more than the batch of num_envs x "
            f"num_steps = {cfg.num_envs * cfg.num_steps} transitions"
        )
    if not 0.0 <= cfg.gamma <= 1.0 or not 0.0 <= cfg.gae_lambda <= 1.0:
        raise ValueError(
            f"gamma and gae_lambda must lie in [0, 1], got {cfg.gamma}, {cfg.gae_lambda}"
        )
    _check_real(cfg, "learning_rate", lambda x: x > 0, "a positive finite number")
    _check_real(cfg, "ent_coef", lambda x: x >= 0, "a finite number >= 0")
    _check_real(cfg, "vf_coef", lambda x: x >= 0, "a finite number >= 0")
    # inf is a clip that never bites; 0 would zero every gradient (there is no "off" value)
    _check_real(
        cfg, "max_grad_norm", lambda x: x > 0, "a positive number (inf: no clipping)", finite=False
    )
    if hasattr(cfg, "clip_coef"):
        _check_real(cfg, "clip_coef", lambda x: x >= 0, "a finite number >= 0")
    if getattr(cfg, "target_kl", None) is not None:
        # 0 is valid: stop after the first epoch that moved the policy at all
        _check_real(cfg, "target_kl", lambda x: x >= 0, "None or a finite number >= 0")
    if hasattr(cfg, "adam_eps"):
        _check_real(cfg, "adam_eps", lambda x: x > 0, "a positive finite number")
    if hasattr(cfg, "rms_alpha"):
        _check_real(cfg, "rms_alpha", lambda x: 0 < x < 1, "in (0, 1)")
    if hasattr(cfg, "rms_eps"):
        _check_real(cfg, "rms_eps", lambda x: x > 0, "a positive finite number")
    if cfg.bf16 not in ("off", "on", "auto"):
        raise ValueError(f"bf16 must be 'off', 'on' or 'auto', got {cfg.bf16!r}")
    for name, least, meaning in (
        ("torch_threads", 0, " (0: automatic)"),
        ("checkpoint_every", 0, " (0: only at the end)"),
        ("log_every", 1, ""),
    ):
        value = getattr(cfg, name)
        if not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}{meaning}, got {value!r}")
    if cfg.activation not in ("tanh", "relu"):
        raise ValueError(f"activation must be 'tanh' or 'relu', got {cfg.activation!r}")
    if cfg.network not in ("auto", "cnn", "mlp"):
        raise ValueError(f"network must be 'auto', 'cnn' or 'mlp', got {cfg.network!r}")
    lr_scale(cfg.num_envs * cfg.num_steps, cfg.base_batch_size, cfg.lr_scaling)  # the mode


def _check_real(
    cfg: Any, name: str, valid: Callable[[float], bool], expected: str, finite: bool = True
) -> None:
    """Raise ``ValueError`` naming ``name`` unless the field is a real number (finite, unless
    ``finite`` is false; never NaN) for which ``valid`` holds."""
    value = getattr(cfg, name)
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not real or math.isnan(value) or (finite and not math.isfinite(value)) or not valid(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")


def usable_device(device: str) -> str:
    """The recorded ``device`` if this machine has it, else ``"cpu"`` (with a warning): a
    checkpoint written on a GPU machine loads on one without, as SB3's ``load`` does."""
    import torch

    name = str(device)
    if name.startswith("cuda") and not torch.cuda.is_available():
        import warnings

        warnings.warn(
            f"the checkpoint was trained on {name!r}, which this machine does not have; "
            "loading it on the CPU (pass device=... to choose)",
            stacklevel=3,
        )
        return "cpu"
    return name


def action_start(space: Any) -> int:
    """``start`` of a ``Discrete`` space (0 for any other space, or none): the env's actions are
    ``start..start+n-1``, a network's outputs ``0..n-1``."""
    return int(space.start) if isinstance(space, gym.spaces.Discrete) else 0


def check_env_matches(
    env_id: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
    trained_observation_space: gym.Space,
    trained_action_space: gym.Space,
) -> None:
    """Raise ``ValueError`` if a loaded agent's network cannot act in the env it is given."""
    for kind, found, trained in (
        ("observation", observation_space, trained_observation_space),
        ("action", action_space, trained_action_space),
    ):
        same = type(found) is type(trained) and found.shape == trained.shape
        if same and isinstance(found, gym.spaces.Discrete):
            # a shifted start shifts every action the network picks by as much
            same = int(found.n) == int(trained.n) and int(found.start) == int(trained.start)
        if not same:
            raise ValueError(
                f"{env_id} has the {kind} space {found}, but the agent was trained on "
                f"{trained}: its network cannot act there"
            )


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (every device).

    Args:
        seed: the run's seed.
    """
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def split_seed(seed: int, *keys: int) -> int:
    """Derive an independent 31-bit seed from ``seed`` and ``keys`` (e.g. an update index).

    Example:
        >>> split_seed(1, 5) == split_seed(1, 5) != split_seed(1, 6)
        True
    """
    return int(np.random.SeedSequence([int(seed), *map(int, keys)]).generate_state(1)[0] >> 1)


def get_rng_state() -> dict[str, Any]:
    """Capture the torch, NumPy and Python RNG states as plain, ``weights_only``-loadable data.

    Returns:
        A dict to store in a checkpoint and hand back to :func:`set_rng_state`.
    """
    import torch

    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNG states captured by :func:`get_rng_state`."""
    import torch

    python_state = state["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["name"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_rank_rng_state(
    state: dict[str, Any],
    seed: int,
    *resume_point: int,
    rank_states: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Restore a checkpoint's global RNG states on this rank; the states now in force.

    A checkpoint written on K ranks holds every rank's torch, NumPy and Python states
    (``rank_states``, gathered by rank 0): resumed on as many ranks, each rank restores its own
    and continues exactly. Otherwise it holds rank 0's alone, and restoring them on every rank
    would give all of them rank 0's streams (the same action samples, minibatch orders...),
    where a fresh run seeds each rank by its rank. So rank 0 restores the saved states and a
    rank ``r > 0`` re-seeds deterministically from ``(seed, r, resume_point)``: its stream
    differs from rank 0's, and a resume from the same checkpoint repeats. (A single process is
    rank 0 and restores the states as before.)

    Args:
        state: the states :func:`get_rng_state` saved on rank 0.
        seed: this rank's seed (already derived from the run's seed by rank).
        resume_point: the counters of the checkpoint, e.g. its global step.
        rank_states: every rank's states, in rank order, where the checkpoint has them.

    Returns:
        What :func:`get_rng_state` returns now, for a later exact restore of this rank's streams.
    """
    from vecaccel.trainers import distributed

    rank = distributed.rank()
    if rank_states is not None and len(rank_states) == distributed.world_size():
        set_rng_state(rank_states[rank])
        return rank_states[rank]
    if rank == 0:
        set_rng_state(state)
        return state
    seed_everything(split_seed(seed, 0x2E5, rank, *resume_point))
    return get_rng_state()


# -- learning-rate scaling -------------------------------------------------------------------


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


# -- checkpoints -----------------------------------------------------------------------------


class CheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt, or not a vecaccel checkpoint."""


_CHECKPOINT_MAGIC = b"VECACCEL-CKPT\x01"
_HEADER_SIZE = len(_CHECKPOINT_MAGIC) + 32 + 8


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` atomically, with a SHA-256 of its bytes so corruption is detected.

    The file is a short header (magic, SHA-256, payload length) followed by ``torch.save``'s
    bytes. They go to a temporary file in the same directory, are flushed and fsynced, and the
    file is renamed over ``path`` with ``os.replace``: a crash leaves the old checkpoint intact.

    Args:
        path: destination file; its directory is created if needed.
        state: a dict of tensors, numbers, strings, lists, tuples and dicts (loadable with
            ``torch.load(weights_only=True)``, so loading never runs pickled code).

    Returns:
        The path written.
    """
    import hashlib

    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    header = (
        _CHECKPOINT_MAGIC + hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "little")
    )
    handle, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(header)
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return path


def apply_runtime_settings(agent: Any, settings: dict[str, Any]) -> None:
    """Set run-time settings (``progress``, ``tensorboard``) on a loaded agent, where they are
    plain attributes: not every trainer keeps them in its config."""
    for key, value in settings.items():
        if hasattr(agent, key) and not isinstance(getattr(type(agent), key, None), property):
            setattr(agent, key, value)


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (or a plain ``torch.save`` dict).

    Args:
        path: the checkpoint file.
        map_location: where tensors are loaded (``torch.load``'s argument).

    Returns:
        The saved dict.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        CheckpointError: if the file is truncated, corrupt or does not hold a dict.
    """
    import hashlib
    import pickle
    import zipfile

    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    data = path.read_bytes()
    if data.startswith(_CHECKPOINT_MAGIC):
        if len(data) < _HEADER_SIZE:
            raise CheckpointError(f"checkpoint {path} is truncated: {len(data)} bytes, header cut")
        start = len(_CHECKPOINT_MAGIC)
        digest, length = (
            data[start : start + 32],
            int.from_bytes(data[start + 32 : start + 40], "little"),
        )
        payload = memoryview(data)[_HEADER_SIZE:]
        if len(payload) != length:
            raise CheckpointError(
                f"checkpoint {path} is truncated: {len(payload)} of {length} payload bytes present"
            )
        if hashlib.sha256(payload).digest() != digest:
            raise CheckpointError(f"checkpoint {path} is corrupt: its SHA-256 does not match")
        source: Any = io.BytesIO(payload)
    elif len(data) == 0:
        raise CheckpointError(f"checkpoint {path} is empty")
    else:
        source = io.BytesIO(data)
    try:
        state = torch.load(source, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointError(
            f"checkpoint {path} ({len(data)} bytes) is truncated or corrupt and cannot be "
            f"loaded: {type(exc).__name__}: {first_line}"
        ) from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a dict")
    return state


# -- configs ---------------------------------------------------------------------------------


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
    """Build ``config_cls`` from a dict, ignoring keys it does not have (older checkpoints)."""
    names = {field.name for field in dataclasses.fields(config_cls)}
    return config_cls(**{key: value for key, value in values.items() if key in names})


# -- logging ---------------------------------------------------------------------------------


class RunLogger:
    """Metrics to TensorBoard, a ``metrics.csv`` and a live progress bar; a PNG curve at the end.

    Every :meth:`log` call writes one CSV row (a ``step`` and ``time`` column plus the metrics;
    a new metric key rewrites the header) and one scalar per metric to TensorBoard. The tqdm bar
    shows steps, steps/s, the recent episodic return and the ETA.

    Args:
        run_dir: directory for ``metrics.csv``, ``tb/`` and ``learning_curve.png``; ``None``
            keeps metrics in memory only (:attr:`history`) and writes no files.
        total_steps: the step budget, for the bar and the ETA.
        use_tensorboard: write TensorBoard event files under ``run_dir/tb``.
        progress: show a tqdm progress bar (on stderr).
        resume_step: when resuming, keep only the CSV rows up to this step (rows a crashed run
            wrote after its last checkpoint are dropped, and TensorBoard purges them too).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as run_dir:
        ...     logger = RunLogger(run_dir, 100, use_tensorboard=False, progress=False)
        ...     logger.log(50, {"charts/episodic_return": 10.0})
        ...     _ = logger.close()
        ...     sorted(p.name for p in Path(run_dir).iterdir())
        ['learning_curve.png', 'metrics.csv']
    """

    RETURN_KEY = "charts/episodic_return"

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None,
        total_steps: int,
        use_tensorboard: bool = True,
        progress: bool = True,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.total_steps = int(total_steps)
        self.csv_path: Path | None = None
        self.curve_path: Path | None = None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.csv_path = self.run_dir / "metrics.csv"
            self.curve_path = self.run_dir / "learning_curve.png"
        self._rows: list[dict[str, Any]] = []
        self._keys: list[str] = ["step", "time"]
        self._time_offset = 0.0
        self._start_step = 0
        if resume_step is not None and self.csv_path is not None and self.csv_path.exists():
            self._load_rows(resume_step)
        self._recent_returns: deque[float] = deque(maxlen=20)
        self._last_step = self._start_step
        self._closed = False
        self._csv_file = None
        self._csv_writer: csv.DictWriter | None = None
        self._rewrite_csv()
        self._writer = None
        if use_tensorboard and self.run_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step)
        # wall-clock starts after the slow TensorBoard import
        self._start_time = time.perf_counter()
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.total_steps,
                initial=min(self._start_step, self.total_steps),
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                smoothing=0.05,
            )

    def _load_rows(self, resume_step: int) -> None:
        with open(self.csv_path, newline="") as file:
            reader = csv.DictReader(file)
            for name in reader.fieldnames or []:
                if name not in self._keys:
                    self._keys.append(name)
            for row in reader:
                try:
                    step = int(float(row["step"]))
                except (KeyError, TypeError, ValueError):
                    continue
                if step > resume_step:
                    continue
                self._rows.append({k: v for k, v in row.items() if v not in ("", None)})
                self._time_offset = float(row.get("time") or self._time_offset)
                self._start_step = step

    def _rewrite_csv(self) -> None:
        if self.csv_path is None:
            return
        if self._csv_file is not None:
            self._csv_file.close()
        self._csv_file = open(self.csv_path, "w", newline="")
        self._csv_writer = csv.DictWriter(self._csv_file, fieldnames=self._keys)
        self._csv_writer.writeheader()
        self._csv_writer.writerows(self._rows)
        self._csv_file.flush()

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every row logged so far (and kept from before a resume), oldest first."""
        return self._rows

    @property
    def elapsed(self) -> float:
        """Seconds of training so far, including the time before a resume."""
        return self._time_offset + time.perf_counter() - self._start_time

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at environment step ``step``.

        Args:
            step: the global environment-step count.
            metrics: metric name to number (``charts/...``, ``losses/...``); ``None`` values
                and NaNs are skipped.
        """
        clean = {}
        for key, value in metrics.items():
            if value is None:
                continue
            value = float(value)
            if math.isnan(value):
                continue
            clean[key] = value
        row: dict[str, Any] = {"step": int(step), "time": round(self.elapsed, 3), **clean}
        self._rows.append(row)
        if any(key not in self._keys for key in clean):
            self._keys.extend(key for key in clean if key not in self._keys)
            self._rewrite_csv()
        elif self._csv_writer is not None and self._csv_file is not None:
            self._csv_writer.writerow(row)
            self._csv_file.flush()
        if self._writer is not None:
            for key, value in clean.items():
                self._writer.add_scalar(key, value, int(step))
        if self.RETURN_KEY in clean:
            self._recent_returns.append(clean[self.RETURN_KEY])
        if self._bar is not None:
            self._bar.update(max(0, min(int(step), self.total_steps) - self._bar.n))
            postfix = {}
            if "charts/SPS" in clean:
                postfix["SPS"] = f"{clean['charts/SPS']:.0f}"
            if self._recent_returns:
                postfix["return"] = f"{np.mean(self._recent_returns):.1f}"
            self._bar.set_postfix(postfix, refresh=False)
        self._last_step = int(step)

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message)

    def close(self) -> Path | None:
        """Flush everything, close the bar, and draw ``learning_curve.png`` from the CSV.

        Returns:
            The path of the PNG, or ``None`` if no episodic return was logged.
        """
        if self._closed:
            return self.curve_path if self.curve_path and self.curve_path.exists() else None
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        if self._csv_file is not None:
            self._csv_file.close()
        if self.csv_path is None or self.curve_path is None:
            return None
        return plot_learning_curve(self.csv_path, self.curve_path)

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def plot_learning_curve(
    csv_path: str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    key: str = RunLogger.RETURN_KEY,
    title: str | None = None,
) -> Path | None:
    """Draw ``key`` against environment steps and against wall-clock time from a metrics CSV.

    Returns:
        ``png_path``, or ``None`` (and no file) if the CSV holds no value for ``key``.
    """
    steps, times, values = [], [], []
    with open(csv_path, newline="") as file:
        for row in csv.DictReader(file):
            if row.get(key) not in (None, ""):
                steps.append(float(row["step"]))
                times.append(float(row.get("time") or 0.0))
                values.append(float(row[key]))
    if not values:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smooth = _moving_average(values, max(1, len(values) // 50))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    for axis, xs, label in ((axes[0], steps, "environment steps"), (axes[1], times, "seconds")):
        axis.plot(xs, values, alpha=0.3, linewidth=0.8, color="tab:blue")
        axis.plot(xs, smooth, linewidth=1.6, color="tab:blue")
        axis.set_xlabel(label)
        axis.set_ylabel(key.split("/")[-1].replace("_", " "))
        axis.grid(alpha=0.3)
    fig.suptitle(title or Path(csv_path).parent.name)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return Path(png_path)


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total, queue = [], 0.0, deque()
    for value in values:
        queue.append(value)
        total += value
        if len(queue) > window:
            total -= queue.popleft()
        out.append(total / len(queue))
    return out


# -- environments ----------------------------------------------------------------------------


def is_atari_id(env_id: str) -> bool:
    """Whether ``env_id`` names an ALE game (``ALE/Pong-v5``, ``PongNoFrameskip-v4``...).

    Example:
        >>> is_atari_id("PongNoFrameskip-v4"), is_atari_id("CartPole-v1")
        (True, False)
    """
    if env_id.startswith("ALE/"):
        return True
    try:
        from vecaccel.manager import register_envs

        register_envs()
        spec = gym.spec(env_id)
    except Exception:
        return False
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    return entry.startswith("ale_py") or "AtariEnv" in entry


class EpisodicLifeEnv(gym.Wrapper):
    """End the episode (``terminated=True``) when a life is lost, without resetting the game.

    Gymnasium's ``AtariPreprocessing(terminal_on_life_loss=True)`` restarts the whole game at
    the next ``reset`` after a life is lost, so the agent would never play past its first life.
    DeepMind's (and SB3's) ``EpisodicLifeEnv`` instead only *signals* the end for value
    bootstrapping and continues the same game with a no-op step. Gymnasium does not ship that
    wrapper, so this is the one piece of Atari set-up vecaccel adds; use it for training only.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(seed=seed, options=options)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class AtariEnvFactory:
    """A picklable env function building the standard Atari set-up from Gymnasium's wrappers.

    ``RecordEpisodeStatistics`` (innermost, so ``info["episode"]`` holds real, unclipped game
    scores) → ``AtariPreprocessing`` (no-op reset, frame skip 4 with max-pooling, 84x84 gray)
    → in training: :class:`EpisodicLifeEnv` and ``ClipReward(-1, 1)`` → ``FrameStackObservation(4)``.

    Args:
        env_id: an ALE id; ``ALE/*-v5`` ids are made with ``frameskip=1`` because
            ``AtariPreprocessing`` does the skipping (their sticky actions stay on).
        training: add the training-only wrappers (life-loss terminal, reward clipping).
        frame_stack: frames stacked along the first axis.
        render_mode: passed to ``gymnasium.make`` (``"rgb_array"`` for videos).
    """

    def __init__(
        self,
        env_id: str,
        training: bool = True,
        frame_stack: int = 4,
        render_mode: str | None = None,
    ) -> None:
        self.env_id = env_id
        self.training = training
        self.frame_stack = frame_stack
        self.render_mode = render_mode

    def __call__(self) -> gym.Env:
        from vecaccel.manager import register_envs

        register_envs()
        kwargs: dict[str, Any] = {}
        if self.render_mode is not None:
            kwargs["render_mode"] = self.render_mode
        if gym.spec(self.env_id).kwargs.get("frameskip", 1) != 1:
            kwargs["frameskip"] = 1
        env = gym.make(self.env_id, **kwargs)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True
        )
        if self.training:
            env = EpisodicLifeEnv(env)
            env = gym.wrappers.ClipReward(env, -1.0, 1.0)
        env = gym.wrappers.FrameStackObservation(env, self.frame_stack)
        return env

    def __repr__(self) -> str:
        return f"AtariEnvFactory({self.env_id!r}, training={self.training})"


class ClassicEnvFactory:
    """A picklable env function: ``gymnasium.make(env_id)`` with ``RecordEpisodeStatistics``."""

    def __init__(self, env_id: str, render_mode: str | None = None, **kwargs: Any) -> None:
        self.env_id = env_id
        self.render_mode = render_mode
        self.kwargs = kwargs

    def __call__(self) -> gym.Env:
        from vecaccel.manager import register_envs

        register_envs()
        kwargs = dict(self.kwargs)
        if self.render_mode is not None:
            kwargs["render_mode"] = self.render_mode
        return gym.wrappers.RecordEpisodeStatistics(gym.make(self.env_id, **kwargs))

    def __repr__(self) -> str:
        return f"ClassicEnvFactory({self.env_id!r})"


def make_env_fn(
    env_id: str, atari: bool | None = None, training: bool = True, render_mode: str | None = None
) -> Callable[[], gym.Env]:
    """The picklable single-env function :func:`make_env_for_training` vectorizes."""
    if atari is None:
        atari = is_atari_id(env_id)
    if atari:
        return AtariEnvFactory(env_id, training=training, render_mode=render_mode)
    return ClassicEnvFactory(env_id, render_mode=render_mode)


def make_env_for_training(
    env_id: str,
    num_envs: int,
    backend: str = "shm",
    seed: int | None = None,
    atari: bool | None = None,
    autoreset_mode: str = "SameStep",
    training: bool = True,
    **backend_options: Any,
) -> gym.vector.VectorEnv:
    """Build the vectorized env a trainer samples from.

    Every env records episode statistics (``info["episode"]``, real scores for Atari); Atari
    envs get the standard set-up of :class:`AtariEnvFactory`.

    Args:
        env_id: a Gymnasium id.
        num_envs: number of sub-environments.
        backend: a registered vecaccel backend.
        seed: seeds the batched action space; the sampler's first ``reset(seed=...)`` seeds the
            envs themselves.
        atari: force the Atari set-up on or off (``None``: detect from ``env_id``).
        autoreset_mode: Gymnasium autoreset mode; trainers use ``SameStep`` so that no step is
            wasted on a reset and ``info["final_obs"]`` gives the truncation bootstrap.
        training: include the training-only Atari wrappers (life-loss terminal, clipped reward).
        **backend_options: passed to the backend (``num_workers``, ``context``, ...).

    Returns:
        A ``gymnasium.vector.VectorEnv``.
    """
    import vecaccel

    env_fn = make_env_fn(env_id, atari, training)
    envs = vecaccel.make_vec(
        [env_fn] * num_envs, backend=backend, autoreset_mode=autoreset_mode, **backend_options
    )
    if seed is not None:
        envs.action_space.seed(seed)
    return envs


def mean_or_none(values: Iterable[float]) -> float | None:
    """Mean of ``values``, or ``None`` when there are none."""
    values = list(values)
    return float(np.mean(values)) if values else None


# -- returns and advantages ------------------------------------------------------------------


def compute_gae(
    rewards: Any,
    values: Any,
    next_value: Any,
    terminated: Any,
    truncated: Any,
    final_values: Any,
    final_index: Any,
    gamma: float,
    gae_lambda: float,
) -> tuple[Any, Any]:
    """Generalized advantage estimation over a time-major batch, bootstrapping truncations.

    ``V(s_{t+1})`` is the value of the next row's observation (``next_value`` after the last
    row), except at truncated steps, where it is the value of the episode's true final
    observation (``final_values`` at ``final_index``); at terminated steps it is 0. The
    recursion stops at every episode end, terminated or truncated.

    Args:
        rewards: ``[T, B]``.
        values: ``[T, B]`` ``V(obs_t)``.
        next_value: ``[B]`` value of the batch's ``next_obs``.
        terminated: ``[T, B]`` bool.
        truncated: ``[T, B]`` bool.
        final_values: ``[K]`` values of ``batch.final_obs``.
        final_index: ``[K, 2]`` ``(t, b)`` of each final observation.
        gamma: discount.
        gae_lambda: GAE's lambda (1 gives n-step returns, as A2C uses).

    Returns:
        ``(advantages, returns)``, each ``[T, B]`` float32, ``returns = advantages + values``.
    """
    import torch

    rewards = rewards.float()
    values = values.float()
    next_values = torch.cat([values[1:], next_value.float().reshape(1, -1)], dim=0)
    if len(final_index):
        next_values[final_index[:, 0], final_index[:, 1]] = final_values.float()
    if rewards.device.type == "cpu":
        # the recursion is T row operations on B numbers: NumPy does each in about a
        # microsecond, torch pays its per-op dispatch (several microseconds) T * 3 times
        advantages = torch.from_numpy(
            _gae_numpy(
                rewards.numpy(),
                values.numpy(),
                next_values.numpy(),
                terminated.numpy(),
                (terminated | truncated).numpy(),
                gamma,
                gae_lambda,
            )
        )
        return advantages, advantages + values
    not_terminal = (~terminated).float()
    not_done = (~(terminated | truncated)).float()
    deltas = rewards + gamma * next_values * not_terminal - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * not_done[t] * last
        advantages[t] = last
    return advantages, advantages + values


def _gae_numpy(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    done: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> np.ndarray:
    """:func:`compute_gae`'s recursion in float32 NumPy, the same operations in the same order."""
    float32 = np.float32
    not_terminal = (~terminated).astype(float32)
    decay = (~done).astype(float32) * float32(gamma * gae_lambda)
    deltas = rewards + float32(gamma) * next_values * not_terminal - values
    advantages = np.empty_like(deltas)
    last = np.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        last = deltas[t] + decay[t] * last
        advantages[t] = last
    return advantages


def explained_variance(predictions: Any, targets: Any) -> float:
    """``1 - Var(targets - predictions) / Var(targets)`` (NaN when the targets are constant)."""
    variance = float(targets.var())
    if variance == 0:
        return float("nan")
    return 1.0 - float((targets - predictions).var()) / variance


# -- spaces in checkpoints -------------------------------------------------------------------


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """Describe a Box or Discrete space with plain data (for ``weights_only`` checkpoints)."""
    import torch

    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": torch.from_numpy(np.array(space.low)),
            "high": torch.from_numpy(np.array(space.high)),
            "dtype": np.dtype(space.dtype).name,
        }
    raise TypeError(f"cannot store a {type(space).__name__} space in a checkpoint")


def space_from_dict(data: dict[str, Any]) -> gym.Space:
    """Inverse of :func:`space_to_dict`."""
    if data["type"] == "Discrete":
        return gym.spaces.Discrete(data["n"], start=data.get("start", 0))
    low, high = data["low"].numpy(), data["high"].numpy()
    return gym.spaces.Box(low=low, high=high, shape=low.shape, dtype=np.dtype(data["dtype"]))


# -- preemption --------------------------------------------------------------------------------


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGINT or SIGTERM after writing a checkpoint (when it has a run dir).

    A ``KeyboardInterrupt``, so code that already handles Ctrl-C handles it too.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
        step: the global env step the checkpoint holds.
    """

    def __init__(self, signal_name: str, step: int) -> None:
        super().__init__(f"training interrupted by {signal_name} at step {step}")
        self.signal_name = signal_name
        self.step = int(step)

    @property
    def exit_code(self) -> int:
        """The shell's exit code for this signal: 128 + its number (130, 143)."""
        import signal

        return 128 + int(getattr(signal, self.signal_name, signal.SIGINT))


class SignalCheckpoint:
    """Within ``with``, SIGINT and SIGTERM set :attr:`requested` instead of killing the process.

    The training loop polls :attr:`requested` after each update, writes a checkpoint (atomically)
    and raises :class:`TrainingInterrupted`, so a preempted job resumes with ``--resume``. A
    second signal while the first is being handled raises ``KeyboardInterrupt`` at once (the
    previous checkpoint file stays intact: writes are atomic). Outside the main thread nothing
    is installed. The previous handlers are restored on exit.

    Example:
        >>> with SignalCheckpoint() as guard:
        ...     guard.requested
        False
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if self.requested:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping now")
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> SignalCheckpoint:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                try:
                    self._previous[signum] = signal.signal(signum, self._handle)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc_info: Any) -> None:
        import signal

        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()


# -- the on-policy runner ----------------------------------------------------------------------


CHECKPOINT_NAME = "checkpoint.pt"


class OnPolicyAlgorithm(abc.ABC):
    """Runner plumbing shared by A2C and PPO: env, sampler, logging, checkpoints, save/load/predict.

    The algorithm files keep what differs in view: the config dataclass, the optimizer and
    ``update(batch, progress_remaining)``, the loss. ``learn`` here is the loop both run:
    collect a batch, anneal the learning rate, update, log, checkpoint.

    Resume. Env state cannot be saved across processes, so a resumable run makes its own
    deterministic restart points: at every checkpoint (``checkpoint_every`` updates) it resets
    every env with a seed derived from ``(seed, update)``, dropping running episodes (their
    transitions were already trained on, bootstrapped as usual at the batch end), and saves the
    model, optimizer, counters and the torch/NumPy/Python RNG states. A resumed run loads all of
    that and resets its envs with the same derived seed, so on CPU (same thread count) it
    produces bit-identical parameters to the run that was never interrupted.

    Args:
        env: a Gymnasium id (built with :func:`make_env_for_training`), a ready vector env, or
            ``None`` (only to ``predict``; ``learn`` then builds ``config.env_id``).
        run_dir: where ``metrics.csv``, TensorBoard files, ``learning_curve.png`` and
            ``checkpoint.pt`` go; ``None`` writes nothing.
        progress: show a progress bar during ``learn``.
        tensorboard: write TensorBoard event files (needs ``run_dir``).
        observation_space: the single-env observation space when ``env`` is ``None`` (else
            one env of ``config.env_id`` is made to read it).
        action_space: likewise, the single-env action space.
        **config: fields of the algorithm's config dataclass.
    """

    algo_name: str = ""
    config_cls: type = object

    def __init__(
        self,
        env: str | gym.vector.VectorEnv | None = None,
        *,
        run_dir: str | os.PathLike[str] | None = None,
        progress: bool = False,
        tensorboard: bool = True,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        **config: Any,
    ) -> None:
        import torch

        from vecaccel.trainers.models import ActorCritic, check_observation_space

        if isinstance(env, str):
            config["env_id"] = env
        try:
            self.config = self.config_cls(**config)
        except TypeError as exc:
            names = ", ".join(field.name for field in dataclasses.fields(self.config_cls))
            raise TypeError(f"{exc}; {self.config_cls.__name__} fields are: {names}") from None
        cfg = self.config
        # under torchrun: join the process group; each rank gets its own seed (envs, sampling)
        from vecaccel.trainers import distributed

        if distributed.init_from_env(cfg.device):
            cfg.device = distributed.local_device(cfg.device)
            cfg.seed = distributed.rank_seed(cfg.seed)
        self.world_size = distributed.world_size()
        self.is_main = distributed.is_main_process()
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.progress = progress
        self.tensorboard = tensorboard
        configure_torch_threads(
            cfg.torch_threads, cfg.backend, cfg.num_envs, getattr(cfg, "num_workers", 0)
        )
        seed_everything(cfg.seed)
        self.device = torch.device(cfg.device)
        self.env: Any = None
        self.sampler: Any = None
        self.owns_env = False
        self.global_step = 0
        self.update_index = 0
        self.target_steps: int | None = None
        self.schedule_start_update = 0
        self.schedule_updates = 1
        self.elapsed_before = 0.0
        # trained by the async runner (a rollout process beside this one); saved in
        # checkpoints, so that `vecaccel train --resume` goes on the same way, with the same
        # options (weight_sync_period, fixed_lag)
        self.async_run = False
        self.async_options: dict[str, Any] = {}
        self.logger: RunLogger | None = None
        self.last_episodes: Any = None
        if env is not None:
            self._attach_env(env)
            observation_space = self.env.single_observation_space
            action_space = self.env.single_action_space
        elif observation_space is None or action_space is None:
            observation_space, action_space = self._spaces_from_env_id(cfg.env_id)
        self.observation_space = observation_space
        self.action_space = action_space
        # a space the model refuses (or any failure setting up) must not leave the envs it
        # built running
        try:
            check_observation_space(observation_space)
            bf16 = cfg.bf16 == "on" or (
                cfg.bf16 == "auto" and _bf16_helps(cfg.device) and len(observation_space.shape) == 3
            )
            self.model = ActorCritic(
                observation_space,
                action_space,
                network=cfg.network,
                hidden_sizes=tuple(cfg.hidden_sizes),
                activation=cfg.activation,
                channels_last=cfg.channels_last,
                bf16=bf16,
            ).to(self.device)
            # the effective batch of an update is the sum of every rank's batch
            self.local_batch_size = cfg.num_envs * cfg.num_steps
            self.batch_size = self.local_batch_size * self.world_size
            self.lr_scale = lr_scale(
                self.batch_size, cfg.base_batch_size or self.batch_size, cfg.lr_scaling
            )
            self.learning_rate = cfg.learning_rate * self.lr_scale
            self.optimizer = self.make_optimizer(self.learning_rate)
            #: the model's parameters as a list, for gradient clipping without a generator per step
            self.model_parameters = list(self.model.parameters())
            # eval() and train() walk every submodule twice per update; skip them for a model
            # whose layers all act the same in both modes
            self._switch_modes = _has_mode_dependent_layers(self.model)
            # the losses go through DistributedDataParallel when there are several ranks
            self.train_model = distributed.wrap_model(self.model, self.device)
            self.signal_checkpoint = True
            if self.env is not None:
                self._make_sampler()
        except BaseException:
            self.close()
            raise

    # -- what each algorithm provides -----------------------------------------------------------

    @abc.abstractmethod
    def make_optimizer(self, learning_rate: float) -> Any:
        """Return the optimizer over ``self.model.parameters()``."""

    @abc.abstractmethod
    def update(self, batch: Any, progress_remaining: float) -> dict[str, float]:
        """One update from a sampler batch; returns ``losses/...`` metrics."""

    def _flat_optimizer_fits(self) -> bool:
        """Whether to keep the parameters in one flat buffer (``trainers/optim.py``): for models
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

    def backward_step(self, loss: Any, max_grad_norm: float) -> None:
        """Zero the gradients, backpropagate ``loss``, clip to ``max_grad_norm``, step.

        Raises:
            FloatingPointError: the gradient is not finite (a NaN or infinite loss), before the
                step would make every parameter NaN.
        """
        import torch

        from vecaccel.trainers.optim import FlatOptimizer

        optimizer = self.optimizer
        if isinstance(optimizer, FlatOptimizer):
            optimizer.zero_grad()
            loss.backward()
            norm = optimizer.clip_grad_norm_(max_grad_norm)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(
                self.model_parameters, max_grad_norm, foreach=True
            )
        # One sync per step, on the norm clipping computed anyway: a NaN or infinite loss makes
        # it non-finite, and Adam/RMSprop would then turn every parameter NaN and training would
        # go on silently. The norm is of the all-reduced gradients, so on several ranks every
        # rank decides alike.
        if not bool(torch.isfinite(norm)):
            raise FloatingPointError(
                f"{self.algo_name.upper()} update {self.update_index} (global step "
                f"{self.global_step}): non-finite loss {float(loss.detach()):g} (gradient norm "
                f"{float(norm):g}); this optimizer step was not taken. A NaN or infinite "
                "reward or observation from the env is the usual cause."
            )
        optimizer.step()

    # -- env and sampler ------------------------------------------------------------------------

    def _spaces_from_env_id(self, env_id: str) -> tuple[gym.Space, gym.Space]:
        env = make_env_fn(env_id, self.config.atari)()
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()

    def _attach_env(self, env: str | gym.vector.VectorEnv) -> None:
        cfg = self.config
        if isinstance(env, str):
            options: dict[str, Any] = {}
            if cfg.num_workers > 0 and cfg.backend != "serial":  # serial has no workers
                options["num_workers"] = cfg.num_workers
            if cfg.backend == "action_server":
                options.update(device=cfg.device, alternating=cfg.alternating)
            elif cfg.alternating:
                raise ValueError("alternating=True needs backend='action_server'")
            env = make_env_for_training(
                cfg.env_id,
                cfg.num_envs,
                backend=cfg.backend,
                seed=cfg.seed,
                atari=cfg.atari,
                autoreset_mode=cfg.autoreset_mode,
                **options,
            )
            self.owns_env = True
            self._episode_stats = "infos"
        else:
            if env.num_envs != cfg.num_envs:
                cfg.num_envs = int(env.num_envs)
            self._episode_stats = "auto"
        self.env = env

    @property
    def _action_start(self) -> int:
        return action_start(self.action_space)

    def _model_actions(self, batch: Any) -> Any:
        """``batch`` with the model's actions: it holds the env's, which a ``Discrete(n, start)``
        space numbers from ``start``, while the losses index the model's outputs from 0."""
        start = self._action_start
        return batch._replace(actions=batch.actions - start) if start else batch

    def _make_sampler(self) -> None:
        import vecaccel

        start = self._action_start
        self.sampler = vecaccel.Sampler(
            self.env,
            self.model if start == 0 else _ShiftedDiscretePolicy(self.model, start),
            horizon=self.config.num_steps,
            device=self.device,
            seed=self.config.seed,
            episode_stats=self._episode_stats,
        )

    def _reseed_envs(self) -> None:
        self.sampler.reset(seed=split_seed(self.config.seed, self.update_index))

    # -- training loop ---------------------------------------------------------------------------

    def set_target_steps(self, total_steps: int) -> None:
        """Make ``total_steps`` the run's total (a resumed run's new budget).

        The learning-rate schedule stretches to the new total; an unchanged total keeps the
        resumed run bit-identical to an uninterrupted one.
        """
        if total_steps == self.target_steps:
            return
        start_step = self.schedule_start_update * self.batch_size
        self.target_steps = int(total_steps)
        self.schedule_updates = max(
            1, math.ceil((self.target_steps - start_step) / self.batch_size)
        )

    def learn(
        self,
        total_steps: int | None = None,
        callback: Callable[[OnPolicyAlgorithm, dict[str, Any]], bool | None] | None = None,
    ) -> OnPolicyAlgorithm:
        """Train for ``total_steps`` more env steps (``None``: finish a resumed run's budget).

        Args:
            total_steps: environment steps to add; the learning rate anneals over them.
            callback: called after every update with the agent and that update's metrics
                (the episodes that ended in it are in ``agent.last_episodes``); returning
                ``False`` stops training.

        Returns:
            ``self``.
        """
        cfg = self.config
        self.set_budget(total_steps)
        self.async_run, self.async_options = False, {}
        if self.env is None:
            self._attach_env(cfg.env_id)
            self._make_sampler()
            if self.update_index > 0:
                self._reseed_envs()
        assert self.target_steps is not None
        from vecaccel.trainers import distributed

        main = self.is_main
        run_dir = self.run_dir if main else None  # rank 0 alone logs and checkpoints
        logger = RunLogger(
            run_dir,
            self.target_steps,
            use_tensorboard=self.tensorboard and main,
            progress=self.progress and main,
            resume_step=self.global_step if self.global_step > 0 else None,
        )
        self.logger = logger
        start_step, start_time = self.global_step, time.perf_counter()
        guard = SignalCheckpoint()
        try:
            with guard:
                while self.global_step < self.target_steps:
                    done_updates = self.update_index - self.schedule_start_update
                    progress_remaining = max(0.0, 1.0 - done_updates / self.schedule_updates)
                    lr_now = self.learning_rate * (progress_remaining if cfg.anneal_lr else 1.0)
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr_now

                    if self._switch_modes:
                        self.model.eval()
                    batch = self.sampler.collect()
                    if self._switch_modes:
                        self.model.train()
                    batch = self._model_actions(batch)
                    self.global_step += self.batch_size
                    metrics = self.update(batch, progress_remaining)
                    self.update_index += 1

                    episodes = self.sampler.pop_episodes()
                    self.last_episodes = episodes
                    elapsed = time.perf_counter() - start_time
                    metrics.update(
                        {
                            "charts/episodic_return": mean_or_none(episodes.returns),
                            "charts/episodic_length": mean_or_none(episodes.lengths),
                            "charts/SPS": (self.global_step - start_step) / max(elapsed, 1e-9),
                            "charts/learning_rate": lr_now,
                            "charts/lr_scale": self.lr_scale,
                            "charts/updates": self.update_index,
                        }
                    )
                    stop = guard.requested
                    if self.world_size > 1:
                        # every rank reduces every update (a collective cannot be skipped)
                        count = float(len(episodes.returns))
                        metrics["charts/episodes"] = count
                        metrics["_stop"] = 1.0 if stop else 0.0
                        metrics = distributed.reduce_metrics(
                            metrics,
                            weights={
                                "charts/episodic_return": count,
                                "charts/episodic_length": count,
                            },
                            sums=("charts/episodes", "_stop"),
                            device=self.device,
                        )
                        stop = bool(metrics.pop("_stop") or 0.0)
                        metrics["charts/world_size"] = float(self.world_size)
                    if (
                        self.update_index % max(1, cfg.log_every) == 0
                        or metrics.get("charts/episodic_return") is not None
                        or self.global_step >= self.target_steps
                    ):
                        logger.log(self.global_step, metrics)
                    if stop:
                        path = self._checkpoint(run_dir)
                        if run_dir is not None:
                            logger.write(
                                f"{guard.signal_name}: checkpoint saved to {path} at step "
                                f"{self.global_step}; continue with --resume {run_dir}"
                            )
                        raise TrainingInterrupted(guard.signal_name, self.global_step)
                    if callback is not None and callback(self, metrics) is False:
                        break
                    if (
                        self.run_dir is not None
                        and cfg.checkpoint_every > 0
                        and self.update_index % cfg.checkpoint_every == 0
                        and self.global_step < self.target_steps
                    ):
                        if cfg.reset_envs_at_checkpoint:
                            self._reseed_envs()
                        self._checkpoint(run_dir)
                self._checkpoint(run_dir)
        finally:
            self.elapsed_before = logger.elapsed
            curve = logger.close()
            if run_dir is not None and self.progress:
                logger.write(
                    f"run directory: {run_dir}  checkpoint: {run_dir / CHECKPOINT_NAME}"
                    + (f"  learning curve: {curve}" if curve else "")
                )
        return self

    def set_budget(self, total_steps: int | None) -> None:
        """Train ``total_steps`` more env steps from here, the learning rate annealing over them;
        ``None`` keeps the budget and schedule of the run this agent was loaded from.

        Raises:
            ValueError: ``total_steps`` is ``None`` and there is no unfinished run to continue.
        """
        if total_steps is None:
            if self.target_steps is None or self.global_step >= self.target_steps:
                raise ValueError("learn() needs total_steps unless it continues a resumed run")
            return
        self.target_steps = self.global_step + int(total_steps)
        self.schedule_start_update = self.update_index
        self.schedule_updates = max(1, math.ceil(int(total_steps) / self.batch_size))

    # -- save, load, predict ---------------------------------------------------------------------

    def state_dict(self, rank_rng: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Everything a checkpoint holds (plain data; ``weights_only`` loadable).

        Args:
            rank_rng: every rank's RNG states (see :meth:`_checkpoint`), kept beside rank 0's.
        """
        extra = {} if rank_rng is None else {"rank_rng": rank_rng}
        return {
            "format": "vecaccel-trainer",
            "version": 1,
            "algo": self.algo_name,
            "config": _plain(dataclasses.asdict(self.config)),
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step,
            "update_index": self.update_index,
            "target_steps": self.target_steps,
            "schedule_start_update": self.schedule_start_update,
            "schedule_updates": self.schedule_updates,
            "elapsed": self.logger.elapsed if self.logger is not None else self.elapsed_before,
            "rng": get_rng_state(),
            "async": bool(self.async_run),
            "async_options": dict(self.async_options),
            **extra,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save a checkpoint (atomically) that :meth:`load` restores and training resumes from."""
        return save_checkpoint(path, self.state_dict())

    def _checkpoint(self, run_dir: Path | None) -> Path | None:
        """Write ``run_dir/checkpoint.pt`` (rank 0; ``run_dir`` is ``None`` on the others).

        On several ranks every rank must call this at the same point: the ranks' RNG states are
        gathered into the checkpoint, so that a run resumed on as many ranks continues each
        rank's streams exactly.
        """
        if self.run_dir is None:  # no rank writes checkpoints: nothing to gather either
            return None
        rank_rng = None
        if self.world_size > 1:
            from vecaccel.trainers import distributed

            rank_rng = distributed.all_gather_object(get_rng_state())
        if run_dir is None:
            return None
        return save_checkpoint(run_dir / CHECKPOINT_NAME, self.state_dict(rank_rng))

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        env: str | gym.vector.VectorEnv | None = None,
        *,
        run_dir: str | os.PathLike[str] | None = None,
        restore_rng: bool = True,
        **overrides: Any,
    ) -> OnPolicyAlgorithm:
        """Load a checkpoint written by :meth:`save` (a file, or a run directory).

        Args:
            path: the checkpoint file or the run directory holding ``checkpoint.pt``.
            env: an env to continue training on (``None``: built from the config on ``learn``).
            run_dir: where a continued run logs and checkpoints.
            restore_rng: restore the RNG states saved with the checkpoint (for exact resume).
            **overrides: config fields to change (e.g. ``device``, ``backend``, ``num_workers``).

        Returns:
            The restored trainer.

        Raises:
            CheckpointError: if the file is corrupt or holds another algorithm.
        """
        path = Path(path)
        if path.is_dir():
            path = path / CHECKPOINT_NAME
        state = load_checkpoint(path, map_location=overrides.get("device", "cpu"))
        if state.get("algo") != cls.algo_name:
            raise CheckpointError(
                f"{path} holds a {state.get('algo')!r} checkpoint, not {cls.algo_name!r}"
            )
        config = {**state["config"], **overrides}
        if "device" not in overrides and "device" in config:
            config["device"] = usable_device(config["device"])
        config = {
            k: v
            for k, v in config.items()
            if k in {f.name for f in dataclasses.fields(cls.config_cls)}
        }
        agent = cls.__new__(cls)
        agent._restore(state, config, env, run_dir, restore_rng)
        return agent

    def _restore(
        self,
        state: dict[str, Any],
        config: dict[str, Any],
        env: Any,
        run_dir: Any,
        restore_rng: bool,
    ) -> None:
        observation_space = space_from_dict(state["observation_space"])
        action_space = space_from_dict(state["action_space"])
        # build without an env, then attach it once the counters say where the run stands
        OnPolicyAlgorithm.__init__(
            self,
            None,
            run_dir=run_dir,
            observation_space=observation_space,
            action_space=action_space,
            **config,
        )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_step = int(state["global_step"])
        self.update_index = int(state["update_index"])
        self.target_steps = state["target_steps"]
        self.schedule_start_update = int(state["schedule_start_update"])
        self.schedule_updates = int(state["schedule_updates"])
        self.elapsed_before = float(state.get("elapsed", 0.0))
        self.async_run = bool(state.get("async", False))
        self.async_options = dict(state.get("async_options", {}))
        if restore_rng:  # each rank's states, or rank 0's and the others re-seed (see there)
            restore_rank_rng_state(
                state["rng"], self.config.seed, self.global_step, rank_states=state.get("rank_rng")
            )
        if env is not None:
            if isinstance(env, str):
                self.config.env_id = env  # the id given, not the one recorded
            self._attach_env(env)
            try:
                check_env_matches(
                    self.config.env_id,
                    self.env.single_observation_space,
                    self.env.single_action_space,
                    observation_space,
                    action_space,
                )
            except ValueError:
                if self.owns_env:
                    self.env.close()
                raise
            self._make_sampler()
            if self.update_index > 0:
                self._reseed_envs()

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, None]:
        """Actions for one observation or a batch, SB3 style: ``(actions, None)``.

        Args:
            observation: one observation, or a batch with a leading env axis.
            state: unused (no recurrent policies); kept for SB3 compatibility.
            episode_start: unused; kept for SB3 compatibility.
            deterministic: take the most likely action instead of sampling.

        Returns:
            ``(actions, None)`` with actions as a NumPy array.
        """
        import torch

        obs = np.asarray(observation)
        single = obs.shape == tuple(self.observation_space.shape)
        tensor = torch.as_tensor(obs[None] if single else obs, device=self.device)
        self.model.eval()
        actions = self.model.act(tensor, deterministic=deterministic).cpu().numpy()
        if self._action_start:
            actions = actions + self._action_start
        space = self.action_space
        if isinstance(space, gym.spaces.Box):  # as SB3: the env gets actions within bounds
            actions = np.clip(actions, space.low, space.high).astype(actions.dtype, copy=False)
        return (actions[0] if single else actions), None

    def close(self) -> None:
        """Close the env this trainer built."""
        if self.env is not None and self.owns_env:
            self.env.close()
        self.env = None
        self.sampler = None


class _ShiftedDiscretePolicy:
    """The sampler's policy for a ``Discrete(n, start)`` env with ``start != 0``: the model's
    actions ``0..n-1`` moved to the env's ``start..start+n-1``.

    The sampler sends the policy's actions to the env as they are and keeps them in the batch,
    so the shift happens here, and :meth:`OnPolicyAlgorithm.learn` undoes it on the batch
    before the losses index the model's outputs with it.
    """

    def __init__(self, model: Any, start: int) -> None:
        self.model = model
        self.start = int(start)

    def __call__(self, obs: Any) -> tuple[Any, Any]:
        actions, extras = self.model(obs)
        return actions + self.start, extras


def _has_mode_dependent_layers(model: Any) -> bool:
    """Whether a layer of ``model`` may act differently in train and eval mode.

    Only layer types known to ignore ``Module.training`` are exempt, so any other (dropout,
    batch norm, a new layer type) counts as mode-dependent.
    """
    from torch import nn

    from vecaccel.trainers import models

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
        models.ActorCritic,
        models.TwinMLP,
        models.MLP,
        models.NatureCNN,
    )
    return any(type(module) not in mode_free for module in model.modules())


def _bf16_helps(device: str) -> bool:
    from vecaccel.trainers.models import bf16_autocast_helps

    return bf16_autocast_helps(device)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value
