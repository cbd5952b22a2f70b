"""Asynchronous sampling and optimisation (``vecaccel train ALGO --async``), on one rank or several.

Two processes run at the same time:

- the **sampler** (a child process) steps the envs with the latest weights it has and hands the
  experience over: the DQN family writes every transition into a replay buffer, A2C and PPO
  write whole ``[T, B]`` rollouts into a double buffer;
- the **optimiser** (the calling process) trains on that experience.

Everything they share lives in shared memory (``async_shared``): the replay buffer (``replay.py``
builds every array, cursors and counters included, with an ``array_factory``; here it allocates
torch shared tensors) or the rollout slots, the weights the sampler acts with, and a few
counters. A lock guards the replay buffer (``add`` in the sampler, ``sample`` and
``update_priorities`` in the optimiser); another guards the weights. The optimiser publishes its
weights every ``async_weight_sync_period`` updates (a setting: how rarely weights are sent
changes results a lot). With automatic torch threads the optimiser leaves the sampler's cores
to it.

One loop (``async_loop``) runs every algorithm; the family decides only what it is fed
(``async_onpolicy``: rollouts; ``async_replay``: replay samples, the replay ratio enforced by
throttling both sides, or chunks with a fixed policy lag). The measured ratio, the fraction of
time each side waited and the policy lag (updates the sampler's weights are behind) are logged.
With ``fixed_lag=True`` either family repeats a seeded run exactly.

**Several ranks** (``--nproc K`` or ``torchrun``): every rank is one such pair, an optimiser with
its own sampler process, envs seeded by rank, and its own replay buffer or rollout double buffer.
The optimisers are data-parallel: the algorithm's model is wrapped in
``DistributedDataParallel`` (``distributed.py``: gloo on CPUs, NCCL with one GPU per rank), so
each update's gradients are averaged over ranks and the parameters stay identical. Every update
is therefore a collective and the ranks update in lockstep; each rank enforces the replay ratio on
its own sampler, which makes it the same ratio globally. The ranks meet for their metrics and to
agree on a stop (SIGINT/SIGTERM) at points fixed by the update count, so they always call the
same collectives in the same order; rank 0 logs the reduced metrics and writes the checkpoints.

A sampler process that dies is reported at once: the optimiser checks it at every turn of its
loop and raises :class:`SamplerError` with the child's exit code and traceback (and rank), which
ends that rank; the other ranks then fail at their next collective (gloo sees the closed
connection; every collective also has a timeout) and ``torchrun`` stops the job. The sampler
exits when its optimiser's process goes away.

Example:
    >>> import torch; torch.set_num_threads(1)
    >>> from vecaccel.trainers.algos.dqn import DQN
    >>> agent = make_async_agent(DQN, "CartPole-v1", learning_starts=64, batch_size=16,
    ...                          buffer_size=500, progress=False, tensorboard=False)
    >>> stats = learn_async(agent, "CartPole-v1", 400)
    >>> stats.env_steps, abs(stats.replay_ratio - agent.config.replay_ratio) < 0.5
    (400, True)
"""

from __future__ import annotations

import os
import sys
from typing import Any

from vecaccel.trainers.runners.asynchronous.loop import AsyncStats, run_async
from vecaccel.trainers.runners.asynchronous.process import (
    SamplerError,
    SamplerOptions,
    leave_cores_to_sampler,
)
from vecaccel.trainers.runners.asynchronous.replay_feed import ReplayFeed
from vecaccel.trainers.runners.asynchronous.rollout_feed import RolloutFeed, num_batches_for

__all__ = [
    "AsyncStats",
    "SamplerError",
    "learn_async",
    "learn_async_on_policy",
    "make_async_agent",
    "make_async_on_policy_agent",
    "resume_async",
    "train_async",
    "train_async_dqn",
    "train_async_on_policy",
]


