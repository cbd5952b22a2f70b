"""The on-policy family's side of the synchronous loop: one update per rollout batch.

:class:`OnPolicyLoop` is what :meth:`OnPolicyAlgorithm.begin_run
<vecaccel.trainers.algos.on_policy.base.OnPolicyAlgorithm.begin_run>` hands the
:class:`~vecaccel.trainers.runners.sync.SyncRunner`: each iteration collects a ``[T, B]`` batch
with the sampler and makes one update from it.
"""

from __future__ import annotations

import time
from typing import Any

from vecaccel.trainers.algos.on_policy.base import scale_rollout_rewards
from vecaccel.trainers.algos.training_loop import TrainingLoop
from vecaccel.trainers.services import distributed
from vecaccel.trainers.services.env_timing import env_timing_metrics
from vecaccel.trainers.services.logger import RunLogger, mean_or_none
from vecaccel.trainers.services.schedules import LogPeriod
from vecaccel.trainers.services.team_returns import team_returns_for

__all__ = ["OnPolicyLoop"]


class OnPolicyLoop(TrainingLoop):
    """One update per iteration, from a rollout batch the sampler collects."""

    def __init__(self, agent: Any, total_timesteps: int | None, reset_num_timesteps: bool) -> None:
        self.agent = agent
        cfg = agent.config
        if reset_num_timesteps and total_timesteps is not None:
            agent.reset_counters()
        agent.set_budget(total_timesteps)
        agent.set_run_mode(None)
        if agent.envs is None:
            agent.attach_env(cfg.env_id)
            agent.make_sampler()
            if agent.num_updates > 0:
                agent.reset_envs()
        self.horizon = int(agent.target_steps)
        self.resume_step = agent.global_step if agent.global_step > 0 else None
        self.log_period = LogPeriod(cfg.log_every_steps, agent.global_step + cfg.log_every_steps)
        # multi-agent envs: each env's team return beside the agents' own
        self.team = team_returns_for(agent.envs)

    def start(self, logger: RunLogger) -> None:
        self.start_step, self.start_time = self.agent.global_step, time.perf_counter()

    def collect(self) -> Any:
        """A rollout batch, in the model's action numbering, with the learning rate set for
        the update it feeds."""
        agent = self.agent
        self.progress_remaining = agent.progress_remaining()
        self.lr_now = agent.apply_learning_rate(self.progress_remaining)
        with agent.acting():
            batch = agent.sampler.collect()
        self.team_return = None
        if self.team is not None and batch.active is not None:
            self.team_return = mean_or_none(self.team.record_batch(batch))
        normalizer = agent.normalizer
        if normalizer is not None:  # the team returns above are of the env's own rewards
            scale_rollout_rewards(normalizer, batch)
            normalizer.sync(agent.device)  # every rank, every batch: the same statistics
        agent.record_progress(steps=agent.batch_size)
        return agent.to_model_actions(batch)

    def steps_per_iteration(self) -> int:
        """A rollout batch: ``num_envs x num_steps`` env steps on each rank."""
        return int(self.agent.batch_size)

    def step_locals(self, batch: Any) -> list[dict[str, Any]]:
        """Each vector step's rewards and episode ends, as SB3 callbacks read them."""
        rewards = batch.rewards.cpu().numpy()
        dones = (batch.terminated | batch.truncated).cpu().numpy()
        return [{"rewards": rewards[t], "dones": dones[t]} for t in range(len(rewards))]

    def update(self, batch: Any) -> dict[str, Any]:
        """One update from the batch."""
        agent = self.agent
        metrics: dict[str, Any] = agent.update(batch, self.progress_remaining)
        agent.record_progress(updates=1)
        return metrics

    def report(
        self, metrics: dict[str, Any], stop_requested: bool
    ) -> tuple[dict[str, Any], bool, bool]:
        """The iteration's row (reduced over ranks), whether to log it and whether to stop."""
        agent = self.agent
        lr_now, team = self.lr_now, self.team_return
        episodes = agent.sampler.pop_episodes()
        agent.record_episodes(episodes)
        elapsed = time.perf_counter() - self.start_time
        metrics.update(
            {
                "charts/episodic_return": mean_or_none(episodes.returns),
                "charts/episodic_length": mean_or_none(episodes.lengths),
                "charts/SPS": (agent.global_step - self.start_step) / max(elapsed, 1e-9),
                **env_timing_metrics(agent.envs),
                "charts/learning_rate": lr_now,
                "charts/lr_scale": agent.lr_scale,
                "charts/updates": agent.num_updates,
            }
        )
        if team is not None:
            metrics["charts/team_episodic_return"] = team
        stop = stop_requested
        if agent.world_size > 1:
            # every rank reduces every update (a collective cannot be skipped), which is where
            # the ranks agree on a stop too
            count = float(len(episodes.returns))
            metrics["charts/episodes"] = count
            metrics["_stop"] = 1.0 if stop else 0.0
            metrics = distributed.reduce_log_row(
                metrics, count, sums=("_stop",), device=agent.device
            )
            stop = bool(metrics.pop("_stop") or 0.0)
        log = (
            self.log_period.due(agent.global_step)
            or metrics.get("charts/episodic_return") is not None
            or agent.global_step >= self.horizon
        )
        self.episodes = len(episodes.returns)
        return metrics, log, stop

    def callback_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The iteration's metrics as callbacks get them: the row, with the step and the
        episode count."""
        return {
            "charts/episodes": self.episodes,
            **metrics,
            "global_step": self.agent.global_step,
        }

    def restart_due(self) -> bool:
        agent = self.agent
        every = agent.config.checkpoint_every
        return (
            agent.run_dir is not None
            and every > 0
            and agent.num_updates % every == 0
            and agent.global_step < self.horizon
        )

    def restart_point(self) -> None:
        if self.agent.config.reset_envs_at_checkpoint:
            self.agent.reset_envs()
            if self.team is not None:
                self.team.reset()

    def write_checkpoint(self) -> None:
        self.agent.write_checkpoint(self.agent.run_dir)

    def end(self) -> None:
        pass
