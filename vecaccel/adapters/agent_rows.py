"""``MultiAgentVecEnv``: one row per (env, agent) on top of any backend.

The backend runs :class:`vecaccel.adapters.stacked_agents.StackedAgentsEnv` sub-environments (one
PettingZoo env each, its agents stacked in a fixed-size ``Dict`` observation); this vector env
unpacks them into rows, env by env and within an env in ``possible_agents`` order. A row whose agent
is not live holds zeros, reward 0 and both flags False, with ``infos["active"]`` False; an env
resets when all its agents are done, under the backend's autoreset mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from vecaccel.adapters.stacked_agents import zero_row
from vecaccel.errors import WorkerError, WorkerTimeoutError
from vecaccel.spaces import check_actions
from vecaccel.vec_env import (
    AsyncState,
    Capabilities,
    VecEnv,
    batch_infos,
    reset_mask_only,
    split_reset_mask,
)

__all__ = ["MultiAgentVecEnv"]


def _map(fn: Any, tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _map(fn, value) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_map(fn, value) for value in tree)
    return fn(tree)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _numpy(value: Any) -> np.ndarray:
    if _is_tensor(value):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _row_copy(tree: Any, row: int) -> Any:
    """Row ``row`` of every leaf, as NumPy copies (infos hold NumPy arrays on every backend)."""
    return _map(lambda leaf: _numpy(leaf[row]).copy(), tree)


def _span(rows: Sequence[int]) -> str:
    rows = list(rows)
    if len(rows) > 1 and rows == list(range(rows[0], rows[-1] + 1)):
        return f"{rows[0]}..{rows[-1]}"
    return ", ".join(str(row) for row in rows)


class MultiAgentVecEnv(VecEnv):
    """A vector env of PettingZoo envs with one row per (env, agent).

    Made by :func:`vecaccel.make_vec` when ``env`` makes PettingZoo envs; ``num_envs`` is
    ``num_multiagent_envs * agents_per_env``. ``single_observation_space`` and
    ``single_action_space`` are the agents' common spaces.

    Attributes:
        env: the backend's vector env of stacked envs (one sub-environment per PettingZoo env).
        possible_agents: the agents of each env, in row order.
        agents_per_env: rows per env.
        num_multiagent_envs: how many PettingZoo envs.
        row_env: the env index of each row (``np.ndarray`` of ``num_envs``).
        row_agent: the agent name of each row (``np.ndarray`` of ``num_envs`` strings).
        batch_size: rows per step: ``num_envs``, or fewer on backends that return a batch of
            envs (``async``, the action server's alternating halves), each with all its rows.

    Every step and reset, ``infos["active"]`` (mask ``infos["_active"]`` all True) says which
    rows hold a live agent; ``infos["env_id"]`` gives the rows returned on ``async`` and the
    action server. ``reset(seed=s)`` seeds env ``k`` with ``s + k``; a list of seeds has one
    per env (or one per row: the first row of each env counts). ``options["reset_mask"]``
    names rows, whole envs at a time. ``call``/``get_attr`` answer once per row (the value of
    the row's env); ``render()`` once per env. A :class:`vecaccel.WorkerError` names the rows
    of the envs that failed in ``env_indices`` and the envs in ``multiagent_env_indices``.

    Example:
        >>> import vecaccel, numpy as np
        >>> from pettingzoo.butterfly import pistonball_v6
        >>> envs = vecaccel.make_vec(
        ...     pistonball_v6.parallel_env, 2, backend="serial",
        ...     env_kwargs={"n_pistons": 3, "continuous": False},
        ... )
        >>> envs.num_envs, envs.agents_per_env, envs.row_env.tolist()
        (6, 3, [0, 0, 0, 1, 1, 1])
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, infos["active"].all()
        ((6, 457, 120, 3), np.True_)
        >>> obs, rew, term, trunc, infos = envs.step(np.ones(6, dtype=np.int64))
        >>> envs.close()
    """

    def __init__(
        self,
        vec_env: gym.vector.VectorEnv,
        agents: Sequence[str],
        observation_space: gym.Space,
        action_space: gym.Space,
    ) -> None:
        self.env = vec_env
        self.possible_agents = list(agents)
        n = self.agents_per_env = len(self.possible_agents)
        envs = self.num_multiagent_envs = int(vec_env.num_envs)
        self.num_envs = envs * n
        self.row_env = np.repeat(np.arange(envs, dtype=np.int64), n)
        self.row_agent = np.array(self.possible_agents * envs)
        self.env_fns = list(getattr(vec_env, "env_fns", []))
        mode = getattr(vec_env, "autoreset_mode", None)
        if mode is None:
            mode = vec_env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.autoreset_mode = AutoresetMode(mode)
        self.copy = bool(getattr(vec_env, "copy", True))
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.metadata = dict(getattr(vec_env, "metadata", {}) or {})
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = getattr(vec_env, "render_mode", None)
        self.spec = None
        capabilities = Capabilities.of(vec_env)
        self.batch_size = capabilities.batch_size * n
        self.observation_space = batch_space(observation_space, self.batch_size)
        self.action_space = batch_space(action_space, self.batch_size)
        self.returns_envs_in_order = capabilities.in_index_order
        self.alternating = capabilities.alternating
        self.device = getattr(vec_env, "device", None)
        if callable(getattr(vec_env, "recv_ids", None)):
            # backends that return envs as they finish or in halves: SB3 refuses them by this
            self.recv_ids = self._recv_ids
        self._last_envs: np.ndarray | None = None
        self._state = AsyncState.DEFAULT
        self.closed = False

    # -- rows and envs ---------------------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        """The backend's worker processes (0 in-process)."""
        return int(getattr(self.env, "num_workers", 0) or 0)

    def rows_of(self, env_ids: Any) -> np.ndarray:
        """The rows of envs ``env_ids``, env by env.

        Example:
            >>> import numpy as np
            >>> envs = MultiAgentVecEnv.__new__(MultiAgentVecEnv)
            >>> envs.agents_per_env = 2
            >>> envs.rows_of([1, 0]).tolist()
            [2, 3, 0, 1]
        """
        ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        n = self.agents_per_env
        return (ids[:, None] * n + np.arange(n)).reshape(-1)

    def _env_mask(self, reset_mask: np.ndarray) -> np.ndarray:
        per_env = reset_mask.reshape(self.num_multiagent_envs, self.agents_per_env)
        partial = np.flatnonzero(per_env.any(axis=1) & ~per_env.all(axis=1))
        if partial.size:
            k = int(partial[0])
            raise ValueError(
                f"options['reset_mask'] names some rows of env {k} (rows "
                f"{_span(self.rows_of([k]).tolist())}) but not all: an env resets with all its "
                "agents, so name whole envs (all their rows)"
            )
        return per_env.all(axis=1)

    def _translate(self, exc: WorkerError) -> WorkerError:
        envs = [int(k) for k in exc.env_indices]
        rows = self.rows_of(envs).tolist() if envs else []
        where = "; ".join(
            f"multi-agent env {k} is rows {_span(self.rows_of([k]).tolist())}" for k in envs
        )
        message = f"{exc} ({where})" if where else str(exc)
        if isinstance(exc, WorkerTimeoutError):
            error: WorkerError = WorkerTimeoutError(
                message,
                worker_indices=exc.worker_indices,
                env_indices=rows,
                remote_traceback=exc.remote_traceback,
            )
        else:
            error = WorkerError(
                message,
                env_indices=rows,
                remote_traceback=exc.remote_traceback,
                exitcode=exc.exitcode,
                original_type=exc.original_type,
            )
        error.multiagent_env_indices = tuple(envs)
        return error

    def _inner(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except WorkerError as exc:
            raise self._translate(exc) from exc

    # -- reset and step ----------------------------------------------------------------------------

    def _env_seeds(self, seed: Any) -> Any:
        if seed is None or isinstance(seed, (int, np.integer)):
            return seed
        seeds = list(seed)
        if len(seeds) == self.num_multiagent_envs:
            return seeds
        if len(seeds) == self.num_envs:
            return seeds[:: self.agents_per_env]
        raise ValueError(
            f"a list of seeds has one per env ({self.num_multiagent_envs}) or one per row "
            f"({self.num_envs}), got length {len(seeds)}"
        )

    def reset(self, *, seed: Any = None, options: dict | None = None):
        self._check_open()
        reset_mask, options = split_reset_mask(options, self.num_envs)
        if reset_mask is not None:
            env_mask = self._env_mask(reset_mask)
            options = (
                reset_mask_only(env_mask)
                if options is None
                else {
                    **options,
                    "reset_mask": env_mask,
                }
            )
        obs, infos = self._inner(self.env.reset, seed=self._env_seeds(seed), options=options)
        self._state = AsyncState.DEFAULT
        result = self._unpack(obs, None, None, infos)
        return result[0], result[4]

    def step_async(self, actions: Any) -> None:
        self._check_open()
        ids = self._last_envs
        count = self.num_multiagent_envs if ids is None else len(ids)
        n = self.agents_per_env
        if not _is_tensor(actions) and not (
            isinstance(actions, dict) and any(_is_tensor(v) for v in actions.values())
        ):
            rows = None if ids is None else self.rows_of(ids)
            actions = check_actions(self.single_action_space, actions, count * n, rows)
        try:
            stacked = _map(lambda leaf: leaf.reshape(count, n, *leaf.shape[1:]), actions)
        except (RuntimeError, ValueError) as exc:  # a tensor of the wrong size
            raise ValueError(f"step() takes one action per row ({count * n} rows): {exc}") from None
        self._inner(self.env.step_async, stacked)
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, **kwargs: Any):
        self._check_open()
        obs, _, terminated, truncated, infos = self._inner(self.env.step_wait, **kwargs)
        self._state = AsyncState.DEFAULT
        return self._unpack(obs, terminated, truncated, infos)

    def _recv_ids(self, row_ids: Any, timeout: float | None = None):
        """Wait for the envs of rows ``row_ids`` (whole envs) and return their rows."""
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        envs = rows[:: self.agents_per_env] // self.agents_per_env
        if not np.array_equal(self.rows_of(envs), rows):
            raise ValueError(f"recv_ids takes whole envs (all their rows), got rows {rows}")
        obs, _, terminated, truncated, infos = self._inner(self.env.recv_ids, envs, timeout)
        return self._unpack(obs, terminated, truncated, infos)

    def peek_obs(self, row_ids: Any) -> Any:
        """The latest observations of rows ``row_ids`` whose envs are not stepping (the action
        server's ``peek_obs``, by rows)."""
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        envs = np.unique(self.row_env[rows])
        stacked = self._inner(self.env.peek_obs, envs)["obs"]
        n = self.agents_per_env
        position = {int(k): p for p, k in enumerate(envs.tolist())}
        index = [position[int(self.row_env[r])] * n + int(r) % n for r in rows]
        return _map(lambda leaf: leaf.reshape(len(envs) * n, *leaf.shape[2:])[index], stacked)

    def _unpack(self, obs: Any, inner_term: Any, inner_trunc: Any, infos: dict):
        n = self.agents_per_env
        env_ids = infos.get("env_id")
        if env_ids is not None:
            env_ids = np.asarray(env_ids, dtype=np.int64)
            self._last_envs = env_ids
        count = self.num_multiagent_envs if env_ids is None else len(env_ids)
        size = count * n
        rows_obs = _map(lambda leaf: leaf.reshape(size, *leaf.shape[2:]), obs["obs"])
        reward = _numpy(obs["reward"]).reshape(size).astype(np.float64)
        terminated = _numpy(obs["terminated"]).reshape(size).astype(np.bool_)
        truncated = _numpy(obs["truncated"]).reshape(size).astype(np.bool_)
        active = _numpy(obs["active"]).reshape(size).astype(np.bool_)
        row_infos: dict[int, dict] = {}
        finals: dict[int, tuple[Any, dict]] = {}
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        agent_infos = infos.get("agents")
        agents_mask = infos.get("_agents")
        ended = np.zeros(count, dtype=np.bool_)
        restarted = np.zeros(count, dtype=np.bool_)
        if inner_term is not None:
            restarted = _numpy(inner_trunc).astype(np.bool_)
            ended = _numpy(inner_term).astype(np.bool_) | restarted
        for p in np.flatnonzero(ended).tolist():
            rows = slice(p * n, (p + 1) * n)
            if restarted[p]:
                reason = infos.get("restart_reason")
                extra = {"worker_restarted": True}
                if reason is not None:
                    extra["restart_reason"] = reason[p]
                reward[rows], terminated[rows], truncated[rows], active[rows] = 0, 0, 1, 1
                for row in range(p * n, (p + 1) * n):
                    row_infos[row] = dict(extra)
                    if same_step:  # the env's observation after its rebuild
                        finals[row] = (_row_copy(infos["final_obs"][p]["obs"], row - p * n), extra)
            elif same_step:
                final = infos["final_obs"][p]  # the stacked env's last observation
                reward[rows] = final["reward"]
                terminated[rows] = final["terminated"].astype(np.bool_)
                truncated[rows] = final["truncated"].astype(np.bool_)
                active[rows] = final["active"].astype(np.bool_)
                final_infos = infos["final_info"]["agents"][p].infos
                for i in range(n):
                    row = p * n + i
                    if active[row] and (terminated[row] or truncated[row]):
                        finals[row] = (_row_copy(final["obs"], i), final_infos[i])
        if same_step:
            # an agent that finished while its env plays on: its last observation is the final
            # one, and its row holds zeros from now on, as every row of an agent not live
            dying = np.flatnonzero((terminated | truncated) & ~np.repeat(ended, n))
            for row in dying.tolist():
                position = row // n
                info = {}
                if agent_infos is not None and agents_mask[position]:
                    info = agent_infos[position].infos[row % n]
                finals[row] = (_row_copy(rows_obs, row), info)
                zero_row(rows_obs, row)
        if agent_infos is not None:
            for p in np.flatnonzero(agents_mask).tolist():
                # SAME_STEP: an env that reset in this step brought its agents' reset infos
                reset_now = same_step and ended[p] and not restarted[p]
                for i, info in enumerate(agent_infos[p].infos):
                    row = p * n + i
                    if info and (reset_now or (active[row] and row not in finals)):
                        row_infos[row] = {**info, **row_infos.get(row, {})}
        if _is_tensor(obs["reward"]):  # the action server: tensors on its device
            import torch

            device = obs["reward"].device
            reward, terminated, truncated = (
                torch.from_numpy(value).to(device) for value in (reward, terminated, truncated)
            )
        batched = self._batch_rows(size, row_infos, finals)
        batched["active"] = active
        batched["_active"] = np.ones(size, dtype=np.bool_)
        if env_ids is not None:
            batched["env_id"] = self.rows_of(env_ids)
        return rows_obs, reward, terminated, truncated, batched

    def _batch_rows(self, size: int, row_infos: dict[int, dict], finals: dict) -> dict:
        pairs = []
        for row in sorted(set(row_infos) | set(finals)):
            info = dict(row_infos.get(row, {}))
            if row in finals:
                final_obs, final_info = finals[row]
                info["final_obs"] = final_obs
                info["final_info"] = dict(final_info)
            pairs.append((row, info))
        return batch_infos(pairs, size)  # over the rows returned

    # -- the envs' attributes ----------------------------------------------------------------------

    def call_indices(self, name, indices, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name`` once in each env of rows ``indices``; one answer per row."""
        self._check_open()
        rows = self._normalize_indices(indices)
        envs = sorted({int(self.row_env[row]) for row in rows})
        if not envs:
            return ()
        answers = self._inner(self.env.call_indices, name, envs, *args, **kwargs)
        by_env = dict(zip(envs, answers))
        return tuple(by_env[int(self.row_env[row])] for row in rows)

    def set_attr_indices(self, name: str, values: Any, indices) -> None:
        """Set ``name`` in the envs of rows ``indices`` (the first row of each env decides)."""
        self._check_open()
        rows = self._normalize_indices(indices)
        values = self._values_for(values, len(rows))
        chosen: dict[int, Any] = {}
        for row, value in zip(rows, values):
            chosen.setdefault(int(self.row_env[row]), value)
        if chosen:
            self._inner(self.env.set_attr_indices, name, list(chosen.values()), list(chosen))

    def render(self):
        """One frame per env (not per row)."""
        return self._inner(self.env.render)

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close(**kwargs)

    def __repr__(self) -> str:
        return (
            f"MultiAgentVecEnv({self.env!r}, num_envs={self.num_envs}, "
            f"agents_per_env={self.agents_per_env})"
        )
