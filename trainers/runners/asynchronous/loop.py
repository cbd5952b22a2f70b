"""The asynchronous runner's loop, shared by every algorithm, and the base of the feeds it runs.

What differs between the families is where the experience comes from and what an update is made
of; that is a *feed* (:class:`AsyncFeed`), which the algorithm hands the runner
(``agent.async_feed``): A2C and PPO get whole rollouts, the DQN family chunks of steps for its
replay buffer. The loop owns
everything around it: the run logger, the signal guard, the wait accounting, the meetings of the
ranks (one reduce of the metrics and an agreed stop in the same collective), the log rows,
stopping the collector process and the final checkpoint's timing.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vecaccel.trainers.runners.asynchronous.process import CollectorHandle, CollectorOptions, Waits

__all__ = ["AsyncFeed", "AsyncStats", "Meeting", "run_async"]


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
        replay_ratio_setting: the replay ratio the run aimed at (``None``: each batch was used
            once).
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
    replay_ratio_setting: float | None = None


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


class AsyncFeed(abc.ABC):
    """The family's side of an asynchronous run, as the loop of :func:`run_async` sees it.

    A feed owns the collector process and the experience it hands over in the slots of a double
    buffer, and makes its updates from them. A subclass sets :attr:`horizon`, :attr:`resume_step`
    and :attr:`spec`, and implements the abstract methods.

    Args:
        agent: the algorithm; its step and update counters are where this run starts.
        model: the module whose weights the collector process acts with; the agent's
            normalisation statistics, if any, are handed over with them.
        role: ``sampler`` or ``rollout`` (in messages and the process's name).
        loop: the collector process's loop (the family's, beside its feed).
        options: how the collector process runs.

    Attributes:
        horizon: the step the run ends at (for the progress bar).
        resume_step: the step a continued run goes on from (its CSV keeps the rows until then).
        spec: the entries of the collector process's spec that its loop reads.
        wants_step_locals: whether :attr:`last_turn` must hold each vector step's locals (set by
            the loop when an SB3 callback reads them).
        last_turn: what the last turn took and made, as callbacks get it: each vector step's
            ``rewards`` and ``dones`` (and ``actions``; empty unless
            :attr:`wants_step_locals`), and the metrics (``global_step``, ``charts/updates``,
            ``charts/episodes``, the episodes' mean return and length, the learning rate, the
            mean ``losses/...`` of its updates); ``None`` after a turn that took nothing.
        slots: the double buffer's two slots, once the collector process has handed them over.
        complete: the budget is done: the turn just made was the last.
        updates_done: updates made in this run.
        lag_sum: the summed policy lag of those updates.
        replay_ratio: as measured over the run.
        replay_ratio_setting: the replay ratio the run aims at (``None``: each batch is used
            once).
    """

    def __init__(
        self,
        agent: Any,
        model: Any,
        role: str,
        loop: Callable[[dict[str, Any]], None],
        options: CollectorOptions,
    ) -> None:
        self.agent = agent
        self.loop = loop
        self.fixed_lag = options.fixed_lag
        normalizer = agent.normalizer
        extra = () if normalizer is None else normalizer.tensors()
        self.collector = CollectorHandle(options, role, model, extra)
        self.counters = self.collector.counters
        self.channels = self.collector.channels
        self.horizon = 0
        self.resume_step: int | None = None
        self.spec: dict[str, Any] = {}
        self.slots: list[dict[str, Any]] = []
        self.pulls_seen = 0  # the sampler's pulls of weights acquired, with a fixed lag
        self.complete = False
        self.updates_done = 0
        self.lag_sum = 0.0
        self.replay_ratio = 0.0
        self.replay_ratio_setting: float | None = None
        self.wants_step_locals = False  # SB3 callbacks read each vector step's locals
        self.last_turn: tuple[list[dict[str, Any]], dict[str, Any]] | None = None

    def start(self) -> None:
        """Publish the first weights and start the collector process."""
        self.collector.publish(self.agent.num_updates)
        self.collector.start(self.loop, self.spec)

    def wait_started(self, check: Callable[[], None]) -> None:
        """Wait until the collector process has handed the slots over."""
        self.slots = self.collector.wait_started(check)

    def sync_weights(self, waits: Waits, pulls: int, due: bool) -> None:
        """Publish the weights to the collector process: with a fixed lag once it has pulled those
        of ``pulls`` items (and then announced), otherwise if ``due``."""
        if self.fixed_lag:
            while self.pulls_seen < pulls:
                waits.acquire(self.channels.pulls)
                self.pulls_seen += 1
            self.collector.publish(self.agent.num_updates)
            self.channels.publishes.release()
        elif due:
            self.collector.publish(self.agent.num_updates)

    def stop(self) -> None:
        """Stop the collector process and close the channels to it."""
        self.collector.stop()

    @abc.abstractmethod
    def turn(self, waits: Waits, requested: bool) -> bool:
        """One turn of the loop: take experience and make the updates then due, waiting with
        ``waits``, and set :attr:`last_turn`; whether the ranks meet after it (``requested``: a
        stop was asked here)."""

    @abc.abstractmethod
    def meeting(self, elapsed: float, optimizer_wait: float) -> Meeting:
        """The metrics of this meeting, ``elapsed`` seconds into the run, of which the
        optimiser waited ``optimizer_wait``."""

    @abc.abstractmethod
    def log_step(self, metrics: dict[str, float | None]) -> int | None:
        """The step to log the reduced ``metrics`` at, or ``None`` when no row is due."""

    @abc.abstractmethod
    def final_checkpoint(self, every_rank_here: bool) -> None:
        """Write the checkpoint at the end of the run, the sampler stopped, if it is safe to:
        ``every_rank_here`` if the run ended or stopped on every rank, not in an error."""


def _reduce(
    metrics: dict[str, float | None],
    episodes: int,
    stop: bool,
    sums: Sequence[str],
    device: Any,
) -> tuple[dict[str, float | None], bool]:
    """Reduce one meeting's metrics over the ranks (identity on one rank) and agree on a stop
    in the same collective."""
    from vecaccel.trainers.services import distributed

    if distributed.world_size() == 1:
        return metrics, stop
    metrics = {**metrics, "charts/episodes": float(episodes), "_stop": 1.0 if stop else 0.0}
    reduced = distributed.reduce_log_row(metrics, episodes, sums=("_stop", *sums), device=device)
    return reduced, bool(reduced.pop("_stop") or 0.0)


def run_async(agent: Any, feed: AsyncFeed, callback: Any = None) -> AsyncStats:
    """Run ``feed`` to its end: the loop of every asynchronous run.

    Rank 0 alone logs and checkpoints. On one rank a SIGINT or SIGTERM stops the run at the
    next turn; on several the ranks agree on it at their next meeting (a rank cannot leave
    while the others wait for it in a collective). The callbacks are called once per turn (an
    item of experience taken and the updates it made due), as the synchronous runner calls
    them once per iteration; one that returns ``False`` ends the run after that turn.

    Args:
        agent: the algorithm (its ``global_step``, ``device``, ``world_size``, ``is_main``,
            ``run_dir``, ``tensorboard`` and ``progress`` are read; ``logger`` is set).
        feed: the family's side of the run.
        callback: what ``learn`` takes as ``callback`` (see
            :mod:`vecaccel.trainers.runners.callbacks`), or ``None``.

    Returns:
        The measured :class:`AsyncStats`.

    Raises:
        CollectorError: the collector process died or raised.
        TrainingInterrupted: SIGINT or SIGTERM arrived (a checkpoint was written first).
    """
    from vecaccel.trainers.runners.callbacks import Callbacks
    from vecaccel.trainers.runners.sync import announce_interrupt, open_run_logger
    from vecaccel.trainers.services.signals import SignalCheckpoint, TrainingInterrupted

    callbacks = Callbacks(callback)
    callbacks.add_config_callbacks(agent)
    sb3, plain = callbacks.sb3 is not None, bool(callbacks.plain)
    feed.wants_step_locals = sb3
    world = agent.world_size
    # before the collector process starts: an error here (a run directory that cannot be made)
    # must not leave it running outside the try/finally that stops it
    logger = open_run_logger(agent, feed.horizon, feed.resume_step)
    collector = feed.collector
    start_step = int(agent.global_step)
    feed.start()
    guard = SignalCheckpoint()
    start = time.perf_counter()
    end: float | None = None
    every_rank_here = False  # the run ended or stopped on every rank, not in an error

    def check() -> None:
        collector.check()
        if world == 1 and guard.requested:
            raise TrainingInterrupted(guard.signal_name, agent.global_step)

    waits = Waits(check)
    try:
        with guard:
            feed.wait_started(check)
            start = time.perf_counter()  # rates are timed from when the collector process runs
            callbacks.training_start(agent, feed.horizon)
            go_on = True
            # the optimiser's turns mix waiting with updating: only the load is read again
            threads = agent.adaptive_threads(reserved=int(collector.options.threads))
            while not feed.complete and go_on:
                threads.check()
                if sb3:
                    callbacks.rollout_start()
                meet = feed.turn(waits, guard.requested)
                if (sb3 or plain) and feed.last_turn is not None:
                    steps, values = feed.last_turn
                    elapsed = max(time.perf_counter() - start, 1e-9)
                    values["charts/SPS"] = (int(agent.global_step) - start_step) / elapsed
                    if sb3:
                        go_on = callbacks.rollout_end(steps)
                    if plain:
                        go_on = callbacks.iteration_end(agent, values) and go_on
                if not meet:
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
            callbacks.training_end()
        end = time.perf_counter()  # the run's rates exclude stopping the collector process
        every_rank_here = True
    except TrainingInterrupted:
        every_rank_here = True  # the ranks agreed on the stop
        announce_interrupt(logger, agent, guard.signal_name or "SIGTERM")
        raise
    finally:
        if end is None:
            end = time.perf_counter()
        feed.stop()
        feed.final_checkpoint(every_rank_here)
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
        sampler_wait_fraction=collector.counters.sampler_wait / seconds,
        mean_policy_lag=feed.lag_sum / updates if updates else 0.0,
        replay_ratio_setting=feed.replay_ratio_setting,
    )
