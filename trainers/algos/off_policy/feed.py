"""The replay feed of the asynchronous loop: the DQN family trains on chunks of steps.

The collector process (:func:`chunk_collector_loop`) collects chunks of ``async_max_lead / 2`` env
steps (whole vector steps); the optimiser (:class:`ReplayFeed`) adds each chunk to the replay
buffer itself, in order, makes the updates then due by the
:class:`~vecaccel.trainers.services.schedules.ReplaySchedule` (the replay ratio holds at every chunk's
end), publishes its weights and frees the slot. The sampler is thus at most two chunks ahead of
the updates: chunk ``n`` acts with the weights published after chunk ``n - 2``'s updates, with a
fixed lag exactly those, otherwise those or newer ones.

Budgets, ``learning_starts`` and the exploration schedule count env steps over all ranks (each
rank collects ``1/K`` of them); the ranks meet after every chunk, at the same update count on
every rank, so they call the same collectives in the same order.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch

from vecaccel.trainers.runners.asynchronous.loop import AsyncFeed, Meeting
from vecaccel.trainers.runners.asynchronous.process import ChildLink, CollectorOptions, Waits
from vecaccel.trainers.runners.asynchronous.shared import CHILD_SEED_KEY, chunk_slots
from vecaccel.trainers.services.logger import mean_or_none
from vecaccel.trainers.services.schedules import ReplaySchedule

__all__ = ["ReplayFeed", "chunk_collector_loop"]


class ReplayFeed(AsyncFeed):
    """Replay samples for the DQN family, from chunks the collector process collects.

    Args:
        agent: a DQN-family algorithm with its networks built.
        total_timesteps: env steps to collect, over all ranks (``None``: what a loaded run has
            left).
        reset_num_timesteps: count env steps and updates from zero (``learning_starts``
            applies even with a restored buffer).
        weight_sync_period: updates between weight copies to the collector process: its
            weights are published at the end of a chunk once that many updates were made since
            the last copy.
        options: how the collector process runs.
    """

    def __init__(
        self,
        agent: Any,
        total_timesteps: int | None,
        *,
        reset_num_timesteps: bool,
        weight_sync_period: int,
        options: CollectorOptions,
    ) -> None:
        self.weight_sync_period = int(weight_sync_period)
        if total_timesteps is None:
            agent.set_budget(None)  # raises unless a loaded run has steps left
            total_timesteps, reset_num_timesteps = agent.target_steps - agent.global_step, False
        if reset_num_timesteps:
            agent.reset_counters()
        # recorded in checkpoints: `vecaccel train --resume` goes on async, with the same options
        agent.set_run_mode(
            {"weight_sync_period": self.weight_sync_period, "fixed_lag": options.fixed_lag}
        )
        super().__init__(agent, agent.q_network, "sampler", chunk_collector_loop, options)
        cfg = self.cfg = agent.config
        self.replay_ratio_setting = float(cfg.replay_ratio)
        self.world = world = int(agent.world_size)
        num_envs = cfg.num_envs
        self.start_global = start_global = int(agent.global_step)
        self.horizon = horizon = start_global + int(total_timesteps)
        self.resume_step = None if reset_num_timesteps else start_global
        self.updates_at_start = int(agent.num_updates)
        # budgets count env steps over all ranks; each rank collects its share
        self.local_start = local_start = start_global // world
        self.local_total = local_total = math.ceil(horizon / world)
        self.counters.steps = local_start
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
            warm_up=reset_num_timesteps or not restored,
        )
        steps_per_update = cfg.batch_size / cfg.replay_ratio
        lead = cfg.async_max_lead or max(num_envs, int(math.ceil(16 * steps_per_update)))
        # chunks of half the lead (whole vector steps), the last one cut to the budget
        chunk_steps = max(1, math.ceil(lead / 2 / num_envs))
        vector_steps = max(0, math.ceil((local_total - local_start) / num_envs))
        self.num_chunks = math.ceil(vector_steps / chunk_steps)
        # the target network follows every target_update_period env steps' worth of updates:
        # counted in updates, it moves at the same update on every rank
        self.target_every = self.schedule.updates_per_target_update
        self.log_every = max(1, int(cfg.log_every_steps))
        exploration = cfg.exploration_steps or int(cfg.exploration_fraction * horizon)
        self.spec = dict(
            config=cfg,
            # a continued run restarts its envs at a seed of its own, not the first episodes again
            env_seed=cfg.seed if start_global == 0 else agent.restart_seed(),
            network=copy.deepcopy(agent.q_network).cpu(),
            support=None if agent.support is None else agent.support.cpu(),
            observation_space=agent.observation_space,
            action_space=agent.action_space,
            exploration_steps=math.ceil(exploration / world),
            chunk_steps=chunk_steps,
            vector_steps=vector_steps,
            # a copy that normalises with the statistics handed over with the weights and
            # hands back what each chunk observed
            normalizer=None if agent.normalizer is None else agent.normalizer.for_collector(),
        )
        self.steps = local_start  # env steps of this rank
        self.chunk = 0  # the next chunk
        self.finished_episodes: list[tuple[float, float]] = []  # since the last row
        self.recent_losses: list[dict[str, float]] = []  # updates' metrics since the last row
        self.env_timing: dict[str, float] = {}  # the collector's vector env's stats, last chunk
        self.next_log = (start_global // self.log_every + 1) * self.log_every

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
        self.last_turn = None
        if m >= self.num_chunks:  # an empty budget
            self.complete = True
            return False
        length, behaviour, ended, self.env_timing = waits.take(self.channels.filled)
        shared = {key: value.numpy() for key, value in self.slots[m % 2].items()}
        if agent.normalizer is not None:  # the chunk's moments, merged over the ranks
            agent.normalizer.add_moments(shared["moments"])
            agent.normalizer.sync(agent.device)
        for t in range(length):  # in order: the run repeats exactly
            agent.buffer.add(
                shared["obs"][t],
                shared["actions"][t],
                shared["rewards"][t],
                shared["terminated"][t],
                shared["truncated"][t],
                shared["final_obs"][t],
            )
        self.steps += length * self.cfg.num_envs
        agent.record_progress(steps=self.steps * self.world - agent.global_step)
        self.finished_episodes.extend(ended)
        agent.episode_log.extend((self.steps * self.world, r, n) for r, n in ended)
        losses_before = len(self.recent_losses)
        while agent.num_updates < self._due_at(self.steps):
            self._update(behaviour)
        steps: list[dict[str, Any]] = []
        if self.wants_step_locals:  # read before the slot is freed and refilled
            dones = shared["terminated"] | shared["truncated"]
            steps = [
                {
                    "rewards": shared["rewards"][t].copy(),
                    "dones": dones[t],
                    "actions": shared["actions"][t].copy(),
                }
                for t in range(length)
            ]
        losses = self.recent_losses[losses_before:]
        values: dict[str, Any] = {
            "global_step": agent.global_step,
            "charts/updates": agent.num_updates,
            "charts/episodes": len(ended),
            "charts/episodic_return": mean_or_none(r for r, _ in ended),
            "charts/episodic_length": mean_or_none(n for _, n in ended),
            "charts/learning_rate": agent.learning_rate,
        }
        for key in losses[0] if losses else ():
            values[key] = float(np.mean([update[key] for update in losses]))
        self.last_turn = (steps, values)
        # with a fixed lag, not before chunk m + 1 has taken the weights after chunk m - 1
        sync_due = agent.num_updates - self.counters.version >= self.weight_sync_period
        self.sync_weights(waits, min(m + 2, self.num_chunks), sync_due)
        # freed only now: the chunk collected into it next acts with the weights just
        # published or newer ones, not with those from before this chunk's updates
        self.channels.free_slots.release()
        self.chunk = m + 1
        self.complete = m == self.num_chunks - 1
        # every rank meets after every chunk, at the same update count
        return self.complete or self.world > 1 or requested or self.steps >= self.next_log

    def meeting(self, elapsed: float, optimizer_wait: float) -> Meeting:
        agent, episodes = self.agent, self.finished_episodes
        metrics: dict[str, float | None] = {
            "charts/SPS": (self.steps - self.local_start) / elapsed,
            "charts/UPS": self.updates_done / elapsed,
            "charts/updates": agent.num_updates,
            "charts/replay_ratio_setting": self.cfg.replay_ratio,
            "charts/learning_rate": agent.learning_rate,
            "charts/lr_scale": agent.lr_scale,
            "charts/optimizer_wait_fraction": optimizer_wait / elapsed,
            "charts/sampler_wait_fraction": self.counters.sampler_wait / elapsed,
            "charts/policy_lag": self.lag_sum / self.updates_done if self.updates_done else None,
            "charts/episodic_return": mean_or_none(r for r, _ in episodes),
            "charts/episodic_length": mean_or_none(n for _, n in episodes),
            **self.env_timing,  # the collector process's vector env: where its steps' time goes
            "_steps": self.steps,
            "_learned": max(0, self.steps - self.learn_from),
        }
        recent = self.recent_losses
        for key in recent[0] if recent else ():
            metrics[key] = mean_or_none(losses[key] for losses in recent)
        return Meeting(metrics, len(episodes), ("charts/SPS", "_steps", "_learned"))

    def log_step(self, metrics: dict[str, float | None]) -> int | None:
        global_steps, learned = int(metrics.pop("_steps") or 0), metrics.pop("_learned") or 0
        if global_steps < self.next_log and not self.complete:
            return None
        self.next_log = (global_steps // self.log_every + 1) * self.log_every
        metrics["charts/replay_ratio"] = (
            self.schedule.measured_ratio(self.updates_done, learned) if learned > 0 else None
        )
        if self.finished_episodes and self.world == 1:
            metrics["charts/episodes"] = len(self.finished_episodes)
        self.finished_episodes, self.recent_losses = [], []
        return global_steps

    def stop(self) -> None:
        if self.complete:
            measured = self.rank_schedule.measured_ratio(
                self.updates_done, max(1, self.steps - self.learn_from)
            )
            self.replay_ratio = measured
            self.agent.set_measured_replay_ratio(measured)
        super().stop()

    def final_checkpoint(self, every_rank_here: bool) -> None:
        # on several ranks the checkpoint is a collective (each rank writes its replay buffer):
        # after an error the other ranks may never come, and the last checkpoint stays; so it
        # does after an error before any step (a sampler that could not start)
        agent = self.agent
        progressed = agent.global_step > self.start_global
        if agent.run_dir is None or not (every_rank_here or (self.world == 1 and progressed)):
            return
        agent.write_checkpoint(agent.run_dir, replay=self.cfg.checkpoint_replay)


def chunk_collector_loop(spec: dict[str, Any]) -> None:
    """The DQN family's sampler: chunk ``n`` of ε-greedy steps into slot ``n % 2``, stepped by
    the algorithm's own acting policy and collector
    (:class:`~vecaccel.trainers.algos.off_policy.exploration.EpsilonGreedy`)."""
    from vecaccel.trainers.algos.off_policy.exploration import EnvStepper, EpsilonGreedy
    from vecaccel.trainers.envs.make import action_start, backend_options_of, make_env_for_training
    from vecaccel.trainers.envs.normalized import normalized_envs
    from vecaccel.trainers.services.env_timing import env_timing_metrics
    from vecaccel.trainers.services.schedules import linear_schedule
    from vecaccel.trainers.services.seeding import seed_everything, split_seed

    link = ChildLink(spec)
    channels = link.channels
    cfg = spec["config"]
    steps = link.counters.steps  # where this rank's steps start
    # its own draws (e.g. noisy nets' noise), new ones for a resumed run (the version published
    # before this process started)
    seed_everything(split_seed(int(spec["env_seed"]), CHILD_SEED_KEY, link.counters.version))
    network: torch.nn.Module = spec["network"]
    normalizer = spec["normalizer"]
    params = list(network.state_dict().values())
    if normalizer is not None:  # the trainer's statistics come with its weights
        params += normalizer.tensors()
    envs = make_env_for_training(
        cfg.env_id,
        cfg.num_envs,
        backend=cfg.backend,
        seed=cfg.seed,
        autoreset_mode="SameStep",
        **backend_options_of(cfg),
    )
    rng = np.random.default_rng(spec["env_seed"] + 1)
    action_space = spec["action_space"]
    policy = EpsilonGreedy(
        network, int(action_space.n), action_start(action_space), spec["support"]
    )
    collector = EnvStepper(normalized_envs(envs, normalizer), policy)
    collector.reset(seed=spec["env_seed"])
    try:
        chunk_steps, vector_steps = spec["chunk_steps"], spec["vector_steps"]
        moments = 0 if normalizer is None else normalizer.moments_size
        shared = chunk_slots(spec["observation_space"], cfg.num_envs, chunk_steps, moments)
        channels.started.put(shared)
        slots = [{key: value.numpy() for key, value in slot.items()} for slot in shared]
        for n in range(math.ceil(vector_steps / chunk_steps)):
            length = min(chunk_steps, vector_steps - n * chunk_steps)
            if not link.acquire(channels.free_slots):  # slot n % 2: chunk n - 2 trained on
                break
            version = link.weights_for(n, params)
            if version is None:
                break
            slot = slots[n % 2]
            ended: list[tuple[float, float]] = []
            for t in range(length):
                epsilon = linear_schedule(
                    cfg.start_epsilon, cfg.end_epsilon, spec["exploration_steps"], steps
                )
                transition, finished = collector.step(epsilon, rng)
                slot["obs"][t] = transition.obs
                slot["actions"][t] = transition.actions
                reward = transition.reward
                if normalizer is not None:  # the replay buffer learns from scaled rewards
                    done = transition.terminated | transition.truncated
                    reward = normalizer.scale_rewards(reward, done)
                slot["rewards"][t] = reward
                slot["terminated"][t] = transition.terminated
                slot["truncated"][t] = transition.truncated
                final_obs = transition.final_obs
                for i in np.flatnonzero(transition.terminated | transition.truncated):
                    if final_obs is not None and final_obs[i] is not None:
                        slot["final_obs"][t, i] = final_obs[i]
                steps += collector.num_envs
                ended.extend(finished)
                link.check_optimiser()
            link.counters.steps = steps
            if normalizer is not None:
                normalizer.take_moments(slot["moments"])
            channels.filled.put((length, version, ended, env_timing_metrics(envs)))
        # the slots travel as file descriptors that this process shares itself: it must not
        # exit before the optimiser has them (a run of two chunks could)
        link.acquire(channels.started_seen)
    finally:
        collector.close()
