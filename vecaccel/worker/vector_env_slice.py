"""A worker's slice as one batched vector env, stepped at once and written into shared memory.

:class:`VectorSlice` has :class:`~vecaccel.worker.EnvSlice`'s interface, so the worker loop
and ``hybrid``'s caller run either; :func:`make_env_slice` picks the one the env functions
ask for (:mod:`vecaccel.envs.vectorized_slices`). A step reads the slice's actions from shared
memory, steps the inner vector env once, and writes its batch of observations, rewards and flags
into the slice's slots with one assignment each. Infos stay batched: one
:class:`~vecaccel.envs.vectorized_slices.SliceInfos` per step that has any.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from vecaccel.envs.source import EnvSource
from vecaccel.envs.vectorized_slices import (
    SliceInfos,
    SubEnvError,
    call_vector_env,
    inner_seed,
    set_vector_env_attr,
    takes_seed_list,
    unbatch_infos,
)
from vecaccel.spaces import assign_tree, copy_tree, has_fixed_layout, index_tree
from vecaccel.worker.concurrency import LaneGate
from vecaccel.worker.env_slice import ENV_ERRORS, EnvMakeError, EnvSlice, derived_seed
from vecaccel.worker.info_schema import InfoSchema
from vecaccel.worker.protocol import ErrorReport, SharedViews, error_report

__all__ = ["VectorSlice", "make_env_slice"]


def make_env_slice(
    start: int,
    env_fns: Sequence[Callable[[], Any]],
    autoreset_mode: AutoresetMode,
    views: SharedViews,
    obs_space: spaces.Space,
    action_space: spaces.Space,
    restart_on_error: bool,
    owner: str = "the caller",
    gate: LaneGate | None = None,
) -> EnvSlice | VectorSlice:
    """The slice for ``env_fns``: a :class:`VectorSlice` for the sub-envs of a vector env
    function, else an :class:`~vecaccel.worker.EnvSlice`; ``owner`` names who steps it in
    error messages (``"worker 3"``); ``gate`` is the ``max_concurrency`` semaphore, which
    only a per-env slice takes (a batched vector env steps its envs together)."""
    if EnvSource.of(env_fns).vectorized:
        return VectorSlice(
            start, env_fns, autoreset_mode, views, obs_space, action_space, restart_on_error, owner
        )
    return EnvSlice(
        start, env_fns, autoreset_mode, views, obs_space, action_space, restart_on_error, gate
    )


class VectorSlice:
    """The envs ``start .. start + len(env_fns) - 1`` as one vector env built by their vector
    env function (:class:`vecaccel.envs.vectorized_slices.VectorEnvFn`).

    Seeds: a reset seeds the inner vector env with the slice's first seed (``seed + start``
    for ``reset(seed=seed)``), so a ``SyncVectorEnv`` inside seeds its sub-envs exactly as
    the per-env backends would. A rebuilt vector env (``on_worker_failure="restart"``) is
    seeded from :func:`~vecaccel.worker.derived_seed` and its slice's episodes end as
    truncated.

    Args:
        start: the index of the slice's first env in the whole vector env.
        env_fns: the slice's env functions (:class:`vecaccel.envs.vectorized_slices.SliceEnvFn`).
        autoreset_mode: the autoreset mode (the inner vector env's own, checked).
        views: the shared buffer's views.
        obs_space: every env's observation space (checked against the inner env's).
        action_space: every env's action space (checked).
        restart_on_error: rebuild the vector env when a step raises, instead of reporting it.
        owner: who steps the slice, for error messages.

    Raises:
        EnvMakeError: if the vector env function raises or its spaces differ (naming the
            slice's first env).
    """

    def __init__(
        self,
        start: int,
        env_fns: Sequence[Callable[[], Any]],
        autoreset_mode: AutoresetMode,
        views: SharedViews,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        restart_on_error: bool,
        owner: str = "the caller",
    ) -> None:
        self.start = start
        self.count = len(env_fns)
        self.stop = start + self.count
        self.autoreset_mode = autoreset_mode
        self.views = views
        self.obs_space = obs_space
        self.action_space = action_space
        self.restart_on_error = restart_on_error
        self.where = f"the vector env of envs {start}..{self.stop - 1} on {owner}"
        self.obs_columns: list = []  # vectorized slices need spaces of fixed layout
        self.action_columns: list = []
        self.last_seed: int | None = None
        self.restarts = 0
        self.busy_ns = 0  # nanoseconds in the inner vector env's step and reset
        # after a rebuild (NEXT_STEP, DISABLED): the next step only reports the fresh episode
        self.skip_next_step = False
        self._slots = slice(start, self.stop)
        try:
            self.vector_fn = EnvSource.of(env_fns).vector_env_fn(start)
            if not (has_fixed_layout(obs_space) and has_fixed_layout(action_space)):
                raise TypeError(
                    "a vectorized slice needs observation and action spaces of fixed size "
                    f"(got {obs_space} and {action_space})"
                )
        except TypeError as exc:
            raise EnvMakeError(start, exc) from exc
        self.envs = self._build()

    def _build(self) -> gym.vector.VectorEnv:
        try:
            envs = self.vector_fn(self.count)
        except BaseException as exc:
            raise EnvMakeError(self.start, exc) from exc
        for kind, expected, found in (
            ("observation", self.obs_space, envs.single_observation_space),
            ("action", self.action_space, envs.single_action_space),
        ):
            if found != expected:
                envs.close()
                error = RuntimeError(
                    f"{self.where} has single {kind} space {found}, but env 0 has {expected}"
                )
                raise EnvMakeError(self.start, error)
        return envs

    @property
    def runners(self) -> list:
        """One entry per env (for code that counts a slice's envs)."""
        return [self.envs] * self.count

    def set_info_schema(self, schema: InfoSchema) -> None:
        """Infos of a vectorized slice stay batched (:class:`SliceInfos`); the per-env info
        area is not used."""

    def obs_items(self, env_indices: Sequence[int]) -> list:
        """No observation items: a vectorized slice's spaces have a fixed layout."""
        return []

    def take_action_items(self, items: list) -> list[int]:
        """No action items: a vectorized slice's spaces have a fixed layout."""
        return list(range(self.count))

    def _report(self, exc: BaseException, what: str) -> ErrorReport:
        return error_report(self.start, exc, f"{what} of {self.where}")

    def step_all(self) -> tuple[list[SliceInfos], list[ErrorReport]]:
        """Step the inner vector env once with the slice's actions; ``([slice infos], errors)``
        (no infos: an empty list)."""
        views, slots = self.views, self._slots
        if self.skip_next_step:
            self.skip_next_step = False
            views.rewards[slots] = 0.0
            views.terminations[slots] = False
            views.truncations[slots] = False
            return [], []
        try:
            actions = copy_tree(index_tree(views.actions, slots))
            began = time.perf_counter_ns()
            try:
                obs, rewards, terms, truncs, infos = self.envs.step(actions)
            finally:
                self.busy_ns += time.perf_counter_ns() - began
            assign_tree(views.obs, slots, obs)
            views.rewards[slots] = rewards
            views.terminations[slots] = terms
            views.truncations[slots] = truncs
        except ENV_ERRORS as exc:
            if not self.restart_on_error:
                return [], [self._report(exc, "step")]
            return self.rebuild(f"{type(exc).__name__}: {exc}")
        if infos:
            return [SliceInfos(self.start, self.count, infos)], []
        return [], []

    def step(self, j: int) -> tuple[dict | None, ErrorReport | None]:
        """A vectorized slice steps as a whole (:meth:`step_all`); one env alone cannot."""
        error = TypeError(
            f"{self.where} steps all its envs at once: a backend must send whole slices"
        )
        return None, error_report(self.start + j, error, "step")

    def rebuild(self, reason: str) -> tuple[list[SliceInfos], list[ErrorReport]]:
        """Replace the vector env by a fresh one, reseeded from a derived seed; every env of
        the slice ends its episode as truncated, with ``info["worker_restarted"]``."""
        try:
            try:
                self.envs.close()
            except Exception:  # noqa: BLE001 - the broken vector env is being replaced anyway
                pass
            self.restarts += 1
            self.envs = self._build()
            seed = derived_seed(self.last_seed, self.start, self.restarts)
            obs, _ = self.envs.reset(seed=seed)
            assign_tree(self.views.obs, self._slots, obs)
        except EnvMakeError as failed:
            return [], [self._report(failed.error, "restart")]
        except ENV_ERRORS as exc:
            return [], [self._report(exc, "restart")]
        self.skip_next_step = self.autoreset_mode is not AutoresetMode.SAME_STEP
        self.views.rewards[self._slots] = 0.0
        self.views.terminations[self._slots] = False
        self.views.truncations[self._slots] = True
        return [SliceInfos(self.start, self.count, self._restarted(obs, reason), reason)], []

    def _restarted(self, obs: Any, reason: str) -> dict:
        every = np.ones(self.count, dtype=np.bool_)
        reasons = np.full(self.count, reason, dtype=object)
        infos: dict[str, Any] = {
            "worker_restarted": every.copy(),
            "_worker_restarted": every.copy(),
            "restart_reason": reasons,
            "_restart_reason": every.copy(),
        }
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            final_obs = np.empty(self.count, dtype=object)
            rows = [index_tree(obs, j) for j in range(self.count)]
            for j, row in enumerate(rows):
                final_obs[j] = copy_tree(row) if not np.isscalar(row) else row
            infos["final_obs"], infos["_final_obs"] = final_obs, every.copy()
            infos["final_info"] = {
                "worker_restarted": every.copy(),
                "_worker_restarted": every.copy(),
                "restart_reason": reasons.copy(),
                "_restart_reason": every.copy(),
            }
            infos["_final_info"] = every.copy()
        return infos

    def reset(
        self, j: int, seed: int | None, options: dict | None, needs_reset: bool = False
    ) -> dict:
        """Reset the whole slice (one env of a vector env cannot reset alone); env ``j``'s
        info."""
        mask = np.ones(self.count, dtype=np.bool_)
        seeds = [seed] * self.count
        infos, errors = self.reset_all(seeds, options, mask, needs_reset)
        if errors:
            raise RuntimeError(errors[0].message)
        return infos[j][1]

    def reset_all(
        self,
        seeds: Sequence[int | None],
        options: dict | None,
        mask: np.ndarray | None,
        needs_reset: bool = False,
    ) -> tuple[list[tuple[int, dict]], list[ErrorReport]]:
        """Reset the inner vector env (the envs in ``mask``, local, through Gymnasium's
        ``options["reset_mask"]``); ``((env index, info) pairs, error reports)``."""
        if mask is not None and not np.any(mask):
            return [], []
        partial = mask is not None and not np.all(mask)
        rows = np.flatnonzero(mask).tolist() if partial else range(self.count)
        seed = inner_seed(seeds, rows, takes_seed_list(self.envs))
        if isinstance(seed, int):
            self.last_seed = seed
        elif seed is not None:
            self.last_seed = next(s for s in seed if s is not None)
        if partial:
            options = {**(options or {}), "reset_mask": np.asarray(mask, dtype=np.bool_)}
        try:
            began = time.perf_counter_ns()
            try:
                obs, infos = self.envs.reset(seed=seed, options=options)
            finally:
                self.busy_ns += time.perf_counter_ns() - began
            if partial:
                index = np.flatnonzero(mask) + self.start
                assign_tree(self.views.obs, index, index_tree(obs, np.flatnonzero(mask)))
            else:
                assign_tree(self.views.obs, self._slots, obs)
        except ENV_ERRORS as exc:
            return [], [self._report(exc, "reset")]
        self.views.terminations[self.start + np.asarray(rows, dtype=np.int64)] = False
        self.views.truncations[self.start + np.asarray(rows, dtype=np.int64)] = False
        self.views.rewards[self.start + np.asarray(rows, dtype=np.int64)] = 0.0
        self.skip_next_step = needs_reset
        per_env = unbatch_infos(infos, self.count) if infos else [{} for _ in range(self.count)]
        return [(self.start + j, per_env[j]) for j in rows], []

    def call_all(
        self,
        name: str | Callable[..., Any],
        local_indices: Sequence[int],
        args: tuple,
        kwargs: dict,
    ) -> tuple[list[Any], list[ErrorReport]]:
        """Call ``name`` on the sub-envs ``local_indices`` of the slice
        (:func:`vecaccel.envs.vectorized_slices.call_vector_env`)."""
        if not local_indices:
            return [], []
        try:
            return call_vector_env(self.envs, name, local_indices, args, kwargs), []
        except SubEnvError as exc:
            report = error_report(self.start + exc.index, exc.error, f"call({name!r})")
            return [], [report]
        except ENV_ERRORS as exc:
            return [], [self._report(exc, f"call({name!r})")]

    def set_attrs(self, name: str, pairs: Sequence[tuple[int, Any]]) -> list[ErrorReport]:
        """Set ``name`` on the sub-envs ``pairs`` names
        (:func:`vecaccel.envs.vectorized_slices.set_vector_env_attr`)."""
        try:
            set_vector_env_attr(self.envs, name, pairs, self.where)
        except ENV_ERRORS as exc:
            return [self._report(exc, f"set_attr({name!r})")]
        return []

    def close(self) -> None:
        """Close the inner vector env (errors in its ``close`` are ignored)."""
        envs, self.envs = getattr(self, "envs", None), None
        if envs is not None:
            try:
                envs.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
