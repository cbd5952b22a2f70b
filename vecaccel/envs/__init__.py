"""What turns a user's env into envs: the env source, the env functions it holds, and the
messages for an id that does not resolve.

Example:
    >>> from vecaccel.envs import EnvSource
    >>> EnvSource.resolve("CartPole-v1", 2).num_envs
    2
"""

from __future__ import annotations

from vecaccel.envs.env_fns import EnvCall, PrebuiltEnvFn, make_gym_env, make_pettingzoo_env
from vecaccel.envs.source import EnvSource

__all__ = ["EnvCall", "EnvSource", "PrebuiltEnvFn", "make_gym_env", "make_pettingzoo_env"]
