"""How :func:`vecaccel.testing.check_backend` compares a backend's results with
``SyncVectorEnv``'s: the first difference in a tree of dicts, tuples and arrays, one env's part of
a batch (observations and Gymnasium-batched infos), and dtypes and shapes against a space.

Example:
    >>> import numpy as np
    >>> difference({"a": np.zeros(2)}, {"a": np.ones(2)}, "obs")
    "obs['a'] is [0.0, 0.0], expected [1.0, 1.0]"
    >>> unbatch_info({"t": np.array([1, 2]), "_t": np.array([True, False])}, 0)
    {'t': np.int64(1)}
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "batch_size_of",
    "describe",
    "difference",
    "item_of",
    "leaf_problems",
    "show",
    "unbatch_info",
]


def difference(actual: Any, expected: Any, path: str) -> str | None:
    """The first difference between two results (trees of dicts, tuples and arrays), or
    ``None``: same keys, types, dtypes, shapes and values (NaN equal to NaN)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path} is {type(actual).__name__}, expected a dict"
        if sorted(actual) != sorted(expected):
            return f"{path} has keys {sorted(actual)}, expected {sorted(expected)}"
        for key in expected:
            found = difference(actual[key], expected[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, (tuple, list)):
        if type(actual) is not type(expected) or len(actual) != len(expected):
            return f"{path} is {describe(actual)}, expected {describe(expected)}"
        for i, (a, b) in enumerate(zip(actual, expected)):
            found = difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(expected, np.ndarray):
        if not isinstance(actual, np.ndarray):
            return f"{path} is {describe(actual)}, expected {describe(expected)}"
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            return f"{path} is {describe(actual)}, expected {describe(expected)}"
        if expected.dtype == object:
            for index in np.ndindex(expected.shape):
                found = difference(actual[index], expected[index], f"{path}[{index}]")
                if found:
                    return found
            return None
        equal_nan = expected.dtype.kind in "fc"
        if not np.array_equal(actual, expected, equal_nan=equal_nan):
            return f"{path} is {actual.tolist()!r}, expected {expected.tolist()!r}"
        return None
    if type(actual) is not type(expected):
        return (
            f"{path} is {show(actual)} ({type(actual).__name__}), expected {show(expected)} "
            f"({type(expected).__name__})"
        )
    if actual != expected and not (actual != actual and expected != expected):  # NaN
        return f"{path} is {show(actual)}, expected {show(expected)}"
    return None


def show(value: Any) -> str:
    return repr(value.item() if isinstance(value, np.generic) else value)


def describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    return f"{type(value).__module__}.{type(value).__name__}"


def item_of(space: gym.Space[Any], batch: Any, position: int) -> Any:
    """The item of one env in a batch of ``space``."""
    if isinstance(space, spaces.Dict):
        return {key: item_of(sub, batch[key], position) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(item_of(sub, part, position) for sub, part in zip(space.spaces, batch))
    return batch[position]


def batch_size_of(batch: Any) -> int:
    """The number of envs in a batch: the length of its first leaf."""
    while isinstance(batch, (dict, tuple)) and not (isinstance(batch, tuple) and not batch):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(batch)


def unbatch_info(infos: dict[str, Any], position: int) -> dict[str, Any]:
    """What env ``position`` of a batch contributed to Gymnasium-batched infos."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id":
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[position]:
            continue
        out[key] = unbatch_info(value, position) if isinstance(value, dict) else value[position]
    return out


def leaf_problems(space: gym.Space[Any], value: Any, size: int, path: str) -> str | None:
    """What is wrong with the dtype or shape of a batch of ``size`` items of ``space``."""
    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict) or sorted(value) != sorted(space.spaces):
            return f"{path} is {describe(value)}, the space has keys {sorted(space.spaces)}"
        for key, sub in space.spaces.items():
            found = leaf_problems(sub, value[key], size, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(space, spaces.Tuple):
        if not isinstance(value, tuple) or len(value) != len(space.spaces):
            return f"{path} is {describe(value)}, the space is a Tuple of {len(space.spaces)}"
        for i, (sub, part) in enumerate(zip(space.spaces, value)):
            found = leaf_problems(sub, part, size, f"{path}[{i}]")
            if found:
                return found
        return None
    shape = (size, *space.shape)  # type: ignore[misc]  # a leaf space has a shape
    if not isinstance(value, np.ndarray) or value.dtype != space.dtype or value.shape != shape:
        return (
            f"{path} is {describe(value)}, the space {space} says dtype {space.dtype} and "
            f"shape {shape}"
        )
    return None
