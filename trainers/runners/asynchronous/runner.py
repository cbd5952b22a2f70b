"""Asynchronous sampling and optimisation (``vecaccel train ALGO --async``), on one rank or several.

Two processes run at the same time: the **sampler** (a child process) steps the envs with the
latest weights it has and hands the experience over through a double buffer, while the
**optimiser** (the calling process) trains on it and publishes its weights. What they share is a
:class:`~vecaccel.trainers.runners.asynchronous.shared.CollectorChannels`. One loop
(:mod:`~vecaccel.trainers.runners.asynchronous.loop`) runs every algorithm, fed by the
:class:`~vecaccel.trainers.runners.asynchronous.loop.AsyncFeed` the algorithm hands it
(``agent.async_feed``): whole rollouts, or chunks of steps for a replay buffer.

**Several ranks** (``--nproc K`` or ``torchrun``): every rank is one such pair, with envs seeded
by rank and its own replay buffer or double buffer. The optimisers are data-parallel
(:mod:`~vecaccel.trainers.services.distributed`), so every update is a collective and the ranks update
in lockstep. They meet for their metrics and to agree on a stop (SIGINT/SIGTERM) at points fixed
by the update count; rank 0 logs and writes the checkpoints. A collector process that dies ends its
rank with a :class:`CollectorError`; the other ranks then fail at their next collective, which has a
timeout, and ``torchrun`` stops the job. A sampler exits when its optimiser's process goes away.

Example:
    >>> import torch; torch.set_num_threads(1)
    >>> from vecaccel.trainers import DQN, AsyncRunner
    >>> agent = DQN(env=None, env_id="CartPole-v1", learning_starts=64, batch_size=16,
    ...             buffer_size=500, progress=False, tensorboard=False)
    >>> runner = AsyncRunner(agent)
    >>> _ = runner.run(400)
    >>> runner.stats.env_steps, abs(runner.stats.replay_ratio - agent.config.replay_ratio) < 0.5
    (400, True)
"""

from __future__ import annotations

from typing import Any

from vecaccel.trainers.runners.asynchronous.loop import AsyncStats, run_async
from vecaccel.trainers.runners.asynchronous.process import (
    CollectorError,
    CollectorOptions,
    leave_cores_to_collector,
)

__all__ = ["AsyncRunner", "AsyncStats", "CollectorError"]


class AsyncRunner:
    """Trains an algorithm with a collector process beside it: the twin of
    :class:`~vecaccel.trainers.runners.sync.SyncRunner`, for every algorithm.

    The collector process builds its own envs from the agent's env id (``config.env_id``): an
    agent made with ``env=None`` and ``env_id=...`` builds none in this process (an off-policy
    one gets its networks here, from one env of that id). An agent that has envs of its own
    keeps them, unused by this runner. What the collector process hands over and how the
    updates are made of it is the algorithm's feed (``agent.async_feed``).

    Args:
        agent: any :class:`~vecaccel.trainers.algos.base.Algorithm`, new or loaded from a
            checkpoint.

    Attributes:
        stats: the :class:`AsyncStats` of the last :meth:`run` (``None`` before one).

    Example:
        >>> from vecaccel.trainers import PPO, AsyncRunner
        >>> agent = PPO(None, env_id="CartPole-v1", backend="serial", num_envs=2, num_steps=8)
        >>> _ = AsyncRunner(agent).run(32, context="fork")
        >>> agent.global_step, agent.num_updates
        (32, 2)
    """

    def __init__(self, agent: Any) -> None:
        from vecaccel.trainers.algos.base import Algorithm

        if not isinstance(agent, Algorithm):
            raise TypeError(f"AsyncRunner trains an Algorithm, got {type(agent).__name__}")
        self.agent = agent
        self.stats: AsyncStats | None = None
        agent.prepare_async()

    def run(
        self,
        total_timesteps: int | None = None,
        callback: Any = None,
        *,
        reset_num_timesteps: bool = True,
        weight_sync_period: int | None = None,
        fixed_lag: bool = False,
        context: str = "spawn",
        poll_interval: float = 0.0005,
        collector_threads: int = 1,
        collector_affinity: set[int] | None = None,
    ) -> Any:
        """Train ``total_timesteps`` more env steps, over all ranks (``None``: finish a loaded
        run's budget); the measured :class:`AsyncStats` are then in :attr:`stats`.

        A2C and PPO round ``total_timesteps`` up to whole batches. Checkpoints go to ``run_dir``
        every ``checkpoint_every`` updates and when the run ends or is stopped (SIGINT,
        SIGTERM); they record the asynchronous options, so that ``vecaccel train --resume``
        goes on alike.

        Args:
            total_timesteps: env steps to collect.
            callback: ``callback(agent, metrics)`` after every turn of the loop (an item of
                experience taken and the updates it made due: a rollout and its update, or a
                chunk of steps and its updates), an SB3 ``BaseCallback``, or a list of them;
                see :mod:`vecaccel.trainers.runners.callbacks`.
            reset_num_timesteps: count env steps and updates (and so the schedules and
                ``learning_starts``) from zero, as SB3 does; ``False`` continues them.
            weight_sync_period: updates between weight copies to the collector process
                (``None``: 1); the DQN family's optimiser publishes at the end of a chunk once
                that many updates were made since the last copy. Checkpoints record it.
            fixed_lag: a fixed policy lag, so that a seeded run repeats exactly: batch ``n`` is
                collected with the weights of update ``n - 1`` (needs ``weight_sync_period=1``),
                chunk ``n`` with those published after chunk ``n - 2``'s updates.
            context: multiprocessing start method of the collector process.
            poll_interval: seconds between checks that the collector process lives while this
                process waits for it to start.
            collector_threads: torch threads of the collector process.
            collector_affinity: CPUs to pin the collector process to (``None``: this process's).

        Returns:
            The agent.

        Raises:
            ValueError: the options do not fit (a fixed lag with another weight-sync period),
                or the agent names no env id for the sampler to build.
            CollectorError: the collector process died or raised.
            TrainingInterrupted: SIGINT or SIGTERM arrived (after the checkpoint was written).
        """
        agent = self.agent
        if weight_sync_period is None:
            weight_sync_period = 1
        if weight_sync_period < 1:
            raise ValueError(f"weight_sync_period must be at least 1, got {weight_sync_period}")
        _env_id(agent)
        options = CollectorOptions(
            context, poll_interval, collector_threads, collector_affinity, bool(fixed_lag)
        )
        leave_cores_to_collector(agent.config, collector_threads)
        feed = agent.async_feed(
            total_timesteps,
            reset_num_timesteps=reset_num_timesteps,
            weight_sync_period=weight_sync_period,
            options=options,
        )
        self.stats = run_async(agent, feed, callback)
        return agent


def _env_id(agent: Any) -> str:
    env_id = agent.config.env_id
    if env_id is None:
        raise ValueError(
            f"AsyncRunner builds the envs in the collector process from an env id: create the "
            f"{type(agent).__name__} with env_id=... (its env has no id)"
        )
    return env_id
