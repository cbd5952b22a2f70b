"""What an asynchronous run's two processes share: named counters and double-buffer slots in
shared memory.

The optimiser allocates every tensor before the sampler process starts and hands them over in
the process's spec; both sides then read and write them in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "CHILD_SEED_KEY",
    "Handover",
    "SharedCounters",
    "chunk_slots",
    "rollout_slots",
    "torch_dtype",
]

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

    NAMES = ("steps", "stop", "version", "ready")
    #: env steps the sampler process has collected (of this rank)
    steps = _Counter()
    #: set by the optimiser: the sampler process must stop
    stop = _Counter()
    #: the version (update count) of the weights last published
    version = _Counter()
    #: set by the sampler process once its envs are built
    ready = _Counter()

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
    takes a free slot (``free_slots``), fills it and announces it on ``filled`` with what the
    optimiser needs to read it (its size, the weights' version that collected it, the episodes
    it ended); the optimiser takes the announcements in order and frees each slot once done.

    With a fixed lag item ``n`` (``n >= 2``) waits for one more publish of the weights
    (``publishes``), and the optimiser publishes no newer ones before the sampler has pulled
    those (``pulls``, counted in :attr:`pulls_seen`).

    Args:
        ctx: the multiprocessing context of the sampler process.
    """

    def __init__(self, ctx: Any) -> None:
        self.filled = ctx.Queue()
        self.free_slots = ctx.Semaphore(2)
        self.publishes = ctx.Semaphore(0)
        self.pulls = ctx.Semaphore(0)
        self.pulls_seen = 0  # the optimiser's count of pulls acquired

    def take(self, waits: Any) -> Any:
        """The optimiser's next announcement, waited for with ``waits``."""
        return waits.take(self.filled)

    def await_pulls(self, count: int, waits: Any) -> None:
        """Wait until the sampler has pulled the weights of ``count`` items in all."""
        while self.pulls_seen < count:
            waits.acquire(self.pulls)
            self.pulls_seen += 1


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype."""
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def chunk_slots(
    observation_space: Any, num_envs: int, chunk_steps: int
) -> list[dict[str, torch.Tensor]]:
    """The two shared slots of a replay run, ``chunk_steps`` vector steps each."""
    obs_dtype = torch_dtype(np.dtype(observation_space.dtype))
    shape = (chunk_steps, num_envs)

    def slot() -> dict[str, torch.Tensor]:
        tensors = {
            "obs": torch.zeros((*shape, *observation_space.shape), dtype=obs_dtype),
            "final_obs": torch.zeros((*shape, *observation_space.shape), dtype=obs_dtype),
            "actions": torch.zeros(shape, dtype=torch.int64),
            "rewards": torch.zeros(shape, dtype=torch.float64),
            "terminated": torch.zeros(shape, dtype=torch.bool),
            "truncated": torch.zeros(shape, dtype=torch.bool),
        }
        return {key: value.share_memory_() for key, value in tensors.items()}

    return [slot(), slot()]


def rollout_slots(batch: Any) -> list[dict[str, Any]]:
    """The two shared slots of an on-policy run, each shaped like the ``SampleBatch`` ``batch``."""
    T, B = batch.rewards.shape
    final_shape = (T * B, *batch.next_obs.shape[1:])

    def like(tensor: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(tensor, device="cpu").share_memory_()

    def slot() -> dict[str, Any]:
        return {
            "obs": like(batch.obs),
            "actions": like(batch.actions),
            "rewards": like(batch.rewards),
            "terminated": like(batch.terminated),
            "truncated": like(batch.truncated),
            "valid": like(batch.valid),
            "extras": {key: like(value) for key, value in batch.extras.items()},
            "next_obs": like(batch.next_obs),
            "final_obs": torch.zeros(final_shape, dtype=batch.next_obs.dtype).share_memory_(),
            "final_index": torch.zeros((T * B, 2), dtype=torch.int64).share_memory_(),
        }

    return [slot(), slot()]
