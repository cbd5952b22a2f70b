"""What the SB3 adapter runs on each env inside the workers.

A worker unpickles a function by importing its module. These live apart from
:mod:`vecaccel.adapters.sb3`, which imports Stable-Baselines3 (and with it torch), so that a
worker started by ``spawn`` or ``forkserver``, or a Ray shard, builds the envs of
:class:`~vecaccel.adapters.sb3.VecAccelEnv` and answers ``get_attr``, ``has_attr`` and
``get_images`` without importing either (unless the env functions themselves need them). They
are top-level, and their only arguments are bound with ``functools.partial``, so that they
pickle under every start method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

__all__ = [
    "MissingAttribute",
    "RegisteringEnvFn",
    "get_wrapper_attr",
    "has_wrapper_attr",
    "render",
]


class MissingAttribute:
    """Returned by a worker in place of an attribute that does not exist (picklable)."""

    def __init__(self, message: str) -> None:
        self.message = message


def get_wrapper_attr(env: gym.Env, name: str) -> Any:
    """``name`` as found through ``env``'s wrappers, or a :class:`MissingAttribute`.

    The attribute itself, never called: SB3's ``get_attr`` returns methods as they are.
    """
    try:
        return env.get_wrapper_attr(name)
    except AttributeError as exc:
        return MissingAttribute(str(exc))


def has_wrapper_attr(env: gym.Env, name: str) -> bool:
    """Whether ``env`` or one of its wrappers has ``name``."""
    try:
        env.get_wrapper_attr(name)
    except AttributeError:
        return False
    return True


def render(env: gym.Env) -> Any:
    """``env.render()``."""
    return env.render()


class RegisteringEnvFn:
    """An env function that first registers plugin environments (ALE ids under ``spawn``).

    SB3's ``make_vec_env`` builds env functions that call ``gym.make(env_id)``; in a worker
    started fresh (``spawn``, ``forkserver``) ids of packages such as ale-py are not registered
    yet, so this wrapper runs the ``vecaccel_register_envs`` hook first.
    """

    def __init__(self, env_fn: Callable[[], gym.Env]) -> None:
        self.env_fn = env_fn

    def __call__(self) -> gym.Env:
        from vecaccel.manager import register_envs

        register_envs()
        return self.env_fn()
