"""Periodic evaluation during training, as SB3's ``EvalCallback`` does it.

With ``eval_every=N`` (``--eval-every N``) both runners evaluate the agent every ``N`` env
steps on an env of its own, built without the training-only wrappers so that the returns are
real scores: ``eval_episodes`` deterministic episodes (``--eval-episodes K``), the same seeds
each time so that two evaluations compare the agent and not the episodes. Each evaluation
logs ``eval/mean_reward``, ``eval/std_reward``, ``eval/mean_ep_length`` and
``eval/best_mean_reward`` at its step (CSV, TensorBoard, the trackers), and a new best mean
saves the agent to ``run_dir/best.pt`` (SB3: ``best_model.zip``). The best mean
(``agent.best_eval_reward``) is saved in checkpoints, so a resumed run replaces ``best.pt`` only
with a better agent. On several ranks the first one evaluates.

Example:
    >>> from vecaccel.trainers import PPO
    >>> agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=16,
    ...             eval_every=32, eval_episodes=2, progress=False, tensorboard=False)
    >>> _ = agent.learn(64)
    >>> [step for step, _ in agent.evaluations]
    [32, 64]
    >>> agent.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BEST_NAME", "EVAL_SEED_OFFSET", "PeriodicEvaluation", "periodic_evaluation"]

#: The file a new best evaluation saves the agent to, in the run directory.
BEST_NAME = "best.pt"

#: Evaluation episodes are seeded from the run's seed plus this, apart from the training envs'.
EVAL_SEED_OFFSET = 1_000_003


class PeriodicEvaluation:
    """A callback ``(agent, metrics)`` that evaluates ``agent`` every ``every`` env steps.

    Args:
        agent: the algorithm being trained (its ``env_id`` names the env evaluated on).
        every: env steps between evaluations.
        episodes: episodes per evaluation.

    Raises:
        ValueError: the agent has no Gymnasium env id to build an evaluation env from.
    """

    def __init__(self, agent: Any, every: int, episodes: int) -> None:
        from vecaccel.envs.source import EnvSource

        env_id = agent.env_id
        if env_id is None or EnvSource.is_module_path(env_id):
            raise ValueError(
                "eval_every evaluates on a Gymnasium env made from the agent's env id; "
                f"{'this agent has none' if env_id is None else f'{env_id} is a PettingZoo env'}"
                " (set eval_every=0, or evaluate with `vecaccel eval` after training)"
            )
        self.env_id = env_id
        self.every, self.episodes = int(every), int(episodes)
        self.next_step = (agent.global_step // self.every + 1) * self.every
        self.best = getattr(agent, "best_eval_reward", None)

    def __call__(self, agent: Any, metrics: dict[str, Any]) -> None:
        if agent.global_step < self.next_step:
            return
        self.next_step = (agent.global_step // self.every + 1) * self.every
        if not agent.is_main:
            return
        from vecaccel.trainers.cli.evaluate import evaluate_agent
        from vecaccel.trainers.services.seeding import get_rng_state, set_rng_state

        # the training run's random streams go on as if no evaluation had been made
        rng = get_rng_state()
        try:
            returns, lengths = evaluate_agent(
                agent,
                self.env_id,
                episodes=self.episodes,
                seed=agent.config.seed + EVAL_SEED_OFFSET,
                deterministic=True,
            )
        finally:
            set_rng_state(rng)
        mean, std = float(np.mean(returns)), float(np.std(returns))
        improved = self.best is None or mean > self.best
        if improved:
            self.best = mean
            agent.best_eval_reward = mean
        row = {
            "eval/mean_reward": mean,
            "eval/std_reward": std,
            "eval/mean_ep_length": float(np.mean(lengths)),
            "eval/best_mean_reward": self.best,
        }
        agent.evaluations.append((int(agent.global_step), row))
        logger = agent.logger
        if logger is not None:
            logger.log(agent.global_step, row)
        run_dir = agent.run_dir
        if improved and run_dir is not None:
            agent.save(Path(run_dir) / BEST_NAME)


def periodic_evaluation(agent: Any) -> PeriodicEvaluation | None:
    """The evaluation ``agent``'s config asks for (``eval_every``), or ``None``."""
    every = int(getattr(agent.config, "eval_every", 0) or 0)
    if every <= 0:
        return None
    return PeriodicEvaluation(agent, every, int(agent.config.eval_episodes))
