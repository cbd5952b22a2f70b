"""The picklable env functions an env source makes from what a user passed.

A worker process under ``spawn`` or ``forkserver`` starts from a fresh interpreter, so an env
function must pickle as something it can import there. :class:`EnvCall` is a call of an
importable function with its arguments, made when a worker needs its env: a Gymnasium id
(:func:`make_gym_env`), the module path of a PettingZoo env (:func:`make_pettingzoo_env`), a
user's function with ``env_kwargs``, or a trainer's set-up of an id. :class:`PrebuiltEnvFn` is a
user's function whose first call hands over the env made already to look at it.

Example:
    >>> fn = EnvCall(make_gym_env, "CartPole-v1")
    >>> fn
    EnvCall(make_gym_env, 'CartPole-v1')
    >>> env = fn()
    >>> env.spec.id
    'CartPole-v1'
    >>> env.close()
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym

__all__ = ["EnvCall", "PrebuiltEnvFn", "make_gym_env", "make_pettingzoo_env"]


class EnvCall:
    """A picklable zero-argument env function: ``fn(*args, **kwargs)``.

    ``fn`` pickles by reference where it is a module's function (it is imported again in a
    fresh worker process), so the env is only made where it is stepped. Its repr shows the call.

    Example:
        >>> EnvCall(make_pettingzoo_env, "pettingzoo.butterfly.pistonball_v6", n_pistons=3)
        EnvCall(make_pettingzoo_env, 'pettingzoo.butterfly.pistonball_v6', n_pistons=3)
    """

    def __init__(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        arguments = [repr(arg) for arg in self.args]
        arguments += [f"{key}={value!r}" for key, value in self.kwargs.items()]
        return f"EnvCall({', '.join([name, *arguments])})"


def make_gym_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)``, after registering the envs of installed plugins
    (a worker process that starts fresh has none registered yet).

    Example:
        >>> env = make_gym_env("CartPole-v1", max_episode_steps=10)
        >>> env.spec.max_episode_steps
        10
        >>> env.close()
    """
    from vecaccel.manager import register_envs

    register_envs()
    return gym.make(env_id, **kwargs)


def make_pettingzoo_env(module: str, **kwargs: Any) -> Any:
    """The PettingZoo env of module path ``module``: its ``parallel_env(**kwargs)``, or for an
    AEC-only module its ``env(**kwargs)``."""
    imported = importlib.import_module(module)
    if hasattr(imported, "parallel_env"):
        return imported.parallel_env(**kwargs)
    return imported.env(**kwargs)


class PrebuiltEnvFn:
    """An env function whose first call in this process returns ``instance``, built already.

    :meth:`~vecaccel.envs.source.EnvSource.resolve` calls a user's env function once to see
    whether it makes a PettingZoo env; the env it made then serves as the backend's first one,
    so the function is called as often as without the look. It pickles as ``fn`` itself.

    Example:
        >>> made = gym.make("CartPole-v1")
        >>> fn = PrebuiltEnvFn(lambda: gym.make("CartPole-v1"), made)
        >>> fn() is made, fn() is made
        (True, False)
    """

    def __init__(self, fn: Callable[[], Any], instance: Any) -> None:
        self.fn = fn
        self.instance = instance
        self._pid = os.getpid()

    def __call__(self) -> Any:
        instance, self.instance = self.instance, None
        if instance is not None and os.getpid() == self._pid:
            return instance
        return self.fn()

    def close_unused(self) -> None:
        """Close the instance if no call took it."""
        instance, self.instance = self.instance, None
        if instance is not None and os.getpid() == self._pid:
            instance.close()

    def __reduce__(self):
        return (_same, (self.fn,))

    def __repr__(self) -> str:
        return repr(self.fn)


def _same(value: Any) -> Any:
    return value
