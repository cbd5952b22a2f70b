"""Asynchronous sampling and optimisation (``vecaccel train ALGO --async``), on one rank or several.

Two processes run at the same time:

- the **sampler** (a child process) steps the envs with the latest weights it has and hands the
  experience over through a double buffer: the DQN family chunks of steps, which the optimiser
  adds to its replay buffer, A2C and PPO whole ``[T, B]`` rollouts;
- the **optimiser** (the calling process) trains on that experience.

What they share lives in shared memory
(:mod:`~vecaccel.trainers.runners.asynchronous.shared`): the two slots of the double buffer,
the weights the sampler acts with (behind a lock), and a few named counters. The optimiser
publishes its weights every ``weight_sync_period`` updates (the DQN family's at the end of a
chunk). With automatic torch threads the optimiser leaves the sampler's
cores to it.

:class:`AsyncRunner` is the twin of :class:`~vecaccel.trainers.runners.sync.SyncRunner`:
``AsyncRunner(agent).run(total_steps)`` trains any of the five algorithms, and
``agent.learn(total_steps, mode="async")`` is the same call. One loop
(:mod:`~vecaccel.trainers.runners.asynchronous.loop`) runs every algorithm; the algorithm's base
class decides only what it is fed (:mod:`~vecaccel.trainers.runners.asynchronous.rollout_feed`:
rollouts for an :class:`~vecaccel.trainers.algos.on_policy.OnPolicyAlgorithm`;
:mod:`~vecaccel.trainers.runners.asynchronous.replay_feed`: chunks of steps for an
:class:`~vecaccel.trainers.algos.off_policy.OffPolicyAlgorithm`'s replay buffer, the replay
ratio held at every chunk's end). The measured ratio, the fraction of time each side waited and
the policy lag (updates the sampler's weights are behind) are logged.
With ``fixed_lag=True`` either family repeats a seeded run exactly.

**Several ranks** (``--nproc K`` or ``torchrun``): every rank is one such pair, an optimiser with
its own sampler process, envs seeded by rank, and its own replay buffer or rollout double buffer.
The optimisers are data-parallel: the algorithm's model is wrapped in ``DistributedDataParallel``
(:mod:`~vecaccel.trainers.run.distributed`: gloo on CPUs, NCCL with one GPU per rank), so each
update's gradients are averaged over ranks and the parameters stay identical. Every update is
therefore a collective and the ranks update in lockstep; each rank holds the replay ratio with its
own sampler's chunks, which makes it the same ratio globally. The ranks meet for their metrics and
to agree on a stop (SIGINT/SIGTERM) at points fixed by the update count, so they always call the
same collectives in the same order; rank 0 logs the reduced metrics and writes the checkpoints.

A sampler process that dies is reported at once: the optimiser checks it at every turn of its
loop and raises :class:`SamplerError` with the child's exit code and traceback (and rank), which
ends that rank; the other ranks then fail at their next collective (gloo sees the closed
connection; every collective also has a timeout) and ``torchrun`` stops the job. The sampler
exits when its optimiser's process goes away.

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
    SamplerError,
    SamplerOptions,
    leave_cores_to_sampler,
)
from vecaccel.trainers.runners.asynchronous.replay_feed import ReplayFeed
from vecaccel.trainers.runners.asynchronous.rollout_feed import RolloutFeed, num_batches_for

__all__ = ["AsyncRunner", "AsyncStats", "SamplerError"]


def _is_on_policy(agent: Any) -> bool:
    """Whether ``agent`` is on-policy (else off-policy), from the algorithm's base class."""
    from vecaccel.trainers.algos.off_policy import OffPolicyAlgorithm
    from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm

    if isinstance(agent, OnPolicyAlgorithm):
        return True
    if isinstance(agent, OffPolicyAlgorithm):
        return False
    raise TypeError(
        f"AsyncRunner trains an OnPolicyAlgorithm or an OffPolicyAlgorithm, got "
        f"{type(agent).__name__}"
    )


