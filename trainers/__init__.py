"""vecaccel's bundled trainers: A2C, PPO, the DQN family and PQN, on vecaccel's sampler.

Each algorithm holds its config, networks, loss and ``update``; a runner owns the loop
(:class:`SyncRunner`, or :class:`AsyncRunner` for ``--async``), the same for every one. The
algorithms, with their summaries and presets, are listed once, in
:mod:`vecaccel.trainers.config.registry`; what this package exports is read from there.

Everything here imports torch, lazily: ``import vecaccel.trainers`` alone stays light.

Example:
    >>> from vecaccel.trainers import PPO
    >>> agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=4)
    >>> _ = agent.learn(total_timesteps=8)
    >>> agent.close()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vecaccel.trainers.config.registry import exports

if TYPE_CHECKING:  # what checkers and editors see; at run time __getattr__ imports on first use
    from vecaccel.trainers.algos.a2c import A2C, A2CConfig
    from vecaccel.trainers.algos.base import Algorithm
    from vecaccel.trainers.algos.dqn import C51, DQN, DQNConfig, Rainbow
    from vecaccel.trainers.algos.ppo import PPO, PPOConfig
    from vecaccel.trainers.algos.pqn import PQN, PQNConfig
    from vecaccel.trainers.config.settings import RunConfig
    from vecaccel.trainers.runners.asynchronous.runner import AsyncRunner
    from vecaccel.trainers.runners.sync import SyncRunner

# name -> "module:attribute", from the registry: each algorithm and its config, the runners...
_LOCATIONS: dict[str, str] = exports()

__all__ = [  # the registry's exports, written out for checkers (a test keeps them equal)
    "A2C",
    "A2CConfig",
    "Algorithm",
    "AsyncRunner",
    "C51",
    "DQN",
    "DQNConfig",
    "PPO",
    "PPOConfig",
    "PQN",
    "PQNConfig",
    "Rainbow",
    "RunConfig",
    "SyncRunner",
]


def __getattr__(name: str) -> Any:
    path = _LOCATIONS.get(name)
    if path is None:
        raise AttributeError(f"module 'vecaccel.trainers' has no attribute {name!r}")
    module_path, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_path), attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
