"""``ProcessVecEnv``: what the backends on a :class:`~vecaccel.worker.WorkerPool` share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from vecaccel.envs.source import EnvSource
from vecaccel.options import WorkerOptions
from vecaccel.vec_env import VecEnv
from vecaccel.worker.pool import WorkerPool

__all__ = ["ProcessVecEnv"]


class ProcessVecEnv(VecEnv):
    """A vector env on worker processes: the pool, control calls, failure counts and shutdown.

    Subclasses implement ``reset``, ``step_async`` and ``step_wait`` on :attr:`pool`, and
    override :meth:`_prepare_control` (bring the envs to a quiet state before a control
    command) and :meth:`_busy` (whether a command is in flight, so ``close`` must not wait for
    polite replies).

    Args:
        env_fns: one zero-argument env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        options: the worker options (:class:`vecaccel.options.WorkerOptions` or a subclass;
            ``copy`` is read from them too).
        inline_envs: how many envs (the first ones) the caller steps itself.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        options: WorkerOptions | None = None,
        inline_envs: int = 0,
    ) -> None:
        options = WorkerOptions() if options is None else options
        if options.max_concurrency is not None and EnvSource.of(env_fns).vectorized:
            raise ValueError(
                "max_concurrency caps envs stepping one at a time; a vectorized slice steps its "
                "envs together: leave vectorized=False to cap them"
            )
        super().__init__(env_fns, autoreset_mode=autoreset_mode, copy=options.copy)
        self.options = options
        self._check_spaces()
        self.pool = WorkerPool(
            self.env_fns,
            self.single_observation_space,
            self.single_action_space,
            self.autoreset_mode,
            options,
            inline_envs=inline_envs,
        )
        self.num_workers = self.pool.num_workers

    @property
    def failures(self) -> int:
        """How many env or worker failures were recovered from (``on_worker_failure="restart"``)."""
        return self.pool.failures if getattr(self, "pool", None) is not None else 0

    @property
    def failures_per_env(self) -> np.ndarray:
        """Failures recovered from, per env."""
        return self.pool.failures_per_env

    def _check_spaces(self) -> None:
        """Refuse spaces this backend cannot serve (raise), before any worker starts.

        Every space is served by default; a backend that needs tensors refuses leaves with no
        fixed size here (:func:`vecaccel.spaces.payload.require_fixed_layout`).
        """

    def _prepare_control(self) -> None:
        """Bring the envs to a quiet state before a control command (reset, call, set_attr)."""

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open()
        self.pool.check_usable()
        self._prepare_control()
        return tuple(self.pool.call(name, self._normalize_indices(indices), args, kwargs))

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        self._check_open()
        self.pool.check_usable()
        self._prepare_control()
        indices = self._normalize_indices(indices)
        self.pool.set_attr(name, indices, self._values_for(values, len(indices)))

    def _busy(self) -> bool:
        return False

    def _env_busy_s(self) -> np.ndarray | None:
        pool = getattr(self, "pool", None)
        if pool is None or pool.views is None:
            return None
        return pool.env_busy_s()

    def close_extras(self, terminate: bool = False, **kwargs: Any) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close(terminate=terminate or self._busy() or pool.broken is not None)
