"""The synchronous runner: the one training loop of every algorithm.

:class:`SyncRunner` owns everything around the updates: the budget and the schedules, the run
logger (CSV, TensorBoard, progress bar, learning curve), periodic checkpoints and restart points,
SIGINT/SIGTERM, and the callback. It knows no family: the algorithm begins the run
(:meth:`~vecaccel.trainers.algos.base.Algorithm.begin_run`) and hands back its
:class:`~vecaccel.trainers.algos.training_loop.TrainingLoop`, which collects, optimises, and says
which rows are logged (reduced over the ranks) and when the ranks stop.

The helpers below :class:`SyncRunner` (:func:`open_run_logger`, :func:`announce_interrupt`,
:func:`announce_run_dir`) are what the asynchronous runner shares with it.

Example:
    >>> from vecaccel.trainers import A2C
    >>> agent = A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=5, seed=0)
    >>> _ = SyncRunner(agent).run(total_timesteps=20)
    >>> agent.global_step, agent.num_updates
    (20, 2)
    >>> agent.close()
"""

from __future__ import annotations

import time
from pathlib import Path

from vecaccel.trainers.algos.base import Algorithm, Callback
from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME
from vecaccel.trainers.runners.callbacks import Callbacks
from vecaccel.trainers.services.logger import RunLogger
from vecaccel.trainers.services.run_config import write_run_config
from vecaccel.trainers.services.signals import SignalCheckpoint, TrainingInterrupted

__all__ = [
    "SyncRunner",
    "announce_interrupt",
    "announce_run_dir",
    "announce_run_length",
    "open_run_logger",
]


def open_run_logger(agent: Algorithm, horizon: int, resume_step: int | None) -> RunLogger:
    """The run logger of ``agent``'s run to ``horizon`` env steps (rank 0 alone writes files);
    set as ``agent.logger``.

    Args:
        agent: the algorithm being trained.
        horizon: the step total, for the bar and the ETA.
        resume_step: the step a resumed run continues from (later CSV rows are dropped), or
            ``None`` for a fresh run.
    """
    main = agent.is_main
    logger = RunLogger(
        agent.run_dir if main else None,
        horizon,
        use_tensorboard=agent.tensorboard and main,
        progress=agent.progress and main,
        resume_step=resume_step,
    )
    agent.start_logging(logger)
    if main and agent.run_dir is not None:
        write_run_config(agent.run_dir, agent.algo_name, agent.config, horizon)
    return logger


def announce_run_length(
    logger: RunLogger, agent: Algorithm, horizon: int, per_iteration: int | None
) -> None:
    """Say where the run will end when whole iterations take it past ``horizon``."""
    if not per_iteration or not agent.is_main or agent.global_step >= horizon:
        return
    iterations = -(-(horizon - agent.global_step) // per_iteration)
    end = agent.global_step + iterations * per_iteration
    if end != horizon:
        logger.write(
            f"training to step {end:,}, not {horizon:,}: the run collects {per_iteration:,} "
            f"env steps at a time ({iterations:,} times)"
        )


def announce_interrupt(logger: RunLogger, agent: Algorithm, signal_name: str) -> None:
    """Say where the checkpoint written on a signal is, and how to continue from it."""
    run_dir = agent.run_dir
    if run_dir is not None and agent.is_main:
        logger.write(
            f"{signal_name}: checkpoint saved to {run_dir / CHECKPOINT_NAME} at step "
            f"{agent.global_step}; continue with --resume {run_dir}"
        )


def announce_run_dir(logger: RunLogger, agent: Algorithm, curve: Path | None) -> None:
    """The line a run with a progress bar ends with: where its files are."""
    run_dir = agent.run_dir
    if run_dir is not None and agent.is_main and agent.progress:
        logger.write(
            f"run directory: {run_dir}  checkpoint: {run_dir / CHECKPOINT_NAME}"
            + (f"  learning curve: {curve}" if curve else "")
        )


class SyncRunner:
    """Trains an algorithm in this process: collect, update, log, checkpoint, repeat.

    Args:
        agent: any :class:`~vecaccel.trainers.algos.base.Algorithm`.
    """

    def __init__(self, agent: Algorithm) -> None:
        if not isinstance(agent, Algorithm):
            raise TypeError(f"SyncRunner trains an Algorithm, got {type(agent).__name__}")
        self.agent = agent

    def run(
        self,
        total_timesteps: int | None = None,
        callback: Callback | None = None,
        reset_num_timesteps: bool = True,
    ) -> Algorithm:
        """Train ``total_timesteps`` more env steps (``None``: finish a loaded run's budget).

        Checkpoints go to ``run_dir`` every ``checkpoint_every`` updates (each a restart point,
        see ``reset_envs_at_checkpoint``), when the run ends and when SIGINT or SIGTERM stops
        it; an error raised inside the loop writes none, leaving the last restart point.

        Args:
            total_timesteps: env steps to collect.
            callback: ``callback(agent, metrics)`` after every iteration (a collect and its
                update), an SB3 ``BaseCallback``, or a list of them; see
                :mod:`vecaccel.trainers.runners.callbacks`.
            reset_num_timesteps: count env steps and updates (and the schedules) from zero, as
                SB3 does; ``False`` continues them.

        Returns:
            The agent.

        Raises:
            TrainingInterrupted: SIGINT or SIGTERM arrived (after the checkpoint was written).
        """
        agent = self.agent
        callbacks = Callbacks(callback)
        loop = agent.begin_run(total_timesteps, reset_num_timesteps)
        callbacks.add_config_callbacks(agent)
        logger = open_run_logger(agent, loop.horizon, loop.resume_step)
        announce_run_length(logger, agent, loop.horizon, loop.steps_per_iteration())
        loop.start(logger)
        threads = agent.adaptive_threads(phases=True)
        guard = SignalCheckpoint()
        sb3, plain = callbacks.sb3 is not None, bool(callbacks.plain)
        try:
            with guard:
                callbacks.training_start(agent, loop.horizon)
                while agent.global_step < loop.horizon:
                    if sb3:
                        callbacks.rollout_start()
                    threads.collect_phase()
                    experience = loop.collect()
                    if sb3 and not callbacks.rollout_end(loop.step_locals(experience)):
                        break
                    threads.update_phase()
                    updates_before, started = agent.num_updates, time.perf_counter()
                    metrics = loop.update(experience)
                    threads.observe(
                        time.perf_counter() - started, agent.num_updates - updates_before
                    )
                    metrics, log, stop = loop.report(metrics, guard.requested)
                    if log:
                        logger.log(agent.global_step, metrics)
                    if stop:
                        loop.write_checkpoint()
                        announce_interrupt(logger, agent, guard.signal_name or "SIGTERM")
                        raise TrainingInterrupted(guard.signal_name or "SIGTERM", agent.global_step)
                    if plain and not callbacks.iteration_end(agent, loop.callback_metrics(metrics)):
                        break
                    if loop.restart_due():
                        loop.restart_point()
                        loop.write_checkpoint()
                loop.write_checkpoint()
                callbacks.training_end()
        finally:
            threads.collect_phase()
            loop.end()
            agent.end_run(logger.elapsed)
            announce_run_dir(logger, agent, logger.close())
        return agent
