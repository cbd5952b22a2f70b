"""The asynchronous runner's loop, shared by every algorithm.

One loop drives every asynchronous run. What differs between the families is where the
experience comes from and what an update is made of; that is a *feed*
(:class:`AsyncFeed`): on-policy algorithms get whole rollouts from a double buffer
(:mod:`~vecaccel.trainers.runners.asynchronous.rollout_feed`), the DQN family chunks of steps for
its replay buffer (:mod:`~vecaccel.trainers.runners.asynchronous.replay_feed`). The loop
owns everything around it: the run logger, the signal guard, the wait accounting, the meetings of
the ranks (one reduce of the metrics and an agreed stop in the same collective), the log rows,
stopping the sampler process and the final checkpoint's timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vecaccel.trainers.runners.asynchronous.process import (
    SamplerHandle,
    poll_until,
    take,
    wait_for,
)

__all__ = ["AsyncFeed", "AsyncStats", "Meeting", "Waits", "run_async"]


@dataclass
class AsyncStats:
    """What an asynchronous run did, measured by the optimiser (of this rank).

    Attributes:
        env_steps: transitions collected, over all ranks.
        updates: gradient updates done (each one over all ranks' batches).
        replay_ratio: ``updates × batch / (env_steps - learning_starts)`` as measured.
        seconds: wall-clock of the run.
        sampling_rate: env steps per second over the run, over all ranks.
        update_rate: updates per second over the run.
        optimizer_wait_fraction: fraction of the run this rank's optimiser waited for data.
        sampler_wait_fraction: fraction of the run this rank's sampler waited for the optimiser.
        mean_policy_lag: mean number of updates the sampler's weights were behind.
    """

    env_steps: int
    updates: int
    replay_ratio: float
    seconds: float
    sampling_rate: float
    update_rate: float
    optimizer_wait_fraction: float
    sampler_wait_fraction: float
    mean_policy_lag: float


@dataclass
class Meeting:
    """One meeting's log row, before it is reduced over the ranks.

    Attributes:
        metrics: the row (``None`` where a value is missing on this rank).
        episodes: the episodes behind its episodic return and length (their reduce weight).
        sums: the keys summed over the ranks rather than averaged.
    """

    metrics: dict[str, float | None]
    episodes: int
    sums: Sequence[str] = ()


class Waits:
    """The optimiser's waits for the sampler, timed: what ``optimizer_wait_fraction`` counts.

    Args:
        check: called every so often while waiting; raises if the sampler died or the run must
            stop now.
    """

    def __init__(self, check: Callable[[], None]) -> None:
        self.check = check
        self.seconds = 0.0

    def take(self, channel: Any) -> Any:
        """The next item of the queue ``channel``, checking while none is there."""
        item, seconds = take(channel, self.check)
        self.seconds += seconds
        return item

    def acquire(self, semaphore: Any) -> None:
        """Acquire ``semaphore``, checking while it is taken."""
        self.seconds += wait_for(semaphore, self.check)


class AsyncFeed(Protocol):
    """The family-specific side of an asynchronous run, as the loop of :func:`run_async` sees it.

    A feed owns the sampler process's handle and the experience it hands over. Its counters of
    updates, steps and policy lag are read by the loop for the run's stats.
    """

    sampler: SamplerHandle
    complete: bool  # the budget is done: the turn just made was the last
    updates_done: int  # updates made in this run
    lag_sum: float  # the summed policy lag of those updates
    replay_ratio: float  # as measured over the run

    def start(self) -> None:
        """Publish the first weights and start the sampler process."""

    def ready(self) -> bool:
        """Whether the sampler process has started handing experience over."""

    def turn(self, waits: Waits, requested: bool) -> bool:
        """One turn of the loop: take experience and make the updates then due, waiting with
        ``waits``; whether the ranks meet after it (``requested``: a stop was asked here)."""

    def meeting(self, elapsed: float, optimizer_wait: float) -> Meeting:
        """The metrics of this meeting, ``elapsed`` seconds into the run, of which the
        optimiser waited ``optimizer_wait``."""

    def log_step(self, metrics: dict[str, float | None]) -> int | None:
        """The step to log the reduced ``metrics`` at, or ``None`` when no row is due."""

    def stop(self) -> None:
        """Stop the sampler process and close the channels to it."""

    def final_checkpoint(self, every_rank_here: bool, logger: Any) -> None:
        """Write the checkpoint at the end of the run, if it is safe to (see the feeds)."""


def _reduce(
    metrics: dict[str, float | None],
    episodes: int,
    stop: bool,
    sums: Sequence[str],
    device: Any,
) -> tuple[dict[str, float | None], bool]:
    """Reduce one meeting's metrics over the ranks (identity on one rank) and agree on a stop
    in the same collective."""
    from vecaccel.trainers.run import distributed

    if distributed.world_size() == 1:
        return metrics, stop
    metrics = {**metrics, "charts/episodes": float(episodes), "_stop": 1.0 if stop else 0.0}
    reduced = distributed.reduce_log_row(metrics, episodes, sums=("_stop", *sums), device=device)
    return reduced, bool(reduced.pop("_stop") or 0.0)


def run_async(
    agent: Any,
    feed: AsyncFeed,
    *,
    horizon: int,
    resume_step: int | None,
) -> AsyncStats:
    """Run ``feed`` to its end: the loop of every asynchronous run.

    Rank 0 alone logs and checkpoints. On one rank a SIGINT or SIGTERM stops the run at the
    next turn; on several the ranks agree on it at their next meeting (a rank cannot leave
    while the others wait for it in a collective).

    Args:
        agent: the algorithm (its ``global_step``, ``device``, ``world_size``, ``is_main``,
            ``run_dir``, ``tensorboard`` and ``progress`` are read; ``logger`` is set).
        feed: the family's side of the run.
        horizon: the step the run ends at (for the progress bar).
        resume_step: the step a continued run goes on from (its CSV keeps the rows until then).

    Returns:
        The measured :class:`AsyncStats`.

    Raises:
        SamplerError: the sampler process died or raised.
        TrainingInterrupted: SIGINT or SIGTERM arrived (a checkpoint was written first).
    """
    from vecaccel.trainers.run.signals import SignalCheckpoint, TrainingInterrupted
    from vecaccel.trainers.runners.sync import announce_interrupt, open_run_logger

    world = agent.world_size
    # before the sampler process starts: an error here (a run directory that cannot be made)
    # must not leave it running outside the try/finally that stops it
    logger = open_run_logger(agent, horizon, resume_step)
    sampler = feed.sampler
    start_step = int(agent.global_step)
    feed.start()
    guard = SignalCheckpoint()
    start = time.perf_counter()
    end: float | None = None
    every_rank_here = False  # the run ended or stopped on every rank, not in an error

    def check() -> None:
        sampler.check()
        if world == 1 and guard.requested:
            raise TrainingInterrupted(guard.signal_name, agent.global_step)

    waits = Waits(check)
    try:
        with guard:
            poll_until(feed.ready, check, sampler.options.poll_interval)
            start = time.perf_counter()  # rates are timed from the sampler's first experience
            while not feed.complete:
                if not feed.turn(waits, guard.requested):
                    continue
                elapsed = max(time.perf_counter() - start, 1e-9)
                meeting = feed.meeting(elapsed, waits.seconds)
                metrics, stop = _reduce(
                    meeting.metrics, meeting.episodes, guard.requested, meeting.sums, agent.device
                )
                step = feed.log_step(metrics)
                if step is not None:
                    logger.log(step, metrics)
                if stop and not feed.complete:
                    raise TrainingInterrupted(guard.signal_name or "SIGTERM", agent.global_step)
        end = time.perf_counter()  # the run's rates exclude stopping the sampler process
        every_rank_here = True
    except TrainingInterrupted:
        every_rank_here = True  # the ranks agreed on the stop
        announce_interrupt(logger, agent, guard.signal_name or "SIGTERM")
        raise
    finally:
        if end is None:
            end = time.perf_counter()
        feed.stop()
        feed.final_checkpoint(every_rank_here, logger)
        agent.end_run(logger.elapsed)
        logger.close()
    seconds = max(end - start, 1e-9)
    env_steps = int(agent.global_step) - start_step
    updates = feed.updates_done
    return AsyncStats(
        env_steps=env_steps,
        updates=updates,
        replay_ratio=feed.replay_ratio,
        seconds=seconds,
        sampling_rate=env_steps / seconds,
        update_rate=updates / seconds,
        optimizer_wait_fraction=waits.seconds / seconds,
        sampler_wait_fraction=sampler.sampler_wait / seconds,
        mean_policy_lag=feed.lag_sum / updates if updates else 0.0,
    )
