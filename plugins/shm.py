"""Backends ``shm`` and ``hybrid``: worker processes step slices of envs straight into shared
memory; under ``hybrid`` the calling process steps a share of the envs itself meanwhile."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from vecaccel import BackendRegistry, hookimpl
from vecaccel.envs.vectorized_slices import SliceInfos, merge_slice_infos, unbatch_infos
from vecaccel.errors import WorkerError
from vecaccel.options import HybridOptions, ShmOptions
from vecaccel.spaces import assign_tree, copy_tree
from vecaccel.spaces.payload import batch_view
from vecaccel.vec_env import (
    AsyncState,
    ResetReturn,
    Seed,
    StepReturn,
    normalize_seeds,
    snapshot,
    split_reset_mask,
)
from vecaccel.worker import (
    Command,
    EnvMakeError,
    EnvSlice,
    ProcessVecEnv,
    Status,
    VectorSlice,
    make_env_slice,
    usable_cpus,
)

__all__ = ["HYBRID_SPIN_US", "HYBRID_WORKER_SPIN_US", "ShmVecEnv", "make_hybrid", "make_shm"]


class ShmVecEnv(ProcessVecEnv):
    """Sub-environments stepped in lock-step by worker processes; per-step data in shared memory.

    Args:
        env_fns: one zero-argument env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        options: see :class:`vecaccel.options.ShmOptions`. With ``copy=False`` the
            observations, rewards and flags are views into shared memory, valid until the next
            ``step``/``reset``. With ``inline_envs`` this process steps the first envs itself
            while the workers step the rest, instead of only waiting for them (the ``hybrid``
            backend); inline envs share this process's fate: a crash in one is a crash here.

    Example:
        >>> import vecaccel, numpy as np
        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="shm", num_workers=2)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        >>> rew.tolist()
        [1.0, 1.0, 1.0, 1.0]
        >>> envs.close()
    """

    supports_per_env_infos = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        options: ShmOptions | None = None,
    ) -> None:
        options = ShmOptions() if options is None else options
        super().__init__(
            env_fns,
            autoreset_mode=autoreset_mode,
            options=options,
            inline_envs=options.inline_envs or 0,
        )
        self.drain_timeout_s = options.drain_timeout_s
        self._pending: list = []
        self._results: dict[int, tuple] = {}
        self._timed_out = False  # the step in flight outlived a step_wait(timeout)
        # what step_wait will return (or raise) for a step a control call had to finish first
        self._finished: tuple | BaseException | None = None
        self._failed_envs: set[int] = set()
        self._seqs: dict[int, int] = {}
        self.inline_envs = self.pool.inline_envs
        # leaves with no fixed size: their items travel pickled with replies and commands
        self._obs_items = bool(self.pool.obs_columns)
        self._action_items = bool(self.pool.action_columns)
        self._inline: EnvSlice | VectorSlice | None = None
        self._inline_pending = False  # a step sent whose inline envs have not stepped yet
        self._inline_result: tuple[list, list] | None = None  # stepped, not yet collected
        self._slice_infos: list[SliceInfos] = []  # vectorized slices' batched step infos
        if self.inline_envs:
            try:
                self._inline = make_env_slice(
                    0,
                    self.env_fns[: self.inline_envs],
                    self.autoreset_mode,
                    self.pool.views,
                    self.single_observation_space,
                    self.single_action_space,
                    self.pool.restart,
                    gate=self.pool.inline_gate(),
                )
            except EnvMakeError as failed:
                self.close(terminate=True)
                raise self.pool.error_from_reports([failed.report()]) from failed.error
            self.pool.add_local_slice(self._inline)

    # -- helpers ------------------------------------------------------------------------------

    def _observations(self) -> Any:
        views = self.pool.views.obs
        if self.copy:
            return copy_tree(views)
        return batch_view(views) if self._obs_items else views

    def _step_inline(self) -> None:
        """Step the inline envs of the step in flight (while the workers step theirs)."""
        if self._inline_pending:
            self._inline_pending = False
            self._inline_result = self._inline.step_all()

    def _collect(self, results: dict[int, tuple]) -> list[tuple[int, Any]]:
        """Read the payloads announced by ``results`` (and the inline envs' results); raise the
        env errors they report."""
        pairs, errors = [], []
        self._slice_infos = []
        if self._inline_result is not None:
            inline_pairs, errors = self._inline_result
            self._inline_result = None
            inline_pairs = self._take_slice_infos(inline_pairs)
            if self.per_env_infos:  # the inline envs' own dicts (the workers' come unpickled)
                inline_pairs = [(i, snapshot(info)) for i, info in inline_pairs]
            pairs.extend(inline_pairs)
            self.pool.note_restarts(inline_pairs)
        for worker in self.pool.workers:
            status = results.get(worker.index)
            if status is None:
                continue
            if status[0] == Status.OK_DATA:
                payload = self._take_slice_infos(self.pool.recv_payload(worker))
                self.pool.note_restarts(payload)
                pairs.extend(payload)
            elif status[0] == Status.ERROR:
                errors.extend(self.pool.recv_payload(worker))
            elif status[0] == Status.RESTARTED:
                pairs.extend(status[1].items())
        if errors:
            self._failed_envs.update(report[0] for report in errors)
            raise self.pool.error_from_reports(errors)
        return pairs

    def _take_slice_infos(self, payload: list) -> list:
        """Keep the vectorized slices' batched infos of ``payload`` aside (counting their
        rebuilds, one failure per slice); return the ``(env index, info)`` pairs."""
        if not payload or not isinstance(payload[0], SliceInfos):
            return payload
        for infos in payload:
            if infos.restart_reason is not None:
                envs = range(infos.start, infos.start + infos.count)
                self.pool.count_failures(list(envs), infos.restart_reason)
            self._slice_infos.append(infos)
        return []

    def _merge_slice_infos(self, infos: dict) -> dict:
        """Add the vectorized slices' batched infos of the last step to ``infos``."""
        slices, self._slice_infos = self._slice_infos, []
        if not slices:
            return infos
        if self.per_env_infos:
            for part in slices:
                rows = unbatch_infos(part.infos, part.count)
                self.last_infos.extend((part.start + j, row) for j, row in enumerate(rows) if row)
            self.last_infos.sort(key=lambda pair: pair[0])
            return infos
        for part in slices:
            where = f"envs {part.start}..{part.start + part.count - 1}"
            merge_slice_infos(infos, part.infos, part.start, part.count, self.num_envs, where)
        return infos

    def _still_running(self, what: str) -> WorkerError:
        envs = sorted(i for w in self._pending for i in w.env_indices)
        return WorkerError(f"envs {envs} are still running {what}", env_indices=envs)

    def _drain(self, timeout: float) -> None:
        """Finish a step that timed out, discarding its late results (never returning them)."""
        self._finished = None
        if not self._pending:
            self._timed_out = False
            return
        self._step_inline()  # every env takes the abandoned step, as the workers' envs do
        try:
            results = self.pool.wait(self._pending, timeout)
        except TimeoutError:
            raise self._still_running(
                "a step that timed out; call step_wait() to keep waiting for it, or close() "
                "the vector env"
            ) from None
        self._results.update(results)
        self._pending = []
        self._timed_out = False
        self._state = AsyncState.DEFAULT
        results, self._results = self._results, {}
        self._collect(results)

    def _prepare_control(self) -> None:
        if self._state is not AsyncState.WAITING_STEP or self._timed_out:
            self._drain(self.drain_timeout_s)
        elif self._finished is None:
            # a step sent by step_async() that step_wait() has not been asked for yet: the
            # workers must finish it before they take another command; its result (or error)
            # is kept for step_wait(), as Gymnasium's other backends keep it
            try:
                self._finished = self._finish_step(self.drain_timeout_s)
            except TimeoutError:
                raise self._still_running(
                    "the step sent by step_async(); call step_wait() for it first"
                ) from None
            except WorkerError as error:
                self._finished = error
            except KeyboardInterrupt:
                self._timed_out = True  # as in step_wait(): the next step_async() drops it
                raise
            self._state = AsyncState.WAITING_STEP  # until step_wait() takes the result

    def _busy(self) -> bool:
        return bool(self._pending)

    # -- the VectorEnv API ----------------------------------------------------------------------

    def reset(self, *, seed: Seed = None, options: dict[str, Any] | None = None) -> ResetReturn:
        """Reset every env (or those in ``options["reset_mask"]``).

        A step that timed out is finished first; an env error it reports is not raised, as on
        ``async`` and ``action_server``: the envs it names start over here (outside a ``reset_mask`` they
        stay failed until a reset includes them).
        """
        self._check_open()
        self.pool.check_usable()
        try:
            self._prepare_control()
        except WorkerError:
            if self._pending:
                raise  # the step is still running: a reset now would take its reply
            self.pool.check_usable()  # a dead worker (past max_restarts) is still raised
        self._finished = None  # a step in flight when reset() was called is discarded
        seeds = normalize_seeds(seed, self.num_envs)
        reset_mask, options = split_reset_mask(options, self.num_envs)
        self._state = AsyncState.WAITING_RESET
        try:
            pairs = self.pool.reset(seeds, options, reset_mask)
            if self._inline is not None:
                pairs = self._reset_inline(seeds, options, reset_mask) + pairs
        finally:
            self._state = AsyncState.DEFAULT
        if reset_mask is None:
            self._failed_envs.clear()
        else:
            self._failed_envs.difference_update(np.flatnonzero(reset_mask).tolist())
        return self._observations(), self._batch_infos(pairs)

    def _reset_inline(self, seeds, options, reset_mask) -> list[tuple[int, Any]]:
        k = self.inline_envs
        mask = None if reset_mask is None else reset_mask[:k]
        for j in range(k):
            if (mask is None or mask[j]) and seeds[j] is not None:
                self.pool.last_seeds[j] = seeds[j]
        pairs, errors = self._inline.reset_all(seeds[:k], options, mask)
        if errors:
            raise self.pool.error_from_reports(errors)
        if self.per_env_infos:  # as in _collect
            pairs = [(i, snapshot(info)) for i, info in pairs]
        return pairs

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        if self._inline is None:
            return super().call_indices(name, indices, *args, **kwargs)
        self._check_open()
        self.pool.check_usable()
        self._prepare_control()
        indices = self._normalize_indices(indices)
        k = self.inline_envs
        remote = [i for i in indices if i >= k]
        remote_results = iter(self.pool.call(name, remote, args, kwargs) if remote else ())
        local_results, errors = self._inline.call_all(
            name, [i for i in indices if i < k], args, kwargs
        )
        if errors:
            raise self.pool.error_from_reports(errors)
        local_results = iter(local_results)
        return tuple(next(local_results if i < k else remote_results) for i in indices)

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        if self._inline is None:
            return super().set_attr_indices(name, values, indices)
        self._check_open()
        self.pool.check_usable()
        self._prepare_control()
        indices = self._normalize_indices(indices)
        pairs = list(zip(indices, self._values_for(values, len(indices))))
        k = self.inline_envs
        remote = [(i, v) for i, v in pairs if i >= k]
        if remote:
            self.pool.set_attr(name, [i for i, _ in remote], [v for _, v in remote])
        errors = self._inline.set_attrs(name, [(i, v) for i, v in pairs if i < k])
        if errors:
            raise self.pool.error_from_reports(errors)

    def close_extras(self, terminate: bool = False, **kwargs: Any) -> None:
        try:
            super().close_extras(terminate=terminate, **kwargs)
        finally:
            if getattr(self, "_inline", None) is not None:
                self._inline.close()

    def step_async(self, actions: Any) -> None:
        self._check_open()
        self.pool.check_usable()
        if self._state is AsyncState.WAITING_STEP and not self._timed_out:
            raise RuntimeError("step_async() called twice without step_wait() in between")
        self._drain(self.drain_timeout_s)  # a step that timed out is finished and discarded
        if self._failed_envs:
            raise WorkerError(
                f"envs {sorted(self._failed_envs)} failed in an earlier call and are in an "
                "unknown state; call reset() to start them over",
                env_indices=sorted(self._failed_envs),
            )
        checked = self._check_actions(actions)
        pool = self.pool
        assign_tree(pool.views.actions, slice(None), checked)
        if pool.spin_seconds:
            self._seqs = {w.index: int(pool.views.done_seq[w.index]) for w in pool.workers}
        if self._action_items:
            pool.send_action_items(pool.workers, Command.STEP)
        else:
            pool.send_all(pool.workers, Command.STEP, spread=True)
        self._pending = list(pool.workers)
        self._inline_pending = self._inline is not None
        self._results = {}
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        self._check_open()
        if self._state is not AsyncState.WAITING_STEP:
            raise RuntimeError("step_wait() called without a pending step_async()")
        finished, self._finished = self._finished, None
        if finished is None:
            try:
                return self._finish_step(timeout)
            except (TimeoutError, KeyboardInterrupt):
                # step_wait() keeps waiting for the step; step_async() finishes and discards it
                self._timed_out = True
                raise
        self._state = AsyncState.DEFAULT
        if isinstance(finished, BaseException):
            raise finished
        return finished

    def _finish_step(self, timeout: float | None):
        """Wait for the step in flight and return it as ``step_wait`` does."""
        self.pool.check_usable()
        self._step_inline()  # the inline envs step while the workers step theirs
        seqs = self._seqs if self.pool.spin_seconds else None
        try:
            results = self.pool.wait(self._pending, timeout, what="step", seqs=seqs)
        except (TimeoutError, KeyboardInterrupt) as error:
            self._results.update(getattr(error, "results", {}))
            self._pending = getattr(error, "pending", self._pending)
            raise
        except WorkerError:
            self._pending = []
            self._state = AsyncState.DEFAULT
            raise
        self._results.update(results)
        self._pending = []
        self._timed_out = False
        self._state = AsyncState.DEFAULT
        results, self._results = self._results, {}
        pairs = self._collect(results)
        views = self.pool.views
        if self.copy:
            rewards = views.rewards.copy()
            terms = views.terminations.copy()
            truncs = views.truncations.copy()
        else:
            rewards, terms, truncs = views.rewards, views.terminations, views.truncations
        infos = self._merge_slice_infos(self._step_infos(pairs))
        return self._observations(), rewards, terms, truncs, infos

    def _step_infos(self, pairs: list[tuple[int, Any]]) -> dict[str, Any]:
        """The batched infos of a lock-step step: ``pairs`` (the infos that came as dicts)
        and those in the shared info area, as ``_batch_infos`` batches them all."""
        tracker = self.pool.info_schema
        if tracker.current is None:
            if len(pairs) > 1:
                pairs.sort(key=lambda p: p[0])
            self.pool.observe_infos(pairs, 0)
            return self._batch_infos(pairs)
        in_slots = tracker.conforming()
        count = int(np.count_nonzero(in_slots))
        if not count:
            infos = self._batch_infos(sorted(pairs, key=lambda p: p[0]))
        elif pairs or self.per_env_infos:
            infos = self._batch_infos(tracker.merge(pairs, np.flatnonzero(in_slots)))
        else:  # every info of the step in the slots: batch them as arrays at once
            self.last_infos = []
            infos = tracker.current.batch(in_slots)
        self.pool.observe_infos(pairs, count)
        return infos


