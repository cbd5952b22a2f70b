"""vecaccel's bundled trainers: A2C, PPO and the DQN family, on vecaccel's sampler.

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

__all__ = ["A2C", "A2CConfig", "C51", "DQN", "DQNConfig", "PPO", "PPOConfig", "Rainbow"]

_LOCATIONS = {
    "A2C": "vecaccel.trainers.a2c",
    "A2CConfig": "vecaccel.trainers.a2c",
    "PPO": "vecaccel.trainers.ppo",
    "PPOConfig": "vecaccel.trainers.ppo",
    "DQN": "vecaccel.trainers.dqn",
    "C51": "vecaccel.trainers.dqn",
    "Rainbow": "vecaccel.trainers.dqn",
    "DQNConfig": "vecaccel.trainers.dqn",
}


def __getattr__(name: str) -> Any:
    module_path = _LOCATIONS.get(name)
    if module_path is None:
        raise AttributeError(f"module 'vecaccel.trainers' has no attribute {name!r}")
    return getattr(importlib.import_module(module_path), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
