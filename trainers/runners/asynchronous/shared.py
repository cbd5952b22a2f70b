"""What an asynchronous run's two processes share: named counters, the hand-over of the double
buffer's slots, and the slots themselves, in shared memory.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import torch

__all__ = ["CHILD_SEED_KEY", "CollectorChannels", "SharedCounters", "chunk_slots", "rollout_slots"]

# the key that derives a collector process's own seed (its torch sampling) from the run's seed
CHILD_SEED_KEY = 0xA5


class SharedCounters(ctypes.Structure):
    """The counters both processes of an asynchronous run read and write, by name: one ctypes
    structure in shared memory, made with the collector process's context.

    Attributes:
        steps: env steps the collector process has collected (of this rank).
        stop: set by the optimiser: the collector process must stop.
        version: the version (update count) of the weights last published.
        sampler_wait: seconds the collector process has waited for the optimiser.

    Example:
        >>> import multiprocessing
        >>> counters = multiprocessing.get_context("spawn").RawValue(SharedCounters)
        >>> counters.steps += 8
        >>> counters.steps, counters.stop
        (8, 0)
    """

    _fields_ = [
        ("steps", ctypes.c_int64),
        ("stop", ctypes.c_int64),
        ("version", ctypes.c_int64),
        ("sampler_wait", ctypes.c_double),
    ]
    steps: int
    stop: int
    version: int
    sampler_wait: float


class CollectorChannels:
    """What passes between the collector process and the optimiser: the weights, the counters
    and the two slots of a double buffer.

    Each side blocks on a queue or a semaphore until the other acts, never polling. The sampler
    allocates the two slots once its envs run and hands them over on ``started`` (they travel
    as file descriptors that it shares itself, so it stays until ``started_seen``). Then, item
    after item, it takes a free slot (``free_slots``), fills it and announces it on ``filled``
    with what the optimiser needs to read it (its size, the weights' version that collected it,
    the episodes it ended); the optimiser takes the announcements in order and frees each slot
    once done with it. The optimiser publishes its weights into ``weights`` (behind
    ``weights_lock``) as version ``counters.version``; the sampler pulls them before each item.

    With a fixed lag the sampler acts on item ``n`` (``n >= 2``) with the weights of one more
    publish (``publishes``), and the optimiser publishes no newer ones before the sampler has
    pulled those (``pulls``): the lag is the same in every run.

    Args:
        ctx: the multiprocessing context of the collector process.
        weights: the tensors to share (copied).
        fixed_lag: hand the weights over with a fixed lag.
    """

    def __init__(self, ctx: Any, weights: list[torch.Tensor], fixed_lag: bool) -> None:
        self.fixed_lag = fixed_lag
        self.counters: SharedCounters = ctx.RawValue(SharedCounters)
        self.weights = [t.detach().cpu().clone().share_memory_() for t in weights]
        self.weights_lock = ctx.Lock()
        self.started = ctx.Queue()
        self.started_seen = ctx.Semaphore(0)
        self.filled = ctx.Queue()
        self.free_slots = ctx.Semaphore(2)
        self.publishes = ctx.Semaphore(0)
        self.pulls = ctx.Semaphore(0)


def _shared(tensors: dict[str, Any]) -> dict[str, Any]:
    return {key: value.share_memory_() for key, value in tensors.items()}


def _with_moments(tensors: dict[str, Any], moments: int) -> dict[str, Any]:
    """``tensors``, and a float64 ``moments`` entry of that length where it is not 0."""
    if moments:
        tensors["moments"] = torch.zeros(moments, dtype=torch.float64)
    return tensors


def chunk_slots(
    observation_space: Any, num_envs: int, chunk_steps: int, moments: int = 0
) -> list[dict[str, torch.Tensor]]:
    """The two shared slots of a replay run, ``chunk_steps`` vector steps each; with
    ``moments``, room for the normalisation moments the chunk observed (that many numbers,
    ``Normalizer.take_moments``)."""
    obs_dtype = torch.from_numpy(np.zeros(0, dtype=observation_space.dtype)).dtype
    shape = (chunk_steps, num_envs)
    obs_shape = (*shape, *observation_space.shape)
    return [
        _shared(
            _with_moments(
                {
                    "obs": torch.zeros(obs_shape, dtype=obs_dtype),
                    "final_obs": torch.zeros(obs_shape, dtype=obs_dtype),
                    "actions": torch.zeros(shape, dtype=torch.int64),
                    "rewards": torch.zeros(shape, dtype=torch.float64),
                    "terminated": torch.zeros(shape, dtype=torch.bool),
                    "truncated": torch.zeros(shape, dtype=torch.bool),
                },
                moments,
            )
        )
        for _ in range(2)
    ]


def rollout_slots(batch: Any, moments: int = 0) -> list[dict[str, Any]]:
    """The two shared slots of an on-policy run, each shaped like the ``SampleBatch`` ``batch``
    (with room for a final observation at every step); with ``moments``, room for the
    normalisation moments the batch observed, as :func:`chunk_slots` has."""
    T, B = batch.rewards.shape
    final_shape = (T * B, *batch.next_obs.shape[1:])
    keys = ("obs", "actions", "rewards", "terminated", "truncated", "valid", "next_obs")

    def slot() -> dict[str, Any]:
        tensors = {key: torch.zeros_like(getattr(batch, key), device="cpu") for key in keys}
        tensors["final_obs"] = torch.zeros(final_shape, dtype=batch.next_obs.dtype)
        tensors["final_index"] = torch.zeros((T * B, 2), dtype=torch.int64)
        _with_moments(tensors, moments)
        extras = {key: torch.zeros_like(value, device="cpu") for key, value in batch.extras.items()}
        return {**_shared(tensors), "extras": _shared(extras)}

    return [slot(), slot()]