def make_shm(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: ShmOptions | None = None,
    **kwargs: Any,
) -> ShmVecEnv:
    """The ``shm`` backend's factory: ``make_vec`` passes checked ``options``; a direct call
    may pass the options as keywords instead."""
    options = ShmOptions.resolve("shm", options, kwargs)
    return ShmVecEnv(env_fns, autoreset_mode=autoreset_mode, options=options)


def make_hybrid(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: HybridOptions | None = None,
    **kwargs: Any,
) -> ShmVecEnv:
    """``shm`` whose calling process steps an equal share of the envs itself.

    For envs that step in microseconds, waiting for a worker's reply costs more than the step:
    here the caller steps ``inline_envs`` envs while ``num_workers`` workers (default: the
    usable CPUs less the caller's) step the rest, then spins ``spin_us`` microseconds for their
    replies before blocking. Between steps each worker keeps looking for the next one for
    ``worker_spin_us`` microseconds before it sleeps (default: ``HYBRID_WORKER_SPIN_US`` when
    the workers and the caller have a core each, else 0), so a step that follows soon (after a
    small policy's forward pass) starts without a wake-up. Built on :class:`ShmVecEnv`; see
    :attr:`vecaccel.options.ShmOptions.inline_envs` for what inline envs give up.

    Args:
        env_fns: one zero-argument env function per sub-environment (at least 2).
        autoreset_mode: Gymnasium's autoreset mode.
        options: see :class:`vecaccel.options.HybridOptions` (``None`` fields get the defaults
            above); a direct call may pass them as keywords instead.

    Example:
        >>> import vecaccel, numpy as np
        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="hybrid", num_workers=1)
        >>> envs.inline_envs, envs.num_workers
        (2, 1)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape
        (4, 4)
        >>> envs.close()
    """
    num_envs = len(env_fns)
    if num_envs < 2:
        raise ValueError(
            f"hybrid needs at least 2 envs (one inline, one in a worker), got {num_envs}"
        )
    options = HybridOptions.resolve("hybrid", options, kwargs)
    num_workers = options.num_workers
    if num_workers is None:
        num_workers = max(1, min(num_envs - 1, usable_cpus() - 1))
    inline_envs = options.inline_envs
    if inline_envs is None:
        inline_envs = max(1, min(num_envs - 1, num_envs // (int(num_workers) + 1)))
    spin_us = HYBRID_SPIN_US if options.spin_us is None else options.spin_us
    worker_spin_us = options.worker_spin_us
    if worker_spin_us is None:  # spin only where every worker has a core of its own
        worker_spin_us = HYBRID_WORKER_SPIN_US if num_workers < usable_cpus() else 0.0
    resolved = dataclasses.replace(
        options,
        inline_envs=inline_envs,
        num_workers=num_workers,
        spin_us=spin_us,
        worker_spin_us=worker_spin_us,
    )
    return ShmVecEnv(env_fns, autoreset_mode=autoreset_mode, options=resolved)


#: The caller finishes its inline envs about when the workers finish theirs, so a short spin
#: usually catches their replies without a wake-up.
HYBRID_SPIN_US = 200.0
#: The workers look for the next step this long before sleeping: long enough to span a small
#: policy's forward pass between two steps (SB3's MLP on CartPole: ~0.4 ms), so the step starts
#: without a wake-up. hybrid gives each worker its own core, which would otherwise idle then.
HYBRID_WORKER_SPIN_US = 1000.0


@hookimpl
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        "shm",
        make_shm,
        "worker processes stepping slices of envs; all per-step data in shared memory",
        options=ShmOptions,
    )
    registry.add(
        "hybrid",
        make_hybrid,
        "shm, with the calling process stepping a share of the envs meanwhile (cheap envs)",
        options=HybridOptions,
    )
