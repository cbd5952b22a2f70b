"""The ceiling of a throughput benchmark: one process per usable CPU, each stepping its own raw
env, no vecaccel in between, their rates summed.

No vector env can step a CPU-bound env faster on the machine than that, so each backend's rate
is reported as a share of it. The processes build and reset their envs first, wait for each
other at a barrier, then step for the warm-up and the timed seconds together, so that the timed
windows overlap; each limits native thread pools (OpenCV in ``AtariPreprocessing``) to one
thread, as vecaccel's workers do, so that one process keeps one core busy.

For a batched simulator (a vector env function ``fn(n) -> VectorEnv``, see
:mod:`vecaccel.envs.vectorized_slices`) the ceiling is :func:`measure_vector_ceiling`: one process
per core, each stepping its own native vector env, the envs of all of them summing to the vector
env's size, their rates summed.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from vecaccel.bench.timing import ACTION_BATCHES, sample_actions, time_raw, time_vector
from vecaccel.bench.workloads import BenchEnv
from vecaccel.worker import usable_cpus
from vecaccel.worker.cpus import limit_threads_after_envs, limit_threads_before_envs
from vecaccel.worker.process import parent_garbage_kept

__all__ = ["measure_ceiling", "measure_vector_ceiling"]

#: Seconds the processes have to build their envs and reach the barrier.
START_TIMEOUT_S = 120.0


def _step_raw_env(
    target: BenchEnv, seconds: float, warmup: float, seed: int, barrier: Any, conn: Any
) -> None:
    """One ceiling process: build, reset, wait for the others, time, report (steps, seconds)."""
    try:
        limit_threads_before_envs(1)
        env = target.env_fn()
        limit_threads_after_envs(1)
        try:
            env.reset(seed=seed)
            actions = sample_actions(env.action_space, ACTION_BATCHES, seed)
            barrier.wait(START_TIMEOUT_S)
            conn.send(("ok", time_raw(env, actions, seconds, warmup)))
        finally:
            env.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        barrier.abort()
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def _step_vector_env(
    vector_fn: Callable[[int], Any],
    num_envs: int,
    seconds: float,
    warmup: float,
    seed: int,
    barrier: Any,
    conn: Any,
) -> None:
    """One vector ceiling process: build and reset its vector env, wait, time, report
    (env steps, seconds)."""
    try:
        limit_threads_before_envs(1)
        envs = vector_fn(num_envs)
        limit_threads_after_envs(1)
        try:
            envs.reset(seed=seed)
            space = batch_space(envs.single_action_space, num_envs)
            actions = sample_actions(space, ACTION_BATCHES, seed)
            barrier.wait(START_TIMEOUT_S)
            batches, elapsed = time_vector(envs, actions, seconds, warmup)
            conn.send(("ok", (batches * num_envs, elapsed)))
        finally:
            envs.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        barrier.abort()
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def measure_vector_ceiling(
    vector_fn: Callable[[int], Any],
    num_envs: int,
    seconds: float,
    warmup: float,
    seed: int,
    processes: int | None = None,
    context: str | None = None,
) -> tuple[float, int]:
    """Summed steps/s of ``processes`` processes each stepping its own native vector env, built
    by ``vector_fn(n)``, the ``n`` summing to ``num_envs`` (split as vecaccel splits slices).

    Args:
        vector_fn: a picklable vector env function ``fn(n) -> gymnasium.vector.VectorEnv``.
        num_envs: the envs of all the processes together.
        seconds: timed seconds.
        warmup: untimed seconds each process steps first.
        seed: process ``k`` resets with ``seed + k`` and samples its actions from it.
        processes: how many (default: the usable CPUs, at most ``num_envs``).
        context: the multiprocessing start method (default: the interpreter's).

    Returns:
        ``(steps per second summed over the processes, processes)``.

    Raises:
        RuntimeError: if a process fails (its error is in the message) or does not report.

    Example:
        >>> from vecaccel.envs.vectorized_slices import VectorEnvFn
        >>> from gymnasium.vector import AutoresetMode
        >>> build = VectorEnvFn("CartPole-v1", AutoresetMode.NEXT_STEP)
        >>> rate, processes = measure_vector_ceiling(build, 8, 0.01, 0.0, 0, 2)
        >>> rate > 0, processes
        (True, 2)
    """
    processes = min(processes or usable_cpus(), num_envs)
    bounds = np.linspace(0, num_envs, processes + 1).round().astype(int)
    sizes = [int(bounds[k + 1] - bounds[k]) for k in range(processes)]
    return _run_ceiling(
        processes,
        context,
        warmup + seconds,
        lambda k, barrier, sender: (
            _step_vector_env,
            (vector_fn, sizes[k], seconds, warmup, seed + k, barrier, sender),
        ),
    )


def measure_ceiling(
    target: BenchEnv,
    seconds: float,
    warmup: float,
    seed: int,
    processes: int | None = None,
    context: str | None = None,
) -> tuple[float, int]:
    """Summed steps/s of ``processes`` processes each stepping one raw env of ``target``.

    Args:
        target: the env to step.
        seconds: timed seconds.
        warmup: untimed seconds each process steps first.
        seed: process ``k`` resets with ``seed + k`` and samples its actions from it.
        processes: how many (default: the usable CPUs).
        context: the multiprocessing start method (default: the interpreter's).

    Returns:
        ``(steps per second summed over the processes, processes)``.

    Raises:
        RuntimeError: if a process fails (its error is in the message) or does not report.

    Example:
        >>> from vecaccel.bench.workloads import resolve_env
        >>> rate, processes = measure_ceiling(resolve_env("CartPole-v1"), 0.01, 0.0, 0, 2)
        >>> rate > 0, processes
        (True, 2)
    """
    processes = processes or usable_cpus()
    return _run_ceiling(
        processes,
        context,
        warmup + seconds,
        lambda k, barrier, sender: (
            _step_raw_env,
            (target, seconds, warmup, seed + k, barrier, sender),
        ),
    )


def _run_ceiling(
    processes: int,
    context: str | None,
    run_s: float,
    job: Callable[[int, Any, Any], tuple[Callable[..., None], tuple]],
) -> tuple[float, int]:
    """Start ``processes`` processes running ``job(k, barrier, sender)``'s function and
    arguments; sum the rates they report."""
    ctx = multiprocessing.get_context(context)
    barrier = ctx.Barrier(processes)
    pipes, procs = [], []
    try:
        for k in range(processes):
            receiver, sender = ctx.Pipe(duplex=False)
            target, args = job(k, barrier, sender)
            proc = ctx.Process(
                target=target,
                args=args,
                name=f"vecaccel-bench-ceiling-{k}",
                daemon=True,
            )
            # a forked child must not finalise what the parent dropped (an earlier trial's EnvPool)
            with parent_garbage_kept(ctx.get_start_method() == "fork"):
                proc.start()
            sender.close()
            pipes.append(receiver)
            procs.append(proc)
        total, errors = 0.0, []
        for k, receiver in enumerate(pipes):
            if not receiver.poll(START_TIMEOUT_S + run_s + 30):
                raise RuntimeError(f"ceiling process {k} did not report")
            try:
                status, value = receiver.recv()
            except EOFError:  # it died before it could say why
                procs[k].join(5)
                status, value = "error", f"exited with code {procs[k].exitcode}"
            if status == "ok":
                steps, elapsed = value
                total += steps / elapsed
            else:
                errors.append(f"process {k}: {value}")
        if errors:
            raise RuntimeError("ceiling measurement failed: " + "; ".join(errors))
        return total, processes
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for receiver in pipes:
            receiver.close()
