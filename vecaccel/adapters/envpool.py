"""EnvPool as a source of vector envs: its C++ batched simulators under Gymnasium's vector contract.

:func:`envpool_vector_fn` gives a vector env function (``fn(n) -> VectorEnv``) for an EnvPool
task, to hand to ``make_vec(..., vectorized=True)``: each worker then steps its own EnvPool of
its slice's size, writing the batch into shared memory. The adapter,
:class:`EnvPoolVectorEnv`, gives an EnvPool env what the contract asks that EnvPool leaves out:

* **seeds**: EnvPool seeds env ``i`` with ``seed + i`` when it is built and ignores the seed of
  ``reset``; a seeded ``reset(seed=s)`` here rebuilds the pool with ``seed=s``. A slice of
  envs ``start..`` reset with ``seed + start`` (what a vecaccel worker does) thus gets the
  seeds one EnvPool of all the envs would give them.
* **infos**: batched with Gymnasium's ``_key`` masks; EnvPool's ``env_id`` and ``players``
  (its own bookkeeping) are left out.
* **partial resets**: ``options={"reset_mask": mask}`` resets those envs through EnvPool's
  ``env_id`` and returns every env's observation.
* **autoreset**: EnvPool resets an env on the step after its episode ends:
  ``AutoresetMode.NEXT_STEP``, declared in ``metadata``.
* **episode scores** (``episode_scores=True``): ``info["episode"]`` with ``r`` (the return),
  ``l`` (the length) and an ``_episode`` mask when a *whole game* ends, as Gymnasium's vector
  ``RecordEpisodeStatistics`` gives them. For Atari the return sums EnvPool's unclipped
  ``info["reward"]`` and a game ends at ``info["terminated"]`` (not at a lost life), so the
  scores stay true with ``reward_clip=True`` and ``episodic_life=True``.

EnvPool is imported only when a pool is built: ``pip install vecaccel[envpool]``.

Example:
    >>> import pytest; envpool = pytest.importorskip("envpool")
    >>> import vecaccel
    >>> fn = envpool_vector_fn("CartPole-v1")
    >>> envs = vecaccel.make_vec(fn, 8, backend="shm", num_workers=2, vectorized=True)
    >>> obs, infos = envs.reset(seed=0)
    >>> obs.shape
    (8, 4)
    >>> envs.close()
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

__all__ = ["EnvPoolFn", "EnvPoolVectorEnv", "envpool_vector_fn", "masked_infos"]

#: EnvPool's info keys that describe its own batching, not the envs.
_BOOKKEEPING_KEYS = ("env_id", "players")


def _make_pool(task_id: str, num_envs: int, seed: int, kwargs: dict[str, Any]) -> Any:
    try:
        import envpool
    except ImportError as exc:
        raise ImportError(
            "EnvPool is not installed: pip install 'vecaccel[envpool]' (EnvPool publishes "
            "wheels for Linux x86_64 and aarch64)"
        ) from exc
    with warnings.catch_warnings():
        # EnvPool's classic-control spaces declare float64 bounds Gymnasium warns about
        warnings.simplefilter("ignore", UserWarning)
        return envpool.make_gymnasium(task_id, num_envs=num_envs, seed=seed, **kwargs)


def masked_infos(infos: dict, num_envs: int) -> dict:
    """EnvPool's infos in Gymnasium's batched form: every array with an all-true ``_key`` mask,
    EnvPool's ``env_id`` and ``players`` left out.

    Example:
        >>> out = masked_infos({"env_id": np.arange(2), "lives": np.array([3, 2])}, 2)
        >>> sorted(out), out["_lives"].tolist()
        (['_lives', 'lives'], [True, True])
    """
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key in _BOOKKEEPING_KEYS:
            continue
        if isinstance(value, dict):
            out[key] = masked_infos(value, num_envs)
        else:
            out[key] = np.asarray(value)
        out[f"_{key}"] = np.ones(num_envs, dtype=np.bool_)
    return out


class EnvPoolVectorEnv(VectorEnv):
    """An EnvPool env of ``num_envs`` envs under Gymnasium's vector contract (see the module).

    Args:
        task_id: EnvPool's task id (``"CartPole-v1"``, ``"Pong-v5"``...; ``envpool.list_all_envs()``).
        num_envs: how many envs.
        seed: the seed of env 0 (env ``i`` gets ``seed + i``) until a seeded ``reset``.
        episode_scores: add ``info["episode"]`` when a whole game ends (see the module).
        **kwargs: EnvPool's own options (``num_threads``, ``episodic_life``, ``img_height``...).

    Example:
        >>> import pytest; envpool = pytest.importorskip("envpool")
        >>> envs = EnvPoolVectorEnv("CartPole-v1", 3)
        >>> obs, infos = envs.reset(seed=1)
        >>> obs.shape, envs.metadata["autoreset_mode"]
        ((3, 4), <AutoresetMode.NEXT_STEP: 'NextStep'>)
        >>> envs.close()
    """

    def __init__(
        self,
        task_id: str,
        num_envs: int,
        seed: int = 0,
        episode_scores: bool = False,
        **kwargs: Any,
    ) -> None:
        self.task_id = task_id
        self.episode_scores = episode_scores
        self._returns = np.zeros(int(num_envs), dtype=np.float64)
        self._lengths = np.zeros(int(num_envs), dtype=np.int64)
        self.num_envs = int(num_envs)
        self.kwargs = dict(kwargs)
        self.pool = _make_pool(task_id, self.num_envs, int(seed), self.kwargs)
        self.single_observation_space = self.pool.single_observation_space
        self.single_action_space = self.pool.single_action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        render_modes = dict(getattr(self.pool, "metadata", {}) or {}).get("render_modes", [])
        self.metadata = {"render_modes": render_modes, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self._obs: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset every env (rebuilding the pool with ``seed`` when one is given), or those in
        ``options["reset_mask"]``; return every env's observation and the reset infos."""
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise ValueError(f"EnvPool's reset takes no options but reset_mask; got {options}")
        if seed is not None:
            self.pool.close()
            self.pool = _make_pool(self.task_id, self.num_envs, int(seed), self.kwargs)
        if mask is None or self._obs is None or np.all(mask):
            self._returns[:] = 0.0
            self._lengths[:] = 0
            obs, infos = self.pool.reset()
            self._obs = np.array(obs)
            return self._obs.copy(), masked_infos(infos, self.num_envs)
        ids = np.flatnonzero(np.asarray(mask, dtype=np.bool_)).astype(np.int32)
        obs, infos = self.pool.reset(env_id=ids)
        self._returns[ids] = 0.0
        self._lengths[ids] = 0
        self._obs = np.array(self._obs)  # the last step's array is the caller's: copy it
        self._obs[ids] = obs
        out: dict[str, Any] = {}
        for key, value in masked_infos(infos, len(ids)).items():
            if key.startswith("_"):
                continue
            full = np.zeros((self.num_envs, *np.shape(value)[1:]), dtype=np.asarray(value).dtype)
            full[ids] = value
            flags = np.zeros(self.num_envs, dtype=np.bool_)
            flags[ids] = True
            out[key], out[f"_{key}"] = full, flags
        return self._obs.copy(), out

    def step(self, actions: Any):
        """Step every env; Gymnasium's ``(obs, rewards, terminations, truncations, infos)``."""
        obs, rewards, terms, truncs, infos = self.pool.step(np.asarray(actions))
        self._obs = obs
        out = masked_infos(infos, self.num_envs)
        if self.episode_scores:
            self._add_episode_scores(out, rewards, terms, truncs)
        return obs, rewards, terms, truncs, out

    def _add_episode_scores(self, infos: dict, rewards: Any, terms: Any, truncs: Any) -> None:
        # the step after an episode's end is EnvPool's reset step (elapsed_step 0): not counted
        counted = np.asarray(infos.get("elapsed_step", np.ones(self.num_envs))) > 0
        reward = np.asarray(infos.get("reward", rewards), dtype=np.float64)
        self._returns += np.where(counted, reward, 0.0)
        self._lengths += counted
        game_over = np.asarray(infos.get("terminated", terms), dtype=np.bool_)
        ended = (game_over | np.asarray(truncs, dtype=np.bool_)) & counted
        infos["episode"] = {
            "r": np.where(ended, self._returns, 0.0),
            "l": np.where(ended, self._lengths, 0),
        }
        infos["_episode"] = ended
        self._returns[ended] = 0.0
        self._lengths[ended] = 0

    def close_extras(self, **kwargs: Any) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()


