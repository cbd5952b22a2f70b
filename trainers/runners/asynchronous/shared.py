"""What an asynchronous run's two processes share: named counters, the hand-over of the double
buffer's slots, and the slots themselves, in shared memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["CHILD_SEED_KEY", "Handover", "SharedCounters", "chunk_slots", "rollout_slots"]

# the key that derives a sampler process's own seed (its torch sampling) from the run's seed
CHILD_SEED_KEY = 0xA5


class _Counter:
    """One named int64 counter of :class:`SharedCounters`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.index = owner.NAMES.index(name)  # type: ignore[attr-defined]

    def __get__(self, counters: Any, owner: Any = None) -> int:
        return int(counters.ints[self.index])

    def __set__(self, counters: Any, value: int) -> None:
        counters.ints[self.index] = value


class SharedCounters:
    """The counters both processes of an asynchronous run read and write, by name.

    They live in one shared int64 tensor (and one float64 for the sampler's waiting time), read
    and written through NumPy views: a scalar access costs far less than on a torch tensor. A
    pickled copy (the sampler process's) shares the same memory.

    Example:
        >>> counters = SharedCounters()
        >>> counters.steps += 8
        >>> counters.steps, counters.stop
        (8, 0)
    """

    NAMES = ("steps", "stop", "version")
    #: env steps the sampler process has collected (of this rank)
    steps = _Counter()
    #: set by the optimiser: the sampler process must stop
    stop = _Counter()
    #: the version (update count) of the weights last published
    version = _Counter()

    def __init__(self, ints: torch.Tensor | None = None, floats: torch.Tensor | None = None):
        self.int_tensor = torch.zeros(len(self.NAMES), dtype=torch.int64).share_memory_()
        self.float_tensor = torch.zeros(1, dtype=torch.float64).share_memory_()
        if ints is not None and floats is not None:
            self.int_tensor, self.float_tensor = ints, floats
        self.ints: np.ndarray = self.int_tensor.numpy()
        self.floats: np.ndarray = self.float_tensor.numpy()

    def __reduce__(self) -> tuple[Any, ...]:
        return (SharedCounters, (self.int_tensor, self.float_tensor))

    @property
    def sampler_wait(self) -> float:
        """Seconds the sampler process has waited for the optimiser."""
        return float(self.floats[0])

    def add_sampler_wait(self, seconds: float) -> None:
        self.floats[0] += seconds


class Handover:
    """How the two slots of a double buffer pass between the sampler process and the optimiser.

    Each side blocks on a queue or a semaphore until the other acts, never polling. The sampler
    allocates the two slots once its envs run and hands them over on ``started`` (they travel
    as file descriptors that it shares itself, so it stays until ``started_seen``). Then, item
    after item, it takes a free slot (``free_slots``), fills it and announces it on ``filled``
    with what the optimiser needs to read it (its size, the weights' version that collected it,
    the episodes it ended); the optimiser takes the announcements in order and frees each slot
    once done with it.

    With a fixed lag the sampler acts on item ``n`` (``n >= 2``) with the weights of one more
    publish (``publishes``), and the optimiser publishes no newer ones before the sampler has
    pulled those (``pulls``, counted in :attr:`pulls_seen`): the lag is the same in every run.

    Args:
        ctx: the multiprocessing context of the sampler process.
        fixed_lag: hand the weights over with a fixed lag.
    """

    def __init__(self, ctx: Any, fixed_lag: bool) -> None:
        self.fixed_lag = fixed_lag
        self.started = ctx.Queue()
        self.started_seen = ctx.Semaphore(0)
        self.filled = ctx.Queue()
        self.free_slots = ctx.Semaphore(2)
        self.publishes = ctx.Semaphore(0)
        self.pulls = ctx.Semaphore(0)
        self.pulls_seen = 0  # the optimiser's count of pulls acquired

    def await_pulls(self, count: int, waits: Any) -> None:
        """Wait until the sampler has pulled the weights of ``count`` items in all."""
        while self.pulls_seen < count:
            waits.acquire(self.pulls)
            self.pulls_seen += 1


def _shared(tensors: dict[str, Any]) -> dict[str, Any]:
    return {key: value.share_memory_() for key, value in tensors.items()}


def chunk_slots(
    observation_space: Any, num_envs: int, chunk_steps: int
) -> list[dict[str, torch.Tensor]]:
    """The two shared slots of a replay run, ``chunk_steps`` vector steps each."""
    obs_dtype = torch.from_numpy(np.zeros(0, dtype=observation_space.dtype)).dtype
    shape = (chunk_steps, num_envs)
    obs_shape = (*shape, *observation_space.shape)
    return [
        _shared(
            {
                "obs": torch.zeros(obs_shape, dtype=obs_dtype),
                "final_obs": torch.zeros(obs_shape, dtype=obs_dtype),
                "actions": torch.zeros(shape, dtype=torch.int64),
                "rewards": torch.zeros(shape, dtype=torch.float64),
                "terminated": torch.zeros(shape, dtype=torch.bool),
                "truncated": torch.zeros(shape, dtype=torch.bool),
            }
        )
        for _ in range(2)
    ]


def rollout_slots(batch: Any) -> list[dict[str, Any]]:
    """The two shared slots of an on-policy run, each shaped like the ``SampleBatch`` ``batch``
    (with room for a final observation at every step)."""
    T, B = batch.rewards.shape
    final_shape = (T * B, *batch.next_obs.shape[1:])
    keys = ("obs", "actions", "rewards", "terminated", "truncated", "valid", "next_obs")

    def slot() -> dict[str, Any]:
        tensors = {key: torch.zeros_like(getattr(batch, key), device="cpu") for key in keys}
        tensors["final_obs"] = torch.zeros(final_shape, dtype=batch.next_obs.dtype)
        tensors["final_index"] = torch.zeros((T * B, 2), dtype=torch.int64)
        extras = {key: torch.zeros_like(value, device="cpu") for key, value in batch.extras.items()}
        return {**_shared(tensors), "extras": _shared(extras)}

    return [slot(), slot()]