def make_async_agent(cls: type, env_id: str, **config: Any) -> Any:
    """A DQN-family agent with networks built for ``env_id`` but no envs (the sampler has them).

    Under ``torchrun`` the agent joins the process group (its model is then data-parallel).
    """
    from vecaccel.trainers.envs import make_env_fn

    agent = cls(env=None, **{**config, "env_id": env_id})  # the env id picks the preset
    env = make_env_fn(env_id)()
    try:
        agent.attach_spaces(env.observation_space, env.action_space, env_id=env_id)
    finally:
        env.close()
    return agent


def make_async_on_policy_agent(cls: type, env_id: str, **config: Any) -> Any:
    """An A2C or PPO agent for ``env_id`` without envs (the rollout process has them)."""
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
    """Train ``agent`` (a DQN-family agent) asynchronously for ``total_steps`` env steps.

    By default the sampler adds each step to the shared replay buffer as it goes, acting with
    the newest weights, and the replay ratio is enforced by throttling: which updates sample
    which transitions, and which weights act, depend on how the two processes are scheduled,
    so two runs with the same seed differ. With ``fixed_lag=True`` the sampler collects chunks
    of ``async_max_lead / 2`` env steps (rounded up to whole vector steps) into a shared double
    buffer; the optimiser adds each chunk to the replay buffer itself, makes the updates then
    due, and chunk ``n`` is acted on with the weights published after chunk ``n - 2``'s
    updates, exactly. Sampling and training still overlap (chunk ``n + 1`` is collected while
    chunk ``n`` is trained on) and a seeded run repeats exactly; weights are published once a
    chunk (``async_weight_sync_period`` does not apply).

    Under a process group (``torchrun``) every rank calls this: each runs its own sampler
    process and replay buffer, collects ``1/K`` of ``total_steps``, and its updates are
    data-parallel with the other ranks' (see the module docstring).

    Checkpoints (``run_dir``: every ``checkpoint_every`` updates, and when training ends or is
    stopped) hold the replay buffer with ``checkpoint_replay``, as synchronous ones do. An agent
    loaded from one (``DQN.load(path)``) continues its run with ``reset_num_timesteps=False``:
    counters, schedules and the replay buffer go on from the checkpoint, and the envs start
    new episodes (env state cannot be saved, so the run does not repeat bit for bit).

    Args:
        agent: from :func:`make_async_agent` (or any DQN with built networks), or loaded from
            a checkpoint; its ``config.num_envs`` envs of ``config.backend`` run in the
            sampler process.
        env_id: the Gymnasium id the sampler builds.
        total_steps: env steps to collect in this call (over all ranks).
        reset_num_timesteps: start the step and update counts (and so the ε and β schedules
            and ``learning_starts``) from zero, as SB3 does; ``False`` continues them.
        fixed_lag: chunks with a fixed policy lag instead of throttling (reproducible runs).
        context: multiprocessing start method of the sampler process.
        poll_interval: seconds between checks while one side waits for the other.
        sampler_threads: torch threads of the sampler process.
        sampler_affinity: CPUs to pin the sampler process to (``None``: those of this process).

    Returns:
        The measured :class:`AsyncStats` (also logged to ``run_dir``).

    Raises:
        SamplerError: the sampler process died or raised.
        TrainingInterrupted: SIGINT or SIGTERM arrived (a checkpoint was written first).
    """
    options = SamplerOptions(context, poll_interval, sampler_threads, sampler_affinity)
    leave_cores_to_sampler(agent.config, sampler_threads)
    if reset_num_timesteps:
        agent.global_step, agent.num_updates = 0, 0
    start = int(agent.global_step)
    horizon = start + int(total_steps)
    feed = ReplayFeed(
        agent, env_id, horizon, fresh=reset_num_timesteps, fixed_lag=fixed_lag, options=options
    )
    # recorded in checkpoints: `vecaccel train --resume` goes on async, with the same options
    agent.async_run = True
    agent.async_options = {"fixed_lag": bool(fixed_lag)}
    return run_async(
        agent,
        feed,
        horizon=horizon,
        resume_step=None if reset_num_timesteps else start,
    )


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
    """Train an A2C or PPO agent with sampling overlapped with optimisation.

    A rollout process collects ``[T, B]`` batches with the weights it last received into two
    shared-memory slots, in turn (a double buffer), while this process updates on the other
    slot. Each batch remembers which update's weights collected it; the **policy lag** (updates
    between those weights and the ones being trained) is logged as ``charts/policy_lag``, 1 with
    ``weight_sync_period=1`` in steady state, but which update's weights a batch gets depends on
    how the two processes happen to be scheduled, so two runs with the same seed differ. With
    ``fixed_lag=True`` batch ``n`` is always collected with the weights of update ``n - 1``
    (the rollout process waits for them; the optimiser publishes no newer ones before they are
    taken): the lag is exactly 1 after the first batch and a seeded run repeats exactly. It
    costs no throughput when one side is clearly the slower, as each side then waits anyway.
    PPO's importance ratio uses the stored behaviour log-probabilities, so the lag is corrected
    up to the clipping; A2C's gradient is biased by it.
    Under a process group every rank runs its own rollout process and double buffer; the
    updates are data-parallel and the ranks reduce their metrics (and agree on a stop) after
    every update, as synchronous training does.

    An agent loaded from a checkpoint (``PPO.load(path)``) goes on from its step and update
    counts; ``total_steps=None`` finishes its run's budget with the learning-rate schedule it
    had. Its envs start new episodes (env state cannot be saved).

    Args:
        agent: an A2C or PPO agent (e.g. from :func:`make_async_on_policy_agent`, or loaded).
        total_steps: env steps to collect, over all ranks (rounded up to whole batches);
            ``None``: those the loaded run has left.
        weight_sync_period: updates between weight copies to the rollout process.
        fixed_lag: collect batch ``n`` with the weights of update ``n - 1`` exactly
            (reproducible runs); needs ``weight_sync_period=1``.
        context: multiprocessing start method of the rollout process.
        poll_interval: seconds between checks while one side waits.
        sampler_threads: torch threads of the rollout process.
        sampler_affinity: CPUs to pin the rollout process to.

    Returns:
        The measured :class:`AsyncStats` (``replay_ratio`` is 1: each batch is used once).

    Raises:
        SamplerError: the rollout process died or raised.
        TrainingInterrupted: SIGINT or SIGTERM arrived (a checkpoint was written first).
    """
    if weight_sync_period < 1:
        raise ValueError(f"weight_sync_period must be at least 1, got {weight_sync_period}")
    if fixed_lag and weight_sync_period != 1:
        raise ValueError(
            f"fixed_lag=True needs weight_sync_period=1 (every update's weights are the next "
            f"batch's), got weight_sync_period={weight_sync_period}"
        )
    options = SamplerOptions(context, poll_interval, sampler_threads, sampler_affinity)
    leave_cores_to_sampler(agent.config, sampler_threads)
    # agent.batch_size is the batch over all ranks, so every rank makes the same updates
    num_batches = num_batches_for(agent, total_steps)
    # recorded in checkpoints: `vecaccel train --resume` goes on async, with these options
    agent.async_run = True
    agent.async_options = {
        "weight_sync_period": int(weight_sync_period),
        "fixed_lag": bool(fixed_lag),
    }
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
    """``vecaccel train ALGO --async``: build the agent, train, report; the exit code.

    Args:
        cls: the algorithm's class (either family).
        env_id: the Gymnasium id the sampler process builds.
        total_steps: env steps to collect, over all ranks.
        run_dir: where the run logs and checkpoints.
        progress: show a progress bar.
        tensorboard: write TensorBoard event files.
        weight_sync_period: updates between weight copies to the sampler process (``None``:
            1 for A2C and PPO, the config's ``async_weight_sync_period`` for the DQN family).
        fixed_lag: a fixed policy lag (reproducible runs).
        **config: the algorithm's config fields.
    """
    runtime = dict(run_dir=run_dir, progress=progress, tensorboard=tensorboard)
    if cls.family == "on_policy":
        agent = make_async_on_policy_agent(cls, env_id, **runtime, **config)
        period = 1 if weight_sync_period is None else weight_sync_period
        stats = learn_async_on_policy(
            agent, total_steps, weight_sync_period=period, fixed_lag=fixed_lag
        )
    else:
        if weight_sync_period is not None:
            config["async_weight_sync_period"] = weight_sync_period
        agent = make_async_agent(cls, env_id, **runtime, **config)
        stats = learn_async(agent, env_id, total_steps, fixed_lag=fixed_lag)
    _report(agent, stats)
    return 0