class EnvPoolFn:
    """A picklable vector env function: ``EnvPoolFn(task_id, **kwargs)(n)`` is an
    :class:`EnvPoolVectorEnv` of ``n`` envs. Build it with :func:`envpool_vector_fn`."""

    def __init__(self, task_id: str, kwargs: dict[str, Any]) -> None:
        self.task_id = task_id
        self.kwargs = dict(kwargs)

    def __call__(self, num_envs: int) -> EnvPoolVectorEnv:
        return EnvPoolVectorEnv(self.task_id, num_envs, **self.kwargs)

    def __repr__(self) -> str:
        return f"envpool_vector_fn({self.task_id!r}, **{self.kwargs!r})"


def envpool_vector_fn(task_id: str, **kwargs: Any) -> EnvPoolFn:
    """The vector env function of EnvPool task ``task_id``, for ``make_vec(...,
    vectorized=True)``; ``kwargs`` are EnvPool's options (``num_threads=1`` keeps each worker
    on its own core).

    Raises:
        ValueError: if ``task_id`` is not a string.

    Example:
        >>> envpool_vector_fn("Pong-v5", num_threads=1)
        envpool_vector_fn('Pong-v5', **{'num_threads': 1})
    """
    if not isinstance(task_id, str):
        raise ValueError(f"task_id must be an EnvPool task id string, got {task_id!r}")
    if "num_envs" in kwargs or "batch_size" in kwargs:
        raise ValueError(
            "num_envs and batch_size are vecaccel's to set (each worker's slice, every env per "
            "step); pass num_envs to make_vec"
        )
    return EnvPoolFn(task_id, kwargs)
