"""The shard's side of the ``ray`` backend: one Ray actor per shard, running a local vecaccel
backend over a contiguous slice of the envs on its node.

Every method of :class:`ShardActor` returns its result, or a :class:`ShardFailure` for an error
of the envs, so that an env's traceback and indices reach the caller unwrapped by Ray.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from vecaccel.envs.vectorized_slices import unbatch_infos
from vecaccel.errors import WorkerError
from vecaccel.manager import register_envs
from vecaccel.vec_env import reset_mask_only

__all__ = ["ShardActor", "ShardFailure", "shard_bounds"]


def shard_bounds(num_envs: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` blocks of ``num_envs`` envs over ``num_shards`` shards, the
    first ``num_envs % num_shards`` shards one env larger.

    Example:
        >>> shard_bounds(10, 3)
        [(0, 4), (4, 7), (7, 10)]
    """
    size, extra = divmod(num_envs, num_shards)
    bounds, start = [], 0
    for k in range(num_shards):
        stop = start + size + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass
class ShardFailure:
    """What a shard's call returns instead of raising when its envs failed (the actor lives)."""

    message: str
    env_indices: tuple[int, ...]
    remote_traceback: str | None
    original_type: str | None

    def error(self, shard: int, node: str) -> WorkerError:
        """The caller's :class:`WorkerError` for this failure on shard ``shard`` at ``node``."""
        return WorkerError(
            f"shard {shard} on node {node}: {self.message}",
            env_indices=self.env_indices,
            remote_traceback=self.remote_traceback,
            original_type=self.original_type,
        )


