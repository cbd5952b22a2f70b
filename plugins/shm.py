"""Backend ``shm``: worker processes that step slices of envs straight into shared memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from vecaccel import hookimpl
from vecaccel.errors import WorkerError
from vecaccel.pooled import ProcessVecEnv
from vecaccel.spaces import assign_tree, copy_tree
from vecaccel.vector import AsyncState, normalize_seeds, split_reset_mask
from vecaccel.worker import Command, Status

__all__ = ["ShmVecEnv"]


class ShmVecEnv(ProcessVecEnv):
    """Sub-environments stepped in lock-step by worker processes; per-step data in shared memory.

    Args:
        env_fns: one zero-argument env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        copy: return copies of the observations, rewards and flags (``False``: views into
            shared memory, valid until the next ``step``/``reset``).
        drain_timeout: seconds a later call waits for a step that timed out before giving up.
        **pool_options: ``num_workers``, ``context``, ``pin_cpus``, ``spin_us``,
            ``on_worker_failure``, ``max_restarts``, ``step_timeout``
            (see :class:`vecaccel.pooled.ProcessVecEnv`).

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
        drain_timeout: float = 30.0,
        **pool_options: Any,
    ) -> None:
        super().__init__(env_fns, autoreset_mode=autoreset_mode, copy=copy, **pool_options)
        self.drain_timeout = drain_timeout
        self._pending: list = []
        self._results: dict[int, tuple] = {}
        self._failed_envs: set[int] = set()
        self._seqs: dict[int, int] = {}

    # -- helpers ------------------------------------------------------------------------------

    def _observations(self) -> Any:
        views = self.pool.views.obs
        return copy_tree(views) if self.copy else views

    def _collect(self, results: dict[int, tuple]) -> list[tuple[int, Any]]:
        """Read the payloads announced by ``results``; raise the env errors they report."""
        pairs, errors = [], []
        for worker in self.pool.workers:
            status = results.get(worker.index)
            if status is None:
                continue
            if status[0] == Status.OK_DATA:
                payload = self.pool.recv_payload(worker)
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

    def _drain(self, timeout: float) -> None:
        """Finish a step that timed out, discarding its late results (never returning them)."""
        if not self._pending:
            return
        try:
            results = self.pool.wait(self._pending, timeout)
        except TimeoutError:
            envs = sorted(i for w in self._pending for i in w.env_indices)
            raise WorkerError(
                f"envs {envs} are still running a step that timed out; call step_wait() to "
                "keep waiting for it, or close() the vector env",
                env_indices=envs,
            ) from None
        self._results.update(results)
        self._pending = []
        self._state = AsyncState.DEFAULT
        results, self._results = self._results, {}
        self._collect(results)

    def _prepare_control(self) -> None:
        self._drain(self.drain_timeout)

    def _busy(self) -> bool:
        return bool(self._pending)

    # -- the VectorEnv API ----------------------------------------------------------------------

    def reset(self, *, seed=None, options=None):
        """Reset every env (or those in ``options["reset_mask"]``).

        A step that timed out is finished first; an env error it reports is not raised, as on
        the pooled backends: the envs it names start over here (outside a ``reset_mask`` they
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
        seeds = normalize_seeds(seed, self.num_envs)
        reset_mask, options = split_reset_mask(options, self.num_envs)
        self._state = AsyncState.WAITING_RESET
        try:
            pairs = self.pool.reset(seeds, options, reset_mask)
        finally:
            self._state = AsyncState.DEFAULT
        if reset_mask is None:
            self._failed_envs.clear()
        else:
            self._failed_envs.difference_update(np.flatnonzero(reset_mask).tolist())
        return self._observations(), self._batch_infos(pairs)

    def step_async(self, actions: Any) -> None:
        self._check_open()
        self.pool.check_usable()
        if self._state is AsyncState.WAITING_STEP and not self._pending:
            raise RuntimeError("step_async() called twice without step_wait() in between")
        self._drain(self.drain_timeout)
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
        seqs = self._seqs if self.pool.spin_seconds else None
        try:
            results = self.pool.wait(self._pending, timeout, what="step", seqs=seqs)
        except TimeoutError as error:
            self._results.update(error.results)  # type: ignore[attr-defined]
            self._pending = error.pending  # type: ignore[attr-defined]
            raise
        except WorkerError:
            self._pending = []
            raise
        self._results.update(results)
        self._pending = []
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
        infos = self._batch_infos(sorted(pairs, key=lambda p: p[0])) if pairs else {}
        return self._observations(), rewards, terms, truncs, infos


def make_shm(env_fns, **options) -> ShmVecEnv:
    return ShmVecEnv(env_fns, **options)


@hookimpl
def vecaccel_register_backends(registry) -> None:
    registry.add(
        "shm",
        make_shm,
        "worker processes stepping slices of envs; all per-step data in shared memory",
    )
