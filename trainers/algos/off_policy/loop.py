"""The off-policy family's side of the synchronous loop: a vector step into the replay buffer,
then the updates the replay ratio allows.

:class:`OffPolicyLoop` is what :meth:`OffPolicyAlgorithm.begin_run
<vecaccel.trainers.algos.off_policy.base.OffPolicyAlgorithm.begin_run>` hands the
:class:`~vecaccel.trainers.runners.sync.SyncRunner`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vecaccel.trainers.algos.training_loop import TrainingLoop
from vecaccel.trainers.services import distributed
from vecaccel.trainers.services.env_timing import env_timing_metrics
from vecaccel.trainers.services.logger import RunLogger, mean_or_none
from vecaccel.trainers.services.schedules import LogPeriod, ReplaySchedule
from vecaccel.trainers.services.seeding import set_rng_state
from vecaccel.trainers.services.state import RunState
from vecaccel.trainers.services.team_returns import team_returns_for

__all__ = ["STOP_AGREEMENT_PERIOD", "OffPolicyLoop"]

#: runs on several ranks agree on a stop request every this many vector steps
STOP_AGREEMENT_PERIOD = 64


class OffPolicyLoop(TrainingLoop):
    """One vector step per iteration into the replay buffer, then the updates from replay
    samples that the replay ratio allows, target-network updates, and ε and β annealed over
    the run.

    The loop's counters are a :class:`~vecaccel.trainers.services.state.RunState`, saved with
    each checkpoint; a loaded agent that continues its run with the same budget restores them,
    so that on CPU it ends bit-identical to a run never interrupted.
    """

    def __init__(self, agent: Any, total_timesteps: int | None, reset_num_timesteps: bool) -> None:
        self.agent = agent
        cfg = agent.config
        if agent.envs is None:
            raise RuntimeError("this agent has no env: pass env= when creating or loading it")
        resume = agent.take_resume_state()
        agent.set_run_mode(None)
        if total_timesteps is None:
            agent.set_budget(None)  # raises unless a loaded run has steps left
            total_timesteps, reset_num_timesteps = agent.target_steps - agent.global_step, False
        exact = (
            resume is not None
            and resume["exact"]
            and not reset_num_timesteps
            and agent.global_step + int(total_timesteps) == resume["horizon"]
        )
        num_envs = agent.envs.num_envs
        self.world = agent.world_size
        # steps and batches are counted over all ranks; each rank adds num_envs per vector step
        self.steps_per_vector_step = num_envs * self.world
        self.schedule = ReplaySchedule.of(cfg, ranks=self.world)
        if reset_num_timesteps:
            agent.reset_counters()
        new_buffer = agent.buffer is None
        if new_buffer:
            agent.set_buffer(agent.make_buffer(num_envs))
            new_buffer = not agent.restore_replay(agent.buffer)
        if reset_num_timesteps or agent.last_obs is None:
            # a second learn() keeps the buffer (as SB3 does), so it closes the open episodes
            if agent.last_obs is not None:
                seed = None
            elif agent.global_step == 0:
                seed = cfg.seed
            else:  # a loaded agent restarts where the checkpoint's run restarted its envs
                seed = agent.restart_seed()
            agent.start_episodes(seed)
        # multi-agent envs: each env's team return beside the agents' own
        self.team = team_returns_for(agent.envs)
        self.team_finished: list[float] = []
        self.start_step = agent.global_step
        horizon = self.start_step + int(total_timesteps)
        agent.set_target_steps(horizon)
        # a continued run that kept its buffer does not wait for learning_starts again
        learn_from = self.schedule.learn_from(
            self.start_step,
            min_fill=self.steps_per_vector_step * (cfg.n_step + agent.buffer.frame_stack + 1),
            warm_up=reset_num_timesteps or new_buffer,
        )
        self.state = RunState(
            horizon=horizon,
            learn_from=learn_from,
            updates_at_start=agent.num_updates,
            beta=cfg.priority_beta_start,
            next_log=self.start_step + cfg.log_every_steps,
            last_target_update=agent.global_step,
        )
        if exact:
            assert resume is not None
            self.state = RunState.from_dict({**resume, "horizon": horizon})
            # after the envs are made and reset, whatever that drew from the global generators
            set_rng_state(resume["rng"])
            agent.restore_exploration(self.state.saw_episode_info, resume["agent_rng"])
        self.horizon = horizon
        self.log_period = LogPeriod(cfg.log_every_steps, self.state.next_log)
        self.resume_step = None if reset_num_timesteps else self.start_step
        self.restart_points = agent.run_dir is not None and cfg.checkpoint_every > 0
        self.restart_pending = False
        self.vector_steps = 0
        self.recent_losses: list[dict[str, float]] = []
        self.finished: list[tuple[float, float]] = []

    def steps_per_iteration(self) -> int:
        """One vector step: ``num_envs`` env steps on each rank."""
        return int(self.steps_per_vector_step)

    def start(self, logger: RunLogger) -> None:
        agent = self.agent
        logger.log(
            self.start_step,
            {"charts/learning_rate": agent.learning_rate, "charts/lr_scale": agent.lr_scale},
        )
        self.start_time = time.perf_counter()

    def loop_state(self) -> dict[str, Any]:
        """The run state as a checkpoint saves it."""
        state = self.state
        state.next_log = self.log_period.next_step
        state.saw_episode_info = self.agent.stepper.episodes.saw_info
        return state.as_dict()

    def collect(self) -> None:
        """One ε-greedy vector step into the replay buffer."""
        agent = self.agent
        self.epsilon = agent.epsilon(agent.global_step, self.horizon)
        transition, finished = agent.collect(self.epsilon)
        agent.record_progress(steps=self.steps_per_vector_step)
        self.vector_steps += 1
        self.transition, self.step_finished = transition, finished
        for episode_return, length in finished:
            agent.episode_log.append((agent.global_step, episode_return, length))
            self.finished.append((episode_return, length))
        self.step_team: list[float] = []
        if self.team is not None and transition.active is not None:
            done = transition.terminated | transition.truncated
            self.step_team = self.team.record(transition.reward, done, transition.active)
            self.team_finished += self.step_team
        self.sync_normalization(every=STOP_AGREEMENT_PERIOD)

    def sync_normalization(self, every: int = 1) -> None:
        """On several ranks, merge the ranks' normalisation statistics every ``every`` vector
        steps of the run (a collective); on one rank each step is merged as it comes."""
        agent = self.agent
        if agent.normalizer is not None:
            if (agent.global_step // self.steps_per_vector_step) % every == 0:
                agent.normalizer.sync(agent.device)

    def step_locals(self, experience: None) -> list[dict[str, Any]]:
        """The vector step's rewards, episode ends and actions, as SB3 callbacks read them."""
        transition = self.transition
        dones = transition.terminated | transition.truncated
        return [{"rewards": transition.reward, "dones": dones, "actions": transition.actions}]

    def update(self, experience: None) -> dict[str, Any]:
        """The updates the replay ratio allows now (updates × batch ≤ ratio × steps since
        learning began), and the target network's when due."""
        agent, cfg, state, schedule = self.agent, self.agent.config, self.state, self.schedule
        self.step_losses: list[dict[str, float]] = []
        if agent.global_step > state.learn_from:
            learned = agent.global_step - state.learn_from
            due = schedule.updates_due(learned)
            while agent.num_updates - state.updates_at_start < due:
                state.beta, batch = agent.sample_batch(agent.global_step / self.horizon)
                losses = agent.update(batch)
                self.recent_losses.append(losses)
                self.step_losses.append(losses)
                agent.record_progress(updates=1)
                if cfg.checkpoint_every and agent.num_updates % cfg.checkpoint_every == 0:
                    self.restart_pending = self.restart_points
            agent.set_measured_replay_ratio(
                schedule.measured_ratio(agent.num_updates - state.updates_at_start, learned)
            )
        if schedule.target_update_due(agent.global_step, state.last_target_update):
            state.last_target_update = agent.global_step
            if agent.num_updates > 0:
                agent.update_target()
        return {}

    def report(
        self, metrics: dict[str, Any], stop_requested: bool
    ) -> tuple[dict[str, Any], bool, bool]:
        """The row when one is due (reduced over ranks), whether to log it, whether to stop."""
        agent = self.agent
        log = self.log_period.due(agent.global_step) or agent.global_step >= self.horizon
        if log:
            metrics = self._row(self.epsilon)
        stop = stop_requested
        if self.world > 1:  # agree at the same step on all ranks
            stop = self.vector_steps % STOP_AGREEMENT_PERIOD == 0 and distributed.all_reduce_any(
                stop, device=agent.device
            )
        return metrics, log, stop

    def _row(self, epsilon: float) -> dict[str, Any]:
        agent = self.agent
        elapsed = time.perf_counter() - self.start_time
        learned_steps = agent.global_step - self.state.learn_from
        metrics: dict[str, Any] = {
            "charts/SPS": (agent.global_step - self.start_step) / max(elapsed, 1e-9),
            **env_timing_metrics(agent.envs),
            "charts/epsilon": epsilon,
            "charts/updates": agent.num_updates,
            "charts/replay_ratio": agent.replay_ratio if learned_steps > 0 else None,
            "charts/learning_rate": agent.learning_rate,
        }
        finished, losses = self.finished, self.recent_losses
        if finished:
            metrics["charts/episodic_return"] = float(np.mean([r for r, _ in finished]))
            metrics["charts/episodic_length"] = float(np.mean([n for _, n in finished]))
            metrics["charts/episodes"] = len(finished)
        if self.team_finished:
            metrics["charts/team_episodic_return"] = float(np.mean(self.team_finished))
            self.team_finished = []
        if losses:
            for key in losses[0]:
                metrics[key] = float(np.mean([m[key] for m in losses]))
        if agent.config.prioritized and agent.num_updates:
            metrics["charts/beta"] = self.state.beta
        if self.world > 1:  # every rank reaches this step: reduce over ranks
            metrics = distributed.reduce_log_row(
                metrics,
                len(finished),
                keys=(
                    "charts/episodic_return",
                    "charts/episodic_length",
                    "charts/episodes",
                    *agent.loss_keys,
                ),
                device=agent.device,
            )
        self.finished, self.recent_losses = [], []
        return metrics

    def callback_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The iteration's metrics as callbacks get them: this vector step's episodes and
        updates (not the logged row's, which may span many steps), on this rank."""
        agent = self.agent
        finished, losses = self.step_finished, self.step_losses
        elapsed = time.perf_counter() - self.start_time
        values: dict[str, Any] = {
            "global_step": agent.global_step,
            "charts/updates": agent.num_updates,
            "charts/episodes": len(finished),
            "charts/episodic_return": mean_or_none(r for r, _ in finished),
            "charts/episodic_length": mean_or_none(n for _, n in finished),
            "charts/SPS": (agent.global_step - self.start_step) / max(elapsed, 1e-9),
            "charts/learning_rate": agent.learning_rate,
            "charts/epsilon": self.epsilon,
        }
        if self.step_team:
            values["charts/team_episodic_return"] = float(np.mean(self.step_team))
        if losses:
            for key in losses[0]:
                values[key] = float(np.mean([m[key] for m in losses]))
        return values

    def restart_due(self) -> bool:
        due, self.restart_pending = self.restart_pending, False
        return due and self.agent.global_step < self.horizon

    def restart_point(self) -> None:
        """Reset the envs at a seed a resumed run can reproduce."""
        agent = self.agent
        if agent.config.reset_envs_at_checkpoint:
            agent.start_episodes(agent.restart_seed())
            if self.team is not None:
                self.team.reset()

    def write_checkpoint(self) -> None:
        agent = self.agent
        self.sync_normalization()  # every rank writes this checkpoint's statistics alike
        agent.set_loop_state(self.loop_state())
        agent.write_checkpoint(agent.run_dir, replay=agent.config.checkpoint_replay)

    def end(self) -> None:
        self.agent.set_loop_state(self.loop_state())
