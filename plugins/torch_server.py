"""The ``action_server`` vector env: workers only simulate; the policy runs batched in the parent.

Observations come back as ``torch`` tensors on ``device`` (staged through pinned memory when the
device is a GPU, copied with ``non_blocking``); actions go in as tensors. With
``alternating=True`` the envs form two fixed halves: while the caller computes actions for one
half, the workers simulate the other, so CPU simulation overlaps policy inference (rlpyt's
``AlternatingSampler``, the seed paper's action server).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.utils import batch_space

from vecaccel.pooled import PooledVecEnv
from vecaccel.worker import usable_cpus, warn_if_torch_oversubscribes

__all__ = ["ActionServerVecEnv"]


def _tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    first = trees[0]
    if isinstance(first, dict):
        return {key: _tree_map(fn, *(t[key] for t in trees)) for key in first}
    if isinstance(first, tuple):
        return tuple(_tree_map(fn, *parts) for parts in zip(*trees))
    return fn(*trees)


class ActionServerVecEnv(PooledVecEnv):
    """Sub-environments in shared-memory workers, with torch tensors in and out on ``device``.

    Args:
        env_fns: one env function per sub-environment.
        device: where observations, rewards and flags are returned (``"cpu"``, ``"cuda"``...).
        alternating: split the envs into two fixed halves (even and odd indices, so each half
            spans every worker) and serve one half per ``step`` while the other simulates.
        num_workers: default: every usable CPU, except with ``alternating=True`` on
            ``device="cpu"``: then the CPUs that torch's threads leave free (at least 1), since
            the policy runs here at the same time as the workers.
        **options: as for ``shm``: ``num_workers``, ``context``, ``autoreset_mode``...

    Each ``step(actions)`` takes actions for the envs the previous call returned
    (``info["env_id"]``) and returns the other half (or all envs without alternation).

    Example:
        >>> import vecaccel, torch
        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="action_server", device="cpu",
        ...                          alternating=True, num_workers=2)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, infos["env_id"].tolist()
        (torch.Size([2, 4]), [0, 2])
        >>> obs, rew, term, trunc, infos = envs.step(torch.zeros(2, dtype=torch.int64))
        >>> infos["env_id"].tolist()
        [1, 3]
        >>> envs.close()
    """

    #: every step returns its envs (all, or one alternating half) in index order
    returns_envs_in_order = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        device: str | torch.device = "cpu",
        alternating: bool = False,
        **options: Any,
    ) -> None:
        num_envs = len(env_fns)
        if alternating and (num_envs < 2 or num_envs % 2):
            raise ValueError(f"alternating=True needs an even number of envs >= 2, got {num_envs}")
        if "batch_size" in options:
            raise ValueError(
                "action_server sets its batch itself: all envs, or half with alternating"
            )
        self.device = torch.device(device)
        self.alternating = alternating
        batch = num_envs // 2 if alternating else num_envs
        if options.get("num_workers") is None and self.device.type == "cpu" and alternating:
            # the policy runs on this process's cores: leave torch its threads, or the workers
            # and torch fight for the same cores and nothing overlaps (measured on Pong, 2 cores:
            # 1,410 steps/s with 2 workers, 1,840 with 1)
            free = usable_cpus() - torch.get_num_threads()
            options["num_workers"] = max(1, min(num_envs, free))
        super().__init__(env_fns, batch_size=batch, **options)
        if self.device.type == "cpu":  # the policy's threads share the cores with the workers
            warn_if_torch_oversubscribes(self.num_workers, stacklevel=4)
        try:  # the workers run now: an error here (no CUDA for pinned memory) must stop them
            if alternating:
                self.groups = [np.arange(0, num_envs, 2), np.arange(1, num_envs, 2)]
            else:
                self.groups = [np.arange(num_envs)]
            self._group = 0
            self._pin = self.device.type == "cuda"
            self._staging = [self._make_staging() for _ in self.groups]
            self._copy_done: list[Any] = [None for _ in self.groups]
            self.observation_space = batch_space(self.single_observation_space, batch)
        except BaseException:
            self.close(terminate=True)
            raise

    def _make_staging(self) -> Any:
        def empty(view: np.ndarray) -> torch.Tensor:
            shape = (self.batch_size, *view.shape[1:])
            tensor = torch.from_numpy(np.empty(shape, dtype=view.dtype))
            return tensor.pin_memory() if self._pin else tensor

        return {
            "obs": _tree_map(empty, self.pool.views.obs),
            "rewards": empty(self.pool.views.rewards),
            "terminations": empty(self.pool.views.terminations),
            "truncations": empty(self.pool.views.truncations),
        }

    def _to_device(self, group: int, ids: np.ndarray) -> tuple[Any, ...]:
        views = self.pool.views
        staging = self._staging[group]
        if self._copy_done[group] is not None:
            self._copy_done[group].synchronize()  # the last copy out of this buffer is finished

        def stage(view: np.ndarray, tensor: torch.Tensor) -> torch.Tensor:
            np.take(view, ids, axis=0, out=tensor.numpy())
            if self.device.type == "cpu":
                return tensor.clone()
            return tensor.to(self.device, non_blocking=True)

        obs = _tree_map(stage, views.obs, staging["obs"])
        rewards = stage(views.rewards, staging["rewards"])
        terms = stage(views.terminations, staging["terminations"])
        truncs = stage(views.truncations, staging["truncations"])
        if self._pin:
            event = torch.cuda.Event()
            event.record()
            self._copy_done[group] = event
        return obs, rewards, terms, truncs

    def _result(self, group: int, result: tuple) -> tuple:
        _, _, _, _, infos = result
        ids = infos["env_id"]
        obs, rewards, terms, truncs = self._to_device(group, ids)
        return obs, rewards, terms, truncs, infos

    def _after_reset(self):
        self._group = 0
        ids = self.groups[0]
        obs, _, _, _, infos = self._result(0, self.recv_ids(ids))
        self._last_ids = ids
        return obs, infos

    def _after_masked_reset(self):
        obs, _, _, _, infos = self._result(self._group, self._gather(self._last_ids))
        return obs, infos

    def step_async(self, actions: Any) -> None:
        if self._last_ids is None:
            raise RuntimeError("call reset() before step()")
        self.send(actions, self.groups[self._group])

    def step_wait(self, timeout: float | None = None):
        next_group = (self._group + 1) % len(self.groups)
        result = self.recv_ids(self.groups[next_group], timeout)
        self._group = next_group
        return self._result(next_group, result)
