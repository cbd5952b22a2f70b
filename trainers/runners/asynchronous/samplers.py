"""The loops of an asynchronous run's sampler process, one per family.

- :func:`chunk_sampler_loop` (the DQN family): chunks of ε-greedy steps, which the optimiser
  adds to its replay buffer itself, in order.
- :func:`rollout_loop` (A2C, PPO): ``[T, B]`` rollouts.

Each runs in the child process started by
:class:`~vecaccel.trainers.runners.asynchronous.process.SamplerHandle`, reads everything it needs
from its spec and fills the two slots of a double buffer in turn, as
:class:`~vecaccel.trainers.runners.asynchronous.shared.Handover` describes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from vecaccel.trainers.runners.asynchronous.process import ChildLink
from vecaccel.trainers.runners.asynchronous.shared import CHILD_SEED_KEY, chunk_slots, rollout_slots

__all__ = ["chunk_sampler_loop", "rollout_loop"]


def chunk_sampler_loop(spec: dict[str, Any]) -> None:
    """The DQN family's sampler: chunk ``n`` of ε-greedy steps into slot ``n % 2``, stepped by
    the algorithm's own acting policy and collector
    (:class:`~vecaccel.trainers.algos.exploration.EpsilonGreedy`)."""
    from vecaccel.trainers.algos.exploration import EpsilonGreedy, TransitionCollector
    from vecaccel.trainers.envs.make import action_start, backend_options_of, make_env_for_training
    from vecaccel.trainers.run.schedules import linear_schedule
    from vecaccel.trainers.run.seeding import seed_everything, split_seed

    link = ChildLink(spec)
    handover = link.handover
    cfg = spec["config"]
    steps = spec["start_steps"]
    # its own draws (e.g. noisy nets' noise), new ones for a resumed run
    seed_everything(split_seed(int(spec["env_seed"]), CHILD_SEED_KEY, spec["updates_at_start"]))
    network: torch.nn.Module = spec["network"]
    params = list(network.state_dict().values())
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
    collector = TransitionCollector(envs, policy)
    collector.reset(seed=spec["env_seed"])
    try:
        chunk_steps, vector_steps = spec["chunk_steps"], spec["vector_steps"]
        shared = chunk_slots(spec["observation_space"], cfg.num_envs, chunk_steps)
        handover.started.put(shared)
        slots = [{key: value.numpy() for key, value in slot.items()} for slot in shared]
        for n in range(math.ceil(vector_steps / chunk_steps)):
            length = min(chunk_steps, vector_steps - n * chunk_steps)
            if not link.acquire(handover.free_slots):  # slot n % 2: chunk n - 2 trained on
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
                slot["rewards"][t] = transition.reward
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
            handover.filled.put((length, version, ended))
        # the slots travel as file descriptors that this process shares itself: it must not
        # exit before the optimiser has them (a run of two chunks could)
        link.acquire(handover.started_seen)
    finally:
        collector.close()


def rollout_loop(spec: dict[str, Any]) -> None:
    """The on-policy sampler: ``[T, B]`` rollouts of the algorithm's sampler policy."""
    import vecaccel
    from vecaccel.trainers.envs.batched import is_batched_source
    from vecaccel.trainers.envs.make import backend_options_of, make_env_for_training
    from vecaccel.trainers.run.seeding import seed_everything, split_seed

    link = ChildLink(spec)
    handover = link.handover
    model: torch.nn.Module = spec["model"]
    cfg = spec["config"]
    # the policy's action sampling, new draws for a resumed run (the version published before
    # this process started)
    seed_everything(split_seed(int(cfg.seed), CHILD_SEED_KEY, link.counters.version))
    batched = is_batched_source(cfg.vectorized, cfg.env_source)
    env = make_env_for_training(
        cfg.env_id,
        cfg.num_envs,
        backend=cfg.backend,
        seed=cfg.seed,
        atari=cfg.atari,
        autoreset_mode=None if batched else cfg.autoreset_mode,
        vectorized=cfg.vectorized,
        env_source=cfg.env_source,
        **backend_options_of(cfg),
    )
    try:
        model.eval()
        params = list(model.state_dict().values())
        # the algorithm's sampler policy around `model` (a Discrete(n, start) env gets the
        # model's actions 0..n-1 moved to start..start+n-1); the optimiser moves them back
        sampler = vecaccel.Sampler(
            env, spec["policy"], horizon=cfg.num_steps, seed=cfg.seed, episode_stats="infos"
        )
        slots: list[dict[str, Any]] | None = None
        for n in range(spec["num_batches"]):
            if link.counters.stop:
                break
            version = link.weights_for(n, params)
            if version is None:
                break
            batch = sampler.collect()
            if slots is None:
                slots = rollout_slots(batch)
                handover.started.put(slots)
            if not link.acquire(handover.free_slots):
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
            episodes = sampler.pop_episodes()
            link.counters.steps += batch.rewards.numel()
            handover.filled.put((k, version, list(episodes.returns), list(episodes.lengths)))
        if slots is not None:  # as the chunk sampler's
            link.acquire(handover.started_seen)
    finally:
        env.close()
