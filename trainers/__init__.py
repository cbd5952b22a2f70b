"""vecaccel's bundled trainers: A2C, PPO and the DQN family, on vecaccel's sampler.

Each algorithm holds its config, networks, loss and ``update``; a runner owns the loop
(:class:`SyncRunner`, or :class:`AsyncRunner` for ``--async``), the same for every one. The
algorithms, with their summaries and presets, are listed once, in
:mod:`vecaccel.trainers.config.registry`; what this package exports is read from there.

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

from vecaccel.trainers.config.registry import exports

# name -> "module:attribute", from the registry: each algorithm and its config, the runners...
_LOCATIONS: dict[str, str] = exports()

__all__ = sorted(_LOCATIONS)


def __getattr__(name: str) -> Any:
    path = _LOCATIONS.get(name)
    if path is None:
        raise AttributeError(f"module 'vecaccel.trainers' has no attribute {name!r}")
    module_path, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_path), attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
