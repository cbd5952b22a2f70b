"""Per-env stepping on the shared-memory workers: the machinery of ``async`` and ``action_server``.

Where ``shm`` steps every env in lock-step, a :class:`PooledVecEnv` sends actions to any subset
of envs and receives envs as each one finishes: every finished env is one byte on its worker's
``done`` pipe (the env's slot in the worker's slice). Observations, rewards and flags are still
read from the shared buffer; only infos, when non-empty, take the side channel.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from vecaccel.errors import WorkerError
from vecaccel.spaces import assign_tree, index_tree
from vecaccel.vector import AsyncState, VecEnv, normalize_seeds, split_reset_mask
from vecaccel.worker import Command, Status, WorkerPool

__all__ = ["PooledVecEnv"]

_PAYLOAD_FLAG = 128


class PooledVecEnv(VecEnv):
    """Sub-environments in worker processes, stepped and received env by env.

    ``num_envs`` is the number of sub-environments; each ``recv`` returns ``batch_size`` of
    them, and ``observation_space``/``action_space`` are batched over ``batch_size``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        batch_size: int | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        num_workers: int | None = None,
        context: str | None = None,
        pin_cpus: bool | Sequence[int] = False,
        spin_us: float | None = None,
    ) -> None:
        super().__init__(env_fns, autoreset_mode=autoreset_mode, copy=copy)
        if batch_size is None:
            batch_size = self.num_envs
        if not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= self.num_envs:
            raise ValueError(
                f"batch_size must be an integer in 1..num_envs={self.num_envs}, got {batch_size!r}"
            )
        self.batch_size = int(batch_size)
        self.observation_space = batch_space(self.single_observation_space, self.batch_size)
        self.action_space = batch_space(self.single_action_space, self.batch_size)
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
        widest = max(w.stop - w.start for w in self.pool.workers)
        if widest >= _PAYLOAD_FLAG:
            self.close(terminate=True)
            raise ValueError(
                f"{widest} envs on one worker; per-env stepping allows at most "
                f"{_PAYLOAD_FLAG - 1}: raise num_workers"
            )
        self.num_workers = self.pool.num_workers
        self._ready: deque[int] = deque()
        self._in_flight = np.zeros(self.num_envs, dtype=np.bool_)
        self._infos: dict[int, dict] = {}
        self._errors: list[tuple] = []
        self._failed_envs: set[int] = set()
        self._last_ids: np.ndarray | None = None
        self._env_to_worker = np.empty(self.num_envs, dtype=np.int64)
        for worker in self.pool.workers:
            self._env_to_worker[worker.start : worker.stop] = worker.index

    # -- sending and receiving ------------------------------------------------------------------

    def send(self, actions: Any, env_ids: Any) -> None:
        """Start stepping the envs ``env_ids`` with ``actions`` (one action per id)."""
        self._check_open()
        self.pool.check_usable()
        ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            return
        if ids.min() < 0 or ids.max() >= self.num_envs:
            raise ValueError(f"env_ids must lie in 0..{self.num_envs - 1}, got {ids.tolist()}")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"env_ids has duplicates: {ids.tolist()}")
        busy = ids[self._in_flight[ids]]
        if busy.size:
            raise ValueError(f"envs {busy.tolist()} are still stepping; recv() them first")
        failed = sorted(self._failed_envs.intersection(ids.tolist()))
        if failed:
            raise WorkerError(
                f"envs {failed} failed earlier and are in an unknown state; call reset()",
                env_indices=failed,
            )
        checked = self._check_actions(actions, env_ids=ids)
        views = self.pool.views
        assign_tree(views.actions, ids, checked)
        views.step_mask[ids] = 1
        self._in_flight[ids] = True
        for k in np.unique(self._env_to_worker[ids]):
            self.pool.send(self.pool.workers[int(k)], Command.STEP_MASKED)
        self._state = AsyncState.WAITING_STEP

    def _take_bytes(self, timeout: float | None) -> bool:
        """Read finished envs from the workers; ``False`` on timeout."""
        arrived, dead = self.pool.wait_bytes(timeout)
        for worker, data in arrived:
            for byte in data:
                index = worker.start + (byte & (_PAYLOAD_FLAG - 1))
                if byte & _PAYLOAD_FLAG:
                    status, payload = self.pool.recv_payload(worker)
                    if status == Status.ERROR:
                        self._errors.extend(payload)
                        self._failed_envs.add(index)
                        self._in_flight[index] = False
                        continue
                    self._infos[index] = payload
                self._in_flight[index] = False
                self._ready.append(index)
        for worker in dead:
            self._on_worker_death(worker)
        return bool(arrived or dead)

    def _on_worker_death(self, worker) -> None:
        self.pool.declare_dead(worker)

    def _raise_errors(self) -> None:
        if self._errors:
            errors, self._errors = self._errors, []
            raise self.pool.error_from_reports(errors, "step")

    def _wait_until(self, done: Callable[[], bool], timeout: float | None, what: str) -> None:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            self._raise_errors()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                running = np.flatnonzero(self._in_flight).tolist()
                raise TimeoutError(f"{what} did not finish within {timeout} s; envs running: {running}")
            self._take_bytes(remaining)
        self._raise_errors()

    def recv(self, timeout: float | None = None):
        """Return ``(obs, rew, terminated, truncated, info)`` for the first ``batch_size`` envs
        that are ready; ``info["env_id"]`` says which envs they are."""
        self._check_open()
        self.pool.check_usable()
        if len(self._ready) < self.batch_size and not self._in_flight.any():
            raise RuntimeError(
                f"recv() needs {self.batch_size} envs but only {len(self._ready)} are ready and "
                "none is stepping: send() actions first"
            )
        self._wait_until(lambda: len(self._ready) >= self.batch_size, timeout, "recv")
        ids = np.array([self._ready.popleft() for _ in range(self.batch_size)], dtype=np.int64)
        return self._gather(ids)

    def recv_ids(self, env_ids: Any, timeout: float | None = None):
        """Wait for exactly the envs ``env_ids`` and return them in that order."""
        self._check_open()
        self.pool.check_usable()
        ids = np.asarray(env_ids, dtype=np.int64)
        wanted = set(ids.tolist())
        if wanted.difference(self._ready) and not self._in_flight[ids].any():
            raise RuntimeError(f"envs {sorted(wanted.difference(self._ready))} are not stepping")
        self._wait_until(lambda: wanted.issubset(self._ready), timeout, "recv")
        self._ready = deque(i for i in self._ready if i not in wanted)
        return self._gather(ids)

    def _gather(self, ids: np.ndarray):
        views = self.pool.views
        self._last_ids = ids
        self._state = AsyncState.DEFAULT if not self._in_flight.any() else self._state
        obs = index_tree(views.obs, ids)
        infos: dict[str, Any] = {}
        for position, index in enumerate(ids.tolist()):
            info = self._infos.pop(index, None)
            if info:
                infos = self._add_info_batch(infos, info, position)
        infos["env_id"] = ids.copy()
        return (
            obs,
            views.rewards[ids],
            views.terminations[ids],
            views.truncations[ids],
            infos,
        )

    def _add_info_batch(self, infos: dict, info: dict, position: int) -> dict:
        # infos are batched over the returned batch, not over all envs
        saved, self.num_envs = self.num_envs, self.batch_size
        try:
            return self._add_info(infos, info, position)
        finally:
            self.num_envs = saved

    # -- the VectorEnv API ----------------------------------------------------------------------

    def _drain_in_flight(self, timeout: float | None = 30.0) -> None:
        if self._in_flight.any():
            try:
                self._wait_until(lambda: not self._in_flight.any(), timeout, "draining")
            except WorkerError:
                pass  # the envs that failed are reset below
        self._errors = []

    def reset(self, *, seed=None, options=None):
        """Reset every env and return the first ``batch_size`` of them."""
        self._check_open()
        self.pool.check_usable()
        self._drain_in_flight()
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
        results = self.pool.wait(targets, None, what="reset")
        errors = []
        reset_ids = []
        for worker in targets:
            payload = self.pool.recv_payload(worker)
            if results[worker.index][0] == Status.ERROR:
                errors.extend(payload)
                continue
            for index, info in payload:
                self._infos[index] = info
                reset_ids.append(index)
        if errors:
            self._failed_envs.update(r[0] for r in errors)
            raise self.pool.error_from_reports(errors, "reset")
        self._failed_envs.difference_update(reset_ids)
        reset_set = set(reset_ids)
        self._ready = deque([i for i in self._ready if i not in reset_set] + sorted(reset_ids))
        return self._after_reset()

    def _after_reset(self):
        obs, _, _, _, infos = self.recv()
        return obs, infos

    def step_async(self, actions: Any) -> None:
        if self._last_ids is None:
            raise RuntimeError("call reset() before step()")
        self.send(actions, self._last_ids)

    def step_wait(self, timeout: float | None = None):
        return self.recv(timeout)

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open()
        self.pool.check_usable()
        self._drain_in_flight()
        indices = self._normalize_indices(indices)
        groups: dict[int, list[int]] = {}
        for index in indices:
            groups.setdefault(int(self._env_to_worker[index]), []).append(index)
        workers = [self.pool.workers[k] for k in groups]
        for worker in workers:
            local = [i - worker.start for i in groups[worker.index]]
            self.pool.send(worker, Command.CALL, (name, local, args, kwargs), has_payload=True)
        results = self.pool.wait(workers, None, what="call")
        out: dict[int, list[Any]] = {}
        errors = []
        for worker in workers:
            payload = self.pool.recv_payload(worker)
            if results[worker.index][0] == Status.ERROR:
                errors.extend(payload)
                continue
            for index, value in zip(groups[worker.index], payload):
                out.setdefault(index, []).append(value)
        if errors:
            raise self.pool.error_from_reports(errors, "call")
        return tuple(out[index].pop(0) for index in indices)

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        self._check_open()
        self.pool.check_usable()
        self._drain_in_flight()
        indices = self._normalize_indices(indices)
        values = self._values_for(values, len(indices))
        by_worker: dict[int, list[tuple[int, Any]]] = {}
        for index, value in zip(indices, values):
            k = int(self._env_to_worker[index])
            by_worker.setdefault(k, []).append((index - self.pool.workers[k].start, value))
        workers = [self.pool.workers[k] for k in by_worker]
        for worker in workers:
            self.pool.send(worker, Command.SET_ATTR, (name, by_worker[worker.index]), has_payload=True)
        results = self.pool.wait(workers, None, what="set_attr")
        errors = []
        for worker in workers:
            if results[worker.index][0] == Status.ERROR:
                errors.extend(self.pool.recv_payload(worker))
        if errors:
            raise self.pool.error_from_reports(errors, "set_attr")

    def close_extras(self, terminate: bool = False, **kwargs: Any) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            busy = bool(self._in_flight.any()) or pool.broken is not None
            pool.close(terminate=terminate or busy)
