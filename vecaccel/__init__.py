"""vecaccel: fast, safe vectorized environments for deep RL.

Example:
    >>> import vecaccel
    >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="serial")
    >>> obs, infos = envs.reset(seed=42)
    >>> obs.shape
    (4, 4)
    >>> envs.close()
"""

from __future__ import annotations

from typing import Any

import pluggy
from gymnasium.vector import AutoresetMode

from vecaccel.envs.source import EnvSource
from vecaccel.errors import ClosedEnvError, WorkerError, WorkerTimeoutError
from vecaccel.make import make_vec
from vecaccel.manager import BackendRegistry, get_plugin_manager, list_backends
from vecaccel.vec_env import VecEnv


def _read_version() -> str:
    """The installed distribution's version (pyproject.toml holds the one place it is written).

    A checkout put on ``sys.path`` without being installed has no metadata: its version is then
    read from the ``pyproject.toml`` beside the package, or is ``0+unknown``.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vecaccel")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        except OSError:
            found = None
        return found.group(1) if found else "0+unknown"


#: The package's version, from its metadata (``importlib.metadata.version("vecaccel")``).
__version__: str = _read_version()

hookimpl = pluggy.HookimplMarker("vecaccel")
"""Marker for hook implementations: ``@vecaccel.hookimpl`` on a plugin's functions named after
the hooks of :mod:`vecaccel.hookspecs`."""

__all__ = [
    "AutoresetMode",
    "BackendRegistry",
    "ClosedEnvError",
    "EnvSource",
    "VecEnv",
    "WorkerError",
    "WorkerTimeoutError",
    "get_plugin_manager",
    "hookimpl",
    "list_backends",
    "make_vec",
    "Sampler",
]


def __getattr__(name: str) -> Any:
    # torch-dependent parts load on first use so that `import vecaccel` never imports torch
    if name == "Sampler":
        from vecaccel.sampler import Sampler

        return Sampler
    raise AttributeError(f"module 'vecaccel' has no attribute {name!r}")
