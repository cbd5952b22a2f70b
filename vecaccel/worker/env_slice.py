"""The envs of one worker, stepped, reset and rebuilt in place, writing into shared memory.

:class:`EnvSlice` is what a worker process runs; the ``hybrid`` backend's caller runs one too,
for the envs it steps itself. It never raises for an env's own error: it returns an
:class:`~vecaccel.worker.protocol.ErrorReport` (or, under the restart policy, rebuilds the env).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from vecaccel.spaces import item_reader, item_writer
from vecaccel.spaces.payload import item_columns, store_items, take_items
from vecaccel.vec_env import EnvRunner, check_env_spaces
from vecaccel.worker.concurrency import LaneGate
from vecaccel.worker.info_schema import InfoSchema, InfoSlots
from vecaccel.worker.protocol import ErrorReport, SharedViews, error_report

__all__ = ["ENV_ERRORS", "EnvMakeError", "EnvSlice", "derived_seed", "restarted_info"]

#: What an env's own code may raise and a slice reports, naming the env, instead of dying:
#: ``SystemExit`` too (an env or a library calling ``sys.exit``), which would otherwise end the
#: worker and report only its exit code.
ENV_ERRORS = (Exception, SystemExit)

InfoPairs = list[tuple[int, dict]]


def derived_seed(base: int | None, env_index: int, restart: int) -> int | None:
    """The seed for env ``env_index`` after its ``restart``-th rebuild (``None`` stays random).

    Example:
        >>> derived_seed(7, 3, 1) == derived_seed(7, 3, 1) != derived_seed(7, 3, 2)
        True
    """
    if base is None:
        return None
    return int(np.random.SeedSequence([int(base), env_index, restart]).generate_state(1)[0])


def restarted_info(autoreset_mode: AutoresetMode, obs: Any, reason: str) -> dict:
    """The info of the step that reports a rebuilt env (its episode ends as truncated)."""
    info = {"worker_restarted": True, "restart_reason": reason}
    if autoreset_mode is AutoresetMode.SAME_STEP:
        return {"final_obs": obs, "final_info": dict(info), **info}
    return info


class FailureCounter:
    """Env failures recovered from, counted against ``max_restarts``, in total and per env (an
    env's own count seeds its next rebuild, :func:`derived_seed`). The worker pool and the Ray
    backend count with it alike.

    Example:
        >>> counter = FailureCounter(num_envs=4, max_restarts=1)
        >>> counter.count([1], "env failed") is None, counter.total, counter.per_env.tolist()
        (True, 1, [0, 1, 0, 0])
        >>> counter.count([2, 3], "worker died")
        'envs [2, 3] failed (worker died); 2 failures exceed max_restarts=1'
    """

    def __init__(self, num_envs: int, max_restarts: int) -> None:
        self.max_restarts = int(max_restarts)
        self.total = 0
        self.per_env = np.zeros(num_envs, dtype=np.int64)

    def count(self, env_indices: Sequence[int], reason: str) -> str | None:
        """Count one failure of ``env_indices`` (a whole slice or shard fails once); the
        message to raise once past ``max_restarts``, else ``None``."""
        for i in env_indices:
            self.per_env[i] += 1
        self.total += 1
        if self.total > self.max_restarts:
            return (
                f"envs {list(env_indices)} failed ({reason}); {self.total} failures exceed "
                f"max_restarts={self.max_restarts}"
            )
        return None

    @staticmethod
    def restarts_in(pairs: Sequence[tuple[int, dict]]) -> list[tuple[int, str]]:
        """``(env, reason)`` of the envs a worker rebuilt in place (their infos say
        ``worker_restarted``)."""
        return [
            (i, str(info.get("restart_reason", "env failed")))
            for i, info in pairs
            if info.get("worker_restarted")
        ]

    def seed(self, base: int | None, env_index: int) -> int | None:
        """The seed of env ``env_index``'s next episode after its failures so far."""
        return derived_seed(base, env_index, int(self.per_env[env_index]))


class EnvMakeError(Exception):
    """An env function raised while a slice built its envs.

    Attributes:
        index: the env's index in the vector env.
        error: what the env function raised.
    """

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error

    def report(self) -> ErrorReport:
        """The error report naming the env whose function raised."""
        return error_report(self.index, self.error, "make")


class EnvSlice:
    """The envs ``start .. start + len(env_fns) - 1`` of a vector env.

    Args:
        start: the index of the first env in the vector env.
        env_fns: one env function per env of the slice.
        autoreset_mode: Gymnasium's autoreset mode.
        views: the shared buffer's views (actions are read from them, the rest written).
        obs_space: every env's observation space (checked).
        action_space: every env's action space (checked).
        restart_on_error: rebuild an env that raises in a step instead of reporting it.
        gate: the ``max_concurrency`` semaphore, held around each env's step and reset
            (``None``: no cap).

    Attributes:
        busy_ns: nanoseconds the envs spent in ``step`` and ``reset`` so far (the time in the
            envs of the run's stats; the wait for ``gate`` is not counted).

    Raises:
        EnvMakeError: if an env function raises, or an env's spaces differ (the envs built so
            far are closed).
    """

    def __init__(
        self,
        start: int,
        env_fns: Sequence[Callable[[], gym.Env]],
        autoreset_mode: AutoresetMode,
        views: SharedViews,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        restart_on_error: bool,
        gate: LaneGate | None = None,
    ) -> None:
        self.start = start
        self.gate = gate
        self.busy_ns = 0
        self.env_fns = env_fns
        self.autoreset_mode = autoreset_mode
        self.views = views
        self.obs_space = obs_space
        self.action_space = action_space
        self.restart_on_error = restart_on_error
        self.runners: list[EnvRunner] = []
        self.write_obs = item_writer(obs_space, views.obs)
        self.read_action = item_reader(views.actions, copy=True)
        # the item columns of leaves with no fixed size (none for a space fixed throughout)
        self.obs_columns = item_columns(views.obs)
        self.action_columns = item_columns(views.actions)
        self.last_seeds: list[int | None] = [None] * len(env_fns)
        self.restarts = [0] * len(env_fns)
        self._rewards: list[Any] = [0.0] * len(env_fns)
        self._terms: list[Any] = [False] * len(env_fns)
        self._truncs: list[Any] = [False] * len(env_fns)
        self._flags: list[int] = [0] * len(env_fns)
        # the info schema the parent announced: step infos that fit it go into shared memory
        self.info_slots: InfoSlots | None = None
        for j, fn in enumerate(env_fns):
            try:
                env = fn()
            except BaseException as exc:
                self.close()  # the envs built so far
                raise EnvMakeError(start + j, exc) from exc
            self.runners.append(EnvRunner(env, autoreset_mode, start + j))
            try:
                check_env_spaces(env, start + j, obs_space, action_space)
            except RuntimeError as exc:
                self.close()
                raise EnvMakeError(start + j, exc) from exc

    def set_info_schema(self, schema: InfoSchema) -> None:
        """Write the step infos that fit ``schema`` into the shared info area from now on."""
        self.info_slots = InfoSlots(schema, self.views.info_area, self.views.info_flags)

    def obs_items(self, env_indices: Sequence[int]) -> list:
        """The observation items (leaves with no fixed size) of envs ``env_indices``, for a
        reply; see :func:`vecaccel.spaces.payload.take_items`."""
        return take_items(self.obs_columns, env_indices)

    def take_action_items(self, items: list) -> list[int]:
        """Store the action items a command carried; return the slots ``j`` of their envs."""
        return [i - self.start for i in store_items(self.action_columns, items)]

    def step(self, j: int) -> tuple[dict | None, ErrorReport | None]:
        """Step env ``j`` of the slice; return ``(info, error_report)``.

        The info is ``None`` when it went into the shared info area (it fits the schema).
        """
        i = self.start + j
        views = self.views
        slots = self.info_slots
        try:
            obs, rew, term, trunc, info = self._step_env(self.runners[j], self.read_action(i))
            self.write_obs(i, obs)
        except ENV_ERRORS as exc:
            if slots is not None:
                views.info_flags[i] = 0
            return self._failed(j, exc)
        views.rewards[i] = rew
        views.terminations[i] = term
        views.truncations[i] = trunc
        if slots is not None:
            if info and slots.store(i, info):
                views.info_flags[i] = slots.generation
                return None, None
            views.info_flags[i] = 0
        return info, None

    def step_all(self) -> tuple[InfoPairs, list[ErrorReport]]:
        """Step every env of the slice (the lock-step hot loop); return ``(infos, errors)``.

        ``infos`` holds the infos that did not go into the shared info area. Rewards and flags
        are gathered in lists and written with one slice assignment each, which saves three
        numpy item writes per env.
        """
        start, views = self.start, self.views
        read_action, write_obs = self.read_action, self.write_obs
        rewards, terms, truncs = self._rewards, self._terms, self._truncs
        slots, flags = self.info_slots, self._flags
        generation = 0 if slots is None else slots.generation
        infos: InfoPairs = []
        errors: list[ErrorReport] = []
        for j, runner in enumerate(self.runners):
            i = start + j
            try:
                obs, rewards[j], terms[j], truncs[j], info = self._step_env(runner, read_action(i))
                write_obs(i, obs)
            except ENV_ERRORS as exc:
                info, error = self._failed(j, exc)
                if error is not None:
                    errors.append(error)
                rewards[j] = views.rewards[i]  # as the failure left them (rebuilt or unchanged)
                terms[j], truncs[j] = views.terminations[i], views.truncations[i]
                flags[j] = 0
                if info:
                    infos.append((i, info))
                continue
            if not info:
                flags[j] = 0
            elif slots is not None and slots.store(i, info):
                flags[j] = generation
            else:
                flags[j] = 0
                infos.append((i, info))
        stop = start + len(self.runners)
        views.rewards[start:stop] = rewards
        views.terminations[start:stop] = terms
        views.truncations[start:stop] = truncs
        if slots is not None:
            views.info_flags[start:stop] = flags
        return infos, errors

    def _step_env(self, runner: EnvRunner, action: Any) -> tuple[Any, Any, Any, Any, Any]:
        """One env's step, timed, inside the ``max_concurrency`` gate if there is one."""
        gate = self.gate
        if gate is not None:
            gate.__enter__()
        began = time.perf_counter_ns()
        try:
            return runner.step(action)
        finally:
            self.busy_ns += time.perf_counter_ns() - began
            if gate is not None:
                gate.__exit__()

    def _failed(self, j: int, exc: BaseException) -> tuple[dict | None, ErrorReport | None]:
        if not self.restart_on_error:
            return None, error_report(self.start + j, exc, "step")
        return self.rebuild(j, f"{type(exc).__name__}: {exc}")

    def rebuild(self, j: int, reason: str) -> tuple[dict | None, ErrorReport | None]:
        """Replace env ``j`` by a fresh one from its env function, reseeded from a derived seed."""
        i = self.start + j
        try:
            try:
                self.runners[j].env.close()
            except Exception:  # noqa: BLE001 - the broken env is being replaced anyway
                pass
            self.restarts[j] += 1
            runner = EnvRunner(self.env_fns[j](), self.autoreset_mode, i)
            self.runners[j] = runner
            check_env_spaces(runner.env, i, self.obs_space, self.action_space)
            obs, _ = runner.reset(seed=derived_seed(self.last_seeds[j], i, self.restarts[j]))
            self.write_obs(i, obs)
        except ENV_ERRORS as exc:
            return None, error_report(i, exc, "restart")
        # the interrupted episode ends as truncated; NEXT_STEP/DISABLED reset on the next step
        runner.needs_reset = self.autoreset_mode is not AutoresetMode.SAME_STEP
        self.views.rewards[i] = 0.0
        self.views.terminations[i] = False
        self.views.truncations[i] = True
        return restarted_info(self.autoreset_mode, obs, reason), None

    def reset(
        self, j: int, seed: int | None, options: dict | None, needs_reset: bool = False
    ) -> dict:
        """Reset env ``j`` of the slice (remembering its seed for rebuilds); return its info."""
        i = self.start + j
        self.last_seeds[j] = seed if seed is not None else self.last_seeds[j]
        gate = self.gate
        if gate is not None:
            gate.__enter__()
        began = time.perf_counter_ns()
        try:
            obs, info = self.runners[j].reset(seed=seed, options=options)
        finally:
            self.busy_ns += time.perf_counter_ns() - began
            if gate is not None:
                gate.__exit__()
        self.write_obs(i, obs)
        self.views.terminations[i] = self.views.truncations[i] = False
        self.views.rewards[i] = 0.0
        self.runners[j].needs_reset = needs_reset
        return info

    def reset_all(
        self,
        seeds: Sequence[int | None],
        options: dict | None,
        mask: np.ndarray | None,
        needs_reset: bool = False,
    ) -> tuple[InfoPairs, list[ErrorReport]]:
        """Reset the slice's envs (those in ``mask``, local); ``(infos, error reports)``."""
        infos: InfoPairs = []
        errors: list[ErrorReport] = []
        for j in range(len(self.runners)):
            if mask is not None and not mask[j]:
                continue
            try:
                infos.append((self.start + j, self.reset(j, seeds[j], options, needs_reset)))
            except ENV_ERRORS as exc:
                errors.append(error_report(self.start + j, exc, "reset"))
        return infos, errors

    def call_all(
        self,
        name: str | Callable[..., Any],
        local_indices: Sequence[int],
        args: tuple,
        kwargs: dict,
    ) -> tuple[list[Any], list[ErrorReport]]:
        """Call ``name`` on the envs at ``local_indices``; ``(results, error reports)``."""
        results: list[Any] = []
        errors: list[ErrorReport] = []
        for j in local_indices:
            try:
                results.append(self.runners[j].call(name, args, kwargs))
            except ENV_ERRORS as exc:
                errors.append(error_report(self.start + j, exc, f"call({name!r})"))
        return results, errors

    def set_attrs(self, name: str, pairs: Sequence[tuple[int, Any]]) -> list[ErrorReport]:
        """Set ``name`` to each ``(local index, value)`` of ``pairs``; the error reports."""
        errors: list[ErrorReport] = []
        for j, value in pairs:
            try:
                self.runners[j].set_attr(name, value)
            except ENV_ERRORS as exc:
                errors.append(error_report(self.start + j, exc, f"set_attr({name!r})"))
        return errors

    def close(self) -> None:
        """Close every env of the slice (errors in an env's ``close`` are ignored)."""
        for runner in self.runners:
            try:
                runner.env.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self.runners = []
