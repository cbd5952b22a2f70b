"""Backend ``action_server``: workers only simulate; the policy runs batched in the parent.

Observations come back as ``torch`` tensors on ``device`` (staged through pinned memory when the
device is a GPU, copied with ``non_blocking``); actions go in as tensors. With
``alternating=True`` the envs form two fixed halves: while the caller computes actions for one
half, the workers simulate the other, so CPU simulation overlaps policy inference (rlpyt's
``AlternatingSampler``, the seed paper's action server). Given a floor or a ceiling
(``min_batch_size``, ``max_batch_size``) it serves instead whichever envs have reported when the
deadline ``batch_wait_s`` after the first of them has passed (SEED RL's and TorchRL's inference
servers batch requests so). Once the caller sets :attr:`ActionServerVecEnv.policy_version`,
every answer carries, per env, the policy version that chose the action it results from
(``infos["policy_version"]``; -1 after a reset), so a caller whose weights change while envs
step can tell how old each transition's policy is.

torch is imported when an env is made, not with this module: the plugin manager imports every
built-in plugin in each process that calls ``make_vec``, spawned workers included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from vecaccel import BackendRegistry, hookimpl
from vecaccel.envs.source import EnvSource
from vecaccel.errors import WorkerError
from vecaccel.options import ActionServerOptions
from vecaccel.plugins.asynchronous import AsyncVecEnv
from vecaccel.spaces.payload import require_fixed_layout
from vecaccel.vec_env import StepReturn
from vecaccel.worker import usable_cpus, warn_if_torch_oversubscribes

if TYPE_CHECKING:
    import torch

__all__ = ["ActionServerVecEnv", "make_action_server"]


def _tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    first = trees[0]
    if isinstance(first, dict):
        return {key: _tree_map(fn, *(t[key] for t in trees)) for key in first}
    if isinstance(first, tuple):
        return tuple(_tree_map(fn, *parts) for parts in zip(*trees))
    return fn(*trees)


class ActionServerVecEnv(AsyncVecEnv):
    """Sub-environments in shared-memory workers, with torch tensors in and out on ``device``.

    Args:
        env_fns: one env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        options: see :class:`vecaccel.options.ActionServerOptions`: ``device``,
            ``alternating`` (two fixed halves, even and odd indices, so each half spans every
            worker), ``drain_timeout_s`` and the worker options. ``num_workers`` defaults to
            every usable CPU, except with ``alternating=True`` on ``device="cpu"``: then the
            CPUs that torch's threads leave free (at least 1), since the policy runs here at
            the same time as the workers. ``min_batch_size``, ``max_batch_size`` and
            ``batch_wait_s`` serve a batch of whichever envs reported (the batch former of
            ``async``, not with ``alternating``).

    Each ``step(actions)`` takes actions for the envs the previous call returned
    (``info["env_id"]``) and returns the other half (or all envs without alternation, or with a
    floor or a ceiling the envs that reported, in the order they finished). Set
    :attr:`policy_version` to the version of the weights that chose the actions before each
    step; ``infos["policy_version"]`` then gives back, per returned env, the version its last
    action was chosen by.
    ``step_async``/``step_wait`` pair up as on ``shm``: a second ``step_async`` before
    ``step_wait`` and a ``step_wait`` without ``step_async`` raise ``RuntimeError``. A step
    given up (``step_wait(timeout)`` timed out, Ctrl-C, an env error) can still be waited for
    with ``step_wait``; the next ``step_async`` instead finishes it and drops its result, and
    then acts for the envs that step would have returned.

    Example:
        >>> import vecaccel, torch
        >>> envs = vecaccel.make_vec("CartPole-v1", 4, backend="action_server", device="cpu",
        ...                          alternating=True, num_workers=2)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, infos["env_id"].tolist()
        (torch.Size([2, 4]), [0, 2])
        >>> obs, rew, term, trunc, infos = envs.step(torch.zeros(2, dtype=torch.int64))
        >>> infos["env_id"].tolist()
        [1, 3]
        >>> envs.close()
    """

    #: every step returns its envs (all, or one alternating half) in index order; with a floor
    #: or a ceiling, in the order they finished
    returns_envs_in_order = True
    #: the version of the policy whose actions the next ``step`` sends (``None``: not stamped);
    #: once set, each env's answer carries the version its action was sent under
    #: (``infos["policy_version"]``, -1 for an env not stepped since its reset)
    policy_version: int | None = None

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        options: ActionServerOptions | None = None,
    ) -> None:
        import torch

        options = ActionServerOptions() if options is None else options
        num_envs = len(env_fns)
        alternating = options.alternating
        if alternating and (num_envs < 2 or num_envs % 2):
            raise ValueError(f"alternating=True needs an even number of envs >= 2, got {num_envs}")
        self.device = torch.device(options.device)
        self.alternating = alternating
        self.forms_batches = options.forms_batches
        if self.forms_batches:
            self.returns_envs_in_order = False
        # per env: the policy version its last action was sent under (-1: none since a reset)
        self._stamps = np.full(num_envs, -1, dtype=np.int64)
        self.drain_timeout_s = options.drain_timeout_s
        # a step_async() whose step_wait() has not returned yet; AsyncVecEnv's _state cannot
        # tell: with alternation a half is in flight between every two steps
        self._step_pending = False
        # the pending step was given up (timed out, interrupted, failed): step_wait() may keep
        # waiting for it, step_async() finishes and drops it
        self._given_up = False
        batch = num_envs // 2 if alternating else num_envs
        if options.num_workers is None and self.device.type == "cpu" and alternating:
            # the policy runs on this process's cores: leave torch its threads, or the workers
            # and torch fight for the same cores and nothing overlaps (measured on Pong, 2 cores:
            # 1,410 steps/s with 2 workers, 1,840 with 1)
            free = usable_cpus() - torch.get_num_threads()
            options = dataclasses.replace(options, num_workers=max(1, min(num_envs, free)))
        if alternating and EnvSource.of(env_fns).vectorized:
            # each half is whole slices (the even workers', the odd workers'): an even count
            workers = options.num_workers or min(num_envs, usable_cpus())
            options = dataclasses.replace(options, num_workers=max(2, workers + workers % 2))
        super().__init__(
            env_fns,
            autoreset_mode=autoreset_mode,
            options=options,
            batch_size=None if self.forms_batches else batch,
        )
        try:  # the workers run now: an error here (no CUDA for pinned memory) must stop them
            if self.device.type == "cpu":  # the policy's threads share the cores with the workers
                warn_if_torch_oversubscribes(self.num_workers)
            if alternating and self.vectorized:
                self.groups = self._slice_halves()
            elif alternating:
                self.groups = [np.arange(0, num_envs, 2), np.arange(1, num_envs, 2)]
            else:
                self.groups = [np.arange(num_envs)]
            self._group = 0
            self._pin = self.device.type == "cuda"
            self._staging = [self._make_staging() for _ in self.groups]
            self._copy_done: list[Any] = [None for _ in self.groups]
            if not self.forms_batches:  # the batch former batches the spaces per batch
                self.observation_space = batch_space(self.single_observation_space, batch)
        except BaseException:
            self.close(terminate=True)
            raise

    def _slice_halves(self) -> list[np.ndarray]:
        """The two halves over vectorized slices: the even workers' envs, the odd workers'."""
        if self.num_workers % 2:
            raise ValueError(
                f"alternating=True over vectorized slices needs an even num_workers (each half "
                f"is whole slices), got {self.num_workers}"
            )
        halves: list[list[int]] = [[], []]
        for worker in self.pool.workers:
            halves[worker.index % 2].extend(worker.env_indices)
        return [np.array(half, dtype=np.int64) for half in halves]

    def _check_spaces(self) -> None:
        what = "backend='action_server'"
        require_fixed_layout(self.single_observation_space, what, "observation")
        require_fixed_layout(self.single_action_space, what, "action")

    def _make_staging(self) -> Any:
        import torch

        def empty(view: np.ndarray) -> torch.Tensor:
            shape = (self.batch_size, *view.shape[1:])
            tensor = torch.from_numpy(np.empty(shape, dtype=view.dtype))
            return tensor.pin_memory() if self._pin else tensor

        return {
            "obs": _tree_map(empty, self.pool.views.obs),
            "rewards": empty(self.pool.views.rewards),
            "terminations": empty(self.pool.views.terminations),
            "truncations": empty(self.pool.views.truncations),
        }

    def _to_device(self, group: int, ids: np.ndarray) -> tuple[Any, ...]:
        import torch

        views = self.pool.views
        staging = self._staging[group]
        if self._copy_done[group] is not None:
            self._copy_done[group].synchronize()  # the last copy out of this buffer is finished

        def stage(view: np.ndarray, tensor: torch.Tensor) -> torch.Tensor:
            tensor = tensor[: len(ids)]  # a formed batch may hold fewer than the ceiling
            np.take(view, ids, axis=0, out=tensor.numpy())
            if self.device.type == "cpu":
                return tensor.clone()
            return tensor.to(self.device, non_blocking=True)

        obs = _tree_map(stage, views.obs, staging["obs"])
        rewards = stage(views.rewards, staging["rewards"])
        terms = stage(views.terminations, staging["terminations"])
        truncs = stage(views.truncations, staging["truncations"])
        if self._pin:
            event = torch.cuda.Event()
            event.record()
            self._copy_done[group] = event
        return obs, rewards, terms, truncs

    def _result(self, group: int, result: tuple) -> tuple:
        _, _, _, _, infos = result
        ids = infos["env_id"]
        obs, rewards, terms, truncs = self._to_device(group, ids)
        if self.policy_version is not None:
            infos["policy_version"] = self._stamps[ids]
        return obs, rewards, terms, truncs, infos

    def send(self, actions: Any, env_ids: Any) -> None:
        """Start stepping envs ``env_ids`` with ``actions``, stamped with :attr:`policy_version`."""
        super().send(actions, env_ids)
        if self.policy_version is not None:
            self._stamps[np.asarray(env_ids, dtype=np.int64)] = int(self.policy_version)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        # the envs a masked reset resets, stamped -1 once it has checked the mask
        self._reset_mask = None if options is None else options.get("reset_mask")
        return super().reset(seed=seed, options=options)

    def _after_reset(self):
        self._stamps[:] = -1
        self._group = 0
        self._step_pending = self._given_up = False  # a step in flight was finished by reset
        if self.forms_batches:  # as async: a batch of the envs reset first
            obs, _, _, _, infos = self._result(0, self.recv())
            return obs, infos
        ids = self.groups[0]
        obs, _, _, _, infos = self._result(0, self.recv_ids(ids))
        self._last_ids = ids
        return obs, infos

    def _after_masked_reset(self):
        self._stamps[np.asarray(self._reset_mask, dtype=np.bool_)] = -1
        if self._step_pending and self.forms_batches:
            # as below: the envs sent (the batch last returned) finished, their results dropped
            self._discard_results(self._last_ids)
            self._step_pending = self._given_up = False
        elif self._step_pending:
            # a step in flight is discarded, as shm discards it: reset() let it finish, and the
            # envs it sent that were not reset hold its results, which no step_wait() returns
            # (the obs returned here are theirs); the other half's, sent by the step before,
            # stay for the next step_wait()
            self._discard_results(self.groups[self._group])
            self._step_pending = self._given_up = False
        obs, _, _, _, infos = self._result(self._group, self._gather(self._last_ids))
        return obs, infos

    @property
    def pinned_staging(self) -> bool:
        """Whether every host buffer that observations, rewards and flags pass through on their
        way to ``device`` is pinned (page-locked), so that the copies run ``non_blocking``: true
        on a CUDA device, false on the CPU, where nothing is staged."""
        tensors: list[Any] = []
        for staging in self._staging:
            _tree_map(tensors.append, staging)
        return bool(tensors) and all(tensor.is_pinned() for tensor in tensors)

    def peek_obs(self, env_ids: Any) -> Any:
        """The latest observations of envs ``env_ids`` that are not stepping, as tensors on
        ``device``, without receiving them.

        After ``reset()`` with alternation this gives the second half's reset observations,
        which the first ``step`` returns (the ``Sampler`` reads them for ``last_obs``).
        """
        import torch

        self._check_open()
        ids = self._checked_ids(env_ids)
        busy = ids[self._in_flight[ids]]
        if busy.size:
            raise RuntimeError(f"envs {busy.tolist()} are still stepping")
        return _tree_map(
            lambda view: torch.from_numpy(view[ids]).to(self.device), self.pool.views.obs
        )

    def step_async(self, actions: Any) -> None:
        self._check_open()
        self.pool.check_usable()
        if self._last_ids is None:
            raise RuntimeError("call reset() before step()")
        if self._step_pending:
            if not self._given_up:
                raise RuntimeError("step_async() called twice without step_wait() in between")
            self._drop_given_up_step()
        group = self._last_ids if self.forms_batches else self.groups[self._group]
        try:
            self.send(actions, group)
        except KeyboardInterrupt:
            if self._in_flight[group].any():  # sent: a step given up like any other
                self._step_pending = self._given_up = True
            raise
        self._step_pending = True

    def step_wait(self, timeout: float | None = None) -> StepReturn:
        self._check_open()
        if not self._step_pending:
            raise RuntimeError("step_wait() called without a pending step_async()")
        next_group = (self._group + 1) % len(self.groups)
        try:
            if self.forms_batches:  # whichever envs reported, between the floor and the ceiling
                result = self.recv(timeout)
            else:
                result = self.recv_ids(self.groups[next_group], timeout)
        except BaseException:
            # TimeoutError, Ctrl-C, an env error: step_wait() keeps waiting for the step,
            # step_async() finishes and discards it
            self._given_up = True
            raise
        self._group = next_group
        self._step_pending = self._given_up = False
        return self._result(next_group, result)

    def _drop_given_up_step(self) -> None:
        """Finish the step given up and drop its result, as ``shm`` drops a timed-out step: the
        caller then holds the envs that step would have returned (with a floor or a ceiling,
        which envs would have reported is unknown: the caller holds again the envs it sent the
        given-up step's actions to, and the other envs stepping stay for later steps)."""
        next_group = (self._group + 1) % len(self.groups)
        ids = self.groups[next_group]
        if self.forms_batches:
            assert self._last_ids is not None  # a step was sent
            ids = self._last_ids
        try:
            # every env back (or failed) before an error is raised: their bytes must not be
            # taken for a later step's
            self._wait_until(
                lambda: not self._in_flight[ids].any(),
                self.drain_timeout_s,
                "a step that was given up",
                raise_early=False,
            )
        except TimeoutError:
            running = ids[self._in_flight[ids]].tolist()
            raise WorkerError(
                f"envs {running} are still running a step that was given up; call step_wait() "
                "to keep waiting for it, or close() the vector env",
                env_indices=running,
            ) from None
        finally:
            if not self._in_flight[ids].any():  # the step is over, also when it raised
                self._discard_results(ids)
                self._group = next_group
                self._last_ids = ids
                self._step_pending = self._given_up = False


def make_action_server(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: ActionServerOptions | None = None,
    **kwargs: Any,
) -> ActionServerVecEnv:
    """The ``action_server`` backend's factory: ``make_vec`` passes checked ``options``; a direct call
    may pass the options as keywords instead."""
    options = ActionServerOptions.resolve("action_server", options, kwargs)
    return ActionServerVecEnv(env_fns, autoreset_mode=autoreset_mode, options=options)


@hookimpl
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        "action_server",
        make_action_server,
        "workers only simulate; torch tensors on a device; alternating halves overlap sim and policy",
        options=ActionServerOptions,
    )
