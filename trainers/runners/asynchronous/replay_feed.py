"""The replay feed of the asynchronous loop: the DQN family samples a shared replay buffer.

Throttled (the default), the sampler process adds each step to the replay buffer as it goes,
acting with the newest weights, and the replay ratio (``updates × batch / env steps`` after
``learning_starts``) is **enforced by throttling** both sides: the optimiser waits while no
update is due, and the sampler waits while it is more than ``async_max_lead`` env steps ahead
of what the updates done so far allow. The sampler never waits for a lock in steady state:
steps collected while the optimiser samples (holding the buffer's lock for the whole batch) are
kept and added with the next step that finds the lock free, and weights being published are
picked up at the next step instead of waited for.

With a fixed lag the sampler collects chunks of ``async_max_lead / 2`` env steps into a shared
double buffer; the optimiser adds each chunk to the replay buffer itself, in order, makes the
updates then due, and chunk ``n`` is acted on with the weights published after chunk ``n - 2``'s
updates, exactly, so a seeded run repeats exactly.

Budgets, ``learning_starts`` and the exploration schedule count env steps over all ranks (each
rank collects ``1/K`` of them). The ranks meet at least every few updates, at the same update
count on every rank, so they call the same collectives in the same order.
"""

from __future__ import annotations

import math
import queue
import time
from typing import Any

import numpy as np

from vecaccel.trainers.run.schedules import ReplaySchedule
from vecaccel.trainers.runners.asynchronous.loop import Meeting, Waits
from vecaccel.trainers.runners.asynchronous.process import SamplerHandle, SamplerOptions, drain
from vecaccel.trainers.runners.asynchronous.samplers import chunk_sampler_loop, replay_sampler_loop
from vecaccel.trainers.runners.asynchronous.shared import (
    CHUNKS,
    PULLS,
    READY,
    SAMPLER_VERSION,
    SAMPLER_WAIT,
    SLOT_K,
    SLOT_STATE,
    SLOT_VERSION,
    STEPS,
    UPDATES,
    LockedBuffer,
    SharedFactory,
    build_replay_buffer,
    chunk_slots,
)

__all__ = ["ReplayFeed"]

# ranks meet at least every this many updates (to agree on a stop and reduce metrics)
_MAX_UPDATES_BETWEEN_MEETINGS = 16
# what the sampler process reads of the run's config
_SAMPLER_CONFIG = (
    "backend",
    "backend_options",
    "num_workers",
    "seed",
    "batch_size",
    "replay_ratio",
    "start_epsilon",
    "end_epsilon",
)


