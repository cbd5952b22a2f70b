"""The runners: the loops that drive an algorithm, synchronous or asynchronous.

:class:`~vecaccel.trainers.runners.sync.SyncRunner` and
:class:`~vecaccel.trainers.runners.asynchronous.runner.AsyncRunner` are twins: each takes any
algorithm and ``run(total_timesteps)`` trains it. ``agent.learn(total_timesteps, mode=...)`` picks
one of them with :func:`run_in_mode`. Callbacks: :mod:`vecaccel.trainers.runners.callbacks`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MODES", "run_in_mode"]

#: the values of ``learn(..., mode=...)``
MODES = ("sync", "async")


def run_in_mode(
    agent: Any,
    mode: str,
    total_timesteps: int | None,
    *,
    callback: Any = None,
    reset_num_timesteps: bool = True,
    **async_options: Any,
) -> Any:
    """Train ``agent`` for ``total_timesteps`` with the runner of ``mode``; what that runner's
    ``run`` returns (the agent, or the asynchronous run's stats).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`, or options do not fit it.
    """
    if mode == "sync":
        if async_options:
            raise ValueError(
                f"learn(mode='sync') takes no asynchronous options, got {sorted(async_options)}"
            )
        from vecaccel.trainers.runners.sync import SyncRunner

        return SyncRunner(agent).run(total_timesteps, callback, reset_num_timesteps)
    if mode == "async":
        from vecaccel.trainers.runners.asynchronous.runner import AsyncRunner

        return AsyncRunner(agent).run(
            total_timesteps, callback, reset_num_timesteps=reset_num_timesteps, **async_options
        )
    raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
