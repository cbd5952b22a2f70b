"""The on-policy feed of the asynchronous loop: whole ``[T, B]`` rollouts from a double buffer.

A rollout process (:func:`rollout_loop`) collects batches with the weights it last received into
two shared slots, in turn, while the optimiser (:class:`RolloutFeed`) updates on the other slot.
Each batch remembers which update's weights collected it: the **policy lag** (updates between
those weights and the ones being trained) is logged as ``charts/policy_lag``; over an env that
stamps each answer with the version that chose its action (the action server), the lag is the
mean of the batch's stamps, so a row acted on with older weights counts as older. With a fixed lag
batch ``n`` is always collected with the weights of update ``n - 1``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from vecaccel.trainers.runners.asynchronous.loop import AsyncFeed, Meeting
from vecaccel.trainers.runners.asynchronous.process import ChildLink, CollectorOptions, Waits
from vecaccel.trainers.runners.asynchronous.shared import CHILD_SEED_KEY, rollout_slots
from vecaccel.trainers.services.logger import mean_or_none

__all__ = ["RolloutFeed", "rollout_loop"]


class RolloutFeed(AsyncFeed):
    """Rollouts for A2C and PPO: one update per batch, the ranks meeting after every update.

    Args:
        agent: an on-policy algorithm without envs (the rollout process has them).
        total_timesteps: env steps to collect, over all ranks, rounded up to whole batches
            (``None``: what a loaded run has left, on its own schedule).
        reset_num_timesteps: count env steps and updates from zero.
        weight_sync_period: updates between weight copies to the rollout process.
        options: how the rollout process runs.
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
        period = int(weight_sync_period)
        if options.fixed_lag and period != 1:
            raise ValueError(
                f"fixed_lag=True needs weight_sync_period=1 (every update's weights are the next "
                f"batch's), got weight_sync_period={weight_sync_period}"
            )
        if total_timesteps is None:
            agent.set_budget(None)
            num_batches = max(
                1, math.ceil((agent.target_steps - agent.global_step) / agent.batch_size)
            )
        else:
            if reset_num_timesteps:
                agent.reset_counters()
            # agent.batch_size is the batch over all ranks, so every rank makes the same updates
            num_batches = max(1, math.ceil(int(total_timesteps) / agent.batch_size))
            agent.set_budget(num_batches * agent.batch_size)
        agent.end_after_batches(num_batches)
        # recorded in checkpoints: `vecaccel train --resume` goes on async, with these options
        agent.set_run_mode({"weight_sync_period": period, "fixed_lag": options.fixed_lag})
        super().__init__(agent, agent.model, "rollout", rollout_loop, options)
        self.num_batches = num_batches
        self.weight_sync_period = period
        self.horizon = agent.target_steps
        self.resume_step = agent.global_step if agent.global_step > 0 else None
        # CPU copies of the model and of the sampler policy around that same copy (the rollout
        # process pulls weights into the model and acts through the policy)
        memo: dict[int, Any] = {}
        model = copy.deepcopy(agent.model, memo)
        policy = copy.deepcopy(agent.sampler_policy(), memo)
        normalizer = agent.normalizer
        self.spec = dict(
            config=agent.config,
            model=model.cpu(),
            policy=policy,
            num_batches=num_batches,
            # a copy that normalises with the statistics handed over with the weights and
            # hands back what each batch observed
            normalizer=None if normalizer is None else normalizer.for_collector(),
        )
        self.complete = agent.global_step >= agent.target_steps
        self.start_step = int(agent.global_step)
        self.replay_ratio = 1.0  # each batch is used once
        self.in_update = False  # between an update's first optimizer step and its counters
        self.log_every_steps = int(agent.config.log_every_steps)
        self.next_log = _next_log(self.start_step, self.log_every_steps)
        # what the last turn's update gave: its metrics, episodes, learning rate and lag
        self._last: tuple[
            dict[str, Any], list[float], list[int], float, float, dict[str, float]
        ] = ({}, [], [], 0.0, 0, {})

    def turn(self, waits: Waits, requested: bool) -> bool:
        from vecaccel.sampler import SampleBatch

        agent = self.agent
        k, behaviour, returns, lengths, timing = waits.take(self.channels.filled)
        shared = self.slots[self.updates_done % 2]
        device = agent.device
        batch = SampleBatch(
            obs=shared["obs"].to(device),
            actions=shared["actions"].to(device),
            rewards=shared["rewards"].to(device),
            terminated=shared["terminated"].to(device),
            truncated=shared["truncated"].to(device),
            valid=shared["valid"].to(device),
            extras={key: value.to(device) for key, value in shared["extras"].items()},
            next_obs=shared["next_obs"].to(device),
            final_obs=shared["final_obs"][:k].to(device),
            final_index=shared["final_index"][:k].to(device),
        )
        batch = agent.to_model_actions(batch)
        if agent.normalizer is not None:  # the batch's moments, merged over the ranks
            agent.normalizer.add_moments(shared["moments"].numpy())
            agent.normalizer.sync(device)
        lag = agent.num_updates - behaviour
        progress_remaining = agent.progress_remaining()
        lr_now = agent.apply_learning_rate(progress_remaining)
        agent.model.train()
        self.in_update = True
        metrics = agent.update(batch, progress_remaining)  # a collective on K ranks
        steps: list[dict[str, Any]] = []
        if self.wants_step_locals:  # read before the slot is freed and refilled
            rewards = shared["rewards"].numpy().copy()
            dones = (shared["terminated"] | shared["truncated"]).numpy()
            steps = [{"rewards": rewards[t], "dones": dones[t]} for t in range(len(rewards))]
        self.channels.free_slots.release()  # the slot may be refilled now
        agent.record_progress(steps=agent.batch_size, updates=1)
        self.in_update = False
        self.updates_done += 1
        # with a fixed lag, not before batch m has taken update m - 1's weights
        sync_due = agent.num_updates % self.weight_sync_period == 0
        self.sync_weights(waits, min(self.updates_done + 1, self.num_batches), sync_due)
        self.lag_sum += lag
        self.complete = agent.global_step >= agent.target_steps
        self._last = (metrics, returns, lengths, lr_now, lag, timing)
        values = {
            "global_step": agent.global_step,
            "charts/updates": agent.num_updates,
            "charts/episodes": len(returns),
            "charts/episodic_return": mean_or_none(returns),
            "charts/episodic_length": mean_or_none(lengths),
            "charts/learning_rate": lr_now,
            "charts/policy_lag": float(lag),
            **metrics,
        }
        self.last_turn = (steps, values)
        return True  # every rank meets after every update (a collective cannot be skipped)

    def meeting(self, elapsed: float, optimizer_wait: float) -> Meeting:
        metrics, returns, lengths, lr_now, lag, timing = self._last
        metrics.update(
            {
                **timing,  # the rollout process's vector env: where its steps' time goes
                "charts/episodic_return": mean_or_none(returns),
                "charts/episodic_length": mean_or_none(lengths),
                "charts/SPS": (self.agent.global_step - self.start_step) / elapsed,
                "charts/learning_rate": lr_now,
                "charts/lr_scale": self.agent.lr_scale,
                "charts/updates": self.agent.num_updates,
                "charts/policy_lag": float(lag),
                "charts/optimizer_wait_fraction": optimizer_wait / elapsed,
                "charts/sampler_wait_fraction": self.counters.sampler_wait / elapsed,
            }
        )
        return Meeting(metrics, len(returns))

    def log_step(self, metrics: dict[str, float | None]) -> int | None:
        step = int(self.agent.global_step)
        if step >= self.next_log or metrics.get("charts/episodic_return") is not None:
            self.next_log = _next_log(step, self.log_every_steps)
            return step
        return step if self.complete else None

    def final_checkpoint(self, every_rank_here: bool) -> None:
        # after an error on several ranks rank 0 may be part-way through an update the others
        # never finished (a collective that failed): the last checkpoint stays, as the replay
        # feed's; so it does after an error before any update (a resume whose rollout process
        # could not start must not record its options in the run's checkpoint), and after an
        # error inside an update (weights part-way through an update the counters do not count)
        agent = self.agent
        progressed = agent.global_step > self.start_step
        single = agent.world_size == 1
        if every_rank_here or (single and progressed and not self.in_update):  # a collective
            agent.write_checkpoint(agent.run_dir if agent.is_main else None)


