"""Spaces as plain data, so that a checkpoint loads with ``torch.load(weights_only=True)``.

Every space the trainers accept is described by a dict of strings, numbers, lists and tensors:
``Box`` of any dtype (``bool`` and ``uint8`` included), ``Discrete`` with its ``start``,
``MultiBinary``, ``MultiDiscrete`` with its ``start``, and ``Tuple`` and ``Dict`` of them.

Example:
    >>> import gymnasium as gym
    >>> space = gym.spaces.MultiDiscrete([3, 4], start=[1, 0])
    >>> space_from_dict(space_to_dict(space)) == space
    True
    >>> space_to_dict(gym.spaces.Discrete(5, start=-2))
    {'type': 'Discrete', 'n': 5, 'start': -2}
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["space_from_dict", "space_to_dict"]


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """Describe ``space`` with plain data.

    Raises:
        TypeError: a space the trainers cannot train on (``Text``, ``Graph``, ``Sequence``...).
    """
    import torch

    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": torch.from_numpy(np.array(space.low)),
            "high": torch.from_numpy(np.array(space.high)),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.atleast_1d(space.n).astype(int).tolist()}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            # tensors keep the shape of a multi-axis nvec, as lists would not for an empty axis
            "nvec": torch.from_numpy(np.array(space.nvec, dtype=np.int64)),
            "start": torch.from_numpy(np.array(space.start, dtype=np.int64)),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_dict(item) for item in space.spaces]}
    if isinstance(space, gym.spaces.Dict):
        return {
            "type": "Dict",
            "spaces": {str(key): space_to_dict(item) for key, item in space.spaces.items()},
        }
    raise TypeError(f"cannot store a {type(space).__name__} space in a checkpoint")


def space_from_dict(data: dict[str, Any]) -> gym.Space:
    """The space :func:`space_to_dict` described."""
    kind = data["type"]
    if kind == "Discrete":
        return gym.spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
    if kind == "Box":
        low, high = data["low"].numpy(), data["high"].numpy()
        return gym.spaces.Box(low=low, high=high, shape=low.shape, dtype=np.dtype(data["dtype"]))
    if kind == "MultiBinary":
        n = list(data["n"])
        return gym.spaces.MultiBinary(n[0] if len(n) == 1 else n)
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(
            data["nvec"].numpy(), dtype=np.dtype(data["dtype"]), start=data["start"].numpy()
        )
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_dict(item) for item in data["spaces"]])
    if kind == "Dict":
        return gym.spaces.Dict({key: space_from_dict(item) for key, item in data["spaces"].items()})
    raise ValueError(f"a checkpoint records a space of unknown type {kind!r}")