class AsyncRunner:
    """Trains an algorithm with a sampler process beside it: the twin of
    :class:`~vecaccel.trainers.runners.sync.SyncRunner`, for every algorithm.

    The sampler process builds its own envs from the agent's env id (``config.env_id``, the id
    the agent was created with): an agent made with ``env=None`` and ``env_id=...`` builds none
    in this process (an off-policy one gets its networks here, from one env of that id). An
    agent that has envs of its own keeps them, unused by this runner.

    Args:
        agent: an :class:`~vecaccel.trainers.algos.on_policy.OnPolicyAlgorithm` (A2C, PPO) or
            an :class:`~vecaccel.trainers.algos.off_policy.OffPolicyAlgorithm` (DQN, C51,
            Rainbow), new or loaded from a checkpoint.

    Attributes:
        on_policy: whether the agent is on-policy (rollouts) or off-policy (replay).
        stats: the :class:`AsyncStats` of the last :meth:`run` (``None`` before one).

    Example:
        >>> from vecaccel.trainers import PPO, AsyncRunner
        >>> agent = PPO(None, env_id="CartPole-v1", backend="serial", num_envs=2, num_steps=8)
        >>> _ = AsyncRunner(agent).run(32, context="fork")
        >>> agent.global_step, agent.num_updates
        (32, 2)
    """

    def __init__(self, agent: Any) -> None:
        self.on_policy = _is_on_policy(agent)
        self.agent = agent
        self.stats: AsyncStats | None = None
        if not self.on_policy and agent.observation_space is None:
            # networks for the spaces of the env the sampler will build (under torchrun the
            # agent has joined the process group: its model is then data-parallel)
            _build_networks_for(agent, _env_id(agent))

    def run(
        self,
        total_steps: int | None = None,
        *,
        reset_num_timesteps: bool = True,
        weight_sync_period: int | None = None,
        fixed_lag: bool = False,
        context: str = "spawn",
        poll_interval: float = 0.0005,
        sampler_threads: int = 1,
        sampler_affinity: set[int] | None = None,
    ) -> Any:
        """Train ``total_steps`` more env steps, over all ranks (``None``: finish a loaded
        run's budget); the measured :class:`AsyncStats` are then in :attr:`stats`.

        A2C and PPO: a rollout process collects ``[T, B]`` batches into a shared double buffer
        while this process updates on the other one (``total_steps`` rounded up to whole
        batches). The DQN family: the sampler collects chunks of steps that this process adds
        to the replay buffer before the updates they make due. Checkpoints go to ``run_dir`` every
        ``checkpoint_every`` updates and when the run ends or is stopped (SIGINT, SIGTERM);
        they record the asynchronous mode and its options, so that ``vecaccel train --resume``
        goes on alike.

        Args:
            total_steps: env steps to collect.
            reset_num_timesteps: count env steps and updates (and so the schedules and
                ``learning_starts``) from zero, as SB3 does; ``False`` continues them.
            weight_sync_period: updates between weight copies to the sampler process
                (``None``: 1 for A2C and PPO, ``config.async_weight_sync_period`` for the DQN
                family, which this then sets: its optimiser publishes at the end of a chunk
                once that many updates were made since the last copy).
            fixed_lag: a fixed policy lag, so that a seeded run repeats exactly: on-policy,
                batch ``n`` is collected with the weights of update ``n - 1`` (needs
                ``weight_sync_period=1``); off-policy, chunks of ``async_max_lead / 2`` env
                steps, chunk ``n`` acted on with the weights published after chunk ``n - 2``'s
                updates.
            context: multiprocessing start method of the sampler process.
            poll_interval: seconds between checks while this process waits for the sampler
                to start (later waits are on semaphores and queues).
            sampler_threads: torch threads of the sampler process.
            sampler_affinity: CPUs to pin the sampler process to (``None``: this process's).

        Returns:
            The agent.

        Raises:
            ValueError: the options do not fit (a fixed lag with another weight-sync period),
                or the agent names no env id for the sampler to build.
            SamplerError: the sampler process died or raised.
            TrainingInterrupted: SIGINT or SIGTERM arrived (after the checkpoint was written).
        """
        options = SamplerOptions(context, poll_interval, sampler_threads, sampler_affinity)
        if self.on_policy:
            period = 1 if weight_sync_period is None else int(weight_sync_period)
            if reset_num_timesteps and total_steps is not None:
                self.agent.reset_counters()
            self.stats = _run_on_policy(self.agent, total_steps, period, fixed_lag, options)
        else:
            if weight_sync_period is not None:
                if weight_sync_period < 1:
                    raise ValueError(
                        f"weight_sync_period must be at least 1, got {weight_sync_period}"
                    )
                self.agent.config.async_weight_sync_period = int(weight_sync_period)
            self.stats = _run_off_policy(
                self.agent, total_steps, reset_num_timesteps, fixed_lag, options
            )
        return self.agent


