"""Registers the Gymnasium environments of installed packages (ale-py) through the plugin hook."""

from __future__ import annotations

from vecaccel import hookimpl


@hookimpl
def vecaccel_register_envs() -> None:
    try:
        import ale_py
    except ImportError:
        return
    import gymnasium as gym

    gym.register_envs(ale_py)
