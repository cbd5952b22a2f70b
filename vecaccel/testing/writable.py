"""Whether what a backend returns can be written to, as ``SyncVectorEnv``'s arrays can.

A caller normalises observations in place, or hands them to ``torch.as_tensor``, which warns
("The given NumPy array is not writable") and shares memory it may not write. Arrays come back
read-only when a backend passes on a buffer it received (pickle-5 out-of-band buffers, Ray's
object store) instead of copying it into its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["read_only_arrays"]


def _arrays(value: Any, path: str) -> Iterator[tuple[str, np.ndarray]]:
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            for index, item in enumerate(value.flat):
                yield from _arrays(item, f"{path}[{index}]")
        else:
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _arrays(item, f"{path}[{key!r}]")
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _arrays(item, f"{path}[{index}]")


def read_only_arrays(result: tuple[Any, ...]) -> list[str]:
    """The parts of a ``step`` result ``(obs, rewards, terminated, truncated, infos)`` (or a
    ``reset`` result with ``None`` for the middle three) that are read-only numpy arrays:
    observations, rewards, flags and ``infos["final_obs"]``, each named as it is reached.

    Example:
        >>> obs = np.zeros((2, 3))
        >>> final = np.empty(2, dtype=object)
        >>> final[:] = [np.zeros(3), None]
        >>> final[0].flags.writeable = False
        >>> read_only_arrays((obs, np.zeros(2), None, None, {"final_obs": final}))
        ["infos['final_obs'][0]"]
    """
    obs, rewards, terminated, truncated, infos = result
    parts: list[tuple[str, Any]] = [
        ("observations", obs),
        ("rewards", rewards),
        ("terminated", terminated),
        ("truncated", truncated),
    ]
    if isinstance(infos, dict) and "final_obs" in infos:
        parts.append(("infos['final_obs']", infos["final_obs"]))
    return [
        path
        for label, value in parts
        for path, array in _arrays(value, label)
        if not array.flags.writeable
    ]
