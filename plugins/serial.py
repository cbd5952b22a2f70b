"""Backend ``serial``: every env in the caller's process; the reference the others are tested against."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array

from vecaccel import BackendRegistry, hookimpl
from vecaccel.envs.source import EnvSource
from vecaccel.envs.vectorized_slices import (
    SubEnvError,
    VectorProbeEnv,
    call_vector_env,
    inner_seed,
    set_vector_env_attr,
    takes_seed_list,
)
from vecaccel.errors import WorkerError, env_error
from vecaccel.options import SerialOptions
from vecaccel.spaces import (
    copy_tree,
    has_fixed_layout,
    item_reader,
    item_writer,
    leaf_specs,
    nbytes_of,
    views_from_buffer,
)
from vecaccel.vec_env import (
    AsyncState,
    EnvRunner,
    ResetReturn,
    Seed,
    StepReturn,
    VecEnv,
    check_env_spaces,
    make_env,
    normalize_seeds,
    snapshot,
    split_reset_mask,
)

__all__ = ["SerialVecEnv", "VectorizedSerialVecEnv"]


class SerialVecEnv(VecEnv):
    """All sub-environments stepped one after another in this process.

    Errors inside an env are raised as :class:`vecaccel.WorkerError`, like every other backend.

    Args:
        env_fns: one zero-argument env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        options: see :class:`vecaccel.options.SerialOptions`.

    Example:
        >>> import gymnasium as gym
        >>> envs = SerialVecEnv([lambda: gym.make("CartPole-v1")] * 2)
        >>> _ = envs.reset(seed=1)
        >>> obs, rew, term, trunc, info = envs.step(np.array([0, 1]))
        >>> rew
        array([1., 1.])
        >>> envs.close()
    """

    supports_per_env_infos = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        options: SerialOptions | None = None,
    ) -> None:
        options = SerialOptions() if options is None else options
        envs = [make_env(fn, i) for i, fn in enumerate(env_fns)]
        try:
            super().__init__(
                env_fns, autoreset_mode=autoreset_mode, copy=options.copy, probe_env=envs[0]
            )
            for i, env in enumerate(envs[1:], start=1):
                check_env_spaces(env, i, self.single_observation_space, self.single_action_space)
        except BaseException:
            for env in envs:
                env.close()
            raise
        self.envs = envs
        self.runners = [EnvRunner(env, self.autoreset_mode, i) for i, env in enumerate(envs)]
        self._obs_items: list | None = None
        if has_fixed_layout(self.single_observation_space):
            spec = leaf_specs(self.single_observation_space, self.num_envs)
            self._obs_buffer = bytearray(nbytes_of(spec))
            self._obs, _ = views_from_buffer(spec, self._obs_buffer)
            self._write_obs = item_writer(self.single_observation_space, self._obs)
        else:  # Text, Sequence, Graph...: kept per env and batched by Gymnasium, as Sync does
            self._obs_items = [None] * self.num_envs
            self._write_obs = self._obs_items.__setitem__
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._actions: Any = None
        # a step that finished after step_wait's timeout: the next step_wait returns it, the
        # next step_async or reset discards it (as on the process backends)
        self._late: tuple | None = None
        self._env_s = np.zeros(1)  # seconds in the envs' steps, for stats()

    def _env_busy_s(self) -> np.ndarray | None:
        return self._env_s.copy()

    def _observations(self) -> Any:
        if self._obs_items is not None:
            space = self.single_observation_space
            return concatenate(space, self._obs_items, create_empty_array(space, self.num_envs))
        return copy_tree(self._obs) if self.copy else self._obs

    def reset(self, *, seed: Seed = None, options: dict[str, Any] | None = None) -> ResetReturn:
        self._check_open()
        seeds = normalize_seeds(seed, self.num_envs)
        reset_mask, options = split_reset_mask(options, self.num_envs)
        # batching copies the infos; per_env_infos hands them over as they are, so copy them
        # here: the envs may change their info dicts and arrays in place later
        keep = snapshot if self.per_env_infos else _as_is
        pairs = []
        for i, runner in enumerate(self.runners):
            if reset_mask is not None and not reset_mask[i]:
                continue
            try:
                obs, info = runner.reset(seed=seeds[i], options=options)
                self._write_obs(i, obs)
            except Exception as exc:
                raise env_error(exc, i, "reset") from exc
            self._terminations[i] = self._truncations[i] = False
            pairs.append((i, keep(info)))
        self._state = AsyncState.DEFAULT
        self._late = None
        return self._observations(), self._batch_infos(pairs)

    def step_async(self, actions: Any) -> None:
        self._check_open()
        if self._state is AsyncState.WAITING_STEP and self._late is None:
            raise RuntimeError("step_async() called twice without step_wait() in between")
        self._actions = self._check_actions(actions)
        self._late = None
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        self._check_open()
        if self._state is not AsyncState.WAITING_STEP:
            raise RuntimeError("step_wait() called without a pending step_async()")
        if self._late is not None:
            late, self._late = self._late, None
            self._state = AsyncState.DEFAULT
            return late
        deadline = None if timeout is None else time.monotonic() + timeout
        self._state = AsyncState.DEFAULT
        read_action, write_obs = item_reader(self._actions), self._write_obs
        rewards, terminations, truncations = self._rewards, self._terminations, self._truncations
        keep = snapshot if self.per_env_infos else _as_is  # as in reset()
        pairs = []
        began = time.perf_counter()
        for i, runner in enumerate(self.runners):
            try:
                obs, rew, term, trunc, info = runner.step(read_action(i))
                write_obs(i, obs)
            except Exception as exc:
                raise env_error(exc, i, "step") from exc
            rewards[i], terminations[i], truncations[i] = rew, term, trunc
            if info:
                pairs.append((i, keep(info)))
        self._env_s[0] += time.perf_counter() - began
        result = (
            self._observations(),
            self._rewards.copy(),
            self._terminations.copy(),
            self._truncations.copy(),
            self._batch_infos(pairs),
        )
        if deadline is not None and time.monotonic() > deadline:
            self._late, self._state = result, AsyncState.WAITING_STEP
            raise TimeoutError(
                f"step_wait exceeded its timeout of {timeout} s (the step ran to its end: "
                "call step_wait() again for its result)"
            )
        return result

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open()
        results = []
        for i in self._normalize_indices(indices):
            try:
                results.append(self.runners[i].call(name, args, kwargs))
            except Exception as exc:
                raise env_error(exc, i, f"call({name!r})") from exc
        return tuple(results)

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        self._check_open()
        indices = self._normalize_indices(indices)
        for i, value in zip(indices, self._values_for(values, len(indices))):
            self.runners[i].set_attr(name, value)

    def close_extras(self, **kwargs: Any) -> None:
        for env in getattr(self, "envs", []):
            env.close()


def _as_is(info: dict) -> dict:
    return info


class VectorizedSerialVecEnv(VecEnv):
    """``serial`` over a vector env function (``make_vec(..., vectorized=True)``): the inner
    vector env of all ``num_envs`` envs, stepped in this process, thinly wrapped.

    Actions are checked, rewards come as ``float64`` and flags as ``bool`` (as on every
    backend), infos pass through as the inner env batched them, and an error inside it is a
    :class:`vecaccel.WorkerError` naming the env range. Reset seeds the inner env so that
    env ``i`` gets seed ``i`` of ``reset``'s seeds
    (:func:`vecaccel.envs.vectorized_slices.inner_seed`).

    Args:
        env_fns: ``num_envs`` :class:`vecaccel.envs.vectorized_slices.SliceEnvFn` of one vector env function.
        autoreset_mode: the autoreset mode (the inner vector env's own, checked).
        options: see :class:`vecaccel.options.SerialOptions`.

    Example:
        >>> import vecaccel, numpy as np
        >>> envs = vecaccel.make_vec("CartPole-v1", 3, backend="serial", vectorized=True)
        >>> type(envs).__name__
        'VectorizedSerialVecEnv'
        >>> _ = envs.reset(seed=0)
        >>> envs.step(np.zeros(3, dtype=np.int64))[1]
        array([1., 1., 1.])
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        options: SerialOptions | None = None,
    ) -> None:
        options = SerialOptions() if options is None else options
        vector_fn = EnvSource.of(env_fns).vector_env_fn()
        try:
            self.envs = vector_fn(len(env_fns))
        except Exception as exc:
            raise env_error(
                exc, 0, f"make of the vector env of envs 0..{len(env_fns) - 1}"
            ) from exc
        try:
            probe = VectorProbeEnv(self.envs)
            super().__init__(
                env_fns, autoreset_mode=autoreset_mode, copy=options.copy, probe_env=probe
            )
        except BaseException:
            self.envs.close()
            raise
        self.metadata = {**dict(self.envs.metadata), "autoreset_mode": self.autoreset_mode}
        self._where = f"the vector env of envs 0..{self.num_envs - 1}"
        self._env_s = np.zeros(1)  # seconds in the vector env's steps, for stats()

    def _env_busy_s(self) -> np.ndarray | None:
        return self._env_s.copy()
        self._actions: Any = None

    def _error(self, exc: Exception, what: str) -> WorkerError:
        error = env_error(exc, 0, f"{what} of {self._where}")
        error.env_indices = tuple(range(self.num_envs))
        return error

    def reset(self, *, seed: Seed = None, options: dict[str, Any] | None = None) -> ResetReturn:
        self._check_open()
        seeds = normalize_seeds(seed, self.num_envs)
        reset_mask, options = split_reset_mask(options, self.num_envs)
        if reset_mask is not None and not reset_mask.all():
            options = {**(options or {}), "reset_mask": reset_mask}
        try:
            rows = range(self.num_envs) if reset_mask is None else np.flatnonzero(reset_mask)
            seed = inner_seed(seeds, list(rows), takes_seed_list(self.envs))
            obs, infos = self.envs.reset(seed=seed, options=options)
        except Exception as exc:
            raise self._error(exc, "reset") from exc
        self._state = AsyncState.DEFAULT
        return (copy_tree(obs) if self.copy else obs), infos

    def step_async(self, actions: Any) -> None:
        self._check_open()
        if self._state is AsyncState.WAITING_STEP:
            raise RuntimeError("step_async() called twice without step_wait() in between")
        self._actions = self._check_actions(actions)
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        self._check_open()
        if self._state is not AsyncState.WAITING_STEP:
            raise RuntimeError("step_wait() called without a pending step_async()")
        self._state = AsyncState.DEFAULT
        began = time.perf_counter()
        try:
            obs, rewards, terms, truncs, infos = self.envs.step(self._actions)
        except Exception as exc:
            raise self._error(exc, "step") from exc
        finally:
            self._env_s[0] += time.perf_counter() - began
        return (
            copy_tree(obs) if self.copy else obs,
            np.asarray(rewards, dtype=np.float64),
            np.asarray(terms, dtype=np.bool_),
            np.asarray(truncs, dtype=np.bool_),
            infos,
        )

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open()
        indices = self._normalize_indices(indices)
        try:
            return tuple(call_vector_env(self.envs, name, indices, args, kwargs))
        except SubEnvError as exc:
            raise env_error(exc.error, exc.index, f"call({name!r})") from exc.error
        except Exception as exc:
            raise self._error(exc, f"call({name!r})") from exc

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        self._check_open()
        indices = self._normalize_indices(indices)
        values = self._values_for(values, len(indices))
        set_vector_env_attr(self.envs, name, list(zip(indices, values)), self._where)

    def close_extras(self, **kwargs: Any) -> None:
        envs = getattr(self, "envs", None)
        if envs is not None:
            envs.close()


def make_serial(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: SerialOptions | None = None,
    **kwargs: Any,
) -> SerialVecEnv | VectorizedSerialVecEnv:
    """The ``serial`` backend's factory: ``make_vec`` passes checked ``options``; a direct call
    may pass the options as keywords instead."""
    options = SerialOptions.resolve("serial", options, kwargs)
    if EnvSource.of(env_fns).vectorized:
        return VectorizedSerialVecEnv(env_fns, autoreset_mode=autoreset_mode, options=options)
    return SerialVecEnv(env_fns, autoreset_mode=autoreset_mode, options=options)


@hookimpl
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        "serial",
        make_serial,
        "all envs in the caller's process (the reference)",
        options=SerialOptions,
    )
