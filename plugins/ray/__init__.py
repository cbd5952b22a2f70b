"""Backend ``ray``: contiguous shards of envs, each a Ray actor running a local backend on its node.

A shard is a worker slice one level up: the actor builds ``vecaccel.make_vec(env_fns[a:b],
backend=shard_backend)`` on whichever node Ray placed it, and a step is one actor call per
shard carrying that shard's actions; the shard's own workers step its envs in parallel there
and its arrays come back through Ray's object store (zero-copy on the caller's node), to be
copied once into the caller's arrays. Ray is imported only when this backend is used.

Faults follow the local backends: an env's exception arrives as :class:`vecaccel.WorkerError`
with the remote traceback and the env indices; a shard whose actor dies, whose node is lost or
that overruns ``step_timeout_s`` raises a ``WorkerError`` naming the shard, its envs and its
node, or under ``on_worker_failure="restart"`` is started again (on any node with the
resources) with its envs reseeded from derived seeds and their episodes ended as truncated
with ``info["worker_restarted"]``.

Joining a cluster (``address``) asks it first, within ``connect_timeout_s``: one that does not
answer, or refuses this client's token, raises :class:`RayConnectionError` saying which and
what to do. A cluster with token authentication gets the token Ray's own clients use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from vecaccel import BackendRegistry, hookimpl
from vecaccel.options import RayOptions

from .auth import RayConnectionError
from .shard import ShardActor, ShardFailure, shard_bounds
from .vec_env import RayVecEnv

__all__ = [
    "RayConnectionError",
    "RayVecEnv",
    "ShardActor",
    "ShardFailure",
    "make_ray",
    "shard_bounds",
    "vecaccel_register_backends",
]


def make_ray(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: RayOptions | None = None,
    **kwargs: Any,
) -> RayVecEnv:
    """The ``ray`` backend's factory: ``make_vec`` passes checked ``options``; a direct call
    may pass the options as keywords instead."""
    options = RayOptions.resolve("ray", options, kwargs)
    return RayVecEnv(env_fns, autoreset_mode=autoreset_mode, options=options)


@hookimpl
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        "ray",
        make_ray,
        "shards of envs as Ray actors, each running a local backend on its node",
        options=RayOptions,
    )