class ShardActor:
    """One shard: a local vecaccel backend over a contiguous slice of envs, inside a Ray actor.

    Every method returns its result, or a :class:`ShardFailure` for an error of the envs, so
    that an env's traceback and indices reach the caller unwrapped.

    Args:
        start: the index (in the whole vector env) of the shard's first env.
    """

    def __init__(self, start: int) -> None:
        register_envs()  # a fresh actor process: plugin packages' Gymnasium namespaces first
        self.start = start
        self.envs: Any = None
        self.num_envs = 0
        self.last_obs: Any = None
        # envs rebuilt by a restart whose next step is their autoreset (NEXT_STEP), or must be
        # reset by the caller first (DISABLED)
        self.reset_due: np.ndarray | None = None

    def _failure(self, exc: BaseException) -> ShardFailure:
        import traceback

        indices = getattr(exc, "env_indices", None)
        if indices:
            indices = tuple(self.start + int(i) for i in indices)
        else:
            indices = tuple(range(self.start, self.start + self.num_envs))
        text = getattr(exc, "remote_traceback", None) or "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        )
        message = str(exc)
        if self.start and getattr(exc, "env_indices", None):
            message += f" (env numbers local to the shard; in the vector env: {list(indices)})"
        original = getattr(exc, "original_type", None) or type(exc).__name__
        return ShardFailure(message, indices, text, original)

    def _pairs(self, infos: dict) -> list[tuple[int, dict]]:
        if self.envs.per_env_infos:
            pairs = self.envs.last_infos
        else:
            per_env = unbatch_infos(infos, self.num_envs)
            pairs = [(j, info) for j, info in enumerate(per_env) if info]
        return [(self.start + j, info) for j, info in pairs]

    def start_envs(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        autoreset_mode: str,
        backend: str,
        options: Mapping[str, Any],
    ) -> dict[str, Any] | ShardFailure:
        """Build the shard's vector env; return its spaces and where it runs."""
        import ray

        import vecaccel

        try:
            self.envs = vecaccel.make_vec(
                list(env_fns), backend=backend, autoreset_mode=autoreset_mode, **options
            )
        except Exception as exc:  # noqa: BLE001 - reported to the caller with its traceback
            self.num_envs = len(env_fns)
            return self._failure(exc)
        self.num_envs = self.envs.num_envs
        self.envs.per_env_infos = bool(getattr(self.envs, "supports_per_env_infos", False))
        self.reset_due = np.zeros(self.num_envs, dtype=np.bool_)
        metadata = dict(self.envs.metadata)
        metadata.pop("autoreset_mode", None)
        context = ray.get_runtime_context()
        return {
            "observation_space": self.envs.single_observation_space,
            "action_space": self.envs.single_action_space,
            "metadata": metadata,
            "render_mode": self.envs.render_mode,
            "spec": self.envs.spec,
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    def reset(
        self,
        seeds: list[int | None],
        options: dict | None,
        mask: np.ndarray | None,
        due_after: bool = False,
    ) -> tuple[Any, list[tuple[int, dict]]] | ShardFailure:
        """Reset the shard's envs (those in ``mask``); ``due_after``: a restart's reset, whose
        envs then take their autoreset step (NEXT_STEP) or wait for a reset (DISABLED)."""
        if mask is not None:  # None stays None for the envs, as reset_mask_only asks
            options = reset_mask_only(mask) if options is None else {**options, "reset_mask": mask}
        try:
            obs, infos = self.envs.reset(seed=seeds, options=options)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            return self._failure(exc)
        self.last_obs = obs
        due = due_after and self.envs.autoreset_mode is not AutoresetMode.SAME_STEP
        if mask is None:
            self.reset_due[:] = due
        else:
            self.reset_due[mask] = due
        return obs, self._pairs(infos)

    def current_obs(self) -> tuple[Any, list]:
        """The observations the shard returned last (and no infos), as ``reset`` returns."""
        return self.last_obs, []

    def step(self, actions: Any) -> tuple | ShardFailure:
        """Step every env of the shard."""
        try:
            if self.reset_due.any():
                return self._step_due(actions)
            obs, rewards, terms, truncs, infos = self.envs.step(actions)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            return self._failure(exc)
        self.last_obs = obs
        return obs, rewards, terms, truncs, self._pairs(infos)

    def _step_due(self, actions: Any) -> tuple:
        due = self.reset_due
        if self.envs.autoreset_mode is AutoresetMode.DISABLED:
            indices = (self.start + np.flatnonzero(due)).tolist()
            raise WorkerError(
                f"envs {indices} were restarted (their episodes ended as truncated) and "
                "autoreset_mode is DISABLED: reset them with reset(options={'reset_mask': "
                "mask}) before stepping them again",
                env_indices=np.flatnonzero(due).tolist(),
            )
        if due.all():  # the autoreset step of NEXT_STEP: a reset, no action taken
            obs, infos = self.envs.reset()
            self.reset_due[:] = False
            self.last_obs = obs
            zeros = np.zeros(self.num_envs, dtype=np.bool_)
            rewards = np.zeros(self.num_envs, dtype=np.float64)
            return obs, rewards, zeros, zeros.copy(), self._pairs(infos)
        # some of the restarted envs were reset by the caller since: a lock-step shard cannot
        # step some envs and reset others, so the rest are reset now and step with the others
        self.envs.reset(options={"reset_mask": due.copy()})
        self.reset_due[:] = False
        obs, rewards, terms, truncs, infos = self.envs.step(actions)
        self.last_obs = obs
        return obs, rewards, terms, truncs, self._pairs(infos)

    def call(
        self, name: Any, local_indices: list[int], args: tuple, kwargs: dict
    ) -> tuple | ShardFailure:
        """``call_indices`` on the shard's envs ``local_indices``."""
        try:
            return tuple(self.envs.call_indices(name, local_indices, *args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            return self._failure(exc)

    def set_attr(self, name: str, local_indices: list[int], values: list) -> None | ShardFailure:
        """``set_attr_indices`` on the shard's envs ``local_indices``."""
        try:
            self.envs.set_attr_indices(name, values, local_indices)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            return self._failure(exc)
        return None

    def close(self) -> None:
        """Close the shard's vector env (its worker processes and shared memory)."""
        if self.envs is not None:
            self.envs.close()
            self.envs = None
