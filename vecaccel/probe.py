"""What one env's step costs, and the backend that cost calls for.

:func:`probe_step_cost` steps one env in the calling process for a few milliseconds with random
actions, resetting it whenever an episode ends, and returns the mean seconds per step.
:func:`choose_backend` turns that cost into a backend, a worker count and an inline share by a
rule short enough to say in one line. ``make_vec(..., backend="auto")`` and ``vecaccel tune``
both use them.

The rule, for ``num_envs`` envs whose step costs ``step_s`` on a machine with ``cpus`` usable
CPUs:

1. The envs must stay in worker processes (``on_worker_failure="restart"`` or a
   ``step_timeout_s``): ``shm``, one worker per CPU (at most one per env). No env is probed in
   the caller then, since the cost would not change the choice.
2. Spreading the batch over the CPUs would save less than one worker round trip
   (``num_envs * step_s * (1 - 1/cpus) <= ROUND_TRIP_S``), or there is one env or one CPU:
   ``serial``.
3. A step cheaper than :data:`INLINE_MAX_STEP_S`: ``hybrid``, one worker per CPU but the
   caller's, the caller stepping an equal share. For such envs waiting for a worker costs
   several steps, and the caller's core would idle through it.
4. Otherwise ``shm``, one worker per CPU (at most one per env): the round trip is small next to
   the steps, and every env keeps the isolation of a worker process.

The constants come from a 2-vCPU x86_64 VM shared with other jobs: CartPole-v1 steps in
12-16 µs, Pong (``AtariPreprocessing``, frame skip 4) in 0.5-1.2 ms; a lock-step ``shm`` round
trip cost 55-80 µs. ``serial`` stepped 8 CartPole envs faster than ``shm`` and ``hybrid`` (and
about as fast as they at 16), ``hybrid`` led on CartPole from 16 envs, and ``shm`` matched
``hybrid`` on Pong from 2 envs up (see ``docs/backends.md``).

Example:
    >>> choice = choose_backend(800e-6, 16, 2)
    >>> choice.backend, choice.options
    ('shm', {'num_workers': 2})
    >>> choose_backend(13e-6, 4, 2).backend
    'serial'
    >>> choose_backend(13e-6, 64, 2).options
    {'num_workers': 1, 'inline_envs': 32}
"""

from __future__ import annotations

import numbers
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = [
    "INLINE_MAX_STEP_S",
    "PROBE_S",
    "ROUND_TRIP_S",
    "Choice",
    "StepCost",
    "choose_backend",
    "probe_step_cost",
]

#: Seconds of stepping the probe times (after one untimed step).
PROBE_S = 0.01

#: Consecutive steps whose mean is one sample of the step cost.
CHUNK_STEPS = 16

#: What one lock-step round trip to the workers costs (wake-ups, flags, copies), in seconds.
ROUND_TRIP_S = 75e-6

#: Envs whose step costs less than this are stepped partly in the caller (``hybrid``).
INLINE_MAX_STEP_S = 100e-6


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


@dataclass(frozen=True)
class Choice:
    """A backend, the options that :func:`choose_backend` set, and why, in one sentence."""

    backend: str
    options: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def choose_backend(
    step_s: float | None,
    num_envs: int,
    cpus: int,
    *,
    isolate: bool = False,
    workers: bool = False,
    num_workers: int | None = None,
) -> Choice:
    """The backend for ``num_envs`` envs whose step costs ``step_s`` seconds (see the module's
    rule).

    Args:
        step_s: seconds per step of one env (:attr:`StepCost.step_s`); ``None`` (not
            measured) only with ``isolate``, which needs no cost.
        num_envs: the number of envs.
        cpus: usable CPUs.
        isolate: every env must run in a worker process (restart or step timeout), so neither
            ``serial`` nor an inline share.
        workers: the envs must run on a worker backend (an option only those take was given),
            so not ``serial``.
        num_workers: a worker count given by the user, kept as given.

    Returns:
        The choice; its ``options`` hold ``num_workers`` for ``shm``, ``num_workers`` and
        ``inline_envs`` for ``hybrid``, nothing for ``serial``.

    Raises:
        ValueError: if ``step_s`` is negative or not a number (or ``None`` without
            ``isolate``), or a count is not positive.

    Example:
        >>> choose_backend(13e-6, 64, 2, isolate=True).backend
        'shm'
        >>> choose_backend(13e-6, 4, 2, workers=True).backend
        'hybrid'
    """
    if not (step_s is None and isolate) and (
        isinstance(step_s, bool) or not (isinstance(step_s, numbers.Real) and step_s >= 0)
    ):
        raise ValueError(f"step_s must be seconds >= 0, got {step_s!r}")
    num_envs = _check_count("num_envs", num_envs)
    cpus = _check_count("cpus", cpus)
    if num_workers is not None:
        num_workers = _check_count("num_workers", num_workers)
    per_worker = num_workers or min(num_envs, cpus)
    if isolate:
        cost = "not measured" if step_s is None else _us(step_s)
        return Choice(
            "shm",
            {"num_workers": per_worker},
            "the envs must stay in worker processes (restart or step timeout), whatever a "
            f"step costs ({cost})",
        )
    assert step_s is not None  # checked above
    cost = f"one step costs {_us(step_s)}"
    saved = num_envs * step_s * (1 - 1 / cpus)
    if not workers and (num_envs == 1 or cpus == 1 or saved <= ROUND_TRIP_S):
        why = (
            "one env"
            if num_envs == 1
            else "one usable CPU"
            if cpus == 1
            else f"spreading {num_envs} envs over {cpus} CPUs would save {_us(saved)} a step, "
            f"less than a worker round trip (~{_us(ROUND_TRIP_S)})"
        )
        return Choice("serial", {}, f"{cost}; {why}")
    inline_workers = num_workers or max(1, min(cpus - 1, num_envs - 1))
    if step_s < INLINE_MAX_STEP_S:
        if num_envs > inline_workers:
            inline = max(1, min(num_envs - 1, num_envs // (inline_workers + 1)))
            return Choice(
                "hybrid",
                {"num_workers": inline_workers, "inline_envs": inline},
                f"{cost} (< {_us(INLINE_MAX_STEP_S)}): waiting for a worker costs several "
                f"steps, so the caller steps {inline} of {num_envs} envs beside "
                f"{inline_workers} worker(s)",
            )
        why = f", but {num_envs} env(s) leave the caller no share beside {inline_workers} worker(s)"
    else:
        why = f" (>= {_us(INLINE_MAX_STEP_S)}): the round trip is small next to the steps"
    return Choice(
        "shm",
        {"num_workers": per_worker},
        f"{cost}{why}; {per_worker} worker(s) for {num_envs} envs",
    )
