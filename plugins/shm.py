"""Backend ``shm``: worker processes that step slices of envs straight into shared memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from vecaccel import hookimpl
from vecaccel.errors import WorkerError
from vecaccel.spaces import assign_tree, copy_tree
from vecaccel.vector import AsyncState, VecEnv, normalize_seeds, split_reset_mask
from vecaccel.worker import Command, Status, WorkerPool

__all__ = ["ShmVecEnv"]


class ShmVecEnv(VecEnv):
    """Sub-environments stepped by worker processes, all per-step data in shared memory.

    Args:
        env_fns: one zero-argument env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        copy: return copies of the observations (``False``: views into shared memory, valid
            until the next ``step``/``reset``).
        num_workers: worker processes, each stepping a contiguous slice of the envs (default:
            the usable CPUs, at most one per env).
        context: start method: ``"fork"``, ``"spawn"``, ``"forkserver"``, or ``"multiprocess"``
            (the ``multiprocess`` package's spawn, for closures dill can pickle).
        pin_cpus: ``True`` to pin worker ``k`` to the ``k``-th usable CPU, or a list of CPUs.
        spin_us: microseconds the parent spins on shared flags before blocking; default 0
            when every core has a worker (spinning would steal a worker's core), else 50.
        drain_timeout: seconds a later call waits for a step that timed out before giving up.

    Example:
        >>> import vecaccel, numpy as np
        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="shm", num_workers=2)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        >>> rew.tolist()
        [1.0, 1.0, 1.0, 1.0]
        >>> envs.close()
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        num_workers: int | None = None,
        context: str | None = None,
        pin_cpus: bool | Sequence[int] = False,
        spin_us: float | None = None,
        drain_timeout: float = 30.0,
    ) -> None:
        super().__init__(env_fns, autoreset_mode=autoreset_mode, copy=copy)
        self.drain_timeout = drain_timeout
        self.pool = WorkerPool(
            self.env_fns,
            self.single_observation_space,
            self.single_action_space,
            self.autoreset_mode,
            num_workers=num_workers,
            context=context,
            pin_cpus=pin_cpus,
            spin_us=spin_us,
        )
        self.num_workers = self.pool.num_workers
        self._pending: list = []
        self._results: dict[int, tuple[int, ...]] = {}
        self._failed_envs: set[int] = set()

    # -- helpers ------------------------------------------------------------------------------

    def _observations(self) -> Any:
        views = self.pool.views.obs
        return copy_tree(views) if self.copy else views

    def _collect(self, results: dict[int, tuple[int, ...]], during: str) -> list[tuple[int, Any]]:
        """Read the payloads announced by ``results``; raise the env errors they report."""
        pairs, errors = [], []
        for worker in self.pool.workers:
            status = results.get(worker.index)
            if status is None:
                continue
            if status[0] == Status.OK_DATA:
                pairs.extend(self.pool.recv_payload(worker))
            elif status[0] == Status.ERROR:
                errors.extend(self.pool.recv_payload(worker))
        if errors:
            self._failed_envs.update(report[0] for report in errors)
            raise self.pool.error_from_reports(errors, during)
        return pairs

    def _drain(self, timeout: float) -> None:
        """Finish a step that timed out, discarding its late results (never returning them)."""
        if not self._pending:
            return
        try:
            results = self.pool.wait(self._pending, timeout)
        except TimeoutError:
            envs = sorted(i for w in self._pending for i in w.env_indices)
            raise WorkerError(
                f"envs {envs} are still running a step that timed out {timeout} s ago; "
                "call step_wait() to keep waiting for it, or close() the vector env",
                env_indices=envs,
            ) from None
        self._results.update(results)
        self._pending = []
        self._state = AsyncState.DEFAULT
        results, self._results = self._results, {}
        self._collect(results, "step")

    def _check_failed(self) -> None:
        if self._failed_envs:
            raise WorkerError(
                f"envs {sorted(self._failed_envs)} failed in an earlier call and are in an "
                "unknown state; call reset() to start them over",
                env_indices=sorted(self._failed_envs),
            )

    def _wait_all(self, workers, timeout=None, what="call") -> dict[int, tuple[int, ...]]:
        return self.pool.wait(workers, timeout, what=what)

    # -- the VectorEnv API ----------------------------------------------------------------------

    def reset(self, *, seed=None, options=None):
        self._check_open()
        self.pool.check_usable()
        self._drain(self.drain_timeout)
        seeds = normalize_seeds(seed, self.num_envs)
        reset_mask, options = split_reset_mask(options, self.num_envs)
        targets = []
        for worker in self.pool.workers:
            mask = None if reset_mask is None else reset_mask[worker.start : worker.stop]
            if mask is not None and not mask.any():
                continue
            self.pool.send(
                worker,
                Command.RESET,
                (seeds[worker.start : worker.stop], options, mask),
                has_payload=True,
            )
            targets.append(worker)
        self._state = AsyncState.WAITING_RESET
        results = self._wait_all(targets, what="reset")
        self._state = AsyncState.DEFAULT
        if reset_mask is None:
            self._failed_envs.clear()
        else:
            self._failed_envs.difference_update(np.flatnonzero(reset_mask).tolist())
        pairs = self._collect(results, "reset")
        return self._observations(), self._batch_infos(sorted(pairs, key=lambda p: p[0]))

    def step_async(self, actions: Any) -> None:
        self._check_open()
        self.pool.check_usable()
        if self._state is AsyncState.WAITING_STEP and not self._pending:
            raise RuntimeError("step_async() called twice without step_wait() in between")
        self._drain(self.drain_timeout)
        self._check_failed()
        checked = self._check_actions(actions)
        pool = self.pool
        assign_tree(pool.views.actions, slice(None), checked)
        self._seqs = {w.index: int(pool.views.done_seq[w.index]) for w in pool.workers}
        for worker in pool.workers:
            pool.send(worker, Command.STEP)
        self._pending = list(pool.workers)
        self._results = {}
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None):
        self._check_open()
        if self._state is not AsyncState.WAITING_STEP:
            raise RuntimeError("step_wait() called without a pending step_async()")
        self.pool.check_usable()
        try:
            results = self.pool.wait(self._pending, timeout, what="step", seqs=self._seqs)
        except TimeoutError as error:
            self._results.update(error.results)  # type: ignore[attr-defined]
            self._pending = error.pending  # type: ignore[attr-defined]
            raise
        self._results.update(results)
        self._pending = []
        self._state = AsyncState.DEFAULT
        results, self._results = self._results, {}
        pairs = self._collect(results, "step")
        views = self.pool.views
        if self.copy:
            rewards, terms, truncs = (
                views.rewards.copy(),
                views.terminations.copy(),
                views.truncations.copy(),
            )
        else:
            rewards, terms, truncs = views.rewards, views.terminations, views.truncations
        infos = self._batch_infos(sorted(pairs, key=lambda p: p[0])) if pairs else {}
        return self._observations(), rewards, terms, truncs, infos

    def _by_worker(self, indices: list[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for index in indices:
            worker = self.pool.worker_of(index)
            groups.setdefault(worker.index, []).append(index)
        return groups

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open()
        self.pool.check_usable()
        self._drain(self.drain_timeout)
        indices = self._normalize_indices(indices)
        groups = self._by_worker(indices)
        workers = [self.pool.workers[k] for k in groups]
        for worker in workers:
            local = [i - worker.start for i in groups[worker.index]]
            self.pool.send(worker, Command.CALL, (name, local, args, kwargs), has_payload=True)
        results = self._wait_all(workers)
        values: dict[int, list[Any]] = {}
        errors = []
        for worker in workers:
            payload = self.pool.recv_payload(worker)
            if results[worker.index][0] == Status.ERROR:
                errors.extend(payload)
            else:
                values[worker.index] = list(payload)
        if errors:
            raise self.pool.error_from_reports(errors, "call")
        out = {}
        for k, group in groups.items():
            for index, value in zip(group, values[k]):
                out.setdefault(index, []).append(value)
        return tuple(out[index].pop(0) for index in indices)

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        self._check_open()
        self.pool.check_usable()
        self._drain(self.drain_timeout)
        indices = self._normalize_indices(indices)
        values = self._values_for(values, len(indices))
        pairs_by_worker: dict[int, list[tuple[int, Any]]] = {}
        for index, value in zip(indices, values):
            worker = self.pool.worker_of(index)
            pairs_by_worker.setdefault(worker.index, []).append((index - worker.start, value))
        workers = [self.pool.workers[k] for k in pairs_by_worker]
        for worker in workers:
            self.pool.send(
                worker, Command.SET_ATTR, (name, pairs_by_worker[worker.index]), has_payload=True
            )
        results = self._wait_all(workers)
        errors = []
        for worker in workers:
            if results[worker.index][0] == Status.ERROR:
                errors.extend(self.pool.recv_payload(worker))
        if errors:
            raise self.pool.error_from_reports(errors, "set_attr")

    def close_extras(self, terminate: bool = False, **kwargs: Any) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            busy = bool(self._pending) or pool.broken is not None
            pool.close(terminate=terminate or busy)


def make_shm(env_fns, **options) -> ShmVecEnv:
    return ShmVecEnv(env_fns, **options)


@hookimpl
def vecaccel_register_backends(registry) -> None:
    registry.add(
        "shm",
        make_shm,
        "worker processes stepping slices of envs; all per-step data in shared memory",
    )
