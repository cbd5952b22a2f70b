"""The sampler: drive a policy over a vector env and return time-major ``[T, B, ...]`` batches.

This module imports torch; ``vecaccel.Sampler`` loads it lazily so ``import vecaccel`` does not.

Autoreset modes. A batch means the same thing whatever the env's autoreset mode:

- ``SAME_STEP`` (preferred, no step is wasted): a done step returns the next episode's first
  observation, and the true final observation comes from ``infos["final_obs"]``.
- ``NEXT_STEP`` (Gymnasium's default): the step after a done resets the env, ignores the
  action and returns reward 0. The sampler marks that row ``valid=False``; losses must mask it.
  The done step's returned observation is the final one and lands in the next row of ``obs``.
- ``DISABLED``: the sampler resets the done envs itself with ``reset_mask`` right away, which
  gives the ``SAME_STEP`` layout.

Backends. Envs that return every env from each step (``serial``, ``shm``, ``action_server``
without alternation) fill row ``t`` with step ``t``. With the action server's alternating halves
(``alternating=True``) each ``step`` serves one half while the other simulates; the sampler
keeps each env's own row counter, so every env's time series is exactly the one a ``serial`` env
would give for the same actions (the half that finishes first acts once more, and that action
becomes its row 0 of the next batch). Backends that return envs in no fixed order (``async``
with ``batch_size < num_envs``) are refused with a ``ValueError``.

Multi-agent envs. An env that reports ``infos["active"]`` (one row per agent, False where the
agent is not live: dead before the others or not yet spawned) gets that mask in
``batch.active`` (``[T, B]``: the row's agent took part in step ``t``, its terminal step
included), and episode lengths count live steps only. For other envs ``batch.active`` is all
True.

In every mode ``batch.final_obs[k]`` is the true last observation of the episode that was
*truncated* (and not terminated) at ``(batch.final_index[k, 0], batch.final_index[k, 1])``,
``(t, b)``, so trainers can bootstrap truncations from ``V(final_obs)`` and terminations from 0.

Example:
    >>> import torch, vecaccel
    >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial", autoreset_mode="SameStep")
    >>> def policy(obs):
    ...     return torch.zeros(obs.shape[0], dtype=torch.int64), {"value": obs.sum(-1)}
    >>> sampler = vecaccel.Sampler(envs, policy, horizon=16, seed=0)
    >>> batch = sampler.collect()
    >>> batch.obs.shape, batch.rewards.shape, batch.extras["value"].shape, batch.next_obs.shape
    (torch.Size([16, 2, 4]), torch.Size([16, 2]), torch.Size([16, 2]), torch.Size([2, 4]))
    >>> envs.close()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from vecaccel.spaces.payload import require_fixed_layout
from vecaccel.vec_env import Capabilities

__all__ = ["EpisodeStats", "SampleBatch", "Sampler"]

Policy = Callable[[torch.Tensor], tuple[torch.Tensor, Mapping[str, torch.Tensor]]]


class SampleBatch(NamedTuple):
    """One rollout, time-major, every tensor on the sampler's device.

    The tensors are the sampler's preallocated buffers: the next ``collect()`` overwrites them,
    so ``clone()`` what must outlive it.
    """

    obs: torch.Tensor
    """``[T, B, *obs_shape]`` observations the policy acted on."""
    actions: torch.Tensor
    """``[T, B, *action_shape]`` the policy's actions."""
    rewards: torch.Tensor
    """``[T, B]`` float32 rewards."""
    terminated: torch.Tensor
    """``[T, B]`` bool: the episode ended in a terminal state at this step (no bootstrap)."""
    truncated: torch.Tensor
    """``[T, B]`` bool: the episode was cut at this step (bootstrap from ``final_obs``)."""
    valid: torch.Tensor
    """``[T, B]`` bool: False only for ``NEXT_STEP`` reset steps, which are no transition."""
    extras: dict[str, torch.Tensor]
    """The policy's extras (``log_prob``, ``value``...), each ``[T, B, ...]``."""
    next_obs: torch.Tensor
    """``[B, *obs_shape]`` the observation after the last step (the bootstrap observation)."""
    final_obs: torch.Tensor
    """``[K, *obs_shape]`` true final observations of the truncated (not terminated) steps."""
    final_index: torch.Tensor
    """``[K, 2]`` int64 ``(t, b)`` of each row of ``final_obs``."""
    active: torch.Tensor | None = None
    """``[T, B]`` bool ``infos["active"]`` of each step: True where the row's agent took part,
    its terminal step included (all True for an env that reports no such mask; ``None`` in
    batches made by hand, meaning the same)."""

    @property
    def horizon(self) -> int:
        """``T``."""
        return self.rewards.shape[0]

    @property
    def num_envs(self) -> int:
        """``B``."""
        return self.rewards.shape[1]