class ReplayFeed:
    """Replay samples for the DQN family, throttled to the replay ratio or with a fixed lag.

    Args:
        agent: a DQN-family algorithm with its networks built; its step and update counters
            are where this run starts.
        env_id: the Gymnasium id the sampler process builds.
        horizon: the step the run ends at, over all ranks.
        fresh: the run starts from zero (``learning_starts`` applies even with a restored buffer).
        fixed_lag: chunks with a fixed policy lag instead of throttling.
        options: how the sampler process runs.
    """

    def __init__(
        self,
        agent: Any,
        env_id: str,
        horizon: int,
        *,
        fresh: bool,
        fixed_lag: bool,
        options: SamplerOptions,
    ) -> None:
        self.agent = agent
        cfg = self.cfg = agent.config
        self.world = world = int(agent.world_size)
        self.fixed_lag = fixed_lag
        self.poll_interval = options.poll_interval
        self.num_envs = num_envs = cfg.num_envs
        self.start_global = start_global = int(agent.global_step)
        self.updates_at_start = int(agent.num_updates)
        # budgets count env steps over all ranks; each rank collects its share
        self.local_start = local_start = start_global // world
        self.local_total = local_total = math.ceil(horizon / world)
        self.sampler = SamplerHandle(options, "sampler", agent.q_network, self._finished)
        self.counters, self.timers = self.sampler.counters, self.sampler.timers
        factory = SharedFactory()
        buffer_spec = {"prioritized": cfg.prioritized, "kwargs": agent.buffer_kwargs(num_envs)}
        buffer = build_replay_buffer(
            buffer_spec, agent.observation_space, agent.action_space, factory
        )
        restored = agent.restore_replay(buffer)  # the loaded checkpoint's buffer, if any
        buffer.end_episodes()  # the sampler's envs start new episodes
        self.buffer, self.buffer_lock = buffer, self.sampler.ctx.Lock()
        # the run's schedule over all ranks, and this rank's share of it in its own steps
        self.schedule = ReplaySchedule.of(cfg, ranks=world)
        self.rank_schedule = self.schedule.rank_share()
        # a continued run that restored its buffer does not wait for learning_starts again
        self.learn_from = self.rank_schedule.learn_from(
            local_start,
            min_fill=num_envs * (cfg.n_step + buffer.frame_stack + 1),
            warm_up=fresh or not restored,
        )
        steps_per_update = cfg.batch_size / cfg.replay_ratio
        lead = cfg.async_max_lead or max(num_envs, int(math.ceil(16 * steps_per_update)))
        # fixed lag: chunks of half the lead (whole vector steps), the last one cut to the budget
        self.chunk_steps = chunk_steps = max(1, math.ceil(lead / 2 / num_envs))
        vector_steps = max(0, math.ceil((local_total - local_start) / num_envs))
        self.num_chunks = math.ceil(vector_steps / chunk_steps)
        # the target network follows every target_update_period env steps' worth of updates:
        # counted in updates, it moves at the same update on every rank
        self.target_every = self.schedule.updates_per_target_update
        self.log_every = max(1, int(cfg.log_every_steps))
        self.meet_every = min(
            _MAX_UPDATES_BETWEEN_MEETINGS, self.schedule.updates_per_steps(self.log_every)
        )
        exploration = cfg.exploration_steps or int(cfg.exploration_fraction * horizon)
        agent.set_buffer(LockedBuffer(buffer, self.buffer_lock, self.sampler.check))
        self.episodes = self.sampler.ctx.Queue()
        self.spec = dict(
            self.sampler.spec(),
            env_id=env_id,
            num_envs=num_envs,
            config={key: getattr(cfg, key) for key in _SAMPLER_CONFIG},
            # a continued run restarts its envs at a seed of its own, not the first episodes again
            env_seed=cfg.seed if start_global == 0 else agent.restart_seed(),
            network=_cpu_copy(agent.q_network),
            support=None if agent.support is None else agent.support.cpu(),
            buffer=buffer_spec,
            buffer_tensors=factory.tensors,
            observation_space=agent.observation_space,
            action_space=agent.action_space,
            buffer_lock=self.buffer_lock,
            episodes=self.episodes,
            total_steps=local_total,
            learn_from=self.learn_from,
            updates_at_start=self.updates_at_start,
            lead=lead,
            exploration_steps=math.ceil(exploration / world),
            start_steps=local_start,
            chunk_steps=chunk_steps,
            vector_steps=vector_steps,
            slots=chunk_slots(agent.observation_space, num_envs, chunk_steps)
            if fixed_lag
            else None,
        )
        self.steps = local_start  # env steps of this rank
        self.complete = False
        self.updates_done = 0
        self.lag_sum = 0.0
        self.replay_ratio = 0.0
        self.chunk = 0  # the fixed lag's next chunk
        self.finished: list[tuple[float, float]] = []  # episodes since the last row
        self.recent_losses: list[dict[str, float]] = []  # updates' metrics since the last row
        self.next_log = (start_global // self.log_every + 1) * self.log_every
        self.next_drain = 0.0
        self.slot_views = [
            {key: value.numpy() for key, value in slot.items()} for slot in self.spec["slots"] or ()
        ]

    def _finished(self, exitcode: int | None) -> bool:
        """Whether the sampler process's exit is the run's normal end."""
        return exitcode == 0 and int(self.counters[STEPS]) >= self.local_total

    def start(self) -> None:
        self.counters[STEPS] = self.local_start
        self.counters[UPDATES] = self.updates_at_start
        self.sampler.publish(self.updates_at_start)
        loop = chunk_sampler_loop if self.fixed_lag else replay_sampler_loop
        self.sampler.start(loop, self.spec)

    def ready(self) -> bool:
        return bool(self.counters[READY])

    # -- the updates ---------------------------------------------------------------------------

    def _due_at(self, steps: int) -> int:
        """The update count due once ``steps`` env steps (of this rank) were collected."""
        if steps <= self.learn_from:
            return self.updates_at_start
        return self.updates_at_start + self.rank_schedule.updates_due(steps - self.learn_from)

    def _update(self, behaviour: int | None) -> None:
        """One update (a collective on K ranks); ``behaviour``: the weights that collected the
        chunk (fixed lag), else the sampler's current ones (and they are published here)."""
        agent, cfg, counters = self.agent, self.cfg, self.counters
        _, batch = agent.sample_batch(self.steps / self.local_total)
        self.recent_losses.append(agent.update(batch))
        agent.record_progress(updates=1)
        self.updates_done += 1
        counters[UPDATES] = agent.num_updates
        if behaviour is None:
            if agent.num_updates % cfg.async_weight_sync_period == 0:
                self.sampler.publish(agent.num_updates)
            behaviour = int(counters[SAMPLER_VERSION])
        self.lag_sum += agent.num_updates - behaviour
        if agent.num_updates % self.target_every == 0:
            agent.update_target()
        if cfg.checkpoint_every and agent.num_updates % cfg.checkpoint_every == 0:
            if agent.run_dir is not None:
                with agent.buffer.held():  # the buffer as it is between two of the sampler's adds
                    self._write_checkpoint()

    def _write_checkpoint(self) -> None:
        """Write the agent's checkpoint (with the buffer's lock held): it saves the buffer
        itself, not the locked view."""
        agent = self.agent
        locked = agent.buffer
        agent.set_buffer(self.buffer)
        try:
            agent.write_checkpoint(agent.run_dir, replay=self.cfg.checkpoint_replay)
        finally:
            agent.set_buffer(locked)

    def _record(self, ended: list[tuple[float, float]]) -> None:
        self.finished.extend(ended)
        self.agent.episode_log.extend((self.steps * self.world, r, n) for r, n in ended)

    def _drain_episodes(self) -> None:
        for _, ended in drain(self.episodes):
            self._record(ended)

    # -- the turns -----------------------------------------------------------------------------

    def turn(self, waits: Waits, requested: bool) -> bool:
        if self.fixed_lag:
            return self._chunk_turn(waits, requested)
        return self._stream_turn(waits, requested)

    def _stream_turn(self, waits: Waits, requested: bool) -> bool:
        """One update if one is due, else the end of the budget, else a short wait."""
        agent = self.agent
        self.sampler.check()
        self.steps = steps = int(self.counters[STEPS])
        agent.record_progress(steps=steps * self.world - agent.global_step)
        updated = False
        if agent.num_updates < self._due_at(steps):
            self._update(None)
            updated = True
        elif steps >= self.local_total:
            self.complete = True
            # the episodes of the last steps may still be on their way: the sampler counts a
            # step before its queue's feeder thread has sent them
            self.sampler.finish(self._drain_episodes)
        else:
            waits.pause()
        now = time.perf_counter()
        if self.world == 1:
            meeting = self.complete or requested or steps >= self.next_log
        else:  # at the same update on every rank, so the collectives pair up
            meeting = self.complete or (updated and agent.num_updates % self.meet_every == 0)
        if now >= self.next_drain or meeting:
            self.next_drain = now + 0.02  # polling the queue's pipe costs ~0.2 ms a time
            self._drain_episodes()
        return meeting

    def _chunk_turn(self, waits: Waits, requested: bool) -> bool:
        """Chunk ``m``: into the replay buffer in order, then the updates it makes due."""
        agent, counters, m = self.agent, self.counters, self.chunk
        if m >= self.num_chunks:  # an empty budget
            self.complete = True
            return False
        full = SLOT_STATE + m % 2
        waits.until(lambda: bool(counters[full]))
        shared, length = self.slot_views[m % 2], int(counters[SLOT_K + m % 2])
        behaviour = int(counters[SLOT_VERSION + m % 2])
        with agent.buffer.held() as held:  # in order: the run repeats exactly
            for t in range(length):
                held.add(
                    shared["obs"][t],
                    shared["actions"][t],
                    shared["rewards"][t],
                    shared["terminated"][t],
                    shared["truncated"][t],
                    shared["final_obs"][t],
                )
        counters[full] = 0  # the slot may be refilled now
        self.steps += length * self.num_envs
        agent.record_progress(steps=self.steps * self.world - agent.global_step)
        self._record(self._chunk_episodes())
        while agent.num_updates < self._due_at(self.steps):
            self._update(behaviour)
        # not before chunk m + 1 has taken the weights after chunk m - 1
        waits.until(lambda: counters[PULLS] >= min(m + 2, self.num_chunks))
        self.sampler.publish(agent.num_updates)
        counters[CHUNKS] = m + 1
        self.chunk = m + 1
        self.complete = m == self.num_chunks - 1
        # every rank meets after every chunk, at the same update count
        return self.complete or self.world > 1 or requested or self.steps >= self.next_log

    def _chunk_episodes(self) -> list[tuple[float, float]]:
        """The episodes the chunk just taken ended (sent before its slot was marked full)."""
        while True:
            try:
                return self.episodes.get(timeout=0.2)
            except queue.Empty:
                self.sampler.check()

    # -- the meetings and the end --------------------------------------------------------------

    def meeting(self, elapsed: float, optimizer_wait: float) -> Meeting:
        agent, cfg, finished = self.agent, self.cfg, self.finished
        metrics: dict[str, float | None] = {
            "charts/SPS": (self.steps - self.local_start) / elapsed,
            "charts/UPS": self.updates_done / elapsed,
            "charts/updates": agent.num_updates,
            "charts/replay_ratio_setting": cfg.replay_ratio,
            "charts/learning_rate": agent.learning_rate,
            "charts/lr_scale": agent.lr_scale,
            "charts/optimizer_wait_fraction": optimizer_wait / elapsed,
            "charts/sampler_wait_fraction": float(self.timers[SAMPLER_WAIT]) / elapsed,
            "charts/policy_lag": self.lag_sum / self.updates_done if self.updates_done else None,
            "charts/episodic_return": float(np.mean([r for r, _ in finished]))
            if finished
            else None,
            "charts/episodic_length": float(np.mean([n for _, n in finished]))
            if finished
            else None,
            "_steps": self.steps,
            "_learned": max(0, self.steps - self.learn_from),
        }
        recent = self.recent_losses
        for key in recent[0] if recent else ():
            metrics[key] = float(np.mean([m[key] for m in recent]))
        return Meeting(metrics, len(finished), ("charts/SPS", "_steps", "_learned"))

    def log_step(self, metrics: dict[str, float | None]) -> int | None:
        global_steps, learned = int(metrics.pop("_steps") or 0), metrics.pop("_learned") or 0
        if global_steps < self.next_log and not self.complete:
            return None
        self.next_log = (global_steps // self.log_every + 1) * self.log_every
        metrics["charts/replay_ratio"] = (
            self.schedule.measured_ratio(self.updates_done, learned) if learned > 0 else None
        )
        if self.finished and self.world == 1:
            metrics["charts/episodes"] = len(self.finished)
        self.finished, self.recent_losses = [], []
        return global_steps

    def stop(self) -> None:
        if self.complete:
            measured = self.rank_schedule.measured_ratio(
                self.updates_done, max(1, self.steps - self.learn_from)
            )
            self.replay_ratio = measured
            self.agent.set_measured_replay_ratio(measured)
        self.sampler.stop(self.episodes)

    def final_checkpoint(self, every_rank_here: bool, logger: Any) -> None:
        """Write the checkpoint at the end of the run, the sampler stopped.

        On several ranks the checkpoint is a collective (each rank writes its replay buffer):
        after an error the other ranks may never come, and the last checkpoint stays; so it does
        after an error before any step (a sampler that could not start). A lock the sampler
        still holds means that it died in the middle of an add and left the buffer torn (on any
        rank): then nothing is written and the last checkpoint stays the restart point.
        """
        from vecaccel.trainers.run import distributed

        agent = self.agent
        progressed = agent.global_step > self.start_global
        if agent.run_dir is None or not (every_rank_here or (self.world == 1 and progressed)):
            return
        held = bool(self.buffer_lock.acquire(block=False))
        try:
            if self.world > 1:
                torn = distributed.all_reduce_any(not held, device=agent.device)
            else:
                torn = not held
            if not torn:
                self._write_checkpoint()
            else:
                logger.write(
                    "the sampler stopped in the middle of a replay buffer write: no checkpoint "
                    "written now, the last one is kept"
                )
        finally:
            if held:
                self.buffer_lock.release()


def _cpu_copy(module: Any) -> Any:
    import copy

    return copy.deepcopy(module).cpu()
