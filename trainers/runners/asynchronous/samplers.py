"""The loops of an asynchronous run's sampler process.

- :func:`chunk_sampler_loop` (the DQN family): chunks of ε-greedy steps into a shared double
  buffer that the optimiser adds to the replay buffer itself, in order.
- :func:`rollout_loop` (A2C, PPO): ``[T, B]`` rollouts into a shared double buffer.

Each runs in the child process started by
:class:`~vecaccel.trainers.runners.asynchronous.process.SamplerHandle` and reads everything it
needs from its spec.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from vecaccel.trainers.runners.asynchronous.process import ChildLink
from vecaccel.trainers.runners.asynchronous.shared import CHILD_SEED_KEY, rollout_slots

__all__ = ["Actor", "chunk_sampler_loop", "rollout_loop"]


class Actor:
    """The DQN sampler's envs, stepped by the algorithm's own acting policy and collector
    (:class:`~vecaccel.trainers.algos.exploration.EpsilonGreedy`) with the weights last pulled."""

    def __init__(self, spec: dict[str, Any], link: ChildLink) -> None:
        from vecaccel.trainers.algos.exploration import EpsilonGreedy, TransitionCollector
        from vecaccel.trainers.envs.make import (
            action_start,
            backend_options_of,
            make_env_for_training,
        )
        from vecaccel.trainers.run.seeding import seed_everything, split_seed

        # its own draws (e.g. noisy nets' noise), new ones for a resumed run
        seed_everything(split_seed(int(spec["env_seed"]), CHILD_SEED_KEY, spec["updates_at_start"]))
        self.link = link
        network: torch.nn.Module = spec["network"]
        self.params = list(network.state_dict().values())
        cfg = spec["config"]
        self.epsilon = (cfg["start_epsilon"], cfg["end_epsilon"], spec["exploration_steps"])
        envs = make_env_for_training(
            spec["env_id"],
            spec["num_envs"],
            backend=cfg["backend"],
            seed=cfg["seed"],
            autoreset_mode="SameStep",
            **backend_options_of(cfg),
        )
        self.rng = np.random.default_rng(spec["env_seed"] + 1)
        policy = EpsilonGreedy(
            network,
            int(spec["action_space"].n),
            action_start(spec["action_space"]),
            spec["support"],
        )
        self.collector = TransitionCollector(envs, policy)
        self.num_envs = self.collector.num_envs
        self.collector.reset(seed=spec["env_seed"])

    def step(self, steps: int) -> tuple[tuple[Any, ...], list[tuple[float, float]]]:
        """One ε-greedy step of every env, ``steps`` env steps into the run: the transition
        ``(obs, actions, reward, terminated, truncated, final_obs)`` and the episodes it ended."""
        from vecaccel.trainers.run.schedules import linear_schedule

        transition, finished = self.collector.step(linear_schedule(*self.epsilon, steps), self.rng)
        return tuple(transition[:6]), finished

    def close(self) -> None:
        self.collector.close()


def chunk_sampler_loop(spec: dict[str, Any]) -> None:
    """The DQN family's sampler: chunk ``n`` of ε-greedy steps into slot ``n % 2``, announced on
    the hand-over's queue; the optimiser adds the chunks to the replay buffer itself, in order.

    With a fixed lag chunk ``n`` is acted on with the weights published once the optimiser has
    trained on chunk ``n - 2`` (waited for, and the optimiser publishes no newer ones before they
    are pulled), so the run repeats exactly; otherwise with the newest weights there are.
    """
    link = ChildLink(spec)
    counters = link.counters
    slots = [{key: value.numpy() for key, value in slot.items()} for slot in spec["slots"]]
    handover = spec["handover"]
    fixed_lag = spec["fixed_lag"]
    steps = spec["start_steps"]
    actor = Actor(spec, link)
    try:
        counters.ready = 1
        chunk_steps, vector_steps = spec["chunk_steps"], spec["vector_steps"]
        for n in range(math.ceil(vector_steps / chunk_steps)):
            length = min(chunk_steps, vector_steps - n * chunk_steps)
            if fixed_lag and n >= 2 and not link.acquire(handover.publishes):
                break  # the weights after chunk n - 2
            if not link.acquire(handover.free_slots):  # slot n % 2, chunk n - 2 trained on
                break
            version = link.pull_weights(actor.params)
            if fixed_lag:
                handover.pulls.release()
            slot = slots[n % 2]
            ended: list[tuple[float, float]] = []
            for t in range(length):
                transition, finished = actor.step(steps)
                obs, actions, reward, terminated, truncated, final_obs = transition
                slot["obs"][t] = obs
                slot["actions"][t] = actions
                slot["rewards"][t] = reward
                slot["terminated"][t] = terminated
                slot["truncated"][t] = truncated
                for i in np.flatnonzero(terminated | truncated):
                    if final_obs is not None and final_obs[i] is not None:
                        slot["final_obs"][t, i] = final_obs[i]
                steps += actor.num_envs
                ended.extend(finished)
                link.check_optimiser()
            counters.steps = steps
            handover.filled.put((length, version, ended))
    finally:
        actor.close()


def rollout_loop(spec: dict[str, Any]) -> None:
    """The on-policy sampler: ``[T, B]`` rollouts into the two shared slots in turn."""
    import vecaccel
    from vecaccel.trainers.envs.batched import is_batched_source
    from vecaccel.trainers.envs.make import backend_options_of, make_env_for_training
    from vecaccel.trainers.run.seeding import seed_everything, split_seed

    link = ChildLink(spec)
    counters = link.counters
    model: torch.nn.Module = spec["model"]
    cfg = spec["config"]
    # the policy's action sampling, new draws for a resumed run (the version published before
    # this process started)
    seed_everything(split_seed(int(cfg["seed"]), CHILD_SEED_KEY, counters.version))
    batched = is_batched_source(cfg["vectorized"], cfg["env_source"])
    env = make_env_for_training(
        cfg["env_id"],
        cfg["num_envs"],
        backend=cfg["backend"],
        seed=cfg["seed"],
        atari=cfg["atari"],
        autoreset_mode=None if batched else cfg["autoreset_mode"],
        vectorized=cfg["vectorized"],
        env_source=cfg["env_source"],
        **backend_options_of(cfg),
    )
    try:
        model.eval()
        params = list(model.state_dict().values())
        # the algorithm's sampler policy around `model` (a Discrete(n, start) env gets the
        # model's actions 0..n-1 moved to start..start+n-1); the optimiser moves them back
        policy = spec["policy"]
        sampler = vecaccel.Sampler(
            env, policy, horizon=cfg["num_steps"], seed=cfg["seed"], episode_stats="infos"
        )
        slots: list[dict[str, Any]] | None = None
        slot = 0
        handover = spec["handover"]
        for n in range(spec["num_batches"]):
            if link.stopped:
                break
            if spec["fixed_lag"]:
                # batch n is collected with the weights of update n - 1 exactly: waited for,
                # and the optimiser publishes no newer ones before they are pulled
                if n >= 2 and not link.acquire(handover.publishes):
                    break
                version = link.pull_weights(params)
                handover.pulls.release()
            else:
                version = link.pull_weights(params)
            batch = sampler.collect()
            if slots is None:
                slots = rollout_slots(batch)
                spec["slots"].put(slots)
            if not link.acquire(handover.free_slots):
                break
            target = slots[slot]
            for key in ("obs", "actions", "rewards", "terminated", "truncated", "valid"):
                target[key].copy_(getattr(batch, key))
            for key, value in batch.extras.items():
                target["extras"][key].copy_(value)
            target["next_obs"].copy_(batch.next_obs)
            k = len(batch.final_obs)
            if k:
                target["final_obs"][:k].copy_(batch.final_obs)
                target["final_index"][:k].copy_(batch.final_index)
            episodes = sampler.pop_episodes()
            counters.steps += batch.rewards.numel()
            handover.filled.put((k, version, list(episodes.returns), list(episodes.lengths)))
            slot ^= 1
        if slots is not None:
            # they travel as file descriptors that this process hands over itself, so it must
            # not exit before the optimiser has them (a run of two batches could)
            link.acquire(spec["slots_taken"])
    finally:
        env.close()
