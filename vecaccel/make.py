"""``make_vec``: turn an env id, an env function or a list of them into a vecaccel ``VecEnv``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from vecaccel.manager import get_backend, register_envs

__all__ = ["make_vec", "EnvFactory"]


class EnvFactory:
    """A picklable zero-argument env function for a registered Gymnasium id.

    It lets plugins register their envs inside the worker process too, which matters under the
    ``spawn`` and ``forkserver`` start methods where the child starts from a fresh interpreter.

    Example:
        >>> env = EnvFactory("CartPole-v1")()
        >>> env.spec.id
        'CartPole-v1'
        >>> env.close()
    """

    def __init__(self, env_id: str, kwargs: dict[str, Any] | None = None) -> None:
        self.env_id = env_id
        self.kwargs = dict(kwargs or {})

    def __call__(self) -> gym.Env:
        register_envs()
        return gym.make(self.env_id, **self.kwargs)

    def __repr__(self) -> str:
        return f"EnvFactory({self.env_id!r}, {self.kwargs!r})"


def _env_fns(
    env: str | Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
    num_envs: int | None,
    env_kwargs: dict[str, Any] | None,
) -> list[Callable[[], gym.Env]]:
    if isinstance(env, str):
        register_envs()
        if env not in gym.registry:
            try:
                gym.spec(env)  # raises a helpful error with close matches
            except gym.error.Error as exc:
                raise ValueError(f"unknown environment id {env!r}: {exc}") from None
        if num_envs is None:
            raise ValueError("num_envs is required when env is an environment id")
        return [EnvFactory(env, env_kwargs) for _ in range(num_envs)]
    if env_kwargs:
        raise ValueError("env_kwargs only applies when env is an environment id")
    if callable(env):
        if num_envs is None:
            raise ValueError("num_envs is required when env is a single env function")
        return [env] * num_envs
    env_fns = list(env)
    for index, fn in enumerate(env_fns):
        if not callable(fn):
            raise TypeError(f"env function {index} is not callable: {fn!r}")
    if num_envs is not None and num_envs != len(env_fns):
        raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env functions were given")
    return env_fns


def make_vec(
    env: str | Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
    num_envs: int | None = None,
    *,
    backend: str = "shm",
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    env_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> gym.vector.VectorEnv:
    """Create a vectorized environment.

    Args:
        env: a registered Gymnasium id, a zero-argument callable returning an env, or a list of
            such callables (one per sub-environment).
        num_envs: how many sub-environments (required unless ``env`` is a list).
        backend: the registered backend to use; see ``vecaccel.list_backends()``.
        autoreset_mode: Gymnasium's ``AutoresetMode`` (or its string value).
        env_kwargs: keyword arguments for ``gymnasium.make`` when ``env`` is an id.
        **options: backend options, e.g. ``num_workers``, ``context``, ``copy``.

    Returns:
        A ``gymnasium.vector.VectorEnv``.

    Example:
        >>> import vecaccel
        >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape
        (2, 4)
        >>> envs.close()
    """
    if num_envs is not None and (not isinstance(num_envs, int) or num_envs < 1):
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    env_fns = _env_fns(env, num_envs, env_kwargs)
    factory = get_backend(backend).factory
    return factory(env_fns, autoreset_mode=autoreset_mode, **options)
