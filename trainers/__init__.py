"""vecaccel's bundled trainers: A2C, PPO and the DQN family, on vecaccel's sampler.

Each algorithm holds its config, networks, loss and ``update``; a runner owns the loop
(:class:`SyncRunner` here, or the asynchronous runner of ``--async``), the same for every one.

Everything here imports torch, lazily: ``import vecaccel.trainers`` alone stays light.

Example:
    >>> from vecaccel.trainers import PPO
    >>> agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=4)
    >>> _ = agent.learn(total_steps=8)
    >>> agent.close()
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "A2C",
    "A2CConfig",
    "Algorithm",
    "AsyncRunner",
    "C51",
    "DQN",
    "DQNConfig",
    "PPO",
    "PPOConfig",
    "Rainbow",
    "RunConfig",
    "SyncRunner",
]

_LOCATIONS = {
    "A2C": "vecaccel.trainers.algos.a2c",
    "A2CConfig": "vecaccel.trainers.algos.a2c",
    "PPO": "vecaccel.trainers.algos.ppo",
    "PPOConfig": "vecaccel.trainers.algos.ppo",
    "DQN": "vecaccel.trainers.algos.dqn",
    "C51": "vecaccel.trainers.algos.dqn",
    "Rainbow": "vecaccel.trainers.algos.dqn",
    "DQNConfig": "vecaccel.trainers.algos.dqn",
    "Algorithm": "vecaccel.trainers.algos.base",
    "RunConfig": "vecaccel.trainers.config",
    "SyncRunner": "vecaccel.trainers.runners.sync",
    "AsyncRunner": "vecaccel.trainers.runners.asynchronous.runner",
}


def __getattr__(name: str) -> Any:
    module_path = _LOCATIONS.get(name)
    if module_path is None:
        raise AttributeError(f"module 'vecaccel.trainers' has no attribute {name!r}")
    return getattr(importlib.import_module(module_path), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
