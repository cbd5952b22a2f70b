"""Seeds and RNG states (per rank)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

__all__ = [
    "get_rng_state",
    "restore_rank_rng_state",
    "seed_everything",
    "set_rng_state",
    "split_seed",
]


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
    from vecaccel.trainers.services import distributed

    rank = distributed.rank()
    if rank_states is not None and len(rank_states) == distributed.world_size():
        set_rng_state(rank_states[rank])
        return rank_states[rank]
    if rank == 0:
        set_rng_state(state)
        return state
    seed_everything(split_seed(seed, 0x2E5, rank, *resume_point))
    return get_rng_state()