class EpisodeStats(NamedTuple):
    """Returns and lengths of the episodes that ended since the last ``pop_episodes()``."""

    returns: list[float]
    lengths: list[int]


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class Sampler:
    """Steps ``env`` with ``policy`` and returns ``[T, B, ...]`` :class:`SampleBatch` es.

    Buffers are allocated once: observations from the first observation, actions and extras
    from the policy's first output. The env is reset (with ``seed``) when the sampler is made.

    Args:
        env: a ``gymnasium.vector.VectorEnv`` (any vecaccel backend). Its ``reset``/``step``
            may return NumPy arrays or torch tensors; actions are handed back in the same kind
            (NumPy on the CPU, or tensors as the policy produced them).
        policy: any callable ``obs -> (actions, extras)`` taking a ``[B, ...]`` tensor on
            ``device`` (an ``nn.Module`` included); called under ``torch.no_grad()``.
        horizon: ``T``, steps per env per ``collect()``.
        device: where the batch lives.
        seed: seed for the first ``env.reset`` (``None``: unseeded).
        episode_stats: where finished-episode returns and lengths come from: ``"infos"``
            (``RecordEpisodeStatistics``' ``info["episode"]``; the real score when reward
            clipping or life-loss terminals sit above it), ``"rewards"`` (the sampler's own sums
            of the rewards it sees), or ``"auto"`` (infos once one has appeared, else rewards).
        clip_actions: clip actions of a ``Box`` action space to its bounds before they reach
            the env, as SB3 and CleanRL do (the batch keeps the policy's own actions, whose
            log-probabilities the losses need).

    Raises:
        ValueError: for a non-positive horizon or an unknown ``episode_stats``.
        TypeError: if observations are not arrays (dict/tuple spaces are not supported), or
            (before the env is reset) a space has a leaf with no fixed size (``Text``,
            ``Graph``...; see :func:`vecaccel.spaces.payload.require_fixed_layout`).
    """

    def __init__(
        self,
        env: Any,
        policy: Policy,
        horizon: int,
        device: str | torch.device = "cpu",
        seed: int | Sequence[int] | None = None,
        episode_stats: str = "auto",
        clip_actions: bool = True,
    ) -> None:
        if int(horizon) < 1:
            raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
        if episode_stats not in ("auto", "infos", "rewards"):
            raise ValueError(
                f"episode_stats must be 'auto', 'infos' or 'rewards', got {episode_stats!r}"
            )
        for kind in ("observation", "action"):
            space = getattr(env, f"single_{kind}_space", None)
            if space is not None:
                require_fixed_layout(space, "the Sampler", kind)
        self.env = env
        self.policy = policy
        self.horizon = int(horizon)
        self.device = torch.device(device)
        self.num_envs = int(env.num_envs)
        mode = getattr(env, "metadata", {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.autoreset_mode = AutoresetMode(mode)
        self.episode_stats = episode_stats
        self._infos_seen = episode_stats == "infos"
        self.total_steps = 0
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._policy_versions: np.ndarray | None = None

        capabilities = Capabilities.of(env)
        batch_size = capabilities.batch_size
        if not capabilities.fixed_batch:
            raise ValueError(
                f"the Sampler needs a fixed batch; this env returns between "
                f"{capabilities.min_batch_size} and {batch_size} envs per step (a floor below "
                "the ceiling): give it batch_size instead"
            )
        if batch_size != self.num_envs and not capabilities.alternating:
            raise ValueError(
                f"the Sampler needs every env back from each step, or the action server's "
                f"alternating halves; this env returns {batch_size} of {self.num_envs} envs "
                "per step in no fixed order"
            )
        if not capabilities.in_index_order and not capabilities.alternating:
            raise ValueError(
                f"{type(env).__name__} returns its envs in the order they finish; the Sampler "
                "needs every env in index order each step (a lock-step backend such as shm, or "
                "the action server)"
            )
        if capabilities.alternating and self.autoreset_mode is AutoresetMode.DISABLED:
            raise ValueError("alternating envs need autoreset (SameStep or NextStep)")
        self._all_ids = np.arange(self.num_envs)
        self._alternating = capabilities.alternating

        obs, infos = env.reset(seed=seed)
        self._tensor_env = isinstance(obs, torch.Tensor)
        self._bounds = None  # (low, high) that actions are clipped to, where there are any
        space = getattr(env, "single_action_space", None)
        if clip_actions and isinstance(space, gym.spaces.Box):
            low, high = space.low, space.high
            if self._tensor_env:
                device = obs.device
                low = torch.as_tensor(low, device=device)
                high = torch.as_tensor(high, device=device)
            self._bounds = (low, high)
        example = self._as_tensor(obs)
        T, B = self.horizon, self.num_envs
        ids = self._group_of(infos)
        if example.shape[0] != len(ids):
            raise ValueError(f"env returned {example.shape[0]} observations for {len(ids)} envs")
        shape = example.shape[1:]
        self._obs = torch.zeros((T, B, *shape), dtype=example.dtype, device=self.device)
        self._next_obs = torch.zeros((B, *shape), dtype=example.dtype, device=self.device)
        self._rewards = torch.zeros((T, B), dtype=torch.float32, device=self.device)
        self._terminated = torch.zeros((T, B), dtype=torch.bool, device=self.device)
        self._truncated = torch.zeros((T, B), dtype=torch.bool, device=self.device)
        self._valid = torch.ones((T, B), dtype=torch.bool, device=self.device)
        # multi-agent envs' infos["active"]; stays all True for an env without it
        self._active = torch.ones((T, B), dtype=torch.bool, device=self.device)
        self._actions: torch.Tensor | None = None
        self._extras: dict[str, torch.Tensor] = {}
        self._final_obs: list[torch.Tensor] = []
        self._final_index: list[tuple[int, int]] = []
        # NumPy views of the CPU buffers: a NumPy env's results are written with NumPy row
        # assignments, a fraction of a torch op's dispatch each (a CartPole step is microseconds)
        self._numpy_rows = self.device.type == "cpu" and not self._tensor_env
        if self._numpy_rows:
            self._active_np = self._active.numpy()
            self._obs_np = self._obs.numpy()
            self._next_obs_np = self._next_obs.numpy()
            self._rewards_np = self._rewards.numpy()
            self._terminated_np = self._terminated.numpy()
            self._truncated_np = self._truncated.numpy()
        self._start(ids, example)

    # -- public API ---------------------------------------------------------------------------

    def reset(self, seed: int | Sequence[int] | None = None, options: dict | None = None) -> None:
        """Reset every env (e.g. with a fresh seed); running episodes are dropped, not logged."""
        obs, infos = self.env.reset(seed=seed, options=options)
        self._start(self._group_of(infos), self._as_tensor(obs))

    def pop_episodes(self) -> EpisodeStats:
        """Return and forget the returns and lengths of episodes finished so far."""
        stats = EpisodeStats(self._returns, self._lengths)
        self._returns, self._lengths = [], []
        return stats

    @property
    def policy_versions(self) -> np.ndarray | None:
        """``[T, B]`` int64: the policy version each row's action was sent under, for an env that
        stamps its answers (``infos["policy_version"]``: the action server once its
        ``policy_version`` is set); ``None`` for one that does not. With alternating halves a
        half's row 0 may be older than the rest: it was acted on at the end of the last batch.
        The next ``collect()`` overwrites it."""
        return self._policy_versions

    @property
    def last_obs(self) -> torch.Tensor:
        """``[B, ...]`` each env's latest observation (the last batch's ``next_obs``)."""
        return self._next_obs

    @torch.no_grad()
    def collect(self) -> SampleBatch:
        """Run ``horizon`` steps in every env and return the batch (see :class:`SampleBatch`).

        A ``collect()`` interrupted in the policy (Ctrl-C, an exception the caller handles)
        leaves the sampler where the env is: the next one continues from the env's latest
        observations. One interrupted in the env's ``step`` (or ``reset``) leaves the env in a
        state the sampler cannot know, so ``collect()`` raises ``RuntimeError`` until
        :meth:`reset`.
        """
        if self._needs_reset:
            raise RuntimeError(
                "a previous collect() was interrupted inside the env's step, so the sampler's "
                "observations no longer match the env's; call reset() first"
            )
        self._final_obs = []
        self._final_index = []
        if self._alternating:
            self._collect_groups()
        else:
            self._collect_lockstep()
        self.total_steps += self.horizon * self.num_envs

        assert self._actions is not None
        order = sorted(range(len(self._final_index)), key=self._final_index.__getitem__)
        if order:
            final_obs = torch.stack([self._final_obs[i] for i in order])
        else:
            final_obs = self._next_obs.new_empty((0, *self._next_obs.shape[1:]))
        final_index = torch.tensor(
            [self._final_index[i] for i in order], dtype=torch.int64, device=self.device
        )
        return SampleBatch(
            obs=self._obs,
            actions=self._actions,
            rewards=self._rewards,
            terminated=self._terminated,
            truncated=self._truncated,
            valid=self._valid,
            extras=dict(self._extras),
            next_obs=self._next_obs,
            final_obs=final_obs,
            final_index=final_index.reshape(-1, 2),
            active=self._active,
        )

    def _collect_lockstep(self) -> None:
        """Every env acts and comes back on every step: row ``t`` is step ``t``."""
        everyone = slice(None)
        numpy_rows = self._numpy_rows
        # row assignment copies into the buffers: NumPy's for a NumPy env on CPU, else torch's
        obs_rows, next_obs = (
            (self._obs_np, self._next_obs_np) if numpy_rows else (self._obs, self._next_obs)
        )
        obs = next_obs
        in_env = False  # between env.step and its results being recorded
        try:
            for t in range(self.horizon):
                obs_rows[t] = obs
                actions, extras = self.policy(self._obs[t])
                self._store_policy_output(t, everyone, actions, extras)
                in_env = True
                result = self.env.step(self._env_actions(actions))
                self._check_in_order(result[4])
                obs = self._record(t, self._all_ids, everyone, result)
                if not numpy_rows:
                    obs = self._as_tensor(obs)
                in_env = False
        except BaseException:
            # interrupted: every step taken so far is recorded (episode sums, NEXT_STEP resets),
            # so keep the latest observation for the next collect(); within a step, give up
            self._needs_reset = in_env
            if not in_env and obs is not next_obs:
                next_obs[...] = obs
            raise
        next_obs[...] = obs
        self._group_obs = self._next_obs

    def _collect_groups(self) -> None:
        """Fixed groups of envs take turns (the action server's alternating halves).

        Each step sends the actions of the group whose observation came back last and returns
        the results of the other group, so each group's rows fill at their own pace. A group
        that finishes its ``horizon`` rows first must still act, so that the results of the
        others come back; that action is the group's row 0 of the next batch.
        """
        T = self.horizon
        rows = np.zeros(self.num_envs, dtype=np.int64)  # transitions recorded per env
        in_flight = np.zeros(self.num_envs, dtype=bool)  # acted, results not back yet
        if self._stash is not None:
            stash_ids, stash_obs, stash_actions, stash_extras = self._stash
            index = self._index(stash_ids)
            self._obs[0, index] = stash_obs
            self._store_policy_output(0, index, stash_actions, stash_extras)
            in_flight[stash_ids] = True
            self._stash = None
        ids, obs = self._group_ids, self._group_obs
        in_env = False  # between env.step and its results being recorded
        try:
            while True:
                row = int(rows[ids[0]])
                actions, extras = self.policy(obs)
                if row < T:
                    index = self._index(ids)
                    self._obs[row, index] = obs
                    self._store_policy_output(row, index, actions, extras)
                else:
                    self._stash = (
                        ids,
                        obs.clone(),
                        torch.as_tensor(actions).clone(),  # a NumPy policy's actions too
                        {key: torch.as_tensor(value).clone() for key, value in extras.items()},
                    )
                in_flight[ids] = True
                in_env = True
                result = self.env.step(self._env_actions(actions))
                ids = self._group_of(result[4])
                acted = in_flight[ids]
                if not acted.any():  # a group's first observation after a reset
                    obs = self._as_tensor(result[0])
                    in_env = False
                    continue
                row = int(rows[ids[0]])
                if not acted.all() or row >= T or (rows[ids] != row).any():
                    raise RuntimeError(
                        "the env returned envs in an order the Sampler does not support (every "
                        "env per step, or the action server's fixed alternating halves)"
                    )
                obs = self._as_tensor(self._record(row, ids, self._index(ids), result))
                rows[ids] += 1
                in_flight[ids] = False
                in_env = False
                if rows[ids[0]] == T:
                    self._next_obs[self._index(ids)] = obs
                    if (rows == T).all():
                        break
        except BaseException:
            self._needs_reset = in_env
            if not in_env:
                self._keep_groups_current(ids, obs, rows, in_flight)
            raise
        self._group_ids, self._group_obs = ids, obs

    def _keep_groups_current(
        self, ids: np.ndarray, obs: torch.Tensor, rows: np.ndarray, in_flight: np.ndarray
    ) -> None:
        """After a ``_collect_groups`` interrupted outside the env: continue from here.

        The env holds ``ids`` (observation ``obs``, not acted on); the group in flight acted on
        its row ``rows[...]``, whose results the next ``collect()`` receives, so that row becomes
        the stash that is row 0 of the next batch.
        """
        self._group_ids, self._group_obs = ids, obs
        self._next_obs[self._index(ids)] = obs
        acted = np.flatnonzero(in_flight)
        if acted.size == 0:  # no group in flight: only after a reset, before any step
            self._stash = None
            return
        row = int(rows[acted[0]])
        if row >= self.horizon:  # acted past the horizon: already stashed
            return
        assert self._actions is not None
        index = self._index(acted)
        stash_obs = self._obs[row, index].clone()
        self._stash = (
            acted,
            stash_obs,
            self._actions[row, index].clone(),
            {key: buffer[row, index].clone() for key, buffer in self._extras.items()},
        )
        self._next_obs[index] = stash_obs  # their latest observation

    def _record(self, row: int, ids: np.ndarray, index: slice | torch.Tensor, result: tuple) -> Any:
        """Write one step's results for envs ``ids`` into ``row``; return their next obs.

        The obs is returned as the env gave it (an array or a tensor), after the resets of a
        ``DISABLED`` env.
        """
        obs, rewards, terminated, truncated, infos = result
        terminated_np = _to_numpy(terminated).astype(bool, copy=False)
        truncated_np = _to_numpy(truncated).astype(bool, copy=False)
        rewards_np = _to_numpy(rewards)
        if self._numpy_rows and isinstance(index, slice):
            self._rewards_np[row] = rewards_np
            self._terminated_np[row] = terminated_np
            self._truncated_np[row] = truncated_np
        else:
            self._write(self._rewards, row, index, rewards)
            self._write(self._terminated, row, index, terminated)
            self._write(self._truncated, row, index, truncated)
        next_step = self.autoreset_mode is AutoresetMode.NEXT_STEP
        if next_step:
            valid_np = ~self._pending_reset[ids]
            self._write(self._valid, row, index, valid_np)
            done_np = (terminated_np | truncated_np) & valid_np
            rewards_np = np.where(valid_np, rewards_np, 0.0)
        else:
            valid_np = None
            done_np = terminated_np | truncated_np
        active_np = self._record_active(infos, row, index)
        versions = infos.get("policy_version") if isinstance(infos, dict) else None
        if versions is not None:
            if self._policy_versions is None:
                shape = (self.horizon, self.num_envs)
                self._policy_versions = np.full(shape, -1, dtype=np.int64)
            self._policy_versions[row, ids] = versions
        if active_np is not None:  # an agent not live takes no step
            valid_np = active_np if valid_np is None else valid_np & active_np
        self._episode_return[ids] += rewards_np
        self._episode_length[ids] += 1 if valid_np is None else valid_np

        if done_np.any():
            truncations = truncated_np & ~terminated_np
            if valid_np is not None:
                truncations &= valid_np
            # before a DISABLED reset: a vector RecordEpisodeStatistics' `_episode` mask is
            # its own array, which the reset clears
            self._finish_episodes(ids, done_np, infos)
            for position in np.flatnonzero(truncations):
                if self.autoreset_mode is AutoresetMode.SAME_STEP:
                    final = self._final_obs_from_infos(infos, int(position))
                else:  # NEXT_STEP, DISABLED: the step's own observation is the last one
                    final = obs[int(position)]
                # a copy, taken before a DISABLED reset: an env made with copy=False returns
                # views that its next step or reset overwrites
                self._final_obs.append(self._as_tensor(final).clone())
                self._final_index.append((row, int(ids[position])))
            if self.autoreset_mode is AutoresetMode.DISABLED:
                mask = np.zeros(self.num_envs, dtype=bool)
                mask[ids[done_np]] = True
                obs, _ = self.env.reset(options={"reset_mask": mask})
        if next_step:
            self._pending_reset[ids] = done_np
        return obs

    def _record_active(self, infos: Any, row: int, index: Any) -> np.ndarray | None:
        """Write ``infos["active"]`` into ``row`` of ``batch.active``; returns it (``None`` for an
        env that reports no such mask)."""
        active = infos.get("active") if isinstance(infos, dict) else None
        if active is None:
            return None
        active_np = _to_numpy(active).astype(bool, copy=False).reshape(-1)
        if self._numpy_rows and isinstance(index, slice):
            self._active_np[row] = active_np
        else:
            self._write(self._active, row, index, active_np)
        return active_np

    def _start(self, ids: np.ndarray, obs: torch.Tensor) -> None:
        # the group whose observation is current (all envs unless they alternate)
        self._group_ids, self._group_obs = ids, obs
        self._next_obs[self._index(ids)] = obs
        if len(ids) < self.num_envs:
            # the other half's reset observations: its first step returns them, but last_obs
            # is every env's latest observation now; the action server has them in memory
            peek = getattr(self.env, "peek_obs", None)
            if peek is not None:
                rest = np.setdiff1d(self._all_ids, ids)
                self._next_obs[self._index(rest)] = self._as_tensor(peek(rest))
        self._stash: tuple | None = None
        self._needs_reset = False  # a collect() was interrupted inside an env step
        self._reset_accumulators()

    def _reset_accumulators(self) -> None:
        self._episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int64)
        # NEXT_STEP: True where the env's next step is a reset step that ignores the action
        self._pending_reset = np.zeros(self.num_envs, dtype=bool)

    def _as_tensor(self, value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            tensor = value
        else:
            array = np.asarray(value)
            if array.dtype == object:
                raise TypeError(
                    "the Sampler supports array observations only (Box/Discrete/MultiDiscrete "
                    f"spaces), got {type(value).__name__}"
                )
            tensor = torch.from_numpy(array)
        return tensor.to(self.device, dtype=dtype, non_blocking=True)

    def _index(self, ids: np.ndarray) -> slice | torch.Tensor:
        if len(ids) == self.num_envs:
            return slice(None)  # envs come back in order: plain row writes, no gather
        return torch.as_tensor(ids, device=self.device)

    def _store_policy_output(
        self,
        row: int,
        index: slice | torch.Tensor,
        actions: torch.Tensor,
        extras: Mapping[str, torch.Tensor],
    ) -> None:
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(np.asarray(actions))
        if self._actions is None:
            self._actions = torch.empty(
                (self.horizon, self.num_envs, *actions.shape[1:]),
                dtype=actions.dtype,
                device=self.device,
            )
        self._write(self._actions, row, index, actions)
        for key, value in extras.items():
            buffer = self._extras.get(key)
            if buffer is None:
                value = torch.as_tensor(value)
                buffer = torch.empty(
                    (self.horizon, self.num_envs, *value.shape[1:]),
                    dtype=value.dtype,
                    device=self.device,
                )
                self._extras[key] = buffer
            self._write(buffer, row, index, value)

    def _check_in_order(self, infos: Any) -> None:
        """A lock-step batch must hold every env in index order (the async backend returns
        its envs in the order they finish: a column would mix several envs' trajectories)."""
        env_id = infos.get("env_id") if isinstance(infos, dict) else None
        if env_id is not None and not np.array_equal(_to_numpy(env_id), self._all_ids):
            raise ValueError(
                f"the env returned its envs in the order {_to_numpy(env_id).tolist()}; the "
                "Sampler needs every env in index order each step (a lock-step backend such "
                "as shm, or the action server)"
            )

    def _group_of(self, infos: Any) -> np.ndarray:
        env_id = infos.get("env_id") if isinstance(infos, dict) else None
        if env_id is None:
            return self._all_ids
        return _to_numpy(env_id).astype(np.int64, copy=False).reshape(-1)

    def _write(self, buffer: torch.Tensor, row: int, index: Any, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            value = torch.from_numpy(np.asarray(value))
        if isinstance(index, slice):
            buffer[row].copy_(value, non_blocking=True)  # converts the dtype on the way
        else:
            buffer[row, index] = value.to(self.device, buffer.dtype)

    def _env_actions(self, actions: Any) -> Any:
        bounds = self._bounds
        if self._tensor_env:
            if bounds is not None:
                if not isinstance(actions, torch.Tensor):
                    # a NumPy policy: clamped as a tensor on the env's device (torch.clamp
                    # takes no array), which a tensor env takes as any tensor policy's actions
                    actions = torch.as_tensor(np.asarray(actions), device=bounds[0].device)
                actions = torch.clamp(
                    actions, bounds[0].to(actions.dtype), bounds[1].to(actions.dtype)
                )
            return actions
        if isinstance(actions, torch.Tensor):
            actions = actions.cpu().numpy()
        else:
            actions = np.asarray(actions)
        if bounds is not None:
            actions = np.clip(actions, bounds[0], bounds[1]).astype(actions.dtype, copy=False)
        return actions

    def _final_obs_from_infos(self, infos: dict, index: int) -> Any:
        try:
            final = infos["final_obs"]
        except KeyError:
            raise RuntimeError(
                "SAME_STEP env reported a truncation without infos['final_obs']"
            ) from None
        return final[index]

    def _finish_episodes(self, ids: np.ndarray, done: np.ndarray, infos: dict) -> None:
        episode_source = infos
        if self.autoreset_mode is AutoresetMode.SAME_STEP and "episode" not in infos:
            # per-env RecordEpisodeStatistics: in the final infos; Gymnasium's vector
            # RecordEpisodeStatistics puts `episode` at the top level in every mode
            episode_source = infos.get("final_info", {})
        episode = episode_source.get("episode") if isinstance(episode_source, dict) else None
        if episode is not None and self.episode_stats != "rewards":
            self._infos_seen = True
            mask = episode_source.get("_episode", np.ones(len(ids), dtype=bool))
            returns, lengths = _to_numpy(episode["r"]), _to_numpy(episode["l"])
            for position in np.flatnonzero(_to_numpy(mask)):
                self._returns.append(float(returns[position]))
                self._lengths.append(int(lengths[position]))
        finished = ids[done]
        if not self._infos_seen:
            # an episode cut short by a worker restart is no episode result: leave it out
            restarted = _to_numpy(infos.get("_worker_restarted", np.zeros(len(ids), dtype=bool)))
            for b in ids[done & ~restarted.astype(bool)]:
                self._returns.append(float(self._episode_return[b]))
                self._lengths.append(int(self._episode_length[b]))
        self._episode_return[finished] = 0.0
        self._episode_length[finished] = 0
