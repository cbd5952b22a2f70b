"""What one env's step costs, measured by stepping it in the calling process.

:func:`probe_step_cost` steps one env for a few milliseconds with random actions, resetting it
whenever an episode ends, and returns the mean seconds per step; the one rule of
:func:`vecaccel.backend_choice.choose_backend` turns it into a backend.
``make_vec(..., backend="auto")`` and ``vecaccel tune`` both use them.

Example:
    >>> import gymnasium as gym
    >>> probe_step_cost(lambda: gym.make("CartPole-v1"), seconds=0.005).steps > 0
    True
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym

__all__ = ["CHUNK_STEPS", "PROBE_S", "StepCost", "probe_step_cost"]

#: Seconds of stepping the probe times (after one untimed step).
PROBE_S = 0.01

#: Consecutive steps whose mean is one sample of the step cost.
CHUNK_STEPS = 16


@dataclass(frozen=True)
class StepCost:
    """What :func:`probe_step_cost` measured.

    Attributes:
        step_s: seconds per step, the resets of episodes that ended included: the median of
            the means of runs of :data:`CHUNK_STEPS` steps (the plain mean when fewer than
            three runs fit in the probe).
        steps: timed steps.
        resets: episodes that ended (and were reset) during the timed steps.
        reset_s: seconds of the first ``reset``, which is not part of ``step_s``.
    """

    step_s: float
    steps: int
    resets: int
    reset_s: float


def probe_step_cost(
    env_fn: Callable[[], gym.Env], seconds: float = PROBE_S, seed: int = 0
) -> StepCost:
    """Step one env made by ``env_fn`` in this process for ``seconds``; return its step cost.

    Actions are random (the action space seeded with ``seed``); an episode that ends is reset
    and the clock keeps running, so envs whose episodes are short pay their resets. Taking the
    median over runs of steps keeps a moment of load on a shared machine out of it. The first
    step is not timed (envs often do lazy work there), and at least one step is. The env is
    closed before this returns.

    Args:
        env_fn: a zero-argument function returning a new env.
        seconds: how long to time steps.
        seed: seed of the first reset and of the action sampling.

    Raises:
        ValueError: if ``seconds`` is not positive.

    Example:
        >>> import gymnasium as gym
        >>> cost = probe_step_cost(lambda: gym.make("CartPole-v1"), seconds=0.005)
        >>> cost.steps > 0 and 0 < cost.step_s < 1
        True
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    env = env_fn()
    try:
        space = env.action_space
        space.seed(seed)
        actions = [space.sample() for _ in range(16)]
        started = time.perf_counter()
        env.reset(seed=seed)
        reset_s = time.perf_counter() - started
        step, reset = env.step, env.reset
        _, _, terminated, truncated, _ = step(actions[0])
        if terminated or truncated:
            reset()
        steps = resets = 0
        chunks: list[float] = []
        start = chunk_start = time.perf_counter()
        while True:
            _, _, terminated, truncated, _ = step(actions[steps % 16])
            steps += 1
            if terminated or truncated:
                reset()
                resets += 1
            now = time.perf_counter()
            if steps % CHUNK_STEPS == 0:
                chunks.append((now - chunk_start) / CHUNK_STEPS)
                chunk_start = now
            if now - start >= seconds:
                # the median of the chunks' means drops a chunk the scheduler stalled; an env
                # too slow to fill three chunks gets the plain mean
                mean = (now - start) / steps
                step_s = statistics.median(chunks) if len(chunks) >= 3 else mean
                return StepCost(step_s, steps, resets, reset_s)
    finally:
        env.close()
