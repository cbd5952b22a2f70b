"""What ``vecaccel train ALGO --async`` calls: a new asynchronous run, or the resume of one.

Both build or load the agent, train it with :class:`~vecaccel.trainers.runners.asynchronous.runner.AsyncRunner`,
print the line the run ends with and return the exit code.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from vecaccel.trainers.runners.asynchronous.runner import AsyncRunner

__all__ = ["resume_async", "train"]


def train(
    cls: type[Any],
    env_id: str,
    total_timesteps: int,
    run_dir: str | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    weight_sync_period: int | None = None,
    fixed_lag: bool = False,
    **config: Any,
) -> int:
    """``vecaccel train ALGO --async``: build the agent, train, report; the exit code.

    Args:
        cls: the algorithm's class.
        env_id: the Gymnasium id the collector process builds.
        total_timesteps: env steps to collect, over all ranks.
        run_dir: where the run logs and checkpoints.
        progress: show a progress bar.
        tensorboard: write TensorBoard event files.
        weight_sync_period: updates between weight copies to the collector process (``None``:
            1).
        fixed_lag: a fixed policy lag (reproducible runs).
        **config: the algorithm's config fields.
    """
    runtime = dict(run_dir=run_dir, progress=progress, tensorboard=tensorboard)
    agent = _new_agent(cls, env_id, **runtime, **config)
    runner = AsyncRunner(agent)
    runner.run(total_timesteps, weight_sync_period=weight_sync_period, fixed_lag=fixed_lag)
    _report(runner)
    return 0


def _new_agent(cls: type[Any], env_id: str, **config: Any) -> Any:
    """A ``cls`` agent for ``env_id`` without envs (the collector process has them); the env
    id picks the preset."""
    return cls(None, **{**config, "env_id": env_id})


def _report(runner: AsyncRunner) -> None:
    """The line ``vecaccel train --async`` ends with (on rank 0)."""
    agent, stats = runner.agent, runner.stats
    if not agent.is_main or stats is None:
        return
    ranks = f" on {agent.world_size} ranks" if agent.world_size > 1 else ""
    rates = f"{stats.env_steps} env steps ({stats.sampling_rate:.0f}/s), {stats.updates} updates"
    if stats.replay_ratio_setting is not None:
        rates += (
            f" ({stats.update_rate:.1f}/s), replay ratio {stats.replay_ratio:.2f} "
            f"(setting {stats.replay_ratio_setting}),"
        )
    else:
        rates += ", mean"
    print(
        f"async {type(agent).__name__}{ranks}: {rates} policy lag "
        f"{stats.mean_policy_lag:.2f} updates; run directory: {agent.run_dir}",
        file=sys.stderr,
    )


def resume_async(
    cls: type[Any],
    checkpoint: str | os.PathLike[str],
    env_id: str,
    total_timesteps: int | None,
    *,
    weight_sync_period: int | None = None,
    fixed_lag: bool | None = None,
    **load_kwargs: Any,
) -> int:
    """``vecaccel train ALGO --resume DIR`` of a run trained with ``--async``: the exit code.

    The agent is loaded without envs (the collector process builds them) and goes on from the
    checkpoint's counters (and its replay buffer, if it keeps one) to ``total_timesteps``, the
    run's new total; ``None`` finishes the run's own budget. ``fixed_lag`` and
    ``weight_sync_period`` (see :meth:`AsyncRunner.run`): ``None`` keeps what the checkpoint
    records (``False`` and 1 for a run trained synchronously until now).
    """
    from vecaccel.trainers.checkpoints.format import apply_runtime_settings

    agent = cls.load(checkpoint, env=None, **load_kwargs)
    runtime = ("progress", "tensorboard")
    apply_runtime_settings(agent, {k: v for k, v in load_kwargs.items() if k in runtime})
    runner = AsyncRunner(agent)
    step = int(agent.global_step)
    if total_timesteps is not None:
        agent.set_target_steps(total_timesteps)
    target = agent.target_steps
    if target is None:
        print("error: pass --total-timesteps to resume this trainer", file=sys.stderr)
        return 2
    if step >= target:
        print(
            f"the run is complete ({step} of {target} steps); pass a larger --total-timesteps "
            "to extend it",
            file=sys.stderr,
        )
        return 0
    recorded = agent.async_options  # empty after synchronous training
    if fixed_lag is None:
        fixed_lag = bool(recorded.get("fixed_lag", False))
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
    options = f", weight sync period {weight_sync_period}" + (", fixed lag" if fixed_lag else "")
    if agent.is_main:
        print(
            f"resuming {cls.__name__} (async{options}) from {checkpoint} at step {step}",
            file=sys.stderr,
        )
    agent.config.env_id = env_id
    runner.run(None, weight_sync_period=weight_sync_period, fixed_lag=fixed_lag)
    _report(runner)
    return 0
