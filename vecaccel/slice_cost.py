"""What a vector env function's step costs, and the backend that cost calls for.

``make_vec(fn, n, vectorized=True, backend="auto")`` hands every worker one batched vector env
over its slice of the envs (:mod:`vecaccel.vectorized`). A cheap batched simulator such as
Gymnasium's ``CartPoleVectorEnv`` steps thousands of envs in the time of one worker round trip,
and EnvPool's own threads already use every core: workers would make both slower.
:func:`probe_vector_step_cost` steps the inner vector env in the calling process at the sizes
that matter; :func:`choose_vector_backend` turns that into a backend by this rule, for
``num_envs`` envs on ``cpus`` usable CPUs:

1. The envs must stay in worker processes (restart or a step timeout): ``shm``, one worker per
   CPU, whatever a step costs.
2. One env or one CPU: ``serial``.
3. The vector env keeps several cores busy by itself (its CPU time over its wall time, as
   EnvPool with ``num_threads`` above 1 does; what the caller's other threads were burning
   before the env was made is left out): only as many workers as such envs fit in the cores;
   where one fits, ``serial``.
4. Splitting the batch into slices saves no more than :data:`MIN_SAVING_S`, twice a quiet
   worker round trip (``step(num_envs) - step(slice) <= MIN_SAVING_S``): ``serial``. Twice,
   because the two mistakes cost unlike: a busy machine lengthens a round trip several times
   over but never a step in the caller, so keeping the envs in the caller loses at most the
   saving, while a worker backend chosen at the margin can lose most of the speed.
5. A slice's step at least :data:`SHM_MIN_SLICE_S`: ``shm``, one worker per slice, since the
   round trip is small next to it and every env keeps a worker's isolation.
6. Otherwise ``hybrid``: the caller steps one slice while the workers step the others, so no
   core idles through the wait.

The round trips were measured on a quiet 2-vCPU x86_64 VM with Gymnasium's CartPole vector
env: ``shm`` with two workers took 180-200 µs a step more than the slowest slice alone, ``hybrid``
with one worker about 80 µs (see ``docs/benchmarks/throughput.md``). A loaded machine's round trips are
longer, which only moves the choice towards ``serial``.

Example:
    >>> choose_vector_backend(VectorStepCost(47e-6, 25e-6, 1.0), 256, 2).backend
    'serial'
    >>> choice = choose_vector_backend(VectorStepCost(16e-3, 8e-3, 1.0), 16, 2)
    >>> choice.backend, choice.options
    ('shm', {'num_workers': 2})
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gymnasium.vector.utils import batch_space

from vecaccel.probe import PROBE_S, Choice, _check_count, _us

__all__ = [
    "HYBRID_ROUND_TRIP_S",
    "MIN_SAVING_S",
    "MULTICORE_RATIO",
    "SHM_MIN_SLICE_S",
    "SHM_ROUND_TRIP_S",
    "VectorStepCost",
    "choose_vector_backend",
    "probe_vector_step_cost",
    "slice_size",
    "worker_slots",
]

#: What ``hybrid`` (one worker, the caller stepping a slice too) adds to a vectorized step.
HYBRID_ROUND_TRIP_S = 80e-6

#: What ``shm`` (one worker per CPU, the caller waiting) adds to a vectorized step.
SHM_ROUND_TRIP_S = 190e-6

#: What slicing must save per step before workers are worth it (see the module's rule, 4).
MIN_SAVING_S = 2 * HYBRID_ROUND_TRIP_S

#: A slice whose step costs at least this goes to ``shm``: its round trip is small next to it.
SHM_MIN_SLICE_S = 10 * SHM_ROUND_TRIP_S

#: A vector env whose CPU time exceeds its wall time by this factor runs threads of its own.
MULTICORE_RATIO = 1.25

#: Batches of random actions sampled before the clock starts; stepping cycles through them.
_ACTION_BATCHES = 8

#: Consecutive steps whose mean is one sample of the step cost.
_CHUNK_STEPS = 4


@dataclass(frozen=True)
class VectorStepCost:
    """What :func:`probe_vector_step_cost` measured (or what a user's ``step_cost_s`` implies).

    Attributes:
        step_s: seconds per step of the vector env of all the envs.
        slice_step_s: seconds per step of a vector env of one slice's envs.
        cores: the vector env's CPU time over its wall time while it stepped all the envs:
            about 1 for one thread, more for a simulator running threads of its own.
    """

    step_s: float
    slice_step_s: float
    cores: float = 1.0


def slice_size(num_envs: int, slices: int) -> int:
    """The largest slice when ``num_envs`` are cut into ``slices`` (the one everyone waits for).

    Example:
        >>> slice_size(4096, 2), slice_size(7, 2)
        (2048, 4)
    """
    return -(-num_envs // max(1, slices))


def _background_cpu(seconds: float) -> float:
    """The CPU this process's other threads (a training loop's, a thread pool's) burn per
    second, measured while the calling thread sleeps ``seconds``."""
    cpu_start, start = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - cpu_start) / (time.perf_counter() - start)


def _time_steps(
    envs: Any, seconds: float, seed: int, background: float = 0.0
) -> tuple[float, float]:
    """Step ``envs`` for ``seconds`` after one untimed step: ``(seconds per step, cores)``.

    ``cores`` counts the CPU of the calling thread and of the vector env's own threads, less
    ``background`` (:func:`_background_cpu`) for the threads that were busy before the env was
    made, and never less than the calling thread's own."""
    space = batch_space(envs.single_action_space, envs.num_envs)
    space.seed(seed)
    actions = [space.sample() for _ in range(_ACTION_BATCHES)]
    envs.reset(seed=seed)
    step = envs.step
    step(actions[0])  # lazy work (buffers, a first autoreset) stays out of the figure
    steps = 0
    chunks: list[float] = []
    cpu_start, thread_start = time.process_time(), time.thread_time()
    start = chunk_start = time.perf_counter()
    while True:
        step(actions[steps % _ACTION_BATCHES])
        steps += 1
        now = time.perf_counter()
        if steps % _CHUNK_STEPS == 0:
            chunks.append((now - chunk_start) / _CHUNK_STEPS)
            chunk_start = now
        if now - start >= seconds:
            wall = now - start
            own = time.thread_time() - thread_start
            cores = max(own, time.process_time() - cpu_start - background * wall) / wall
            # the median of the chunks drops a chunk the scheduler stalled
            step_s = statistics.median(chunks) if len(chunks) >= 3 else wall / steps
            return step_s, cores


def worker_slots(num_envs: int, cpus: int, cores: float, num_workers: int | None = None) -> int:
    """How many slices the envs are cut into: ``num_workers`` where given, else one per CPU,
    or per group of CPUs where the vector env keeps ``cores`` cores busy by itself.

    Example:
        >>> worker_slots(4096, 2, 1.0), worker_slots(16, 2, 1.9), worker_slots(16, 16, 4.2)
        (2, 1, 4)
    """
    if num_workers:
        return num_workers
    per_env = max(1, round(cores)) if cores >= MULTICORE_RATIO else 1
    return max(1, min(num_envs, cpus // per_env))


def probe_vector_step_cost(
    vector_fn: Callable[[int], Any],
    num_envs: int,
    cpus: int,
    num_workers: int | None = None,
    seconds: float = PROBE_S,
    seed: int = 0,
) -> VectorStepCost:
    """Step ``vector_fn(num_envs)`` in this process for ``seconds``, then a vector env of
    one slice of them (:func:`worker_slots`, :func:`slice_size`), with random actions; both
    are closed before this returns.

    Args:
        vector_fn: ``fn(n) -> gymnasium.vector.VectorEnv``.
        num_envs: the envs asked for.
        cpus: usable CPUs.
        num_workers: a worker count given by the user (the slices are then its).
        seconds: how long to time each.
        seed: seed of the resets and of the action sampling.

    Raises:
        ValueError: if ``seconds`` is not positive.

    Example:
        >>> import gymnasium as gym
        >>> fn = lambda n: gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")
        >>> cost = probe_vector_step_cost(fn, 64, cpus=2, seconds=0.005)
        >>> 0 < cost.step_s < 1 and 0 < cost.slice_step_s < 1
        True
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    # process CPU time counts every thread: what the others burn is measured before any env
    # exists, so that a busy training or data thread does not read as the env's own threads
    background = _background_cpu(seconds)

    def timed(size: int) -> tuple[float, float]:
        envs = vector_fn(size)
        try:
            return _time_steps(envs, seconds, seed, background)
        finally:
            envs.close()

    step_s, cores = timed(num_envs)
    size = slice_size(num_envs, worker_slots(num_envs, cpus, cores, num_workers))
    slice_step_s = step_s if size == num_envs else timed(size)[0]
    return VectorStepCost(step_s, slice_step_s, cores)


def choose_vector_backend(
    cost: VectorStepCost | None,
    num_envs: int,
    cpus: int,
    *,
    isolate: bool = False,
    workers: bool = False,
    num_workers: int | None = None,
) -> Choice:
    """The backend for ``num_envs`` envs of a vector env function that costs ``cost`` (see the
    module's rule).

    Args:
        cost: what stepping the vector env costs; ``None`` (not measured) only with
            ``isolate``.
        num_envs: the number of envs.
        cpus: usable CPUs.
        isolate: every env must run in a worker process (restart or step timeout).
        workers: an option only worker backends take was given, so not ``serial``.
        num_workers: a worker count given by the user, kept as given (``cost`` measured
            its slices, :func:`worker_slots`).

    Returns:
        The choice; its ``options`` hold ``num_workers`` for ``shm``, ``num_workers`` and
        ``inline_envs`` for ``hybrid``, nothing for ``serial``.

    Raises:
        ValueError: if ``cost`` is missing without ``isolate``, or a count is not positive.

    Example:
        >>> choose_vector_backend(VectorStepCost(8e-3, 4e-3, 2.0), 16, 2).reason
        'the vector env keeps 2.0 cores busy by itself (its own threads), and 2 CPU(s) hold 1 such env: workers cannot add cores'
        >>> choose_vector_backend(VectorStepCost(500e-6, 250e-6), 8192, 2).options
        {'num_workers': 1, 'inline_envs': 4096}
    """
    num_envs = _check_count("num_envs", num_envs)
    cpus = _check_count("cpus", cpus)
    if num_workers is not None:
        num_workers = _check_count("num_workers", num_workers)
    if isolate:
        count = num_workers or min(num_envs, cpus)
        return Choice(
            "shm",
            {"num_workers": count},
            "the envs must stay in worker processes (restart or step timeout): one vector env "
            f"per worker, {count} worker(s)",
        )
    if cost is None:
        raise ValueError("a vector env's step cost is needed unless the envs must stay isolated")
    whole = f"a step of all {num_envs} envs costs {_us(cost.step_s)}"
    if not workers and (num_envs == 1 or cpus == 1):
        return Choice("serial", {}, f"{whole}; {'one env' if num_envs == 1 else 'one CPU'}")
    slots = worker_slots(num_envs, cpus, cost.cores, num_workers)
    if cost.cores >= MULTICORE_RATIO and slots == 1 and not workers:
        return Choice(
            "serial",
            {},
            f"the vector env keeps {cost.cores:.1f} cores busy by itself (its own threads), and "
            f"{cpus} CPU(s) hold 1 such env: workers cannot add cores",
        )
    saved = cost.step_s - cost.slice_step_s
    sliced = f"a slice of {slice_size(num_envs, slots)} costs {_us(cost.slice_step_s)}"
    if not workers and saved <= MIN_SAVING_S:
        return Choice(
            "serial",
            {},
            f"{whole}, {sliced}: slicing would save {_us(max(saved, 0.0))} a step, no more "
            f"than twice a worker round trip (~{_us(HYBRID_ROUND_TRIP_S)}), so the vector env "
            "stays in the caller",
        )
    if cost.slice_step_s >= SHM_MIN_SLICE_S or slots == 1:
        return Choice(
            "shm",
            {"num_workers": slots},
            f"{whole}, {sliced}: the round trip (~{_us(SHM_ROUND_TRIP_S)}) is small next to "
            f"it; {slots} worker(s), one vector env each",
        )
    hybrid_workers = num_workers or slots - 1  # the caller steps the last slice
    inline = max(1, num_envs // (hybrid_workers + 1))
    return Choice(
        "hybrid",
        {"num_workers": hybrid_workers, "inline_envs": inline},
        f"{whole}, {sliced}: the caller steps {inline} envs as one vector env beside "
        f"{hybrid_workers} worker(s), so no core waits out a round trip",
    )
