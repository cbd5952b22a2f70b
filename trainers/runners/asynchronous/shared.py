"""What an asynchronous run's two processes share: counters, locks, buffers in shared memory.

The optimiser allocates every tensor before the sampler process starts and hands them over in
the process's spec; both sides then read and write them in place. The counters are an int64
tensor indexed by the constants below, the timers a float64 one; the sampler reads and writes
them as NumPy views (a scalar access costs far less than on the torch tensor).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

__all__ = [
    "CHILD_SEED_KEY",
    "CHUNKS",
    "NUM_COUNTERS",
    "NUM_TIMERS",
    "PULLS",
    "READY",
    "SAMPLER_BUSY",
    "SAMPLER_VERSION",
    "SAMPLER_WAIT",
    "SLOTS_TAKEN",
    "SLOT_K",
    "SLOT_STATE",
    "SLOT_VERSION",
    "STEPS",
    "STOP",
    "UPDATES",
    "VERSION",
    "GuardedLock",
    "LockedBuffer",
    "ReplayFactory",
    "SharedFactory",
    "build_replay_buffer",
    "chunk_slots",
    "rollout_slots",
    "torch_dtype",
]

# slots of the shared int64 counters
STEPS, UPDATES, STOP, VERSION, SAMPLER_VERSION, READY = range(6)
# with a fixed lag: how many batches' weights the sampler process has pulled so far
PULLS = 6
# with a fixed lag (replay): how many chunks the optimiser has trained on and published after
CHUNKS = 7
# per double-buffer slot i: SLOT_STATE + i is 0 (free) or 1 (full), SLOT_K + i the number of
# final observations (rollouts) or of vector steps (chunks), SLOT_VERSION + i the weights that
# collected it
SLOT_STATE, SLOT_K, SLOT_VERSION = 8, 10, 12
# set once the optimiser has the rollout slots: they travel as file descriptors that the
# rollout process itself hands over, so it must not exit before (a run of two batches could)
SLOTS_TAKEN = 14
NUM_COUNTERS = 16
# slots of the shared float64 timers (seconds)
SAMPLER_WAIT, SAMPLER_BUSY = range(2)
NUM_TIMERS = 4
# the key that derives a sampler process's own seed (its torch sampling) from the run's seed
CHILD_SEED_KEY = 0xA5


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype."""
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


class SharedFactory:
    """An ``array_factory`` that allocates torch shared-memory tensors and remembers them in order."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        tensor = torch.zeros(tuple(shape), dtype=torch_dtype(np.dtype(dtype))).share_memory_()
        self.tensors.append(tensor)
        return tensor.numpy()


class ReplayFactory:
    """An ``array_factory`` handing out, in order, tensors another process allocated."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = list(tensors)
        self.position = 0

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        tensor = self.tensors[self.position]
        self.position += 1
        array = tensor.numpy()
        if array.shape != tuple(shape) or array.dtype != np.dtype(dtype):
            raise RuntimeError(
                f"shared replay array {self.position - 1} is {array.shape} {array.dtype}, "
                f"expected {tuple(shape)} {np.dtype(dtype)}"
            )
        return array


class GuardedLock:
    """A cross-process lock acquired in bounded waits, checking between them that the other
    process lives: a process killed while holding a lock never releases it.

    Args:
        lock: a ``multiprocessing`` lock.
        check: called between waits; raises if the other side is gone.
    """

    def __init__(self, lock: Any, check: Callable[[], None] | None = None) -> None:
        self.lock = lock
        self.check = check

    def __enter__(self) -> None:
        while not self.lock.acquire(timeout=0.25):
            if self.check is not None:
                self.check()

    def __exit__(self, *exc_info: Any) -> None:
        self.lock.release()

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits (release it with :meth:`release`)."""
        return bool(self.lock.acquire(block=False))

    def release(self) -> None:
        """Release the lock taken by :meth:`try_acquire` or ``with``."""
        self.lock.release()


class LockedBuffer:
    """The optimiser's view of the shared replay buffer: sampling and priority updates take the
    lock, everything else reads the buffer itself.

    Args:
        buffer: the replay buffer on shared arrays.
        lock: the ``multiprocessing`` lock the sampler takes to add.
        check: raises if the sampler process died (perhaps holding the lock).
    """

    def __init__(self, buffer: Any, lock: Any, check: Callable[[], None]) -> None:
        self._buffer = buffer
        self._lock = GuardedLock(lock, check)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._buffer.sample(*args, **kwargs)

    def update_priorities(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self._buffer.update_priorities(*args, **kwargs)

    @contextlib.contextmanager
    def held(self) -> Iterator[Any]:
        """The buffer itself, with the lock held (the sampler adds nothing meanwhile)."""
        with self._lock:
            yield self._buffer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)


def build_replay_buffer(
    spec: dict[str, Any], observation_space: Any, action_space: Any, factory: Any
) -> Any:
    """The replay buffer ``spec`` describes, its arrays made by ``factory``.

    Args:
        spec: ``{"prioritized": bool, "kwargs": dict}``, the algorithm's buffer description.
        observation_space: the env's observation space.
        action_space: the env's action space.
        factory: a :class:`SharedFactory` (the optimiser) or :class:`ReplayFactory` (the sampler).
    """
    from vecaccel.trainers.replay.buffer import ReplayBuffer
    from vecaccel.trainers.replay.prioritized import PrioritizedReplayBuffer

    cls = PrioritizedReplayBuffer if spec["prioritized"] else ReplayBuffer
    return cls(observation_space, action_space, array_factory=factory, **spec["kwargs"])


def chunk_slots(
    observation_space: Any, num_envs: int, chunk_steps: int
) -> list[dict[str, torch.Tensor]]:
    """The two shared slots of a fixed-lag replay run, ``chunk_steps`` vector steps each."""
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
