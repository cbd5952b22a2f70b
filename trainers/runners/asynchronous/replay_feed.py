"""The replay feed of the asynchronous loop: the DQN family trains on chunks of steps.

The sampler process collects chunks of ``async_max_lead / 2`` env steps (whole vector steps)
into a shared double buffer and announces each on a queue; the optimiser adds each chunk to the
replay buffer itself, in order, makes the updates then due by the
:class:`~vecaccel.trainers.run.schedules.ReplaySchedule` (the replay ratio holds at every chunk's
end), publishes its weights and frees the slot. The sampler is thus at most two chunks ahead of
the updates, and chunk ``n`` acts with the weights published after chunk ``n - 2``'s updates or
newer ones. With a fixed lag exactly those (the sampler waits for them, and the optimiser
publishes no newer ones before they are pulled), so a seeded run repeats exactly.

Budgets, ``learning_starts`` and the exploration schedule count env steps over all ranks (each
rank collects ``1/K`` of them); the ranks meet after every chunk, at the same update count on
every rank, so they call the same collectives in the same order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vecaccel.trainers.run.schedules import ReplaySchedule
from vecaccel.trainers.runners.asynchronous.loop import Meeting, Waits
from vecaccel.trainers.runners.asynchronous.process import SamplerHandle, SamplerOptions
from vecaccel.trainers.runners.asynchronous.samplers import chunk_sampler_loop
from vecaccel.trainers.runners.asynchronous.shared import Handover, chunk_slots

__all__ = ["ReplayFeed"]

# what the sampler process reads of the run's config
_SAMPLER_CONFIG = (
    "backend",
    "backend_options",
    "num_workers",
    "seed",
    "start_epsilon",
    "end_epsilon",
)


class ReplayFeed:
    """Replay samples for the DQN family, from chunks the sampler process collects.

    Args:
        agent: a DQN-family algorithm with its networks built; its step and update counters
            are where this run starts.
        env_id: the Gymnasium id the sampler process builds.
        horizon: the step the run ends at, over all ranks.
        fresh: the run starts from zero (``learning_starts`` applies even with a restored buffer).
        fixed_lag: act on each chunk with the weights of two chunks before, exactly.
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
        self.num_envs = num_envs = cfg.num_envs
        self.start_global = start_global = int(agent.global_step)
        self.updates_at_start = int(agent.num_updates)
        # budgets count env steps over all ranks; each rank collects its share
        self.local_start = local_start = start_global // world
        self.local_total = local_total = math.ceil(horizon / world)
        self.sampler = SamplerHandle(options, "sampler", agent.q_network, self._finished)
        self.counters = self.sampler.counters
        # only the optimiser touches the replay buffer: the sampler hands its steps over
        buffer = agent.make_buffer(num_envs)
        restored = agent.restore_replay(buffer)  # the loaded checkpoint's buffer, if any
        buffer.end_episodes()  # the sampler's envs start new episodes
        agent.set_buffer(buffer)
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
        # chunks of half the lead (whole vector steps), the last one cut to the budget
        self.chunk_steps = chunk_steps = max(1, math.ceil(lead / 2 / num_envs))
        vector_steps = max(0, math.ceil((local_total - local_start) / num_envs))
        self.num_chunks = math.ceil(vector_steps / chunk_steps)
        # the target network follows every target_update_period env steps' worth of updates:
        # counted in updates, it moves at the same update on every rank
        self.target_every = self.schedule.updates_per_target_update
        self.log_every = max(1, int(cfg.log_every_steps))
        exploration = cfg.exploration_steps or int(cfg.exploration_fraction * horizon)
        self.handover = Handover(self.sampler.ctx)
        self.spec = dict(
            self.sampler.spec(),
            env_id=env_id,
            num_envs=num_envs,
            config={key: getattr(cfg, key) for key in _SAMPLER_CONFIG},
            # a continued run restarts its envs at a seed of its own, not the first episodes again
            env_seed=cfg.seed if start_global == 0 else agent.restart_seed(),
            network=_cpu_copy(agent.q_network),
            support=None if agent.support is None else agent.support.cpu(),
            action_space=agent.action_space,
            updates_at_start=self.updates_at_start,
            exploration_steps=math.ceil(exploration / world),
            start_steps=local_start,
            chunk_steps=chunk_steps,
            vector_steps=vector_steps,
            slots=chunk_slots(agent.observation_space, num_envs, chunk_steps),
            fixed_lag=bool(fixed_lag),
            handover=self.handover,
        )
        self.steps = local_start  # env steps of this rank
        self.complete = False
        self.updates_done = 0
        self.lag_sum = 0.0
        self.replay_ratio = 0.0
        self.chunk = 0  # the next chunk
        self.finished: list[tuple[float, float]] = []  # episodes since the last row
        self.recent_losses: list[dict[str, float]] = []  # updates' metrics since the last row
        self.next_log = (start_global // self.log_every + 1) * self.log_every
        self.slot_views = [
            {key: value.numpy() for key, value in slot.items()} for slot in self.spec["slots"]
        ]

    def _finished(self, exitcode: int | None) -> bool:
        """Whether the sampler process's exit is the run's normal end."""
        return exitcode == 0 and self.counters.steps >= self.local_total

    def start(self) -> None:
        self.counters.steps = self.local_start
        self.sampler.publish(self.updates_at_start)
        self.sampler.start(chunk_sampler_loop, self.spec)

    def ready(self) -> bool:
        return bool(self.counters.ready)

    # -- the updates ---------------------------------------------------------------------------

    def _due_at(self, steps: int) -> int:
        """The update count due once ``steps`` env steps (of this rank) were collected."""
        if steps <= self.learn_from:
            return self.updates_at_start
        return self.updates_at_start + self.rank_schedule.updates_due(steps - self.learn_from)

    def _update(self, behaviour: int) -> None:
        """One update (a collective on K ranks); ``behaviour``: the weights' version that
        collected the chunk it trains on."""
        agent = self.agent
        _, batch = agent.sample_batch(self.steps / self.local_total)
        self.recent_losses.append(agent.update(batch))
        agent.record_progress(updates=1)
        self.updates_done += 1
        self.lag_sum += agent.num_updates - behaviour
        if agent.num_updates % self.target_every == 0:
            agent.update_target()
        every = self.cfg.checkpoint_every
        if every and agent.num_updates % every == 0 and agent.run_dir is not None:
            agent.write_checkpoint(agent.run_dir, replay=self.cfg.checkpoint_replay)

    def turn(self, waits: Waits, requested: bool) -> bool:
        """Chunk ``m``: into the replay buffer in order, then the updates it makes due."""
        agent, m = self.agent, self.chunk
        if m >= self.num_chunks:  # an empty budget
            self.complete = True
            return False
        length, behaviour, ended = self.handover.take(waits)
        shared = self.slot_views[m % 2]
        for t in range(length):  # in order: the run repeats exactly
            agent.buffer.add(
                shared["obs"][t],
                shared["actions"][t],
                shared["rewards"][t],
                shared["terminated"][t],
                shared["truncated"][t],
                shared["final_obs"][t],
            )
        self.steps += length * self.num_envs
        agent.record_progress(steps=self.steps * self.world - agent.global_step)
        self.finished.extend(ended)
        agent.episode_log.extend((self.steps * self.world, r, n) for r, n in ended)
        while agent.num_updates < self._due_at(self.steps):
            self._update(behaviour)
        if self.fixed_lag:  # not before chunk m + 1 has taken the weights after chunk m - 1
            self.handover.await_pulls(min(m + 2, self.num_chunks), waits)
            self.sampler.publish(agent.num_updates)
            self.handover.publishes.release()
        elif agent.num_updates - self.counters.version >= self.cfg.async_weight_sync_period:
            self.sampler.publish(agent.num_updates)
        # refilled only now: the chunk collected into it next acts with the weights just
        # published or newer ones, not with those from before this chunk's updates
        self.handover.free_slots.release()
        self.chunk = m + 1
        self.complete = m == self.num_chunks - 1
        # every rank meets after every chunk, at the same update count
        return self.complete or self.world > 1 or requested or self.steps >= self.next_log

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
            "charts/sampler_wait_fraction": self.counters.sampler_wait / elapsed,
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
        self.sampler.stop(self.handover.filled)

    def final_checkpoint(self, every_rank_here: bool, logger: Any) -> None:
        """Write the checkpoint at the end of the run, the sampler stopped.

        On several ranks the checkpoint is a collective (each rank writes its replay buffer):
        after an error the other ranks may never come, and the last checkpoint stays; so it does
        after an error before any step (a sampler that could not start).
        """
        agent = self.agent
        progressed = agent.global_step > self.start_global
        if agent.run_dir is None or not (every_rank_here or (self.world == 1 and progressed)):
            return
        agent.write_checkpoint(agent.run_dir, replay=self.cfg.checkpoint_replay)


def _cpu_copy(module: Any) -> Any:
    import copy

    return copy.deepcopy(module).cpu()
