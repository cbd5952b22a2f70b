"""Backend ``async``: return whichever ``batch_size`` envs are ready, as EnvPool and PufferLib do."""

from __future__ import annotations

from vecaccel import hookimpl
from vecaccel.pooled import PooledVecEnv

__all__ = ["AsyncVecEnv"]


class AsyncVecEnv(PooledVecEnv):
    """Asynchronous stepping: ``batch_size < num_envs`` so a slow env never stalls the batch.

    ``send(actions, env_ids)`` starts envs; ``recv()`` returns the first ``batch_size`` envs
    that are ready with ``info["env_id"]``; ``step(actions)`` sends ``actions`` to the envs
    the last ``recv`` returned and receives the next batch. It runs on the same worker
    processes and shared memory as ``shm``.

    Example:
        >>> import vecaccel, numpy as np
        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="async", batch_size=2, num_workers=2)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, len(infos["env_id"])
        ((2, 4), 2)
        >>> obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
        >>> envs.close()
    """


def make_async(env_fns, **options) -> AsyncVecEnv:
    return AsyncVecEnv(env_fns, **options)


@hookimpl
def vecaccel_register_backends(registry) -> None:
    registry.add(
        "async",
        make_async,
        "shared-memory workers; recv() returns the first batch_size envs that are ready",
    )
