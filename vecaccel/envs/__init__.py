"""What turns a user's env into envs: the env source, the env functions it holds, and the
messages for an id that does not resolve.

Example:
    >>> from vecaccel.envs import EnvSource
    >>> EnvSource.resolve("CartPole-v1", 2).num_envs
    2
"""

from __future__ import annotations

from vecaccel.envs.source import EnvFactory, EnvSource

__all__ = ["EnvFactory", "EnvSource"]
