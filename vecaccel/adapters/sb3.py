"""Stable-Baselines3 on vecaccel: an adapter that turns a vecaccel ``VecEnv`` into an SB3 ``VecEnv``.

Two entry points:

* :func:`to_sb3` wraps a vector env made by :func:`vecaccel.make_vec` (autoreset mode
  ``SAME_STEP`` or ``DISABLED``).
* :class:`VecAccelEnv` is a drop-in ``vec_env_cls`` for SB3's ``make_vec_env`` and
  ``make_atari_env``: ``vec_env_cls=VecAccelEnv, vec_env_kwargs={"backend": "shm"}``.

The adapter gives SB3's semantics exactly as ``DummyVecEnv`` does: ``dones = terminated |
truncated``, one info dict per env with ``terminal_observation`` and ``TimeLimit.truncated``
(``truncated and not terminated``), the env reset within the same step, ``reset()`` returning
observations only and filling ``reset_infos``, and ``seed()``/``set_options()`` applied at the
next reset and then cleared.

A PettingZoo env made by :func:`vecaccel.make_vec` (one row per agent) trains one policy
shared by all agents: each row is one of SB3's envs. A row whose agent is not live holds zeros
with reward 0 and ``done`` False (SuperSuit's black death), and its info has ``active`` False.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> import vecaccel
    >>> from vecaccel.adapters.sb3 import to_sb3
    >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial", autoreset_mode="SameStep")
    >>> venv = to_sb3(envs)
    >>> _ = venv.seed(0)
    >>> obs = venv.reset()
    >>> obs.shape
    (2, 4)
    >>> obs, rewards, dones, infos = venv.step(np.array([0, 1]))
    >>> rewards.tolist(), dones.tolist(), infos[0]["TimeLimit.truncated"]
    ([1.0, 1.0], [False, False], False)
    >>> venv.close()
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array
from stable_baselines3.common import env_util as sb3_env_util
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv as SB3BaseVecEnv,
)
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from vecaccel.adapters.env_calls import (
    MissingAttribute,
    RegisteringEnvFn,
    get_wrapper_attr,
    has_wrapper_attr,
    render,
)
from vecaccel.spaces import assign_tree, copy_tree, read_item
from vecaccel.vec_env import reset_mask_only

__all__ = ["SB3VecEnv", "VecAccelEnv", "to_sb3"]

_FINAL_OBS = "final_obs"
_FINAL_INFO = "final_info"


# ---------------------------------------------------------------------------------------------
# Gymnasium's batched infos -> SB3's list of per-env dicts


def _is_mask_key(key: str, infos: Mapping[str, Any]) -> bool:
    return key.startswith("_") and key[1:] in infos


def _split_infos(infos: Mapping[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Turn Gymnasium's batched infos (``key`` arrays with ``_key`` masks) into one dict per env.

    Nested dicts (``final_info``, ``episode``...) are split recursively. Entries of numeric
    1-D arrays come back as Python scalars, the types the env most likely put in its info.

    Example:
        >>> infos = {"lives": np.array([3, 0]), "_lives": np.array([True, False])}
        >>> _split_infos(infos, 2)
        [{'lives': 3}, {}]
    """
    per_env: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        if _is_mask_key(key, infos):
            continue
        mask = infos.get(f"_{key}")
        present = range(num_envs) if mask is None else np.flatnonzero(mask).tolist()
        if not present:
            continue
        if isinstance(value, Mapping):
            parts = _split_infos(value, num_envs)
            for index in present:
                per_env[index][key] = parts[index]
        elif isinstance(value, np.ndarray) and value.ndim >= 1 and len(value) == num_envs:
            if value.dtype != object and value.ndim == 1:
                items = value.tolist()
                for index in present:
                    per_env[index][key] = items[index]
            else:
                for index in present:
                    item = value[index]
                    per_env[index][key] = item.copy() if isinstance(item, np.ndarray) else item
        else:
            # Not batched per env (a backend-level entry): every env that has it sees it.
            for index in present:
                per_env[index][key] = value
    return per_env


# ---------------------------------------------------------------------------------------------
# the adapter


