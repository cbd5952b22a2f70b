"""The layers of a trainer's vector env: the env itself, then the envs it wraps (Gymnasium's
``env``, SB3's ``venv``, an adapter's ``vec_env``), down to the vecaccel backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["layers", "set_policy_version"]

_INNER = ("env", "vec_env", "venv")
#: wrappers nest a few deep; a cycle of references must not loop forever
_MOST_LAYERS = 8


def layers(env: Any) -> Iterator[Any]:
    """``env``, then each env it wraps, outermost first.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.wrappers.TimeLimit(gym.make("CartPole-v1"), 10)
        >>> [type(layer).__name__ for layer in layers(env)]
        ['TimeLimit', 'TimeLimit', 'OrderEnforcing', 'PassiveEnvChecker', 'CartPoleEnv']
    """
    for _ in range(_MOST_LAYERS):
        if env is None:
            return
        yield env
        env = next((getattr(env, name) for name in _INNER if hasattr(env, name)), None)


def set_policy_version(env: Any, version: int) -> bool:
    """Stamp the actions that ``env`` is stepped with from now on as policy ``version``, where
    a layer stamps its answers (the action server's ``policy_version``); whether one does.

    Example:
        >>> import vecaccel
        >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
        >>> set_policy_version(envs, 3)
        False
        >>> envs.close()
    """
    for layer in layers(env):
        if hasattr(type(layer), "policy_version"):
            layer.policy_version = int(version)
            return True
    return False