def _env_id(agent: Any) -> str:
    env_id = agent.config.env_id
    if env_id is None:
        raise ValueError(
            f"AsyncRunner builds the envs in the sampler process from an env id: create the "
            f"{type(agent).__name__} with env_id=... (its env has no id)"
        )
    return env_id


def _build_networks_for(agent: Any, env_id: str) -> None:
    """Give an off-policy agent without spaces its networks, from one env of ``env_id``."""
    from vecaccel.trainers.envs.make import make_env_fn

    env = make_env_fn(env_id)()
    try:
        agent.attach_spaces(env.observation_space, env.action_space, env_id=env_id)
    finally:
        env.close()


def _run_off_policy(
    agent: Any,
    total_steps: int | None,
    reset_num_timesteps: bool,
    fixed_lag: bool,
    options: SamplerOptions,
) -> AsyncStats:
    env_id = _env_id(agent)
    if total_steps is None:
        agent.set_budget(None)  # raises unless a loaded run has steps left
        total_steps, reset_num_timesteps = agent.target_steps - agent.global_step, False
    leave_cores_to_sampler(agent.config, options.threads)
    if reset_num_timesteps:
        agent.reset_counters()
    start = int(agent.global_step)
    horizon = start + int(total_steps)
    feed = ReplayFeed(
        agent, env_id, horizon, fresh=reset_num_timesteps, fixed_lag=fixed_lag, options=options
    )
    # recorded in checkpoints: `vecaccel train --resume` goes on async, with the same options
    agent.set_run_mode({"fixed_lag": bool(fixed_lag)})
    return run_async(
        agent,
        feed,
        horizon=horizon,
        resume_step=None if reset_num_timesteps else start,
    )


def _run_on_policy(
    agent: Any,
    total_steps: int | None,
    weight_sync_period: int,
    fixed_lag: bool,
    options: SamplerOptions,
) -> AsyncStats:
    if weight_sync_period < 1:
        raise ValueError(f"weight_sync_period must be at least 1, got {weight_sync_period}")
    if fixed_lag and weight_sync_period != 1:
        raise ValueError(
            f"fixed_lag=True needs weight_sync_period=1 (every update's weights are the next "
            f"batch's), got weight_sync_period={weight_sync_period}"
        )
    _env_id(agent)
    leave_cores_to_sampler(agent.config, options.threads)
    # agent.batch_size is the batch over all ranks, so every rank makes the same updates
    num_batches = num_batches_for(agent, total_steps)
    # recorded in checkpoints: `vecaccel train --resume` goes on async, with these options
    agent.set_run_mode(
        {"weight_sync_period": int(weight_sync_period), "fixed_lag": bool(fixed_lag)}
    )
    feed = RolloutFeed(
        agent,
        num_batches,
        weight_sync_period=weight_sync_period,
        fixed_lag=fixed_lag,
        options=options,
    )
    return run_async(
        agent,
        feed,
        horizon=agent.target_steps,
        resume_step=agent.global_step if agent.global_step > 0 else None,
    )
