"""The clock: build, reset, step and close one vector env, timing only the stepping.

Actions are random and sampled before the clock starts, and stepping cycles through them, so the
policy's cost is not in the figures.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector.utils import batch_space

from vecaccel.bench.peers import reset_envs
from vecaccel.bench.workloads import BenchEnv

__all__ = ["ACTION_BATCHES", "measure", "measure_raw", "sample_actions", "time_raw", "time_vector"]

#: How many batches of random actions are sampled before timing; stepping cycles through them.
ACTION_BATCHES = 64


def sample_actions(space: gym.Space, count: int, seed: int) -> list[Any]:
    """``count`` actions of ``space``, sampled after seeding it with ``seed``, to cycle through
    while the clock runs.

    Example:
        >>> sample_actions(gym.spaces.Discrete(2), 3, seed=0)[0] in (0, 1)
        True
    """
    space.seed(seed)
    return [space.sample() for _ in range(count)]


def time_vector(
    envs: Any, actions: Sequence[Any], seconds: float, warmup: float, policy_s: float = 0.0
) -> tuple[int, float]:
    """Step the vector env ``envs`` for ``warmup`` then ``seconds`` through ``actions`` (a
    cycle of batches), sleeping ``policy_s`` before each step; return (batches stepped, elapsed
    s)."""
    count = len(actions)
    step = envs.step
    i = 0
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step(actions[i % count])
        i += 1
    start = time.perf_counter()
    deadline = start + seconds
    batches = 0
    while True:
        if policy_s:
            time.sleep(policy_s)
        step(actions[i % count])
        i += 1
        batches += 1
        now = time.perf_counter()
        if now >= deadline:
            return batches, now - start


def time_raw(
    env: gym.Env, actions: Sequence[Any], seconds: float, warmup: float
) -> tuple[int, float]:
    """Step one plain env for ``warmup`` then ``seconds`` through ``actions`` (a cycle),
    resetting it when an episode ends; return (steps, elapsed s)."""
    count = len(actions)
    step, reset = env.step, env.reset
    i = 0
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        _, _, terminated, truncated, _ = step(actions[i % count])
        if terminated or truncated:
            reset()
        i += 1
    start = time.perf_counter()
    deadline = start + seconds
    steps = 0
    while True:
        # the clock is read every 16 steps so it costs nothing next to a fast env's step
        for _ in range(16):
            _, _, terminated, truncated, _ = step(actions[i % count])
            if terminated or truncated:
                reset()
            i += 1
        steps += 16
        now = time.perf_counter()
        if now >= deadline:
            return steps, now - start


def measure(
    impl: str,
    build: Callable[[], Any],
    num_envs: int,
    seconds: float,
    warmup: float,
    seed: int,
    policy_s: float = 0.0,
    before_close: Callable[[Any], None] | None = None,
) -> tuple[float, float]:
    """Build, reset, time and close one vector env; return (steps/s, set-up seconds).

    Args:
        impl: the implementation's name (``vecaccel-<backend>`` or a peer), which decides how
            the env is reset.
        build: makes the vector env.
        num_envs: its number of sub-environments.
        seconds: timed seconds.
        warmup: untimed seconds stepped first.
        seed: seed of the reset and of the action sampling.
        policy_s: a policy's latency to simulate before each timed step (a sleep, as a GPU
            forward costs the CPU little), so that what overlaps it shows (``vecaccel tune
            --policy-ms``).
        before_close: called with the vector env after timing, before it is closed (to read
            its ``stats()``).

    Example:
        >>> import functools, gymnasium as gym
        >>> from vecaccel.bench.workloads import make_gym_env
        >>> build = functools.partial(
        ...     gym.vector.SyncVectorEnv, [functools.partial(make_gym_env, "CartPole-v1")] * 2
        ... )
        >>> rate, setup_s = measure("gym-sync", build, 2, seconds=0.01, warmup=0.0, seed=0)
        >>> rate > 0
        True
    """
    started = time.perf_counter()
    envs = build()
    try:
        setup = time.perf_counter() - started
        with warnings.catch_warnings():
            if impl == "envpool":
                # EnvPool rebuilds its spaces on each access, and its CartPole declares float64
                # bounds that Gymnasium warns about every time
                warnings.simplefilter("ignore", UserWarning)
            reset_envs(envs, impl, seed)
            single_action_space = getattr(envs, "single_action_space", None)
            if single_action_space is None:  # SB3 and EnvPool expose the per-env space
                single_action_space = envs.action_space
        # backends that return part of the envs each step (async batch_size, alternating
        # action server) take and return that many
        per_step = int(getattr(envs, "batch_size", None) or num_envs)
        batched = batch_space(single_action_space, per_step)
        actions = sample_actions(batched, ACTION_BATCHES, seed)
        batches, elapsed = time_vector(envs, actions, seconds, warmup, policy_s)
        if before_close is not None:
            before_close(envs)
        return batches * per_step / elapsed, setup
    finally:
        envs.close()


def measure_raw(target: BenchEnv, seconds: float, warmup: float, seed: int) -> float:
    """Steps/s of one plain env of ``target`` stepped in a loop: the single-core rate."""
    env = target.env_fn()
    try:
        env.reset(seed=seed)
        actions = sample_actions(env.action_space, ACTION_BATCHES, seed)
        steps, elapsed = time_raw(env, actions, seconds, warmup)
        return steps / elapsed
    finally:
        env.close()
