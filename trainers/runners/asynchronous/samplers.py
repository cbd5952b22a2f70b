"""The loops of an asynchronous run's sampler process, one per way of handing experience over.

- :func:`replay_sampler_loop` (replay, throttled): ε-greedy steps straight into the shared replay
  buffer, kept within a lead of the optimiser's updates.
- :func:`chunk_sampler_loop` (replay, fixed lag): chunks of steps into a shared double buffer
  that the optimiser adds to the replay buffer itself, in order.
- :func:`rollout_loop` (on-policy): ``[T, B]`` rollouts into a shared double buffer.

Each runs in the child process started by :class:`~vecaccel.trainers.runners.asynchronous.process.SamplerHandle`
and reads everything it needs from its spec.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from vecaccel.trainers.runners.asynchronous.process import ChildLink
from vecaccel.trainers.runners.asynchronous.shared import (
    CHILD_SEED_KEY,
    CHUNKS,
    PULLS,
    READY,
    SAMPLER_BUSY,
    SLOT_K,
    SLOT_STATE,
    SLOT_VERSION,
    SLOTS_TAKEN,
    STEPS,
    UPDATES,
    VERSION,
    GuardedLock,
    ReplayFactory,
    build_replay_buffer,
    rollout_slots,
)

__all__ = ["Actor", "chunk_sampler_loop", "replay_sampler_loop", "rollout_loop"]

# vector steps the sampler may hold back while the optimiser holds the replay buffer's lock
_MAX_PENDING_STEPS = 32


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


def replay_sampler_loop(spec: dict[str, Any]) -> None:
    """The DQN sampler: ε-greedy steps with the latest weights into the shared replay buffer."""
    link = ChildLink(spec)
    counters, timers = link.counters, link.timers
    buffer = build_replay_buffer(
        spec["buffer"],
        spec["observation_space"],
        spec["action_space"],
        ReplayFactory(spec["buffer_tensors"]),
    )
    buffer_lock = GuardedLock(spec["buffer_lock"], link.check_optimiser)
    episodes = spec["episodes"]
    cfg = spec["config"]
    total, learn_from, lead = spec["total_steps"], spec["learn_from"], spec["lead"]
    updates_at_start = spec["updates_at_start"]
    steps_per_update = cfg["batch_size"] / cfg["replay_ratio"]

    actor = Actor(spec, link)
    try:
        num_envs = actor.num_envs
        steps = 0
        # steps collected while the optimiser samples (holding the buffer's lock) wait here
        # instead of stalling the envs, and go in with the next step that finds the lock free
        pending: list[tuple[Any, ...]] = []

        def add(transition: tuple[Any, ...]) -> None:
            if len(pending) >= _MAX_PENDING_STEPS:
                buffer_lock.__enter__()
            elif not buffer_lock.try_acquire():
                # the envs may reuse their arrays at the next step: keep copies
                pending.append(tuple(None if x is None else np.array(x) for x in transition))
                return
            try:
                for waiting in pending:
                    buffer.add(*waiting)
                buffer.add(*transition)
            finally:
                buffer_lock.release()
            pending.clear()

        def too_far_ahead() -> bool:  # the throttle: stay within `lead` steps of the updates
            updates = int(counters[UPDATES]) - updates_at_start
            allowed = learn_from + updates * steps_per_update + lead
            return steps + num_envs > allowed

        counters[READY] = 1
        start = time.perf_counter()
        while not link.stopped:
            steps = int(counters[STEPS])
            if steps >= total:
                break
            if steps >= learn_from:
                link.wait_while(too_far_ahead)
            link.pull_weights(actor.params, wait=False)
            transition, finished = actor.step(steps)
            add(transition)
            counters[STEPS] += num_envs
            if finished:
                episodes.put((steps + num_envs, finished))
            link.check_optimiser()
        if pending:
            with buffer_lock:
                for waiting in pending:
                    buffer.add(*waiting)
        timers[SAMPLER_BUSY] = time.perf_counter() - start
    finally:
        actor.close()


def chunk_sampler_loop(spec: dict[str, Any]) -> None:
    """The DQN sampler with a fixed lag: chunk ``n`` into slot ``n % 2`` with the weights
    published once the optimiser has trained on chunk ``n - 2``; the optimiser adds the chunks
    to the replay buffer itself, in order, so the run repeats exactly."""
    link = ChildLink(spec)
    counters, timers = link.counters, link.timers
    slots = [{key: value.numpy() for key, value in slot.items()} for slot in spec["slots"]]
    episodes = spec["episodes"]
    steps = spec["start_steps"]
    actor = Actor(spec, link)
    try:
        counters[READY] = 1
        start = time.perf_counter()
        chunk_steps, vector_steps = spec["chunk_steps"], spec["vector_steps"]
        for n in range(math.ceil(vector_steps / chunk_steps)):
            length = min(chunk_steps, vector_steps - n * chunk_steps)
            # the weights after chunk n - 2: waited for, and the optimiser publishes no newer
            # ones before they are pulled
            wanted = max(0, n - 1)
            link.wait_while(lambda wanted=wanted: int(counters[CHUNKS]) < wanted)
            full = SLOT_STATE + n % 2
            link.wait_while(lambda full=full: bool(counters[full]))
            if link.stopped:
                break
            version = link.pull_weights(actor.params)
            counters[PULLS] = n + 1
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
            episodes.put(ended)  # before the slot is marked full: one item per chunk
            counters[SLOT_VERSION + n % 2] = version
            counters[SLOT_K + n % 2] = length
            counters[full] = 1
            counters[STEPS] = steps
        timers[SAMPLER_BUSY] = time.perf_counter() - start
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
    first_version = int(counters[VERSION])  # published before this process started
    # the policy's action sampling, new draws for a resumed run
    seed_everything(split_seed(int(cfg["seed"]), CHILD_SEED_KEY, first_version))
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
        for n in range(spec["num_batches"]):
            if link.stopped:
                break
            if spec["fixed_lag"]:
                # batch n is collected with the weights of update n - 1 exactly: waited for,
                # and the optimiser publishes no newer ones before they are pulled
                wanted = first_version + max(0, n - 1)
                link.wait_while(lambda wanted=wanted: int(counters[VERSION]) < wanted)
                if link.stopped:
                    break
                version = link.pull_weights(params)
                counters[PULLS] = n + 1
            else:
                version = link.pull_weights(params)
            batch = sampler.collect()
            if slots is None:
                slots = rollout_slots(batch)
                spec["slots"].put(slots)
            link.wait_while(lambda full=SLOT_STATE + slot: bool(counters[full]))
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
            counters[SLOT_K + slot] = k
            counters[SLOT_VERSION + slot] = version
            episodes = sampler.pop_episodes()
            spec["episodes"].put((list(episodes.returns), list(episodes.lengths)))
            counters[SLOT_STATE + slot] = 1
            counters[STEPS] += batch.rewards.numel()
            slot ^= 1
        if slots is not None:
            link.wait_while(lambda: not counters[SLOTS_TAKEN])
    finally:
        env.close()
