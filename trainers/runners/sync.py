"""The synchronous runner: the one training loop of every algorithm.

:class:`SyncRunner` owns everything around the updates: the budget and the schedules, the run
logger (CSV, TensorBoard, progress bar, learning curve), periodic checkpoints and restart points,
SIGINT/SIGTERM, the distributed reduce of each log row, and the callback. What it asks of the
algorithm depends on its family, through public methods only:

- on-policy (A2C, PPO): one iteration collects a rollout batch with the sampler and makes one
  update from it;
- off-policy (the DQN family): one iteration steps the envs once, stores the transitions in the
  replay buffer and makes as many updates from replay samples as the replay ratio allows.

The helpers below :class:`SyncRunner` (:func:`open_run_logger`, :func:`announce_interrupt`,
:func:`announce_run_dir`) are what the asynchronous runner shares with it.

Example:
    >>> from vecaccel.trainers import A2C
    >>> agent = A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=5, seed=0)
    >>> _ = SyncRunner(agent).run(total_steps=20)
    >>> agent.global_step, agent.num_updates
    (20, 2)
    >>> agent.close()
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from vecaccel.trainers.algos.base import Algorithm, Callback
from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME
from vecaccel.trainers.run import distributed
from vecaccel.trainers.run.logger import RunLogger, mean_or_none
from vecaccel.trainers.run.schedules import ReplaySchedule
from vecaccel.trainers.run.seeding import set_rng_state
from vecaccel.trainers.run.signals import SignalCheckpoint, TrainingInterrupted
from vecaccel.trainers.run.team_returns import team_returns_for
from vecaccel.trainers.runners.callbacks import Callbacks
from vecaccel.trainers.runners.state import RunState

__all__ = ["SyncRunner", "announce_interrupt", "announce_run_dir", "open_run_logger"]

#: off-policy runs on several ranks agree on a stop request every this many vector steps
STOP_AGREEMENT_PERIOD = 64


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
    return logger


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


class _LogPeriod:
    """Whether a metric row is due: every ``period`` env steps (0: every iteration)."""

    def __init__(self, period: int, next_step: int) -> None:
        self.period = int(period)
        self.next_step = int(next_step)

    def due(self, step: int) -> bool:
        if self.period <= 0:
            return True
        if step < self.next_step:
            return False
        self.next_step += self.period
        return True


class SyncRunner:
    """Trains an algorithm in this process: collect, update, log, checkpoint, repeat.

    Args:
        agent: an on-policy or off-policy :class:`~vecaccel.trainers.algos.base.Algorithm`.
    """

    def __init__(self, agent: Algorithm) -> None:
        self.agent = agent

    def run(
        self,
        total_steps: int | None = None,
        callback: Callback | None = None,
        reset_num_timesteps: bool = True,
    ) -> Algorithm:
        """Train ``total_steps`` more env steps (``None``: finish a loaded run's budget).

        Checkpoints go to ``run_dir`` every ``checkpoint_every`` updates (each a restart point,
        see ``reset_envs_at_checkpoint``), when the run ends and when SIGINT or SIGTERM stops
        it; an error raised inside the loop writes none, leaving the last restart point.

        Args:
            total_steps: env steps to collect.
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
        loop = _loop_for(agent, total_steps, reset_num_timesteps)
        logger = open_run_logger(agent, loop.horizon, loop.resume_step)
        loop.start(logger)
        guard = SignalCheckpoint()
        sb3, plain = callbacks.sb3 is not None, bool(callbacks.plain)
        try:
            with guard:
                callbacks.training_start(agent, loop.horizon)
                while agent.global_step < loop.horizon:
                    if sb3:
                        callbacks.rollout_start()
                    experience = loop.collect()
                    if sb3 and not callbacks.rollout_end(loop.step_locals(experience)):
                        break
                    metrics = loop.update(experience)
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
            loop.end()
            agent.end_run(logger.elapsed)
            announce_run_dir(logger, agent, logger.close())
        return agent


def _loop_for(agent: Algorithm, total_steps: int | None, reset_num_timesteps: bool) -> Any:
    """The family's side of the loop, chosen by the algorithm's base class."""
    from vecaccel.trainers.algos.off_policy import OffPolicyAlgorithm
    from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm

    if isinstance(agent, OnPolicyAlgorithm):
        return _OnPolicyLoop(agent, total_steps, reset_num_timesteps)
    if isinstance(agent, OffPolicyAlgorithm):
        return _OffPolicyLoop(agent, total_steps, reset_num_timesteps)
    raise TypeError(
        f"SyncRunner trains an OnPolicyAlgorithm or an OffPolicyAlgorithm, got "
        f"{type(agent).__name__}"
    )


class _OnPolicyLoop:
    """One update per iteration, from a rollout batch the sampler collects."""

    def __init__(self, agent: Any, total_steps: int | None, reset_num_timesteps: bool) -> None:
        self.agent = agent
        cfg = agent.config
        if reset_num_timesteps and total_steps is not None:
            agent.reset_counters()
        agent.set_budget(total_steps)
        agent.set_run_mode(None)
        if agent.envs is None:
            agent.attach_env(cfg.env_id)
            agent.make_sampler()
            if agent.num_updates > 0:
                agent.reset_envs()
        self.horizon = int(agent.target_steps)
        self.resume_step = agent.global_step if agent.global_step > 0 else None
        self.log_period = _LogPeriod(cfg.log_every_steps, agent.global_step + cfg.log_every_steps)
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
        agent.record_progress(steps=agent.batch_size)
        return agent.to_model_actions(batch)

    def step_locals(self, batch: Any) -> list[dict[str, Any]]:
        """Each vector step's rewards and episode ends, as SB3 callbacks read them."""
        rewards = batch.rewards.cpu().numpy()
        dones = (batch.terminated | batch.truncated).cpu().numpy()
        return [{"rewards": rewards[t], "dones": dones[t]} for t in range(len(rewards))]

    def update(self, batch: Any) -> dict[str, Any]:
        """One update from the batch."""
        agent = self.agent
        metrics = agent.update(batch, self.progress_remaining)
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


class _OffPolicyLoop:
    """One vector step per iteration into the replay buffer, then the updates from replay
    samples that the replay ratio allows, target-network updates, and ε and β annealed over
    the run.

    The loop's counters are a :class:`~vecaccel.trainers.runners.state.RunState`, saved with
    each checkpoint; a loaded agent that continues its run with the same budget restores them,
    so that on CPU it ends bit-identical to a run never interrupted.
    """

    def __init__(self, agent: Any, total_steps: int | None, reset_num_timesteps: bool) -> None:
        self.agent = agent
        cfg = agent.config
        if agent.envs is None:
            raise RuntimeError("this agent has no env: pass env= when creating or loading it")
        resume = agent.take_resume_state()
        agent.set_run_mode(None)
        if total_steps is None:
            agent.set_budget(None)  # raises unless a loaded run has steps left
            total_steps, reset_num_timesteps = agent.target_steps - agent.global_step, False
        exact = (
            resume is not None
            and resume["exact"]
            and not reset_num_timesteps
            and agent.global_step + int(total_steps) == resume["horizon"]
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
        horizon = self.start_step + int(total_steps)
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
        self.log_period = _LogPeriod(cfg.log_every_steps, self.state.next_log)
        self.resume_step = None if reset_num_timesteps else self.start_step
        self.restart_points = agent.run_dir is not None and cfg.checkpoint_every > 0
        self.restart_pending = False
        self.vector_steps = 0
        self.recent_losses: list[dict[str, float]] = []
        self.finished: list[tuple[float, float]] = []

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
        state.saw_episode_info = self.agent.collector.episodes.saw_info
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
        agent.set_loop_state(self.loop_state())
        agent.write_checkpoint(agent.run_dir, replay=agent.config.checkpoint_replay)

    def end(self) -> None:
        self.agent.set_loop_state(self.loop_state())
