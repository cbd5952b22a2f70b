"""The caller's side of the ``ray`` backend: :class:`RayVecEnv`, a ``VecEnv`` over shard actors."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from vecaccel.errors import WorkerError, WorkerTimeoutError
from vecaccel.options import RayOptions
from vecaccel.spaces import assign_tree, has_fixed_layout, index_tree, read_item
from vecaccel.vec_env import (
    AsyncState,
    ResetReturn,
    Seed,
    StepReturn,
    VecEnv,
    check_reset_mask_held,
    normalize_seeds,
    split_reset_mask,
)
from vecaccel.worker import FailureCounter, restarted_info

from .cluster import (
    actor_class,
    actor_options,
    check_batch_size,
    concurrency_shares,
    default_num_shards,
    import_ray,
    owned,
    shard_bundle,
    shard_options,
    stop_actors,
)
from .records import Shard, ShardLost, ShardSpaces
from .runtime import RayRuntime
from .shard import ShardFailure, shard_bounds

__all__ = ["CLOSE_TIMEOUT_S", "RayVecEnv"]

#: Seconds ``close()`` gives each shard to close its local backend before its actor is killed.
CLOSE_TIMEOUT_S = 10.0


class RayVecEnv(VecEnv):
    """Sub-environments in contiguous shards, each a Ray actor running a local backend.

    ``step`` makes one actor call per shard; ``send(actions, env_ids)``/``recv()`` step whole
    shards and return the first ``batch_size`` envs' shards to finish (``ray.wait``), for
    clusters whose nodes differ in speed. Spaces, metadata and ``spec`` come from shard 0.

    Args:
        env_fns: one zero-argument env function per sub-environment (picklable by
            cloudpickle: they travel to the shards' nodes).
        autoreset_mode: Gymnasium's autoreset mode.
        options: see :class:`vecaccel.options.RayOptions`.

    Example:
        >>> import vecaccel, numpy as np  # doctest: +SKIP
        >>> envs = vecaccel.make_vec("CartPole-v1", 8, backend="ray", num_shards=2)  # doctest: +SKIP
        >>> obs, infos = envs.reset(seed=0)  # doctest: +SKIP
        >>> obs.shape  # doctest: +SKIP
        (8, 4)
        >>> envs.close()  # doctest: +SKIP
    """

    batch_size: int

    supports_per_env_infos = True

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        options: RayOptions | None = None,
    ) -> None:
        self.options = options = RayOptions() if options is None else options
        self.closed = True  # until the shards are up: close() has nothing to do before
        ray = import_ray()
        num_envs = len(env_fns)
        if num_envs == 0:
            raise ValueError("a vector env needs at least one env function")
        self._shard_options = shard_options(options)
        RayRuntime.acquire(options.address, options.connect_timeout_s)
        self._ray = ray
        self._holds_ray = True
        self._placement_group = None
        self._shards: list[Shard] = []
        self._broken: str | None = None
        self._broken_envs: tuple[int, ...] = ()
        self._failure_counter = FailureCounter(num_envs, options.max_restarts)
        try:
            num_shards = options.num_shards or default_num_shards(ray)
            num_shards = min(num_shards, num_envs)
            batch_size = options.batch_size or num_envs
            bounds = shard_bounds(num_envs, num_shards)
            check_batch_size(batch_size, num_envs, bounds)
            self._concurrency = concurrency_shares(options.max_concurrency, num_shards)
            self.batch_size = batch_size
            self._shards = [
                Shard(k, start, stop, env_fns=list(env_fns[start:stop]))
                for k, (start, stop) in enumerate(bounds)
            ]
            self._autoreset_value = _mode_value(autoreset_mode)
            described = self._start_shards()
            VecEnv.__init__(
                self,
                env_fns,
                autoreset_mode=autoreset_mode,
                copy=options.copy,
                probe_env=ShardSpaces(described),
            )
        except KeyboardInterrupt:
            self._teardown(polite=False)  # at once: Ctrl-C asks to stop, not to tidy up
            raise KeyboardInterrupt("interrupted while starting the Ray shards") from None
        except BaseException:
            self._teardown()
            raise
        self.closed = False
        if batch_size < num_envs:
            self.observation_space = batch_space(self.single_observation_space, batch_size)
            self.action_space = batch_space(self.single_action_space, batch_size)
        self._fixed_obs = has_fixed_layout(self.single_observation_space)
        self._obs = self._empty_obs(num_envs)
        self._rewards = np.zeros(num_envs, dtype=np.float64)
        self._terms = np.zeros(num_envs, dtype=np.bool_)
        self._truncs = np.zeros(num_envs, dtype=np.bool_)
        self._ready: deque[int] = deque()  # shards with a result received, in arrival order
        self._last_ids: np.ndarray | None = None
        self._last_seeds: list[int | None] = [None] * num_envs

    # -- starting and restarting shards -------------------------------------------------------

    def _start_shards(self) -> dict[str, Any]:
        ray = self._ray
        from ray.util.placement_group import placement_group

        timeout = self.options.start_timeout_s
        bundle = shard_bundle(self.options.shard_resources)
        self._placement_group = placement_group(
            [bundle] * len(self._shards), strategy=self.options.placement
        )
        ready, _ = ray.wait([self._placement_group.ready()], timeout=timeout)
        if not ready:
            raise WorkerTimeoutError(
                f"could not reserve {len(self._shards)} shards of {bundle} "
                f"({self.options.placement}) within start_timeout_s={timeout}; the cluster "
                f"has {ray.available_resources()} free: lower num_shards or shard_resources",
                worker_indices=[s.index for s in self._shards],
                env_indices=range(self._shards[-1].stop),
            )
        refs = [self._launch(shard) for shard in self._shards]
        described = self._await_started(self._shards, refs)
        first = described[0]
        for shard, info in zip(self._shards, described):
            for kind in ("observation_space", "action_space"):
                if info[kind] != first[kind]:
                    raise RuntimeError(
                        f"env {shard.start} has {kind.split('_')[0]} space {info[kind]}, but "
                        f"env 0 has {first[kind]}: all sub-environments of a vector env must "
                        f"have the same {kind.replace('_', ' ')}"
                    )
        return first

    def _launch(self, shard: Shard) -> Any:
        """Start ``shard``'s actor; return the reference of its ``start_envs`` call."""
        options = actor_options(self.options.shard_resources, self._placement_group, shard.index)
        shard.actor = actor_class(self._ray).options(**options).remote(shard.start)
        shard.node = "?"
        local = dict(self._shard_options)
        share = self._concurrency[shard.index]
        if share is not None:  # the shard's part of the cluster-wide cap
            local["max_concurrency"] = share
        return shard.actor.start_envs.remote(
            shard.env_fns, self._autoreset_value, self.options.shard_backend, local
        )

    def _await_started(self, shards: list[Shard], refs: list) -> list[dict[str, Any]]:
        ray = self._ray
        timeout = self.options.start_timeout_s
        ready, waiting = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if waiting:
            late = [s for s, ref in zip(shards, refs) if ref in set(waiting)]
            raise WorkerTimeoutError(
                f"shards {[s.index for s in late]} (envs "
                f"{[f'{s.start}..{s.stop - 1}' for s in late]}) did not build their envs "
                f"within start_timeout_s={timeout}",
                worker_indices=[s.index for s in late],
                env_indices=[i for s in late for i in s.env_indices],
            )
        described = []
        for shard, ref in zip(shards, refs):
            try:
                info = ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise WorkerError(
                    f"{shard.describe()} could not start: {exc}",
                    env_indices=shard.env_indices,
                ) from exc
            if isinstance(info, ShardFailure):
                raise info.error(shard.index, "?")
            shard.node = f"{info['node_ip']} ({info['node_id'][:8]})"
            described.append(info)
        return described

    def _restart(self, shard: Shard, reason: str) -> tuple:
        """Start ``shard`` again, reseed its envs, return the truncated step reporting it."""
        self._kill(shard)
        envs = shard.env_indices
        self._count_failure(envs, reason)
        try:
            self._await_started([shard], [self._launch(shard)])
            seeds = [self._failure_counter.seed(self._last_seeds[i], i) for i in envs]
            result = self._get(shard, shard.actor.reset.remote(seeds, None, None, True), "restart")
        except WorkerError as exc:
            self._break(f"{shard.describe()} could not be restarted: {exc}", envs)
            raise
        obs = result[0]
        n = shard.stop - shard.start
        infos = [
            (i, restarted_info(self.autoreset_mode, read_item(obs, j), reason))
            for j, i in enumerate(envs)
        ]
        truncs = np.ones(n, dtype=np.bool_)
        return obs, np.zeros(n), np.zeros(n, dtype=np.bool_), truncs, infos

    @property
    def failures(self) -> int:
        """Shard and env failures recovered from so far."""
        return self._failure_counter.total

    @property
    def failures_per_env(self) -> np.ndarray:
        """Failures recovered from, per env."""
        return self._failure_counter.per_env

    def _count_failure(self, env_indices: list[int], reason: str) -> None:
        message = self._failure_counter.count(env_indices, reason)
        if message is not None:
            self._break(message, env_indices)
            raise WorkerError(message, env_indices=env_indices)

    def _break(self, message: str, env_indices: Sequence[int]) -> None:
        if self._broken is None:
            self._broken = f"{message}; this vector env cannot continue: close() it"
            self._broken_envs = tuple(env_indices)

    def _check_usable(self) -> None:
        self._check_open()
        if self._broken is not None:
            raise WorkerError(self._broken, env_indices=self._broken_envs)

    def _kill(self, shard: Shard) -> None:
        if shard.actor is not None:
            try:
                self._ray.kill(shard.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
        shard.actor, shard.pending, shard.result = None, None, None

    # -- calls to shards ------------------------------------------------------------------------

    def _lost(self, shard: Shard, what: str, exc: BaseException | None) -> str:
        if exc is None:
            return (
                f"{shard.describe()} overran step_timeout_s={self.options.step_timeout_s} in "
                f"{what}; its actor was killed"
            )
        return f"{shard.describe()} was lost in {what} ({type(exc).__name__}: {exc})"

    def _get(self, shard: Shard, ref: Any, what: str) -> Any:
        """The result of ``ref``, a call to ``shard`` outside a step; a lost shard is raised
        (restarting it is up to the caller of this method)."""
        ray = self._ray
        try:
            result = ray.get(ref, timeout=self.options.step_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._kill(shard)
            raise ShardLost(self._lost(shard, what, None), shard) from None
        except ray.exceptions.RayError as exc:
            raise ShardLost(self._lost(shard, what, exc), shard) from exc
        if isinstance(result, ShardFailure):
            raise result.error(shard.index, shard.node)
        return result

    def _control(self, shard: Shard, what: str, call: Callable[[Any], Any], ref: Any = None) -> Any:
        """The result of ``call(actor)`` on ``shard`` (``ref``: that call, made already); a
        lost shard is restarted (its truncation owed to its next step) and the call made
        again, or raised."""
        while True:
            try:
                return self._get(shard, call(shard.actor) if ref is None else ref, what)
            except ShardLost as lost:
                ref = None
                self._on_lost(shard, lost)
                shard.restart_result = self._restart(shard, str(lost))

    def _on_lost(self, shard: Shard, lost: ShardLost) -> None:
        if self.options.on_worker_failure != "restart":
            self._kill(shard)
            self._break(str(lost), shard.env_indices)
            raise WorkerError(str(lost), env_indices=shard.env_indices) from lost

    def _finish_pending(self) -> None:
        """Let steps in flight finish before a control call (results received are kept)."""
        for shard in self._shards:
            if shard.pending is not None:
                self._wait_shards(lambda: all(s.pending is None for s in self._shards), None)
                return

    # -- the VectorEnv API --------------------------------------------------------------------

    def reset(self, *, seed: Seed = None, options: dict[str, Any] | None = None) -> ResetReturn:
        """Reset every env (or those in ``options["reset_mask"]``); with ``batch_size`` below
        ``num_envs``, return the first batch (a masked reset may only name envs of the batch
        last returned, which comes back again)."""
        self._check_usable()
        seeds = normalize_seeds(seed, self.num_envs)
        reset_mask, options = split_reset_mask(options, self.num_envs)
        partial = self.batch_size < self.num_envs
        if reset_mask is not None and partial:
            check_reset_mask_held(reset_mask, self._last_ids)
        try:
            self._finish_pending()
        except WorkerError:
            self._check_usable()  # envs that failed in that step are reset here
        if reset_mask is not None and partial:
            held = set(self._last_ids.tolist())
            shards = [s for s in self._shards if s.start in held]
        else:
            shards = list(self._shards)
        requests = []
        for shard in shards:
            mask = None if reset_mask is None else reset_mask[shard.start : shard.stop].copy()
            if mask is not None and not mask.any():  # unchanged: its current observations
                requests.append((shard, "reset", lambda actor: actor.current_obs.remote()))
                continue
            for i in range(shard.start, shard.stop):
                if (mask is None or mask[i - shard.start]) and seeds[i] is not None:
                    self._last_seeds[i] = seeds[i]
            shard.restart_result = None
            shard_seeds = seeds[shard.start : shard.stop]
            requests.append(
                (
                    shard,
                    "reset",
                    lambda actor, a=(shard_seeds, options, mask): actor.reset.remote(*a),
                )
            )
        self._state = AsyncState.WAITING_RESET
        try:
            refs = [call(shard.actor) for shard, _, call in requests]  # in parallel
            for (shard, what, call), ref in zip(requests, refs):
                result = self._control(shard, what, call, ref)
                obs, pairs = result
                size = shard.stop - shard.start
                falses = np.zeros(size, dtype=np.bool_)
                shard.result = (obs, np.zeros(size), falses, falses, pairs)
        finally:
            self._state = AsyncState.DEFAULT
        if partial and reset_mask is None:
            self._ready = deque(s.index for s in self._shards)
            obs, _, _, _, infos = self.recv()
        else:
            self._ready.clear()
            obs, _, _, _, infos = self._assemble(shards)
        return obs, infos

    def step_async(self, actions: Any) -> None:
        if self.batch_size == self.num_envs:
            self.send(actions, np.arange(self.num_envs))
            return
        if self._last_ids is None:
            raise RuntimeError("call reset() before step()")
        self.send(actions, self._last_ids)

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        self._check_open()
        if self._state is not AsyncState.WAITING_STEP and not self._ready:
            raise RuntimeError("step_wait() called without a pending step_async()")
        return self.recv(timeout)

    def send(self, actions: Any, env_ids: Any) -> None:
        """Start stepping the shards of envs ``env_ids`` (whole shards) with ``actions``."""
        self._check_usable()
        ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(f"env_ids must lie in 0..{self.num_envs - 1}, got {ids.tolist()}")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"env_ids has duplicates: {ids.tolist()}")
        checked = self._check_actions(actions, env_ids=None if ids.size == self.num_envs else ids)
        if self.batch_size == self.num_envs:
            # lock-step: what is left of a step that raised or timed out is dropped (a shard
            # runs its calls in order, so the new step simply queues behind it)
            for shard in self._shards:
                shard.pending = shard.result = None
            self._ready.clear()
        position = np.full(self.num_envs, -1, dtype=np.int64)
        position[ids] = np.arange(ids.size)
        chosen = []
        for shard in self._shards:
            inside = position[shard.start : shard.stop]
            if (inside < 0).all():
                continue
            if (inside < 0).any():
                raise ValueError(
                    f"env_ids must name whole shards: {shard.describe()} is named in part "
                    f"({sorted(set(ids.tolist()) & set(shard.env_indices))})"
                )
            if shard.pending is not None or shard.result is not None:
                raise ValueError(
                    f"{shard.describe()} is still stepping or has results not received yet; "
                    "recv() them first"
                )
            chosen.append((shard, inside))
        now = time.monotonic()
        for shard, inside in chosen:
            if shard.restart_result is not None:  # restarted while the caller held it
                shard.result, shard.restart_result = shard.restart_result, None
                self._ready.append(shard.index)
                continue
            sequential = inside[0] + np.arange(inside.size)
            part = (
                index_tree(checked, slice(int(inside[0]), int(inside[-1]) + 1))
                if (inside == sequential).all()
                else index_tree(checked, inside)
            )
            shard.pending = shard.actor.step.remote(part)
            shard.sent_at = now
        self._state = AsyncState.WAITING_STEP

    def recv(self, timeout: float | None = None):
        """Return ``(obs, rew, terminated, truncated, info)`` of the first ``batch_size`` envs'
        shards to finish; below ``num_envs``, ``info["env_id"]`` says which envs they are."""
        self._check_usable()
        stepping = sum(s.stop - s.start for s in self._shards if s.pending is not None)
        ready_envs = sum(self._size(k) for k in self._ready)
        if ready_envs + stepping < self.batch_size:
            raise RuntimeError(
                f"recv() needs {self.batch_size} envs but only {ready_envs} are ready and "
                f"{stepping} stepping: send() actions first"
            )

        def enough() -> bool:
            return sum(self._size(k) for k in self._ready) >= self.batch_size

        self._wait_shards(enough, timeout)
        picked: list[int] = []
        while sum(self._size(k) for k in picked) < self.batch_size:
            picked.append(self._ready.popleft())
        picked.sort()
        if not any(s.pending is not None for s in self._shards):
            self._state = AsyncState.DEFAULT
        return self._assemble([self._shards[k] for k in picked])

    def _size(self, k: int) -> int:
        return self._shards[k].stop - self._shards[k].start

    def _wait_shards(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Receive shards' step results until ``done()``; raise a failure as it arrives."""
        ray = self._ray
        deadline = None if timeout is None else time.monotonic() + timeout
        step_timeout = self.options.step_timeout_s
        if self._get_all(timeout):
            return
        while not done():
            flying = [s for s in self._shards if s.pending is not None]
            now = time.monotonic()
            waits = []
            if deadline is not None:
                waits.append(deadline - now)
            if step_timeout is not None and flying:
                waits.append(min(s.sent_at for s in flying) + step_timeout - now)
            wait = max(0.0, min(waits)) if waits else None
            refs = [s.pending for s in flying]
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait) if refs else ([], [])
            ready_set = set(ready)
            for shard in flying:
                if shard.pending in ready_set:
                    self._receive(shard)
            now = time.monotonic()
            if step_timeout is not None:
                for shard in flying:
                    if shard.pending is not None and now - shard.sent_at >= step_timeout:
                        self._kill(shard)
                        self._step_lost(shard, ShardLost(self._lost(shard, "step", None), shard))
            if not done() and deadline is not None and time.monotonic() >= deadline:
                running = [s.index for s in self._shards if s.pending is not None]
                raise TimeoutError(
                    f"the step did not finish within {timeout} s; shards running: {running}"
                )

    def _get_all(self, timeout: float | None) -> bool:
        """The lock-step fast path: every shard in flight and all wanted, fetched with one
        ``ray.get``. ``False`` when that is not the case or anything went wrong, for the
        shard-by-shard loop to sort out (the references stay valid)."""
        ray = self._ray
        if self.batch_size != self.num_envs or self._ready:
            return False
        shards = self._shards
        if any(s.pending is None for s in shards):
            return False
        limits = [t for t in (timeout, self.options.step_timeout_s) if t is not None]
        started = min(s.sent_at for s in shards)
        limit = None if not limits else max(0.0, started + min(limits) - time.monotonic())
        try:
            results = ray.get([s.pending for s in shards], timeout=limit)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return False
        if any(isinstance(result, ShardFailure) for result in results):
            return False
        for shard, result in zip(shards, results):
            shard.pending, shard.result = None, result
            self._note_restarts(result[4])
            self._ready.append(shard.index)
        return True

    def _receive(self, shard: Shard) -> None:
        ray = self._ray
        ref, shard.pending = shard.pending, None
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as exc:
            self._step_lost(shard, ShardLost(self._lost(shard, "step", exc), shard))
            return
        if isinstance(result, ShardFailure):
            raise result.error(shard.index, shard.node)
        shard.result = result
        self._note_restarts(result[4])
        self._ready.append(shard.index)

    def _step_lost(self, shard: Shard, lost: ShardLost) -> None:
        self._on_lost(shard, lost)
        shard.result = self._restart(shard, str(lost))
        self._ready.append(shard.index)

    def _note_restarts(self, pairs: list[tuple[int, dict]]) -> None:
        for i, reason in FailureCounter.restarts_in(pairs):
            self._count_failure([i], reason)

    def _assemble(self, shards: list[Shard]):
        """One batch from the results of ``shards`` (in index order), copied once."""
        whole = len(shards) == len(self._shards)
        n = sum(s.stop - s.start for s in shards)
        if not self.copy and whole:
            obs, rewards, terms, truncs = self._obs, self._rewards, self._terms, self._truncs
        else:
            obs = self._empty_obs(n)
            rewards = np.empty(n, dtype=np.float64)
            terms = np.empty(n, dtype=np.bool_)
            truncs = np.empty(n, dtype=np.bool_)
        pairs: list[tuple[int, dict]] = []
        offset = 0
        items: list = []
        for shard in shards:
            s_obs, s_rew, s_term, s_trunc, s_pairs = shard.result
            shard.result = None
            size = shard.stop - shard.start
            where = slice(offset, offset + size)
            if self._fixed_obs:
                assign_tree(obs, where, s_obs)
            else:  # leaves with no fixed size: Gymnasium's tuples of items, rebuilt whole
                items.extend(iterate(batch_space(self.single_observation_space, size), s_obs))
            rewards[where], terms[where], truncs[where] = s_rew, s_term, s_trunc
            pairs.extend((i - shard.start + offset, owned(info)) for i, info in s_pairs)
            offset += size
        if not self._fixed_obs:
            obs = concatenate(self.single_observation_space, items, self._empty_obs(n))
        if whole and self.batch_size == self.num_envs:
            self._last_ids = None
            return obs, rewards, terms, truncs, self._batch_infos(pairs)
        ids = np.concatenate([np.arange(s.start, s.stop) for s in shards])
        self._last_ids = ids
        infos = self._batch_of(ids, dict((int(ids[p]), info) for p, info in pairs))
        infos["env_id"] = ids.copy()
        return obs, rewards, terms, truncs, infos

    def _batch_of(self, ids: np.ndarray, by_env: dict[int, dict]) -> dict[str, Any]:
        """Infos batched over a batch of envs ``ids`` (not over all envs)."""
        pairs = [(p, by_env[i]) for p, i in enumerate(ids.tolist()) if i in by_env]
        return self._batch_infos(pairs, size=len(ids))

    # -- observations --------------------------------------------------------------------------

    def _empty_obs(self, n: int | None = None) -> Any:
        return create_empty_array(
            self.single_observation_space, self.num_envs if n is None else n, fn=np.empty
        )

    # -- call, attributes, close ----------------------------------------------------------------

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_usable()
        self._finish_pending()
        indices = self._normalize_indices(indices)
        results: dict[int, Any] = {}
        for shard in self._shards:
            local = [i - shard.start for i in indices if shard.start <= i < shard.stop]
            if not local:
                continue
            values = self._control(
                shard,
                f"call({name!r})",
                lambda actor, local=local: actor.call.remote(name, local, args, kwargs),
            )
            results.update(zip((shard.start + j for j in local), values))
        return tuple(results[i] for i in indices)

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        self._check_usable()
        self._finish_pending()
        indices = self._normalize_indices(indices)
        by_env = dict(zip(indices, self._values_for(values, len(indices))))
        for shard in self._shards:
            local = [i - shard.start for i in indices if shard.start <= i < shard.stop]
            if not local:
                continue
            chosen = [by_env[shard.start + j] for j in local]
            self._control(
                shard,
                f"set_attr({name!r})",
                lambda actor, local=local, chosen=chosen: actor.set_attr.remote(
                    name, local, chosen
                ),
            )

    @property
    def num_shards(self) -> int:
        """How many shards (actors) the envs are split into."""
        return len(self._shards)

    @property
    def shard_nodes(self) -> list[str]:
        """The node (IP and node id prefix) each shard runs on, by shard."""
        return [shard.node for shard in self._shards]

    @property
    def shard_actors(self) -> list[Any]:
        """The Ray actor handle of each shard (``None`` where none is running)."""
        return [shard.actor for shard in self._shards]

    def close_extras(self, terminate: bool = False, **kwargs: Any) -> None:
        self._teardown(polite=not terminate)

    def _teardown(self, polite: bool = True) -> None:
        ray = getattr(self, "_ray", None)
        if ray is None:
            return
        try:
            if ray.is_initialized():
                shards = [s for s in getattr(self, "_shards", []) if s.actor is not None]
                if polite and shards:
                    stop_actors(ray, shards, CLOSE_TIMEOUT_S)
                for shard in shards:
                    self._kill(shard)
                if self._placement_group is not None:
                    from ray.util.placement_group import remove_placement_group

                    remove_placement_group(self._placement_group)
        finally:
            self._placement_group = None
            if self._holds_ray:
                self._holds_ray = False
                RayRuntime.release()

    def __repr__(self) -> str:
        return f"RayVecEnv(num_envs={self.num_envs}, num_shards={len(self._shards)})"


def _mode_value(mode: str | AutoresetMode) -> str:
    return mode.value if isinstance(mode, AutoresetMode) else str(mode)
