"""A thread-pool vector env built on vecaccel's shared pieces.

It subclasses :class:`vecaccel.VecEnv` (spaces, metadata, action checking, info batching) and
steps every env through :class:`vecaccel.vec_env.EnvRunner`, so its autoreset semantics are the
same as every other backend's. Each thread steps a contiguous slice of the envs and writes
straight into its rows of the observation arrays.

Threads pay off for envs whose step releases the GIL (simulators written in C or C++, envs that
wait on I/O); for pure-Python envs they are a correct but not a faster backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode

from vecaccel import VecEnv
from vecaccel.errors import env_error
from vecaccel.options import BackendOptions
from vecaccel.spaces import (
    copy_tree,
    leaf_specs,
    nbytes_of,
    read_item,
    views_from_buffer,
    write_item,
)
from vecaccel.vec_env import (
    AsyncState,
    EnvRunner,
    ResetReturn,
    Seed,
    StepReturn,
    normalize_seeds,
    split_reset_mask,
)

__all__ = ["ThreadOptions", "ThreadVecEnv", "make_thread_vec_env"]

InfoPairs = list[tuple[int, dict]]


@dataclass(frozen=True, kw_only=True)
class ThreadOptions(BackendOptions):
    """The options of the ``example-threads`` backend; ``copy`` comes from ``BackendOptions``.

    Registered with the backend, so ``make_vec`` checks them: a misspelled option is a
    ``TypeError`` that names the closest one, raised before any env is built.
    """

    num_threads: int | None = None
    """Threads in the pool (default: the CPU count, at most one per env)."""

    def __post_init__(self) -> None:
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {self.num_threads}")


class ThreadVecEnv(VecEnv):
    """Sub-environments stepped in parallel by a pool of threads in the caller's process.

    Args:
        env_fns: one zero-argument function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        copy: return copies of the observations (``False``: views that the next step rewrites).
        num_threads: threads in the pool (default: the CPU count, at most one per env).

    Example:
        >>> import gymnasium as gym
        >>> import numpy as np
        >>> envs = ThreadVecEnv([lambda: gym.make("CartPole-v1")] * 4, num_threads=2)
        >>> _ = envs.reset(seed=1)
        >>> obs, rew, terminated, truncated, infos = envs.step(np.array([0, 1, 0, 1]))
        >>> obs.shape, rew
        ((4, 4), array([1., 1., 1., 1.]))
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        num_threads: int | None = None,
    ) -> None:
        if num_threads is None:
            num_threads = os.cpu_count() or 1
        if num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {num_threads}")
        envs: list[gym.Env] = []
        try:
            for fn in env_fns:
                envs.append(fn())
            super().__init__(env_fns, autoreset_mode=autoreset_mode, copy=copy, probe_env=envs[0])
        except BaseException:
            for env in envs:
                env.close()
            raise
        self.envs = envs
        self.runners = [EnvRunner(env, self.autoreset_mode, i) for i, env in enumerate(envs)]
        self.num_threads = min(num_threads, self.num_envs)
        self._slices = [
            (int(part[0]), int(part[-1]) + 1)
            for part in np.array_split(np.arange(self.num_envs), self.num_threads)
        ]
        self._executor = ThreadPoolExecutor(self.num_threads, thread_name_prefix="example-threads")
        spec = leaf_specs(self.single_observation_space, self.num_envs)
        self._obs_buffer = bytearray(nbytes_of(spec))
        self._obs, _ = views_from_buffer(spec, self._obs_buffer)
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._pending: list[Future[InfoPairs]] = []

    # -- work done by the pool's threads ----------------------------------------------------

    def _reset_slice(
        self,
        start: int,
        stop: int,
        seeds: list[int | None],
        options: dict[str, Any] | None,
        mask: Any,
    ) -> InfoPairs:
        pairs = []
        for i in range(start, stop):
            if mask is not None and not mask[i]:
                continue
            try:
                obs, info = self.runners[i].reset(seed=seeds[i], options=options)
            except Exception as exc:
                raise env_error(exc, i, "reset") from exc
            write_item(self.single_observation_space, self._obs, i, obs)
            self._terminations[i] = self._truncations[i] = False
            pairs.append((i, info))
        return pairs

    def _step_slice(self, start: int, stop: int, actions: Any) -> InfoPairs:
        pairs = []
        for i in range(start, stop):
            try:
                obs, rew, term, trunc, info = self.runners[i].step(read_item(actions, i))
            except Exception as exc:
                raise env_error(exc, i, "step") from exc
            write_item(self.single_observation_space, self._obs, i, obs)
            self._rewards[i], self._terminations[i], self._truncations[i] = rew, term, trunc
            pairs.append((i, info))
        return pairs

    # -- the VectorEnv API --------------------------------------------------------------------

    def _observations(self) -> Any:
        return copy_tree(self._obs) if self.copy else self._obs

    def _collect(self, futures: list[Future[InfoPairs]]) -> InfoPairs:
        """Return the slices' info pairs in env order, raising the first env's error."""
        pairs: InfoPairs = []
        errors = []
        for future in futures:
            exc = future.exception()
            if exc is not None:
                errors.append(exc)
            else:
                pairs.extend(future.result())
        if errors:
            raise errors[0]
        return pairs

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._state is not AsyncState.DEFAULT:
            raise AlreadyPendingCallError(
                f"calling {what} while waiting for a pending call to `{self._state.value}` to "
                "complete",
                self._state.value,
            )

    def reset(self, *, seed: Seed = None, options: dict[str, Any] | None = None) -> ResetReturn:
        """Reset all sub-environments (or those of ``options["reset_mask"]``)."""
        self._check_idle("reset")
        seeds = normalize_seeds(seed, self.num_envs)
        reset_mask, options = split_reset_mask(options, self.num_envs)
        futures = [
            self._executor.submit(self._reset_slice, start, stop, seeds, options, reset_mask)
            for start, stop in self._slices
        ]
        wait(futures)
        pairs = self._collect(futures)
        return self._observations(), self._batch_infos(pairs)

    def step_async(self, actions: Any) -> None:
        """Check ``actions`` and hand each thread its slice of envs to step."""
        self._check_idle("step_async")
        actions = self._check_actions(actions)
        self._pending = [
            self._executor.submit(self._step_slice, start, stop, actions)
            for start, stop in self._slices
        ]
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        """Wait for the pending step.

        Raises:
            TimeoutError: if the step is not done within ``timeout`` seconds; the step stays
                pending, and a later ``step_wait`` returns its result (never a stale one).
            vecaccel.WorkerError: if an env raised.
        """
        self._check_open()
        if self._state is not AsyncState.WAITING_STEP:
            raise NoAsyncCallError("step_wait() called without a pending step_async()", "step")
        done, not_done = wait(self._pending, timeout=timeout, return_when=FIRST_EXCEPTION)
        if not_done and not any(future.exception() is not None for future in done):
            raise TimeoutError(f"step_wait exceeded its timeout of {timeout} s")
        wait(self._pending)  # after an error, let the other slices finish before reporting
        futures, self._pending = self._pending, []
        self._state = AsyncState.DEFAULT
        pairs = self._collect(futures)
        return (
            self._observations(),
            self._rewards.copy(),
            self._terminations.copy(),
            self._truncations.copy(),
            self._batch_infos(pairs),
        )

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) of every sub-environment."""
        self._check_idle("call")
        results = []
        for i, runner in enumerate(self.runners):
            try:
                results.append(runner.call(name, args, kwargs))
            except Exception as exc:
                raise env_error(exc, i, f"call({name!r})") from exc
        return tuple(results)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every sub-environment (one value, or one per env)."""
        self._check_idle("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                f"values must be a list or tuple of length num_envs={self.num_envs}, "
                f"got length {len(values)}"
            )
        for runner, value in zip(self.runners, values):
            runner.set_attr(name, value)

    def close_extras(self, **kwargs: Any) -> None:
        """Let running steps finish (threads cannot be killed), stop the pool, close the envs."""
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self._pending = []
        for env in getattr(self, "envs", []):
            env.close()


def make_thread_vec_env(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: ThreadOptions | None = None,
    **kwargs: Any,
) -> ThreadVecEnv:
    """The backend factory. ``make_vec`` calls it as
    ``factory(env_fns, autoreset_mode=..., options=ThreadOptions(...))``, having checked the
    options; called directly, it takes them as keywords.

    Example:
        >>> import gymnasium as gym
        >>> envs = make_thread_vec_env([lambda: gym.make("CartPole-v1")] * 2, num_threads=1)
        >>> envs.num_threads
        1
        >>> envs.close()
    """
    options = ThreadOptions.resolve("example-threads", options, kwargs)
    return ThreadVecEnv(
        env_fns,
        autoreset_mode=autoreset_mode,
        copy=options.copy,
        num_threads=options.num_threads,
    )
