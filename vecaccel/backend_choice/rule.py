"""The backend a step cost calls for: the one rule ``backend="auto"`` and ``vecaccel tune`` go by.

:func:`choose_backend` turns what a step costs into a backend, a worker count and an inline
share. The cost is either one env's seconds per step
(:func:`vecaccel.backend_choice.probe_step_cost`) or, for vectorized slices
(:mod:`vecaccel.envs.vectorized_slices`), what a vector env of all the envs and one of a slice's
envs cost (:class:`vecaccel.backend_choice.VectorStepCost`). For ``num_envs`` envs on a machine with
``cpus`` usable CPUs:

1. The envs must stay in worker processes (``on_worker_failure="restart"`` or a
   ``step_timeout_s``): ``shm``, one worker per CPU (at most one per env), whatever a step
   costs. No env is probed in the caller then, since the cost would not change the choice.
2. One env or one CPU: ``serial``.

One env's step cost ``step_s``:

3. Spreading the batch over the CPUs would save less than one worker round trip
   (``num_envs * step_s * (1 - 1/cpus) <= ROUND_TRIP_S``): ``serial``.
4. A step cheaper than :data:`INLINE_MAX_STEP_S`: ``hybrid``, one worker per CPU but the
   caller's, the caller stepping an equal share. For such envs waiting for a worker costs
   several steps, and the caller's core would idle through it.
5. Otherwise ``shm``, one worker per CPU (at most one per env): the round trip is small next to
   the steps, and every env keeps the isolation of a worker process.

A vector env's step cost:

3. The vector env keeps several cores busy by itself (its CPU time over its wall time, as
   EnvPool with ``num_threads`` above 1 does): only as many workers as such envs fit in the
   cores; where one fits, ``serial``.
4. Splitting the batch into slices saves no more than :data:`MIN_SAVING_S`, twice a quiet
   worker round trip (``step(num_envs) - step(slice) <= MIN_SAVING_S``): ``serial``. Twice,
   because the two mistakes cost unlike: a busy machine lengthens a round trip several times
   over but never a step in the caller, so keeping the envs in the caller loses at most the
   saving, while a worker backend chosen at the margin can lose most of the speed.
5. A slice's step at least :data:`SHM_MIN_SLICE_S`: ``shm``, one worker per slice, since the
   round trip is small next to it and every env keeps a worker's isolation.
6. Otherwise ``hybrid``: the caller steps one slice while the workers step the others, so no
   core idles through the wait.

An option only worker backends take (``workers=True``) rules ``serial`` out at every step.

The constants come from a 2-vCPU x86_64 VM shared with other jobs: CartPole-v1 steps in
12-16 µs, Pong (``AtariPreprocessing``, frame skip 4) in 0.5-1.2 ms; a lock-step ``shm`` round
trip cost 55-80 µs. ``serial`` stepped 8 CartPole envs faster than ``shm`` and ``hybrid`` (and
about as fast as they at 16), ``hybrid`` led on CartPole from 16 envs, and ``shm`` matched
``hybrid`` on Pong from 2 envs up (see ``docs/backends.md``). With Gymnasium's CartPole vector
env, ``shm`` with two workers took 180-200 µs a step more than the slowest slice alone, ``hybrid``
with one worker about 80 µs (see ``docs/benchmarks/throughput.md``). A loaded machine's round
trips are longer, which only moves the choice towards ``serial``.

Example:
    >>> from vecaccel.backend_choice.vector_step_cost import VectorStepCost
    >>> choice = choose_backend(800e-6, 16, 2)
    >>> choice.backend, choice.options
    ('shm', {'num_workers': 2})
    >>> choose_backend(13e-6, 4, 2).backend
    'serial'
    >>> choose_backend(13e-6, 64, 2).options
    {'num_workers': 1, 'inline_envs': 32}
    >>> choose_backend(VectorStepCost(47e-6, 25e-6, 1.0), 256, 2).backend
    'serial'
    >>> choice = choose_backend(VectorStepCost(16e-3, 8e-3, 1.0), 16, 2)
    >>> choice.backend, choice.options
    ('shm', {'num_workers': 2})
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

from vecaccel.backend_choice.vector_step_cost import (
    MULTICORE_RATIO,
    VectorStepCost,
    slice_size,
    worker_slots,
)

__all__ = [
    "HYBRID_ROUND_TRIP_S",
    "INLINE_MAX_STEP_S",
    "MIN_SAVING_S",
    "ROUND_TRIP_S",
    "SHM_MIN_SLICE_S",
    "SHM_ROUND_TRIP_S",
    "Choice",
    "choose_backend",
    "format_seconds",
]

#: What one lock-step round trip to the workers costs (wake-ups, flags, copies), in seconds.
ROUND_TRIP_S = 75e-6

#: Envs whose step costs less than this are stepped partly in the caller (``hybrid``).
INLINE_MAX_STEP_S = 100e-6

#: What ``hybrid`` (one worker, the caller stepping a slice too) adds to a vectorized step.
HYBRID_ROUND_TRIP_S = 80e-6

#: What ``shm`` (one worker per CPU, the caller waiting) adds to a vectorized step.
SHM_ROUND_TRIP_S = 190e-6

#: What slicing must save per step before workers are worth it (see the module's rule, 4).
MIN_SAVING_S = 2 * HYBRID_ROUND_TRIP_S

#: A slice whose step costs at least this goes to ``shm``: its round trip is small next to it.
SHM_MIN_SLICE_S = 10 * SHM_ROUND_TRIP_S


@dataclass(frozen=True)
class Choice:
    """A backend, the options that :func:`choose_backend` set, and why, in one sentence."""

    backend: str
    options: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def format_seconds(seconds: float) -> str:
    """``seconds`` as µs below a millisecond, else as ms, for the reasons of a choice.

    Example:
        >>> format_seconds(13e-6), format_seconds(0.0042)
        ('13 µs', '4.20 ms')
    """
    return f"{seconds * 1e6:,.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def choose_backend(
    cost: float | VectorStepCost | None,
    num_envs: int,
    cpus: int,
    *,
    isolate: bool = False,
    workers: bool = False,
    num_workers: int | None = None,
) -> Choice:
    """The backend for ``num_envs`` envs whose step costs ``cost`` (see the module's rule).

    Args:
        cost: seconds per step of one env (:attr:`vecaccel.backend_choice.StepCost.step_s`), or what
            the vector env of vectorized slices costs
            (:class:`~vecaccel.backend_choice.VectorStepCost`); ``None`` (not measured) only with
            ``isolate``, which needs no cost.
        num_envs: the number of envs.
        cpus: usable CPUs.
        isolate: every env must run in a worker process (restart or step timeout), so neither
            ``serial`` nor an inline share.
        workers: the envs must run on a worker backend (an option only those take was given),
            so not ``serial``.
        num_workers: a worker count given by the user, kept as given (a vector env's ``cost``
            measured its slices, :func:`~vecaccel.backend_choice.vector_step_cost.worker_slots`).

    Returns:
        The choice; its ``options`` hold ``num_workers`` for ``shm``, ``num_workers`` and
        ``inline_envs`` for ``hybrid``, nothing for ``serial``.

    Raises:
        ValueError: if one env's cost is negative or not a number, the cost is ``None``
            without ``isolate``, or a count is not positive.

    Example:
        >>> choose_backend(13e-6, 64, 2, isolate=True).backend
        'shm'
        >>> choose_backend(13e-6, 4, 2, workers=True).backend
        'hybrid'
        >>> choose_backend(VectorStepCost(8e-3, 4e-3, 2.0), 16, 2).reason
        'the vector env keeps 2.0 cores busy by itself (its own threads), and 2 CPU(s) hold 1 such env: workers cannot add cores'
    """
    if not (cost is None and isolate or isinstance(cost, VectorStepCost)) and (
        isinstance(cost, bool) or not (isinstance(cost, numbers.Real) and cost >= 0)
    ):
        raise ValueError(
            "step_s must be seconds >= 0 (a step cost is needed unless the envs must stay "
            f"isolated), got {cost!r}"
        )
    num_envs = _check_count("num_envs", num_envs)
    cpus = _check_count("cpus", cpus)
    if num_workers is not None:
        num_workers = _check_count("num_workers", num_workers)
    per_worker = num_workers or min(num_envs, cpus)
    if isolate:
        measured = (
            "not measured"
            if cost is None
            else f"a step of all {num_envs} envs costs {format_seconds(cost.step_s)}"
            if isinstance(cost, VectorStepCost)
            else format_seconds(cost)
        )
        return Choice(
            "shm",
            {"num_workers": per_worker},
            "the envs must stay in worker processes (restart or step timeout), whatever a "
            f"step costs ({measured})",
        )
    assert cost is not None  # checked above
    if isinstance(cost, VectorStepCost):
        described = f"a step of all {num_envs} envs costs {format_seconds(cost.step_s)}"
    else:
        described = f"one step costs {format_seconds(cost)}"
    if not workers and (num_envs == 1 or cpus == 1):
        return Choice(
            "serial", {}, f"{described}; {'one env' if num_envs == 1 else 'one usable CPU'}"
        )
    if isinstance(cost, VectorStepCost):
        return _choose_for_vector_env(cost, described, num_envs, cpus, workers, num_workers)
    saved = num_envs * cost * (1 - 1 / cpus)
    if not workers and saved <= ROUND_TRIP_S:
        return Choice(
            "serial",
            {},
            f"{described}; spreading {num_envs} envs over {cpus} CPUs would save "
            f"{format_seconds(saved)} a step, less than a worker round trip "
            f"(~{format_seconds(ROUND_TRIP_S)})",
        )
    inline_workers = num_workers or max(1, min(cpus - 1, num_envs - 1))
    if cost < INLINE_MAX_STEP_S:
        if num_envs > inline_workers:
            inline = max(1, min(num_envs - 1, num_envs // (inline_workers + 1)))
            return Choice(
                "hybrid",
                {"num_workers": inline_workers, "inline_envs": inline},
                f"{described} (< {format_seconds(INLINE_MAX_STEP_S)}): waiting for a worker "
                f"costs several steps, so the caller steps {inline} of {num_envs} envs beside "
                f"{inline_workers} worker(s)",
            )
        why = f", but {num_envs} env(s) leave the caller no share beside {inline_workers} worker(s)"
    else:
        why = (
            f" (>= {format_seconds(INLINE_MAX_STEP_S)}): the round trip is small next to the steps"
        )
    return Choice(
        "shm",
        {"num_workers": per_worker},
        f"{described}{why}; {per_worker} worker(s) for {num_envs} envs",
    )


def _choose_for_vector_env(
    cost: VectorStepCost,
    described: str,
    num_envs: int,
    cpus: int,
    workers: bool,
    num_workers: int | None,
) -> Choice:
    """Steps 3 to 6 of the module's rule for a vector env's step cost."""
    slots = worker_slots(num_envs, cpus, cost.cores, num_workers)
    if cost.cores >= MULTICORE_RATIO and slots == 1 and not workers:
        return Choice(
            "serial",
            {},
            f"the vector env keeps {cost.cores:.1f} cores busy by itself (its own threads), and "
            f"{cpus} CPU(s) hold 1 such env: workers cannot add cores",
        )
    saved = cost.step_s - cost.slice_step_s
    sliced = f"a slice of {slice_size(num_envs, slots)} costs {format_seconds(cost.slice_step_s)}"
    if not workers and saved <= MIN_SAVING_S:
        return Choice(
            "serial",
            {},
            f"{described}, {sliced}: slicing would save {format_seconds(max(saved, 0.0))} a "
            f"step, no more than twice a worker round trip "
            f"(~{format_seconds(HYBRID_ROUND_TRIP_S)}), so the vector env stays in the caller",
        )
    if cost.slice_step_s >= SHM_MIN_SLICE_S or slots == 1:
        return Choice(
            "shm",
            {"num_workers": slots},
            f"{described}, {sliced}: the round trip (~{format_seconds(SHM_ROUND_TRIP_S)}) is "
            f"small next to it; {slots} worker(s), one vector env each",
        )
    hybrid_workers = num_workers or slots - 1  # the caller steps the last slice
    inline = max(1, num_envs // (hybrid_workers + 1))
    return Choice(
        "hybrid",
        {"num_workers": hybrid_workers, "inline_envs": inline},
        f"{described}, {sliced}: the caller steps {inline} envs as one vector env beside "
        f"{hybrid_workers} worker(s), so no core waits out a round trip",
    )
