"""What a vector env function's step costs, measured by stepping it in the calling process.

``make_vec(fn, n, vectorized=True, backend="auto")`` hands every worker one batched vector env
over its slice of the envs (:mod:`vecaccel.envs.vectorized_slices`). A cheap batched simulator such
as Gymnasium's ``CartPoleVectorEnv`` steps thousands of envs in the time of one worker round trip,
and EnvPool's own threads already use every core: workers would make both slower.
:func:`probe_vector_step_cost` steps the inner vector env in the calling process at the sizes
that matter (all the envs, and one slice of them); the one rule of
:func:`vecaccel.backend_choice.choose_backend` turns that into a backend.

Example:
    >>> slice_size(4096, worker_slots(4096, 2, 1.0))
    2048
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gymnasium.vector.utils import batch_space

from vecaccel.backend_choice.env_step_cost import PROBE_S

__all__ = [
    "MULTICORE_RATIO",
    "VectorStepCost",
    "probe_vector_step_cost",
    "slice_size",
    "worker_slots",
]

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