class SB3VecEnv(SB3BaseVecEnv):
    """A vecaccel vector env seen through Stable-Baselines3's ``VecEnv`` interface.

    Build it with :func:`to_sb3`, or use :class:`VecAccelEnv` as SB3's ``vec_env_cls``.
    The wrapped env must run with ``autoreset_mode`` ``SAME_STEP`` (the final observation and
    info of an episode come back in ``infos``) or ``DISABLED`` (the adapter resets done envs
    with ``options=None``, as ``DummyVecEnv`` does); ``NEXT_STEP`` cannot give SB3's semantics.

    The adapter takes the wrapped env over: its :meth:`close` closes it. The wrapped env stays a
    Gymnasium vector env all the same: between the adapter's calls, its own ``reset``/``step``
    return Gymnasium's batched infos as before.

    Errors raised by the backend (:class:`vecaccel.WorkerError`, ``ValueError`` for bad
    actions, ``TimeoutError``) pass through unchanged.

    Attributes:
        vec_env: the wrapped ``gymnasium.vector.VectorEnv``.

    Example:
        >>> import numpy as np
        >>> import vecaccel
        >>> envs = vecaccel.make_vec("CartPole-v1", 3, backend="serial", autoreset_mode="SameStep")
        >>> venv = SB3VecEnv(envs)
        >>> venv.get_attr("spec", indices=[-1])[0].id
        'CartPole-v1'
        >>> venv.close()
    """

    def __init__(self, vec_env: gym.vector.VectorEnv) -> None:
        mode = _autoreset_mode_of(vec_env)
        if mode is AutoresetMode.NEXT_STEP:
            raise ValueError(
                "Stable-Baselines3 needs the reset to happen in the same step as the episode end, "
                f"but {vec_env!r} uses autoreset_mode=NEXT_STEP: create it with "
                "vecaccel.make_vec(..., autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP) "
                "(or DISABLED), or use vecaccel.adapters.sb3.VecAccelEnv"
            )
        if mode is AutoresetMode.DISABLED and getattr(vec_env, "agents_per_env", None):
            raise ValueError(
                f"{vec_env!r} has one row per agent, and SB3 resets every row that is done; an "
                "env resets only with all its agents: create it with "
                "autoreset_mode=AutoresetMode.SAME_STEP"
            )
        if callable(getattr(vec_env, "recv_ids", None)):
            raise ValueError(
                f"{vec_env!r} returns envs in the order they become ready (async backends) "
                "and possibly not as numpy arrays, but SB3 steps every env each step, in index "
                "order: use backend='shm' (or 'serial')"
            )
        for method in ("call_indices", "set_attr_indices"):
            if not callable(getattr(vec_env, method, None)):
                raise TypeError(
                    f"{vec_env!r} has no {method}(); to_sb3 wraps vector envs made by "
                    "vecaccel.make_vec"
                )
        # a vecaccel backend: beyond Gymnasium's VectorEnv it has call_indices,
        # set_attr_indices and per_env_infos, checked above
        self.vec_env: Any = vec_env
        self.autoreset_mode = mode
        # SB3 wants one info dict per env: where the backend can, take the envs' dicts instead
        # of batching them Gymnasium-style and splitting the batch again. Only during the
        # adapter's own calls (see _per_env_call): the user's env keeps Gymnasium's infos.
        self._per_env_infos = bool(getattr(vec_env, "supports_per_env_infos", False))
        super().__init__(
            vec_env.num_envs, vec_env.single_observation_space, vec_env.single_action_space
        )
        # SB3 builds its own render-mode list; keep the env's other metadata (render_fps...) too.
        self.metadata = {**getattr(vec_env, "metadata", {}), **self.metadata}

    # -- stepping ------------------------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds/options set since the last reset, then clear them.

        Returns:
            The batched observations; the per-env reset infos are in ``reset_infos``.
        """
        seeds = list(self._seeds)
        seed_arg = None if all(seed is None for seed in seeds) else seeds
        groups = _group_options(self._options)
        if len(groups) == 1:
            options = groups[0][0]
            obs, infos = self._per_env_call(
                self.vec_env.reset, seed=seed_arg, options=options or None
            )
            self.reset_infos = self._infos_per_env(infos)
        else:
            # Per-env options differ: one masked reset per distinct options dict; envs without
            # options get options=None, as DummyVecEnv gives them (not Gymnasium's leftover {})
            obs = None
            reset_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
            for options, indices in groups:
                mask = np.zeros(self.num_envs, dtype=np.bool_)
                mask[indices] = True
                group_obs, infos = self._per_env_call(
                    self.vec_env.reset,
                    seed=seeds,
                    options={**options, "reset_mask": mask} if options else reset_mask_only(mask),
                )
                if obs is None:
                    obs = copy_tree(group_obs)
                else:
                    assign_tree(obs, mask, _select(group_obs, mask))
                split = self._infos_per_env(infos)
                for index in indices:
                    reset_infos[index] = split[index]
            self.reset_infos = reset_infos
        self._reset_seeds()
        self._reset_options()
        return self._to_sb3_obs(obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Send ``actions`` (one per env) to the backend."""
        self.vec_env.step_async(self._batch_actions(actions))

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step sent by :meth:`step_async`.

        Returns:
            ``(obs, rewards, dones, infos)`` with done envs already reset, their last
            observation in ``infos[i]["terminal_observation"]``.
        """
        step = self._per_env_call(self.vec_env.step_wait)
        obs, rewards, terminations, truncations, batched_infos = step
        # as few NumPy calls as possible: each costs microseconds right after a policy's
        # forward pass has pushed NumPy's code out of the CPU's caches; lists of 16 do not
        dones = np.asarray(terminations) | np.asarray(truncations)
        done_list = dones.tolist()
        done_indices = [index for index, done in enumerate(done_list) if done]
        if done_indices:
            time_limits = [
                trunc and not term
                for term, trunc in zip(
                    np.asarray(terminations).tolist(), np.asarray(truncations).tolist()
                )
            ]
        else:
            time_limits = done_list  # all False
        infos = self._infos_per_env(batched_infos)
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            for index in done_indices:
                reset_info = infos[index]
                terminal_obs = reset_info.pop(_FINAL_OBS, None)
                info = reset_info.pop(_FINAL_INFO, {})
                info["terminal_observation"] = copy.deepcopy(terminal_obs)
                infos[index] = info
                self.reset_infos[index] = reset_info
        elif done_indices:  # DISABLED: reset the done envs here
            for index in done_indices:
                infos[index]["terminal_observation"] = copy.deepcopy(read_item(obs, index))
            obs = copy_tree(obs)
            # options=None for the envs, as DummyVecEnv's env.reset(): not Gymnasium's {}
            reset_obs, reset_batched = self._per_env_call(
                self.vec_env.reset, options=reset_mask_only(dones)
            )
            assign_tree(obs, dones, _select(reset_obs, dones))
            reset_split = self._infos_per_env(reset_batched)
            for index in done_indices:
                self.reset_infos[index] = reset_split[index]
        for info, time_limit in zip(infos, time_limits):
            info["TimeLimit.truncated"] = time_limit
        # float32 as DummyVecEnv's reward buffer, so that wrappers accumulating rewards
        # (VecMonitor, VecNormalize) compute bit for bit what they compute on DummyVecEnv
        return self._to_sb3_obs(obs), np.asarray(rewards).astype(np.float32), dones, infos

    def set_options(self, options: list[dict[str, Any]] | dict[str, Any] | None = None) -> None:
        """Set the options of the next reset: one dict for every env, or one per env.

        A falsy entry of a per-env list (``None``, ``{}``) resets that env with
        ``options=None``, as ``DummyVecEnv`` does.

        Raises:
            ValueError: if a per-env list does not have one entry per env (``DummyVecEnv``
                would raise ``IndexError`` at the next reset, or ignore the extra entries).
        """
        if options is not None and not isinstance(options, dict):
            options = list(options)
            if len(options) != self.num_envs:
                raise ValueError(
                    f"set_options() takes one dict for all envs or a list of {self.num_envs} "
                    f"(one per env), got a list of length {len(options)}"
                )
        super().set_options(options)

    def close(self) -> None:
        """Close the wrapped vector env (and its workers)."""
        self.vec_env.close()

    # -- attributes and methods of the sub-environments ---------------------------------------

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return ``attr_name`` of the chosen envs (searched through their wrappers).

        Raises:
            AttributeError: if an env has no such attribute.
            IndexError: if an index is out of range.
        """
        values = self._call(functools.partial(get_wrapper_attr, name=attr_name), indices)
        for value in values:
            if isinstance(value, MissingAttribute):
                raise AttributeError(value.message)
        return values

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has ``attr_name`` (checked in the workers, nothing is pickled)."""
        return all(self._call(functools.partial(has_wrapper_attr, name=attr_name), None))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` to ``value`` in the chosen envs only.

        The attribute is set where it is defined in the wrapper stack (Gymnasium's
        ``set_wrapper_attr``), so the env itself sees the change.
        """
        chosen = self._indices(indices)
        self.vec_env.set_attr_indices(attr_name, [value] * len(chosen), chosen)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name(*method_args, **method_kwargs)`` in the chosen envs only."""
        return self._call(method_name, indices, *method_args, **method_kwargs)

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Whether each chosen env is wrapped with ``wrapper_class`` (checked in the workers)."""
        check = functools.partial(sb3_env_util.is_wrapped, wrapper_class=wrapper_class)
        return [bool(result) for result in self._call(check, indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """One ``rgb_array`` frame per env (``None`` each, with a warning, in other modes)."""
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is "
                "`rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return self._call(render, None)

    # -- helpers -------------------------------------------------------------------------------

    def _indices(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, (int, np.integer)):
            indices = [indices]
        chosen = []
        for index in indices:
            index = int(index)
            if not -self.num_envs <= index < self.num_envs:
                raise IndexError(f"env index {index} out of range for {self.num_envs} envs")
            chosen.append(index % self.num_envs)
        return chosen

    def _call(
        self,
        name: str | Callable[[gym.Env[Any, Any]], Any],
        indices: VecEnvIndices,
        *args: Any,
        **kwargs: Any,
    ) -> list[Any]:
        chosen = self._indices(indices)
        if not chosen:
            return []
        return list(self.vec_env.call_indices(name, chosen, *args, **kwargs))

    def _per_env_call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` with the backend's ``per_env_infos`` on for this call
        only, so that the user's env, called directly, still returns Gymnasium's infos."""
        if not self._per_env_infos:
            return method(*args, **kwargs)
        vec_env = self.vec_env
        before = vec_env.per_env_infos
        vec_env.per_env_infos = True
        try:
            return method(*args, **kwargs)
        finally:
            vec_env.per_env_infos = before

    def _infos_per_env(self, batched: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One info dict per env, from the backend's batched ``infos`` or its per-env infos."""
        if batched:
            # batched after all: a step of ours that the backend finished during a direct call
            # on the user's env (shm finishes a step in flight before any other command)
            return _split_infos(batched, self.num_envs)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if self._per_env_infos:
            for index, info in self.vec_env.last_infos:
                infos[index] = info
        return infos

    def _batch_actions(self, actions: Any) -> Any:
        # SB3 code (and its tests) may hand Dict/Tuple actions as one item per env;
        # Gymnasium backends want one batch per sub-space.
        space = self.vec_env.single_action_space
        per_env = False
        if isinstance(space, spaces.Dict) and not isinstance(actions, Mapping):
            per_env = _is_per_env(actions, self.num_envs, Mapping)
        elif isinstance(space, spaces.Tuple) and isinstance(actions, (list, np.ndarray)):
            per_env = _is_per_env(actions, self.num_envs, tuple)
        if per_env:
            out = create_empty_array(space, self.num_envs)
            return concatenate(space, list(actions), out)  # type: ignore[arg-type]
        return actions

    def _to_sb3_obs(self, obs: Any) -> VecEnvObs:
        if not getattr(self.vec_env, "copy", True):
            # views the next step overwrites; SB3 keeps `_last_obs` across steps (its replay
            # buffer stores it after the step), so every SB3 VecEnv returns fresh arrays
            obs = copy_tree(obs)
        if isinstance(self.observation_space, spaces.Dict):
            return OrderedDict((key, obs[key]) for key in self.observation_space.spaces)
        return cast(VecEnvObs, obs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.vec_env!r})"


def _is_per_env(actions: Any, num_envs: int, item_type: type) -> bool:
    try:
        return len(actions) == num_envs and all(isinstance(a, item_type) for a in actions)
    except TypeError:
        return False


def _select(tree: Any, mask: np.ndarray) -> Any:
    if isinstance(tree, np.ndarray):
        return tree[mask]
    if isinstance(tree, Mapping):
        return {key: _select(value, mask) for key, value in tree.items()}
    return tuple(_select(value, mask) for value in tree)


def _group_options(
    options: Sequence[dict[str, Any] | None],
) -> list[tuple[dict[str, Any], list[int]]]:
    """Group env indices by equal options (one entry per env, as set_options checks); a falsy
    entry (``None``, ``{}``) means no options, as in ``DummyVecEnv.reset``."""
    groups: list[tuple[dict[str, Any], list[int]]] = []
    for index, option in enumerate(options):
        option = option or {}
        for known, members in groups:
            if _same_options(known, option):
                members.append(index)
                break
        else:
            groups.append((option, [index]))
    return groups


def _same_options(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except ValueError:  # numpy arrays inside the options: compare them element-wise
        return a.keys() == b.keys() and all(
            np.array_equal(a[key], b[key]) if isinstance(a[key], np.ndarray) else a[key] == b[key]
            for key in a
        )


def _autoreset_mode_of(vec_env: gym.vector.VectorEnv) -> AutoresetMode:
    mode = getattr(vec_env, "autoreset_mode", None)
    if mode is None:
        mode = getattr(vec_env, "metadata", {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
    return mode if isinstance(mode, AutoresetMode) else AutoresetMode(mode)


def to_sb3(vec_env: gym.vector.VectorEnv) -> SB3VecEnv:
    """Wrap a vecaccel vector env as a Stable-Baselines3 ``VecEnv``.

    Args:
        vec_env: a vector env made by :func:`vecaccel.make_vec` with
            ``autoreset_mode=AutoresetMode.SAME_STEP`` (or ``DISABLED``).

    Returns:
        An :class:`SB3VecEnv`, which SB3's algorithms and vec-env wrappers accept.

    Raises:
        ValueError: if ``vec_env`` uses ``autoreset_mode=NEXT_STEP``, or is an asynchronous
            backend (``async``, ``action_server``) that returns envs in the order they finish.
        TypeError: if ``vec_env`` was not made by vecaccel.

    Example:
        >>> import vecaccel
        >>> from gymnasium.vector import AutoresetMode
        >>> from stable_baselines3 import PPO
        >>> envs = vecaccel.make_vec(
        ...     "CartPole-v1", 2, backend="serial", autoreset_mode=AutoresetMode.SAME_STEP
        ... )
        >>> model = PPO("MlpPolicy", to_sb3(envs), n_steps=16, batch_size=32, seed=0)
        >>> _ = model.learn(total_timesteps=64)
        >>> model.get_env().close()
    """
    return SB3VecEnv(vec_env)


class VecAccelEnv(SB3VecEnv):
    """A vecaccel-backed SB3 ``VecEnv`` built from env functions: SB3's ``vec_env_cls``.

    ``make_vec_env(env_id, n_envs, vec_env_cls=VecAccelEnv, vec_env_kwargs={"backend": "shm"})``
    and ``make_atari_env`` switch from ``SubprocVecEnv``/``DummyVecEnv`` with this one argument.

    Args:
        env_fns: one zero-argument function per env, each returning a new ``gymnasium.Env``.
        backend: the vecaccel backend (see :func:`vecaccel.list_backends`); ``auto`` chooses
            ``serial``, ``hybrid`` or ``shm`` from one env's step cost.
        autoreset_mode: ``SAME_STEP`` (default) or ``DISABLED``; ``NEXT_STEP`` is refused.
        start_method: ``SubprocVecEnv``'s name for the backend option ``context`` (``"fork"``,
            ``"spawn"``, ``"forkserver"``), so that ``vec_env_kwargs`` written for
            ``SubprocVecEnv`` work unchanged; ``None`` leaves the backend's default.
        **options: backend options, e.g. ``num_workers`` or ``context`` for ``shm``.

    Raises:
        ValueError: if ``start_method`` and ``context`` are both given and differ.

    Example:
        >>> from stable_baselines3.common.env_util import make_vec_env
        >>> venv = make_vec_env(
        ...     "CartPole-v1", n_envs=2, vec_env_cls=VecAccelEnv,
        ...     vec_env_kwargs={"backend": "serial"},
        ... )
        >>> venv.reset().shape
        (2, 4)
        >>> venv.close()
    """

    def __init__(
        self,
        env_fns: Iterable[Callable[[], gym.Env]],
        backend: str = "auto",
        autoreset_mode: str | AutoresetMode = AutoresetMode.SAME_STEP,
        start_method: str | None = None,
        **options: Any,
    ) -> None:
        from vecaccel.make import make_vec
        from vecaccel.manager import register_envs
        from vecaccel.worker import warn_if_torch_oversubscribes

        if start_method is not None:
            context = options.setdefault("context", start_method)
            if context != start_method:
                raise ValueError(
                    f"start_method={start_method!r} and context={context!r} disagree: "
                    "start_method is SubprocVecEnv's name for context, give one of them"
                )
        register_envs()
        env_fns = [RegisteringEnvFn(fn) for fn in env_fns]
        vec_env = make_vec(env_fns, backend=backend, autoreset_mode=autoreset_mode, **options)
        try:
            super().__init__(vec_env)
            # inside: under -W error the warning is an exception, and the workers must stop
            warn_if_torch_oversubscribes(getattr(vec_env, "num_workers", 0))
        except BaseException:
            vec_env.close()
            raise