def _next_log(step: int, every: int) -> int:
    """The first step after ``step`` at which a row is due (every step when ``every`` is 0)."""
    if every <= 0:
        return step
    return (step // every + 1) * every


def rollout_loop(spec: dict[str, Any]) -> None:
    """The on-policy sampler: ``[T, B]`` rollouts of the algorithm's sampler policy."""
    import vecaccel
    from vecaccel.trainers.algos.on_policy.base import scale_rollout_rewards
    from vecaccel.trainers.envs.layers import set_policy_version
    from vecaccel.trainers.envs.make import make_envs_for_config
    from vecaccel.trainers.envs.normalized import normalized_envs
    from vecaccel.trainers.services.env_timing import env_timing_metrics
    from vecaccel.trainers.services.seeding import seed_everything, split_seed

    link = ChildLink(spec)
    channels = link.channels
    model: torch.nn.Module = spec["model"]
    cfg = spec["config"]
    # the policy's action sampling, new draws for a resumed run (the version published before
    # this process started)
    seed_everything(split_seed(int(cfg.seed), CHILD_SEED_KEY, link.counters.version))
    env = make_envs_for_config(cfg, cfg.env_id)
    normalizer = spec["normalizer"]
    try:
        model.eval()
        params = list(model.state_dict().values())
        if normalizer is not None:  # the trainer's statistics come with its weights
            params += normalizer.tensors()
        # the algorithm's sampler policy around `model` (a Discrete(n, start) env gets the
        # model's actions 0..n-1 moved to start..start+n-1); the optimiser moves them back
        sampler = vecaccel.Sampler(
            normalized_envs(env, normalizer),
            spec["policy"],
            horizon=cfg.num_steps,
            seed=cfg.seed,
            episode_stats="infos",
        )
        slots: list[dict[str, Any]] | None = None
        for n in range(spec["num_batches"]):
            if link.counters.stop:
                break
            version = link.weights_for(n, params)
            if version is None:
                break
            stamped = set_policy_version(env, version)
            batch = sampler.collect()
            behaviour: float = version
            if stamped and sampler.policy_versions is not None:
                # the env's own stamps: with alternating halves a half's first row was acted on
                # by the weights of the batch before
                behaviour = float(sampler.policy_versions.mean())
            scale_rollout_rewards(normalizer, batch)
            if slots is None:
                slots = rollout_slots(batch, 0 if normalizer is None else normalizer.moments_size)
                channels.started.put(slots)
            if not link.acquire(channels.free_slots):
                break
            target = slots[n % 2]
            for key in ("obs", "actions", "rewards", "terminated", "truncated", "valid"):
                target[key].copy_(getattr(batch, key))
            for key, value in batch.extras.items():
                target["extras"][key].copy_(value)
            target["next_obs"].copy_(batch.next_obs)
            k = len(batch.final_obs)
            if k:
                target["final_obs"][:k].copy_(batch.final_obs)
                target["final_index"][:k].copy_(batch.final_index)
            if normalizer is not None:
                normalizer.take_moments(target["moments"].numpy())
            episodes = sampler.pop_episodes()
            link.counters.steps += batch.rewards.numel()
            returns, lengths = list(episodes.returns), list(episodes.lengths)
            channels.filled.put((k, behaviour, returns, lengths, env_timing_metrics(env)))
        if slots is not None:  # as the chunk sampler's
            link.acquire(channels.started_seen)
    finally:
        env.close()
