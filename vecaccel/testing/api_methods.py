"""The methods :func:`vecaccel.testing.check_backend` calls on a backend's vector env, and what
to do about one that is missing.

``gymnasium.vector.VectorEnv`` declares ``step`` and ``reset`` but neither the
``step_async``/``step_wait`` pair nor ``call``/``get_attr``/``set_attr``: a backend built on it
alone would stop the kit with a bare ``AttributeError``. :func:`missing_methods` names each one
with its fix, so that the kit reports it as every other property: an ``AssertionError`` saying
what broke and how to fix it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REQUIRED_METHODS", "missing_methods"]

_SUBCLASS = "subclass vecaccel.VecEnv"

#: The methods the kit calls, each with how a backend gets it.
REQUIRED_METHODS: dict[str, str] = {
    "reset": "implement reset(*, seed=None, options=None) -> (obs, infos)",
    "step": f"{_SUBCLASS}, whose step(actions) is step_async(actions) then step_wait()",
    "step_async": f"{_SUBCLASS} and implement step_async(actions): check the whole batch "
    "(self._check_actions) before any env steps, then start the step",
    "step_wait": f"{_SUBCLASS} and implement step_wait(timeout=None) -> (obs, rewards, "
    "terminated, truncated, infos), raising gymnasium.error.NoAsyncCallError when no step is "
    "pending",
    "call": f"{_SUBCLASS} and implement call(name, *args, **kwargs) (or call_indices), one "
    "result per env in a tuple, an env's error raised as vecaccel.errors.env_error(exc, i, "
    "'call')",
    "get_attr": f"{_SUBCLASS}, whose get_attr(name) is call(name)",
    "set_attr": f"{_SUBCLASS} and implement set_attr(name, values) (or set_attr_indices): one "
    "value for all envs or one per env, ValueError for another count",
    "close": "implement close() (vecaccel.VecEnv's calls close_extras() once)",
}


#: What ``vecaccel.VecEnv``'s own methods call; its ``*_indices`` methods raise ``TypeError``.
_RESTS_ON = {"get_attr": "call", "call": "call_indices", "set_attr": "set_attr_indices"}


def _placeholder(envs: Any, method: str) -> bool:
    """Whether ``method`` is ``vecaccel.VecEnv``'s own and ends, through what it calls, at an
    ``*_indices`` method the backend left as the placeholder that raises ``TypeError``."""
    from vecaccel.vec_env import VecEnv

    if not isinstance(envs, VecEnv) or getattr(type(envs), method) is not getattr(VecEnv, method):
        return False
    return method not in _RESTS_ON or _placeholder(envs, _RESTS_ON[method])


def missing_methods(envs: Any) -> list[tuple[str, str]]:
    """``(method, how to get it)`` for each method of :data:`REQUIRED_METHODS` that ``envs``
    lacks, or has only as ``vecaccel.VecEnv``'s placeholder.

    Example:
        >>> import gymnasium as gym
        >>> envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
        >>> [method for method, _ in missing_methods(envs)]
        ['step_async', 'step_wait']
        >>> envs.close()
    """
    return [
        (method, fix)
        for method, fix in REQUIRED_METHODS.items()
        if not callable(getattr(envs, method, None))
        or (method in _RESTS_ON and _placeholder(envs, method))
    ]
