"""Backend ``async``: return whichever ``batch_size`` envs are ready, as EnvPool and PufferLib do.

Where ``shm`` steps every env in lock-step, :class:`AsyncVecEnv` sends actions to any subset of
envs and receives envs as each one finishes: every finished env is one byte on its worker's
``done`` pipe (the env's slot in the worker's slice, see :data:`vecaccel.worker.ENV_PAYLOAD_FLAG`).
Observations, rewards and flags are still read from the shared buffer, and so are infos that
fit the info schema (:mod:`vecaccel.worker.info_schema`); other non-empty infos take the side
channel. The ``action_server`` backend is built on this class.

Over vectorized slices (``make_vec(..., vectorized=True)``, :mod:`vecaccel.envs.vectorized_slices`)
a worker steps its whole vector env at once: actions go to whole slices, each slice's worker answers
with one status byte as under ``shm``, and a batch is made of whole slices (every slice the same
size, ``batch_size`` a multiple of it).

A batch is formed between a floor and a ceiling with a deadline (``min_batch_size``,
``max_batch_size``, ``batch_wait_s``; TorchRL's ``AsyncEnvPool`` takes ``min_get``, ``max_get`` and
a ``timeout`` alike): ``recv`` returns once the floor is ready and ``batch_wait_s`` has passed
since the oldest ready env finished, or at once when the ceiling is ready. A worker stamps each
env's finish time into shared memory, so the deadline counts from when the env finished, not
from when the caller next looked.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from vecaccel import BackendRegistry, hookimpl
from vecaccel.envs.source import EnvSource
from vecaccel.envs.vectorized_slices import SliceInfos, unbatch_infos
from vecaccel.errors import WorkerError
from vecaccel.options import AsyncOptions, BatchFormerOptions, WorkerOptions
from vecaccel.spaces import assign_tree, index_tree
from vecaccel.vec_env import (
    AsyncState,
    ResetReturn,
    Seed,
    StepReturn,
    add_info,
    check_reset_mask_held,
    normalize_seeds,
    split_reset_mask,
)
from vecaccel.worker import (
    ENV_PAYLOAD_FLAG,
    Command,
    ErrorReport,
    ProcessVecEnv,
    Status,
    WorkerHandle,
    usable_cpus,
)

__all__ = ["AsyncVecEnv", "make_async"]


class AsyncVecEnv(ProcessVecEnv):
    """Asynchronous stepping: ``batch_size < num_envs`` so a slow env never stalls the batch.

    ``send(actions, env_ids)`` starts envs; ``recv()`` returns the envs that are ready with
    ``info["env_id"]``: ``batch_size`` of them, or, with a floor and a ceiling, between
    ``min_batch_size`` and ``max_batch_size`` once ``batch_wait_s`` has passed since the oldest
    ready env finished (the ceiling returns at once). ``step(actions)`` sends ``actions`` to the
    envs the last ``recv`` returned and receives the next batch. It runs on the same worker
    processes and shared memory as ``shm``. ``num_envs`` is the number of sub-environments;
    ``observation_space``/``action_space`` are batched over the batch last returned (the
    ceiling, ``batch_size``, before the first).

    Args:
        env_fns: one zero-argument env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        options: see :class:`vecaccel.options.AsyncOptions`; subclasses pass their own
            :class:`vecaccel.options.WorkerOptions` and ``batch_size``.
        batch_size: envs per ``recv``, for subclasses whose options have no ``batch_size``.

    Example:
        >>> import vecaccel, numpy as np
        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="async", batch_size=2, num_workers=2)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, len(infos["env_id"])
        ((2, 4), 2)
        >>> obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
        >>> envs.close()

        A floor of 2, a ceiling of 4 and a 5 ms deadline:

        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="async", num_workers=2,
        ...                          min_batch_size=2, max_batch_size=4, batch_wait_s=0.005)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs, rew, term, trunc, infos = envs.step(np.zeros(len(obs), dtype=np.int64))
        >>> 2 <= len(infos["env_id"]) <= 4
        True
        >>> envs.close()
    """

    #: ``step`` returns envs in the order they finish (``info["env_id"]``), not by index
    returns_envs_in_order = False
    batch_size: int
    min_batch_size: int

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        options: WorkerOptions | None = None,
        batch_size: int | None = None,
    ) -> None:
        options = AsyncOptions() if options is None else options
        num_envs = len(env_fns)
        if batch_size is not None:
            low = high = batch_size
        elif isinstance(options, BatchFormerOptions):
            options.check_num_envs(num_envs)
            low, high = options.batch_bounds(num_envs)
        else:
            low = high = num_envs
        if not isinstance(high, (int, np.integer)) or not 1 <= high <= num_envs:
            raise ValueError(
                f"batch_size must be an integer in 1..num_envs={num_envs}, got {high!r}"
            )
        self.min_batch_size, self.max_batch_size = int(low), int(high)
        self.batch_wait_s = float(getattr(options, "batch_wait_s", 0.0))
        #: seconds the oldest env of the last batch waited between finishing and being returned
        #: (by ``recv`` or ``recv_ids``)
        self.last_ready_age_s = 0.0
        vectorized = EnvSource.of(env_fns).vectorized
        if options.num_workers is None and vectorized:
            options = dataclasses.replace(options, num_workers=min(num_envs, usable_cpus()))
        elif options.num_workers is None:
            # one byte names an env in the per-env protocol: at most 127 envs per worker
            most = ENV_PAYLOAD_FLAG - 1
            num_workers = max(min(num_envs, usable_cpus()), -(-num_envs // most))
            options = dataclasses.replace(options, num_workers=num_workers)
        super().__init__(env_fns, autoreset_mode=autoreset_mode, options=options)
        self.batch_size = int(high)
        self._spaces_cache: dict[int, tuple[gym.Space, gym.Space]] = {}
        self._spaces_size = 0
        self._batch_spaces(self.batch_size)
        self.vectorized = vectorized
        widest = max(w.stop - w.start for w in self.pool.workers)
        if vectorized:
            self._check_whole_slices(widest)
        elif widest >= ENV_PAYLOAD_FLAG:
            self.close(terminate=True)
            raise ValueError(
                f"{widest} envs on one worker; per-env stepping allows at most "
                f"{ENV_PAYLOAD_FLAG - 1}: raise num_workers"
            )
        self._ready: deque[int] = deque()
        self._in_flight = np.zeros(self.num_envs, dtype=np.bool_)
        self._sent_at = np.zeros(self.num_envs, dtype=np.float64)  # for step_timeout_s
        self._ready_at = np.zeros(self.num_envs, dtype=np.float64)  # for batch_wait_s
        self._infos: dict[int, dict] = {}
        self._errors: list[ErrorReport] = []
        self._failed_envs: set[int] = set()
        self._last_ids: np.ndarray | None = None
        self._restart_pending = np.zeros(self.num_envs, dtype=np.bool_)
        # per env: the schema generation its result's info is in the shared info area under
        # (read from its flag as it arrives), or 0
        self._slot_generation = np.zeros(self.num_envs, dtype=np.uint8)
        self._env_to_worker = np.empty(self.num_envs, dtype=np.int64)
        for worker in self.pool.workers:
            self._env_to_worker[worker.start : worker.stop] = worker.index

    def _batch_spaces(self, size: int) -> None:
        """Batch the spaces over ``size`` envs: the batch last returned, whose actions the next
        ``step`` takes (a batch between a floor and a ceiling changes size)."""
        if size not in self._spaces_cache:
            self._spaces_cache[size] = (
                batch_space(self.single_observation_space, size),
                batch_space(self.single_action_space, size),
            )
        self.observation_space, self.action_space = self._spaces_cache[size]
        self._spaces_size = size

    def _check_whole_slices(self, size: int) -> None:
        """Vectorized slices: a batch of every env, or every slice ``size`` envs and a batch a
        whole number of them."""
        sizes = sorted({w.stop - w.start for w in self.pool.workers})
        bounds = (self.min_batch_size, self.max_batch_size)
        if bounds != (self.num_envs, self.num_envs) and (
            len(sizes) > 1 or any(bound % size for bound in bounds)
        ):
            self.close(terminate=True)
            raise ValueError(
                f"vectorized slices on async need num_envs={self.num_envs} to split evenly over "
                f"num_workers={self.num_workers} (slices of {sizes} envs) and batch bounds that "
                f"are multiples of the slice size, or batch_size=num_envs (got "
                f"{list(bounds)}): a batch is made of whole slices"
            )
        # with slices of unequal sizes only the whole batch is made of whole slices
        self._slice_size = size if len(sizes) == 1 else self.num_envs

    def _check_slice_ids(self, ids: np.ndarray) -> None:
        """Vectorized slices step as a whole: ``ids`` must cover whole slices."""
        chosen = set(ids.tolist())
        for worker in self.pool.workers:
            inside = [i for i in worker.env_indices if i in chosen]
            if inside and len(inside) != worker.stop - worker.start:
                raise ValueError(
                    f"envs {worker.start}..{worker.stop - 1} are one vectorized slice on worker "
                    f"{worker.index} and step together; send actions for all of them, not "
                    f"only {inside}"
                )

    # -- sending and receiving ------------------------------------------------------------------

    def send(self, actions: Any, env_ids: Any) -> None:
        """Start stepping the envs ``env_ids`` with ``actions`` (one action per id)."""
        self._check_open()
        self.pool.check_usable()
        ids = self._checked_ids(env_ids)
        if ids.size == 0:
            return
        busy = ids[self._in_flight[ids]]
        if busy.size:
            raise ValueError(f"envs {busy.tolist()} are still stepping; recv() them first")
        if self._ready:
            unread = sorted(set(ids.tolist()).intersection(self._ready))
            if unread:
                raise ValueError(f"envs {unread} have results not received yet; recv() them first")
        failed = sorted(self._failed_envs.intersection(ids.tolist()))
        if failed:
            raise WorkerError(
                f"envs {failed} failed earlier and are in an unknown state; call reset()",
                env_indices=failed,
            )
        checked = self._check_actions(actions, env_ids=ids)
        if self.vectorized:
            self._check_slice_ids(ids)
        self._clock.begin()
        # envs rebuilt after their worker died, while the caller held them, are returned as
        # restarted (truncated) without stepping: the action was meant for the old episode
        restarted = ids[self._restart_pending[ids]]
        if restarted.size:
            self._restart_pending[restarted] = False
            self._ready.extend(restarted.tolist())
            self._ready_at[restarted] = time.monotonic()
            keep = ~np.isin(ids, restarted)
            ids = ids[keep]
            checked = index_tree(checked, keep)
            if ids.size == 0:
                return
        views = self.pool.views
        assign_tree(views.actions, ids, checked)
        if not self.vectorized:
            views.step_mask[ids] = 1
        self._in_flight[ids] = True
        self._sent_at[ids] = time.monotonic()
        workers = self.pool.workers
        targets = [workers[k] for k in np.unique(self._env_to_worker[ids]).tolist()]
        if self.vectorized:  # a whole slice per worker: one STEP, one status byte back
            self.pool.send_all(targets, Command.STEP)
        elif self.pool.action_columns:  # leaves with no fixed size: their items go with it
            self.pool.send_action_items(targets, Command.STEP_MASKED, ids.tolist())
        else:
            self.pool.send_all(targets, Command.STEP_MASKED)
        self._state = AsyncState.WAITING_STEP

    def _checked_ids(self, env_ids: Any) -> np.ndarray:
        ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(f"env_ids must lie in 0..{self.num_envs - 1}, got {ids.tolist()}")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"env_ids has duplicates: {ids.tolist()}")
        return ids

    def _take_bytes(self, timeout: float | None) -> bool:
        """Read finished envs from the workers; ``False`` on timeout."""
        arrived, dead = self.pool.wait_bytes(timeout)
        flags = self.pool.views.info_flags
        finished_at = self.pool.views.ready_at
        learning = self.pool.info_schema.generation == 0
        pairs: list[tuple[int, dict]] = []  # the infos that came as dicts, for the schema
        in_slots = 0
        for worker, data in arrived:
            if self.vectorized:
                self._take_slice(worker, data)
                continue
            for byte in data:
                index = worker.start + (byte & (ENV_PAYLOAD_FLAG - 1))
                if byte & ENV_PAYLOAD_FLAG:
                    status, payload = self.pool.recv_payload(worker)
                    if status == Status.ERROR:
                        self._errors.extend(payload)
                        self._failed_envs.add(index)
                        self._in_flight[index] = False
                        continue
                    if payload is not None:  # None: the info is in the shared info area
                        self._infos[index] = payload
                        self.pool.note_restarts([(index, payload)])
                        if payload:
                            pairs.append((index, payload))
                if not learning and flags[index]:
                    self._slot_generation[index] = flags[index]
                    in_slots += 1
                self._in_flight[index] = False
                self._ready_at[index] = finished_at[index]
                self._ready.append(index)
        if pairs or not learning:
            self.pool.observe_infos(pairs, in_slots)
        for worker in dead:
            self._on_worker_death(worker)
        return bool(arrived or dead)

    def _take_slice(self, worker: WorkerHandle, data: bytes) -> None:
        """A vectorized slice's status byte: its whole slice is ready (or failed)."""
        envs = list(worker.env_indices)
        for status in data:
            payload = self.pool.recv_payload(worker) if status != Status.OK else None
            self._in_flight[envs] = False
            if status == Status.ERROR:
                self._errors.extend(payload)
                self._failed_envs.update(envs)
                continue
            for part in payload or ():
                if isinstance(part, SliceInfos):
                    if part.restart_reason is not None:
                        self.pool.count_failures(envs, part.restart_reason)
                    rows = unbatch_infos(part.infos, part.count)
                    for j, info in enumerate(rows):
                        if info:
                            self._infos[part.start + j] = info
            self._ready_at[envs] = time.monotonic()
            self._ready.extend(envs)

    def _on_worker_death(self, worker: WorkerHandle) -> None:
        if not self.pool.restart:
            self.pool.declare_dead(worker)
        # the steps the dead worker never took are reported as restarts below; its replacement
        # must not take them at its first command (one env twice in the ready queue)
        self.pool.views.step_mask[worker.start : worker.stop] = 0
        infos = self.pool.respawn(worker)
        ready = set(self._ready)
        for index, info in infos.items():
            self._infos[index] = info
            self._slot_generation[index] = 0
            if self._in_flight[index]:
                self._in_flight[index] = False
                self._ready_at[index] = time.monotonic()
                self._ready.append(index)
            elif index not in ready:
                self._restart_pending[index] = True

    def _raise_errors(self) -> None:
        if self._errors:
            errors, self._errors = self._errors, []
            raise self.pool.error_from_reports(errors)

    def _wait_until(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        what: str,
        raise_early: bool = True,
        due_at: Callable[[], float | None] | None = None,
    ) -> None:
        """Take finished envs until ``done()``; env errors are raised as soon as they arrive,
        or (``raise_early=False``) only once ``done()``. ``due_at()`` is a time at which
        ``done()`` may turn true without a new arrival (a batch's deadline), or ``None``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # checked even when done() already holds: with batch_size < num_envs the other envs
            # can fill every batch, and a stuck env would never be waited for
            kill_at = self._kill_overdue()
            if done():
                break
            if raise_early:
                self._raise_errors()
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                running = np.flatnonzero(self._in_flight).tolist()
                raise TimeoutError(
                    f"{what} did not finish within {timeout} s; envs running: {running}"
                )
            due = None if due_at is None else due_at()
            ends = [t - now for t in (deadline, kill_at, due) if t is not None]
            self._take_bytes(max(0.0, min(ends)) if ends else None)
        self._raise_errors()

    def _kill_overdue(self) -> float | None:
        """Kill the workers of envs stepping for more than ``step_timeout_s`` since they were
        sent (the failure policy then handles them); return when the next env would be overdue."""
        if self.pool.step_timeout_s is None or not self._in_flight.any():
            return None
        now = time.monotonic()
        running = np.flatnonzero(self._in_flight)
        due = self._sent_at[running] + self.pool.step_timeout_s
        overdue = running[due <= now]
        if overdue.size:
            stuck = {int(self._env_to_worker[i]) for i in overdue}
            # their sentinels report them
            self.pool.kill_stuck([self.pool.workers[k] for k in stuck])
        later = due[due > now]
        return float(later.min()) if later.size else None

    def recv(
        self,
        timeout: float | None = None,
        *,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        batch_wait_s: float | None = None,
    ):
        """Return ``(obs, rew, terminated, truncated, info)`` for a batch of ready envs, in the
        order they finished; ``info["env_id"]`` says which envs they are.

        The batch holds at least ``min_batch_size`` and at most ``max_batch_size`` envs: it is
        returned once the floor is ready and ``batch_wait_s`` has passed since the oldest ready
        env finished, or as soon as the ceiling is ready (or the floor is, and no other env is
        stepping). Each bound defaults to the backend's option.

        Args:
            timeout: seconds to wait for the floor before a ``TimeoutError`` (``None``: no limit).
            min_batch_size: the floor, fewest envs returned.
            max_batch_size: the ceiling, most envs returned.
            batch_wait_s: seconds to wait for more envs after the oldest ready one finished.

        Raises:
            ValueError: if a bound is out of range, the floor above the ceiling, or the wait
                negative.
            RuntimeError: if fewer than the floor are ready or stepping.
        """
        self._check_open()
        self.pool.check_usable()
        low, high, wait = self._batch_bounds(min_batch_size, max_batch_size, batch_wait_s)
        stepping = int(self._in_flight.sum())
        if len(self._ready) + stepping < low:
            raise RuntimeError(
                f"recv() needs {low} envs but only {len(self._ready)} are ready and "
                f"{stepping} stepping: send() actions first"
            )
        ready_at = self._ready_at

        def due_at() -> float | None:
            if not wait or len(self._ready) < low:
                return None
            return float(ready_at[list(self._ready)].min()) + wait

        def done() -> bool:
            count = len(self._ready)
            if count >= high:
                return True
            if count < low:
                return False
            if not wait or not self._in_flight.any():
                return True
            due = due_at()
            return due is not None and time.monotonic() >= due

        self._wait_until(done, timeout, "recv", due_at=due_at)
        count = min(len(self._ready), high)
        if self.vectorized:  # whole slices only
            count -= count % self._slice_size
        ids = np.array([self._ready.popleft() for _ in range(count)], dtype=np.int64)
        self.last_ready_age_s = max(0.0, time.monotonic() - float(ready_at[ids].min()))
        self._clock.end()
        return self._gather(ids)

    def _batch_bounds(
        self, low: int | None, high: int | None, wait: float | None
    ) -> tuple[int, int, float]:
        """``recv``'s floor, ceiling and wait: the arguments, else the backend's options."""
        low = self.min_batch_size if low is None else low
        high = self.max_batch_size if high is None else high
        wait = self.batch_wait_s if wait is None else wait
        for name, value in (("min_batch_size", low), ("max_batch_size", high)):
            if not isinstance(value, (int, np.integer)) or not 1 <= value <= self.num_envs:
                raise ValueError(
                    f"{name} must be an integer in 1..num_envs={self.num_envs}, got {value!r}"
                )
        if low > high:
            raise ValueError(f"min_batch_size={low} is above max_batch_size={high}")
        if not isinstance(wait, (int, float, np.floating)) or wait < 0:
            raise ValueError(f"batch_wait_s must be seconds >= 0, got {wait!r}")
        if self.vectorized and (low % self._slice_size or high % self._slice_size):
            whole = (
                f"num_envs={self.num_envs} (the slices are of unequal sizes)"
                if self._slice_size == self.num_envs
                else f"multiples of the slice size {self._slice_size}"
            )
            raise ValueError(
                f"batch bounds must be {whole}, got min_batch_size={low} "
                f"and max_batch_size={high}: a batch is made of whole slices"
            )
        return int(low), int(high), float(wait)

    def recv_ids(self, env_ids: Any, timeout: float | None = None):
        """Wait for exactly the envs ``env_ids`` and return them in that order."""
        self._check_open()
        self.pool.check_usable()
        ids = self._checked_ids(env_ids)
        wanted = set(ids.tolist())
        missing = wanted.difference(self._ready)
        if missing and not self._in_flight[sorted(missing)].all():
            raise RuntimeError(f"envs {sorted(missing)} are neither ready nor stepping")
        self._wait_until(lambda: wanted.issubset(self._ready), timeout, "recv")
        self._ready = deque(i for i in self._ready if i not in wanted)
        if ids.size:
            self.last_ready_age_s = max(0.0, time.monotonic() - float(self._ready_at[ids].min()))
        self._clock.end()
        return self._gather(ids)

    def _discard_results(self, env_ids: np.ndarray) -> None:
        """Drop the received-but-unread results of envs ``env_ids`` (a step given up)."""
        dropped = set(env_ids.tolist()).intersection(self._ready)
        for index in dropped:
            self._infos.pop(index, None)
            self._slot_generation[index] = 0
        self._ready = deque(i for i in self._ready if i not in dropped)

    def _gather(self, ids: np.ndarray):
        views = self.pool.views
        self._last_ids = ids
        if len(ids) != self._spaces_size:
            self._batch_spaces(len(ids))
        if not self._in_flight.any():
            self._state = AsyncState.DEFAULT
        obs = index_tree(views.obs, ids)
        infos = self._batch_of(ids)
        infos["env_id"] = ids.copy()
        return (
            obs,
            views.rewards[ids],
            views.terminations[ids],
            views.truncations[ids],
            infos,
        )

    def _batch_of(self, ids: np.ndarray) -> dict[str, Any]:
        """The batched infos of envs ``ids`` (in that order): those that came as dicts and
        those in the shared info area, batched over the returned batch."""
        generations = self._slot_generation[ids]
        in_slots = generations != 0
        infos: dict[str, Any] = {}
        tracker = self.pool.info_schema
        if in_slots.any():
            self._slot_generation[ids] = 0
            if (generations[in_slots] == tracker.generation).all() and not any(
                i in self._infos for i in ids.tolist()
            ):
                return tracker.current.batch(in_slots, ids)
        for position, index in enumerate(ids.tolist()):
            info = self._infos.pop(index, None)
            if info is None and in_slots[position]:
                info = tracker.slots(int(generations[position])).decode([index])[0]
            if info:  # batched over the returned batch, not over all envs
                infos = add_info(infos, info, position, len(ids))
        return infos

    # -- the VectorEnv API ----------------------------------------------------------------------

    def _prepare_control(self) -> None:
        """Let envs still stepping finish (their results stay ready to be received).

        Every env must be back before an error is raised: a control command sent to a worker
        still stepping would take that env's step byte for its own reply.
        """
        if self._in_flight.any():
            self._wait_until(
                lambda: not self._in_flight.any(),
                30.0,
                "waiting for stepping envs",
                raise_early=False,
            )

    def _busy(self) -> bool:
        return bool(self._in_flight.any())

    def reset(self, *, seed: Seed = None, options: dict[str, Any] | None = None) -> ResetReturn:
        """Reset every env and return the first batch, or reset some envs of the batch in hand.

        With ``options["reset_mask"]`` only the envs of the batch last returned (the envs the
        caller holds, ``info["env_id"]``) may be named; that batch comes back again, the named
        envs in it reset, as ``SyncVectorEnv`` returns every env with the masked ones reset.
        """
        self._check_open()
        self.pool.check_usable()
        reset_mask, options = split_reset_mask(options, self.num_envs)
        if reset_mask is not None:
            check_reset_mask_held(reset_mask, self._last_ids)
        try:
            self._prepare_control()
        except WorkerError:
            # envs that failed while draining are reset below; a worker that died (or the
            # max_restarts cap) leaves the pool broken, and a reset would wait on it forever
            self.pool.check_usable()
        self._errors = []
        seeds = normalize_seeds(seed, self.num_envs)
        pairs = self.pool.reset(seeds, options, reset_mask)
        reset_ids = [index for index, _ in pairs]
        for index, info in pairs:
            self._infos[index] = info
        self._slot_generation[reset_ids] = 0
        self._failed_envs.difference_update(reset_ids)
        self._restart_pending[reset_ids] = False
        reset_set = set(reset_ids)
        if reset_mask is not None:  # the caller still holds these envs
            self._ready = deque(i for i in self._ready if i not in reset_set)
            return self._after_masked_reset()
        self._ready = deque([i for i in self._ready if i not in reset_set] + reset_ids)
        self._ready_at[reset_ids] = time.monotonic()
        return self._after_reset()

    def _after_reset(self):
        obs, _, _, _, infos = self.recv()
        return obs, infos

    def _after_masked_reset(self):
        obs, _, _, _, infos = self._gather(self._last_ids)
        return obs, infos

    def step_async(self, actions: Any) -> None:
        if self._last_ids is None:
            raise RuntimeError("call reset() before step()")
        self.send(actions, self._last_ids)

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        return self.recv(timeout)


def make_async(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: AsyncOptions | None = None,
    **kwargs: Any,
) -> AsyncVecEnv:
    """The ``async`` backend's factory: ``make_vec`` passes checked ``options``; a direct call
    may pass the options as keywords instead."""
    options = AsyncOptions.resolve("async", options, kwargs)
    return AsyncVecEnv(env_fns, autoreset_mode=autoreset_mode, options=options)


@hookimpl
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        "async",
        make_async,
        "shared-memory workers; recv() returns the envs that are ready, between a floor and a "
        "ceiling with a deadline",
        options=AsyncOptions,
    )