# the names `vecaccel train` used for each family
train_async_dqn = train_async
train_async_on_policy = train_async


def _report(agent: Any, stats: AsyncStats) -> None:
    """The line ``vecaccel train --async`` ends with (on rank 0)."""
    if not agent.is_main:
        return
    ranks = f" on {agent.world_size} ranks" if agent.world_size > 1 else ""
    rates = f"{stats.env_steps} env steps ({stats.sampling_rate:.0f}/s), {stats.updates} updates"
    if agent.family == "off_policy":
        rates += (
            f" ({stats.update_rate:.1f}/s), replay ratio {stats.replay_ratio:.2f} "
            f"(setting {agent.config.replay_ratio}),"
        )
    else:
        rates += ", mean"
    print(
        f"async {type(agent).__name__}{ranks}: {rates} policy lag "
        f"{stats.mean_policy_lag:.2f} updates; run directory: {agent.run_dir}",
        file=sys.stderr,
    )


def resume_async(
    cls: type,
    checkpoint: str | os.PathLike[str],
    env_id: str,
    total_steps: int | None,
    *,
    weight_sync_period: int | None = None,
    fixed_lag: bool | None = None,
    **load_kwargs: Any,
) -> int:
    """``vecaccel train ALGO --resume DIR`` of a run trained with ``--async``: the exit code.

    The agent is loaded without envs (the sampler process builds them) and goes on from the
    checkpoint's counters (and, for the DQN family, its replay buffer) to ``total_steps``, the
    run's new total; A2C and PPO may leave it out to finish the run's own budget.
    ``fixed_lag`` (see :func:`learn_async` and :func:`learn_async_on_policy`) and, for A2C and
    PPO, ``weight_sync_period``: ``None`` keeps what the checkpoint records (``False`` and 1
    for a run trained synchronously until now).
    """
    from vecaccel.trainers.checkpoint import apply_runtime_settings

    agent = cls.load(checkpoint, env=None, **load_kwargs)
    runtime = ("progress", "tensorboard")
    apply_runtime_settings(agent, {k: v for k, v in load_kwargs.items() if k in runtime})
    step = int(agent.global_step)
    on_policy = agent.family == "on_policy"
    if on_policy and total_steps is not None:
        agent.set_target_steps(total_steps)
    target = agent.target_steps if on_policy else total_steps
    if target is None:
        print("error: pass --total-steps to resume this trainer", file=sys.stderr)
        return 2
    if step >= target:
        print(
            f"the run is complete ({step} of {target} steps); pass a larger --total-steps to "
            "extend it",
            file=sys.stderr,
        )
        return 0
    recorded = agent.async_options  # empty after synchronous training
    if fixed_lag is None:
        fixed_lag = bool(recorded.get("fixed_lag", False))
    options = ", fixed lag" if fixed_lag else ""
    if on_policy:
        if weight_sync_period is None:
            weight_sync_period = int(recorded.get("weight_sync_period", 1))
        if fixed_lag and weight_sync_period != 1:
            print(
                "error: a fixed lag needs a weight-sync period of 1, got "
                f"{weight_sync_period} (pass --async-weight-sync-period 1 or "
                "--no-async-fixed-lag)",
                file=sys.stderr,
            )
            return 2
        options = f", weight sync period {weight_sync_period}{options}"
    if agent.is_main:
        print(
            f"resuming {cls.__name__} (async{options}) from {checkpoint} at step {step}",
            file=sys.stderr,
        )
    if on_policy:
        stats = learn_async_on_policy(
            agent, None, weight_sync_period=weight_sync_period, fixed_lag=fixed_lag
        )
    else:
        stats = learn_async(
            agent, env_id, target - step, reset_num_timesteps=False, fixed_lag=fixed_lag
        )
    _report(agent, stats)
    return 0
