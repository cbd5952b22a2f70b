"""Deprecated asynchronous functions, each a wrapper that warns and forwards to the runner.

Each warns with a :class:`DeprecationWarning` naming the call that replaces it
(:class:`~vecaccel.trainers.runners.asynchronous.runner.AsyncRunner`, or ``agent.learn(...,
mode="async")``) and forwards to it. They are importable from
``vecaccel.trainers.runners.asynchronous.runner`` too. They follow the deprecation
policy in ``CHANGELOG.md``.
"""

from __future__ import annotations

import warnings
from typing import Any

from vecaccel.trainers.runners.asynchronous.loop import AsyncStats
from vecaccel.trainers.runners.asynchronous.runner import (
    AsyncRunner,
    _build_networks_for,
    _is_on_policy,
)

__all__ = [
    "learn_async",
    "learn_async_on_policy",
    "make_async_agent",
    "make_async_on_policy_agent",
    "train_async",
    "train_async_dqn",
    "train_async_on_policy",
]


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def make_async_agent(cls: type, env_id: str, **config: Any) -> Any:
    """A DQN-family agent with networks built for ``env_id`` but no envs (deprecated).

    .. deprecated:: use ``cls(env=None, env_id=env_id, **config)`` and :class:`AsyncRunner`
       (it builds the networks of an agent without envs).
    """
    _deprecated(
        "make_async_agent(cls, env_id, ...)",
        "cls(env=None, env_id=env_id, ...) with AsyncRunner(agent).run(total_steps)",
    )
    agent = cls(env=None, **{**config, "env_id": env_id})
    _build_networks_for(agent, env_id)
    return agent


def make_async_on_policy_agent(cls: type, env_id: str, **config: Any) -> Any:
    """An A2C or PPO agent for ``env_id`` without envs (deprecated).

    .. deprecated:: use ``cls(None, env_id=env_id, **config)`` and :class:`AsyncRunner`.
    """
    _deprecated(
        "make_async_on_policy_agent(cls, env_id, ...)",
        "cls(None, env_id=env_id, ...) with AsyncRunner(agent).run(total_steps)",
    )
    return cls(None, env_id=env_id, **config)


def learn_async(
    agent: Any,
    env_id: str,
    total_steps: int,
    *,
    reset_num_timesteps: bool = True,
    fixed_lag: bool = False,
    context: str = "spawn",
    poll_interval: float = 0.0005,
    sampler_threads: int = 1,
    sampler_affinity: set[int] | None = None,
) -> AsyncStats:
    """Train a DQN-family ``agent`` asynchronously on ``env_id`` (deprecated); its stats.

    .. deprecated:: use ``AsyncRunner(agent).run(total_steps, ...)`` (its ``stats``), or
       ``agent.learn(total_steps, mode="async")``.
    """
    _deprecated("learn_async(agent, env_id, total_steps)", "AsyncRunner(agent).run(total_steps)")
    if _is_on_policy(agent):
        raise TypeError(
            f"learn_async trains the DQN family, got {type(agent).__name__}; use "
            "AsyncRunner(agent).run(total_steps)"
        )
    agent.config.env_id = env_id
    runner = AsyncRunner(agent)
    runner.run(
        total_steps,
        reset_num_timesteps=reset_num_timesteps,
        fixed_lag=fixed_lag,
        context=context,
        poll_interval=poll_interval,
        sampler_threads=sampler_threads,
        sampler_affinity=sampler_affinity,
    )
    assert runner.stats is not None
    return runner.stats


def learn_async_on_policy(
    agent: Any,
    total_steps: int | None,
    *,
    weight_sync_period: int = 1,
    fixed_lag: bool = False,
    context: str = "spawn",
    poll_interval: float = 0.0005,
    sampler_threads: int = 1,
    sampler_affinity: set[int] | None = None,
) -> AsyncStats:
    """Train an A2C or PPO agent asynchronously (deprecated); its stats.

    .. deprecated:: use ``AsyncRunner(agent).run(total_steps, ...)`` (its ``stats``), or
       ``agent.learn(total_steps, mode="async")``.
    """
    _deprecated("learn_async_on_policy(agent, total_steps)", "AsyncRunner(agent).run(total_steps)")
    if not _is_on_policy(agent):
        raise TypeError(
            f"learn_async_on_policy trains A2C and PPO, got {type(agent).__name__}; use "
            "AsyncRunner(agent).run(total_steps)"
        )
    runner = AsyncRunner(agent)
    runner.run(
        total_steps,
        weight_sync_period=weight_sync_period,
        fixed_lag=fixed_lag,
        context=context,
        poll_interval=poll_interval,
        sampler_threads=sampler_threads,
        sampler_affinity=sampler_affinity,
    )
    assert runner.stats is not None
    return runner.stats


def train_async(
    cls: type,
    env_id: str,
    total_steps: int,
    run_dir: str | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    weight_sync_period: int | None = None,
    fixed_lag: bool = False,
    **config: Any,
) -> int:
    """:func:`train` under another name (deprecated).

    .. deprecated:: use ``AsyncRunner(agent).run(total_steps)`` from Python
       (``vecaccel train ALGO --async`` on the command line).
    """
    _deprecated("train_async(cls, env_id, total_steps)", "AsyncRunner(agent).run(total_steps)")
    from vecaccel.trainers.runners.asynchronous import command_line

    return command_line.train(
        cls,
        env_id,
        total_steps,
        run_dir=run_dir,
        progress=progress,
        tensorboard=tensorboard,
        weight_sync_period=weight_sync_period,
        fixed_lag=fixed_lag,
        **config,
    )


# one name per family for the same function (deprecated with train_async)
train_async_dqn = train_async
train_async_on_policy = train_async
