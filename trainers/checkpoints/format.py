"""The checkpoint format: an atomic, checksummed ``torch.save`` file of plain data.

A checkpoint is a dict of tensors, numbers, strings and containers, loadable with
``torch.load(weights_only=True)`` so that loading never runs pickled code. Spaces are stored as
plain dicts (:mod:`~vecaccel.trainers.checkpoints.space_serialization`); what the trainers put in it is
:mod:`~vecaccel.trainers.checkpoints.writer`'s.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save_checkpoint(Path(folder) / CHECKPOINT_NAME, {"global_step": 3})
    ...     load_checkpoint(path)
    {'global_step': 3}
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym

__all__ = [
    "CHECKPOINT_NAME",
    "CheckpointError",
    "apply_runtime_settings",
    "check_env_matches",
    "checkpoint_file",
    "load_checkpoint",
    "save_checkpoint",
    "usable_device",
]

CHECKPOINT_NAME = "checkpoint.pt"


class CheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt, or not a vecaccel checkpoint."""


_CHECKPOINT_MAGIC = b"VECACCEL-CKPT\x01"

_HEADER_SIZE = len(_CHECKPOINT_MAGIC) + 32 + 8


def checkpoint_file(path: str | os.PathLike[str]) -> Path:
    """``path``, or the ``checkpoint.pt`` in it when it is a run directory."""
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


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


def apply_runtime_settings(agent: Any, settings: dict[str, Any]) -> None:
    """Set run-time settings (``progress``, ``tensorboard``) in a loaded agent's config: they
    say how this process shows the run, not what the checkpoint recorded."""
    for key, value in settings.items():
        setattr(agent.config, key, value)
