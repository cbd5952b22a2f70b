"""An example third-party vecaccel plugin: the ``example-threads`` backend.

vecaccel finds this module through the ``vecaccel`` entry-point group declared in this package's
``pyproject.toml`` and calls its hook implementations, exactly as it does for its built-in
backends.

Once the package is installed, ``vecaccel.make_vec("CartPole-v1", 2, backend="example-threads")``
builds the backend; the factory can also be called directly.

Example:
    >>> import gymnasium as gym
    >>> from vecaccel_example_plugin import make_thread_vec_env
    >>> envs = make_thread_vec_env([lambda: gym.make("CartPole-v1")] * 2)
    >>> obs, infos = envs.reset(seed=0)
    >>> obs.shape
    (2, 4)
    >>> envs.close()
"""

from __future__ import annotations

from vecaccel import BackendRegistry, hookimpl
from vecaccel_example_plugin.threads import ThreadOptions, ThreadVecEnv, make_thread_vec_env

__all__ = ["ThreadOptions", "ThreadVecEnv", "make_thread_vec_env", "vecaccel_register_backends"]
__version__ = "0.1.0"


@hookimpl
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    """Register the ``example-threads`` backend."""
    registry.add(
        "example-threads",
        make_thread_vec_env,
        "example plugin: envs stepped by a thread pool in the caller's process",
        options=ThreadOptions,
    )
