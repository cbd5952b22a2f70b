"""Replay buffers in checkpoints: an uncompressed ``.npz`` beside ``checkpoint.pt``.

A checkpoint names its replay file and an id that the file holds too, so that a replay file
from another checkpoint (an older run in the same directory) is refused instead of read.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vecaccel.trainers.checkpoints.format import CheckpointError

if TYPE_CHECKING:
    from vecaccel.trainers.replay.buffer import ReplayBuffer

__all__ = ["read_replay", "restore_replay", "write_replay"]

_REPLAY_TOKEN = "__checkpoint_token__"


def write_replay(buffer: ReplayBuffer, checkpoint: Path, token: str) -> Path:
    """Write every array of ``buffer`` to an uncompressed ``.npz`` beside ``checkpoint``, atomically.

    The arrays are streamed into the archive in chunks (no copy of a GB-sized buffer); zip's
    CRC-32 of every member lets :func:`read_replay` detect corruption.
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


def read_replay(buffer: ReplayBuffer, path: Path, token: str, checkpoint: Path) -> None:
    """Read a file written by :func:`write_replay` straight into ``buffer``'s arrays.

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


def restore_replay(buffer: ReplayBuffer, checkpoint: Path, entry: dict[str, Any]) -> None:
    """Fill ``buffer`` from the replay file that ``checkpoint`` names in ``entry``.

    Raises:
        CheckpointError: the file is missing or corrupt, or does not fit ``buffer`` (another
            buffer type, another config).
    """
    if type(buffer).__name__ != entry["buffer"]:
        raise CheckpointError(
            f"checkpoint {checkpoint} holds a {entry['buffer']}, but this agent's config "
            f"makes a {type(buffer).__name__}"
        )
    read_replay(buffer, checkpoint.parent / entry["file"], entry["token"], checkpoint)
    buffer.rng.bit_generator.state = entry["rng"]
    # n_step may be overridden on load, which changes which slots can be sampled, and
    # priority_alpha, which changes the priorities a prioritized tree holds
    buffer.restored(entry.get("n_step"), entry.get("alpha"))
