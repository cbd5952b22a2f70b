"""Batched simulators as worker slices: a *vector env function* builds one vector env per worker.

A vector env function is a callable ``fn(n) -> gymnasium.vector.VectorEnv`` with ``n``
sub-envs (Gymnasium's ``CartPoleVectorEnv``, an EnvPool env through
:func:`vecaccel.adapters.envpool.envpool_vector_fn`, a ``SyncVectorEnv`` of your own...).
``make_vec(fn, num_envs, vectorized=True)`` hands every worker one such vector env over its
slice of the envs, instead of one Gymnasium env per env; a registered id with a
``vector_entry_point`` (``"CartPole-v1"``) is built through that entry point.

Backends see the usual list of ``num_envs`` env functions; each is a :class:`SliceEnvFn`
naming the same :class:`VectorEnvFn`, and the worker machinery
(:func:`vecaccel.worker.make_env_slice`) builds one vector env for each run of them. A
backend that steps envs one at a time cannot serve them: calling a :class:`SliceEnvFn` gives
a probe env that holds the spaces and refuses to step.

Infos come batched from the inner vector env, with Gymnasium's ``_key`` masks, and travel as
one :class:`SliceInfos` per slice; :func:`merge_slice_infos` places them into the whole
vector env's infos at the slice's offset.

Example:
    >>> import vecaccel
    >>> envs = vecaccel.make_vec("CartPole-v1", 8, backend="shm", num_workers=2, vectorized=True)
    >>> obs, infos = envs.reset(seed=0)
    >>> obs.shape
    (8, 4)
    >>> envs.close()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

__all__ = [
    "SliceEnvFn",
    "SliceInfos",
    "SubEnvError",
    "VectorEnvFn",
    "VectorProbeEnv",
    "call_vector_env",
    "check_vector_env",
    "inner_seed",
    "merge_slice_infos",
    "require_vector_entry_point",
    "set_vector_env_attr",
    "takes_seed_list",
    "unbatch_infos",
    "vector_env_fn_of",
]


def require_vector_entry_point(env_id: str, advice: str) -> None:
    """Check that the registered Gymnasium id ``env_id`` has a ``vector_entry_point`` (a batched
    simulator of its own).

    Raises:
        ValueError: for an unknown id, or one without a vector entry point (then ending with
            ``advice``).

    Example:
        >>> require_vector_entry_point("CartPole-v1", "")
        >>> require_vector_entry_point("Acrobot-v1", "drop vectorized=True")
        Traceback (most recent call last):
        ...
        ValueError: environment id 'Acrobot-v1' has no vector_entry_point, drop vectorized=True
    """
    from vecaccel.manager import register_envs

    register_envs()
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"unknown environment id {env_id!r}: {exc}") from None
    if spec.vector_entry_point is None:
        raise ValueError(f"environment id {env_id!r} has no vector_entry_point, {advice}")


class VectorEnvFn:
    """A picklable builder of vector envs of any size, checked against the autoreset mode asked.

    Args:
        fn: ``fn(n)`` returns a ``gymnasium.vector.VectorEnv`` with ``n`` sub-envs; or a
            registered Gymnasium id whose spec has a ``vector_entry_point``.
        autoreset_mode: the mode the vector env must already have (never converted).
        env_kwargs: keyword arguments for the id's vector entry point (ids only).

    Example:
        >>> from gymnasium.vector import AutoresetMode
        >>> build = VectorEnvFn("CartPole-v1", AutoresetMode.NEXT_STEP)
        >>> envs = build(3)
        >>> envs.num_envs
        3
        >>> envs.close()
        >>> VectorEnvFn("CartPole-v1", AutoresetMode.SAME_STEP)(2)
        Traceback (most recent call last):
        ...
        ValueError: vector env function VectorEnvFn('CartPole-v1') built a CartPoleVectorEnv ...
    """

    def __init__(
        self,
        fn: str | Callable[[int], gym.vector.VectorEnv],
        autoreset_mode: AutoresetMode,
        env_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(fn, str):
            require_vector_entry_point(
                fn,
                "so vectorized=True cannot build it as one vector env per worker: pass a vector "
                "env function fn(n) -> VectorEnv instead, or drop vectorized=True",
            )
        elif not callable(fn):
            raise TypeError(
                "vectorized=True takes a vector env function fn(n) -> gymnasium.vector.VectorEnv "
                f"or a registered id with a vector_entry_point; got {fn!r}"
            )
        elif env_kwargs:
            raise ValueError("env_kwargs only applies when env is an environment id")
        self.fn = fn
        self.autoreset_mode = autoreset_mode
        self.env_kwargs = dict(env_kwargs or {})

    def __call__(self, num_envs: int) -> gym.vector.VectorEnv:
        """Build a vector env of ``num_envs`` sub-envs.

        Raises:
            TypeError: if the function returns something other than a ``VectorEnv``.
            ValueError: if it has another number of sub-envs, or another autoreset mode than
                the one asked for (the message names both).
        """
        if isinstance(self.fn, str):
            from vecaccel.manager import register_envs

            register_envs()
            envs = gym.make_vec(
                self.fn, num_envs, vectorization_mode="vector_entry_point", **self.env_kwargs
            )
        else:
            envs = self.fn(num_envs)
        try:
            check_vector_env(envs, num_envs, self.autoreset_mode, repr(self))
        except BaseException:
            if hasattr(envs, "close"):
                envs.close()
            raise
        return envs

    def __repr__(self) -> str:
        name = self.fn if isinstance(self.fn, str) else getattr(self.fn, "__name__", self.fn)
        return f"VectorEnvFn({name!r})"


def check_vector_env(envs: Any, num_envs: int, autoreset_mode: AutoresetMode, source: str) -> None:
    """Raise if ``envs`` is not a vector env of ``num_envs`` sub-envs in ``autoreset_mode``.

    Example:
        >>> import gymnasium as gym
        >>> envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point")
        >>> check_vector_env(envs, 2, AutoresetMode.NEXT_STEP, "CartPole-v1")
        >>> envs.close()
    """
    if not isinstance(envs, gym.vector.VectorEnv):
        per_env = (
            ": it looks like a per-env function fn() -> gymnasium.Env, which goes without "
            "vectorized=True"
            if isinstance(envs, gym.Env)
            else ""
        )
        raise TypeError(
            f"vector env function {source} returned {type(envs).__name__}, not a "
            f"gymnasium.vector.VectorEnv{per_env}"
        )
    if envs.num_envs != num_envs:
        raise ValueError(
            f"vector env function {source} was asked for {num_envs} envs but built {envs.num_envs}"
        )
    found = (getattr(envs, "metadata", None) or {}).get("autoreset_mode")
    if isinstance(found, str):
        try:
            found = AutoresetMode(found)
        except ValueError:
            pass
    if found != autoreset_mode:
        raise ValueError(
            f"vector env function {source} built a {type(envs.unwrapped).__name__} whose "
            f"autoreset mode is {_mode_name(found)}, but autoreset_mode={_mode_name(autoreset_mode)} "
            "was asked for: vecaccel does not convert a vector env's mode; pass "
            f"autoreset_mode={_mode_name(found)} or build the vector env in the mode asked"
        )


def _mode_name(mode: Any) -> str:
    return f"AutoresetMode.{mode.name}" if isinstance(mode, AutoresetMode) else repr(mode)


class VectorProbeEnv(gym.Env):
    """What calling a :class:`SliceEnvFn` gives: the spaces and metadata of one sub-env of the
    vector env (for a backend's checks); it refuses to step or reset."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.observation_space = envs.single_observation_space
        self.action_space = envs.single_action_space
        metadata = dict(getattr(envs, "metadata", {}) or {})
        metadata.pop("autoreset_mode", None)
        self.metadata = metadata
        self.render_mode = getattr(envs, "render_mode", None)
        self.spec = getattr(envs, "spec", None)
        self._envs = envs

    def _refuse(self) -> TypeError:
        return TypeError(
            "this env is one sub-env of a vectorized slice (make_vec(..., vectorized=True)): its "
            "worker steps the whole vector env at once, so it cannot be stepped alone; use a "
            "backend that takes vectorized slices (serial, shm, hybrid, async, action_server)"
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        raise self._refuse()

    def step(self, action: Any):
        raise self._refuse()

    def close(self) -> None:
        self._envs.close()


class SliceEnvFn:
    """The env function of one sub-env of a vectorized slice: it names the vector env function
    that builds the slice (see the module's docstring).

    Example:
        >>> from gymnasium.vector import AutoresetMode
        >>> fn = SliceEnvFn(VectorEnvFn("CartPole-v1", AutoresetMode.NEXT_STEP))
        >>> probe = fn()
        >>> probe.observation_space.shape
        (4,)
        >>> probe.close()
    """

    def __init__(self, vector_fn: VectorEnvFn) -> None:
        self.vector_fn = vector_fn

    def __call__(self) -> gym.Env:
        return VectorProbeEnv(self.vector_fn(1))

    def __repr__(self) -> str:
        return f"SliceEnvFn({self.vector_fn!r})"


def vector_env_fn_of(env_fns: Sequence[Any], start: int) -> VectorEnvFn:
    """The vector env function of a slice's env functions (envs ``start`` and on); read it
    through :meth:`vecaccel.envs.source.EnvSource.vector_env_fn`.

    Raises:
        TypeError: if some are not :class:`SliceEnvFn`, or name other vector env functions.
    """
    first = env_fns[0]
    for j, fn in enumerate(env_fns):
        if not isinstance(fn, SliceEnvFn) or fn.vector_fn is not first.vector_fn:
            raise TypeError(
                f"env {start + j} is not a sub-env of the same vector env function as env "
                f"{start}: a vectorized slice needs one vector env function for all its envs"
            )
    return first.vector_fn


class SliceInfos(NamedTuple):
    """The infos of one vectorized slice's step or reset, batched over the slice.

    Attributes:
        start: the slice's first env index.
        count: the slice's number of envs.
        infos: Gymnasium-style batched infos over the slice (arrays with ``_key`` masks).
        restart_reason: set when the slice's vector env was rebuilt in this step.
    """

    start: int
    count: int
    infos: dict
    restart_reason: str | None = None


def _batch_leaf(value: Any, count: int, key: str, where: str) -> np.ndarray:
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.ndim == 0 or len(array) != count:
        raise ValueError(
            f"info {key!r} of {where} is not batched over its {count} envs (got {value!r}): a "
            "vector env's infos hold one entry per sub-env, with a '_key' mask"
        )
    return array


def merge_slice_infos(
    into: dict, infos: dict, start: int, count: int, num_envs: int, where: str = "a slice"
) -> dict:
    """Place a slice's batched ``infos`` (``count`` envs) at ``start`` in ``into``, a batched
    info dict over ``num_envs`` envs; return ``into``.

    Example:
        >>> merged = merge_slice_infos({}, {"x": np.array([1, 2]), "_x": np.array([True, False])},
        ...                            start=2, count=2, num_envs=4)
        >>> merged["x"].tolist(), merged["_x"].tolist()
        ([0, 0, 1, 2], [False, False, True, False])
    """
    stop = start + count
    for key, value in infos.items():
        if key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        if isinstance(value, dict):
            into[key] = merge_slice_infos(into.get(key, {}), value, start, count, num_envs, where)
        else:
            array = _batch_leaf(value, count, key, where)
            target = into.get(key)
            if target is None:
                if array.dtype == object:
                    target = np.full((num_envs, *array.shape[1:]), None, dtype=object)
                else:
                    target = np.zeros((num_envs, *array.shape[1:]), dtype=array.dtype)
            elif target.dtype != array.dtype and not np.can_cast(array.dtype, target.dtype):
                target = target.astype(np.result_type(target, array))
            if target.dtype == object and array.dtype == object:
                for j in range(count):  # element by element: the items may be arrays
                    target[start + j] = array[j]
            else:
                target[start:stop] = array
            into[key] = target
        flags = into.get(f"_{key}")
        if flags is None:
            flags = into[f"_{key}"] = np.zeros(num_envs, dtype=np.bool_)
        flags[start:stop] = True if mask is None else mask
    return into


def inner_seed(
    seeds: Sequence[int | None], rows: Sequence[int], takes_list: bool = True
) -> int | list[int | None] | None:
    """The ``seed`` for an inner vector env's ``reset`` that gives its env ``j`` the seed
    ``seeds[j]``, for the envs ``rows`` being reset.

    One int where the seeds run on by one (``seed + j``, which every vector env takes), ``None``
    where no env gets a seed, else the list, one per env (``None`` lets that env's generator
    run on), which ``SyncVectorEnv`` takes. A vector env that takes one int only
    (``takes_list=False``: Gymnasium's ``CartPoleVectorEnv`` seeds one generator for all its
    envs) gets the first reset env's seed, less its index.

    Example:
        >>> inner_seed([7, 8, 9], range(3)), inner_seed([None, 8, None], [1])
        (7, 7)
        >>> inner_seed([5, None, 9], range(3)), inner_seed([5, None, 9], range(3), takes_list=False)
        ([5, None, 9], 5)
    """
    chosen = [seeds[j] for j in rows]
    if all(seed is None for seed in chosen):
        return None
    first = int(rows[0])
    base = seeds[first]
    if base is not None and base >= first and all(seeds[j] == base - first + j for j in rows):
        return int(base) - first
    if not takes_list:
        seed = next(seeds[j] for j in rows if seeds[j] is not None)
        return max(int(seed) - first, 0)
    return [None if seed is None else int(seed) for seed in seeds]


class SubEnvError(Exception):
    """An exception that sub-env ``index`` (local to its vector env) raised in ``call``, so
    that the error can name that env rather than the whole slice.

    Attributes:
        index: the sub-env's index in its vector env.
        error: the exception it raised.
    """

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"sub-env {index}: {type(error).__name__}: {error}")
        self.index = index
        self.error = error


def call_vector_env(
    envs: gym.vector.VectorEnv,
    name: str | Callable[..., Any],
    indices: Sequence[int],
    args: tuple = (),
    kwargs: dict | None = None,
) -> list[Any]:
    """``call(name)`` for the sub-envs ``indices`` (local) of an inner vector env.

    A function is applied to each sub-env where the vector env holds them in ``envs``
    (``SyncVectorEnv``), and a name goes through the vector env's own ``call`` where it has
    one, once per sub-env, as on any vector env; else either is called once on the vector env
    itself (``CartPoleVectorEnv`` holds no sub-envs), the result given to each of ``indices``.

    Example:
        >>> envs = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")
        >>> call_vector_env(envs, lambda env: env.spec.id, [0, 2])
        ['CartPole-v1', 'CartPole-v1']
        >>> envs.close()
    """
    kwargs = kwargs or {}
    sub_envs = getattr(envs, "envs", None)
    if callable(name) and isinstance(sub_envs, (list, tuple)) and len(sub_envs) == envs.num_envs:
        results = []
        for j in indices:
            try:
                results.append(name(sub_envs[j], *args, **kwargs))
            except Exception as exc:
                raise SubEnvError(j, exc) from exc
        return results
    if isinstance(sub_envs, (list, tuple)) and len(sub_envs) == envs.num_envs:
        return call_vector_env(envs, _SubEnvCall(name), indices, args, kwargs)
    if not callable(name) and callable(getattr(envs, "call", None)):
        results = envs.call(name, *args, **kwargs)
        return [results[j] for j in indices]
    if callable(name):
        value = name(envs, *args, **kwargs)
    else:
        attribute = getattr(envs, name)
        value = attribute(*args, **kwargs) if callable(attribute) else attribute
    return [value] * len(indices)


class _SubEnvCall:
    """``call(name)`` on one sub-env, as ``SyncVectorEnv.call`` makes it: a method is called,
    an attribute is returned (read through wrappers)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, env: gym.Env, *args: Any, **kwargs: Any) -> Any:
        attribute = env.get_wrapper_attr(self.name)
        return attribute(*args, **kwargs) if callable(attribute) else attribute


def set_vector_env_attr(
    envs: gym.vector.VectorEnv, name: str, pairs: Sequence[tuple[int, Any]], where: str
) -> None:
    """Set ``name`` to ``value`` on each ``(local index, value)`` of ``pairs`` in an inner
    vector env.

    On each named sub-env where the vector env holds its envs in ``envs`` (``SyncVectorEnv``),
    through wrappers as ``set_attr`` does; through its ``set_attr`` when every env is named;
    else one value on the vector env itself, which then must be the same for all.

    Raises:
        ValueError: if the values differ and the vector env cannot take one per env.

    Example:
        >>> envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")
        >>> set_vector_env_attr(envs, "gravity", [(1, 5.0)], "a slice")
        >>> envs.get_attr("gravity")
        (9.8, 5.0)
        >>> envs.close()
    """
    if not pairs:
        return
    values = [value for _, value in pairs]
    sub_envs = getattr(envs, "envs", None)
    if isinstance(sub_envs, (list, tuple)) and len(sub_envs) == envs.num_envs:
        for j, value in pairs:
            env = sub_envs[j]
            if hasattr(env, "set_wrapper_attr"):
                env.set_wrapper_attr(name, value)
            else:
                setattr(env, name, value)
    elif hasattr(envs, "set_attr") and len(pairs) == envs.num_envs:
        envs.set_attr(name, [value for _, value in sorted(pairs, key=lambda pair: pair[0])])
    elif all(value is values[0] or value == values[0] for value in values):
        setattr(envs, name, values[0])
    else:
        raise ValueError(
            f"{where} takes one value of {name!r} for all its envs, or one per env for all of "
            "them at once"
        )


def takes_seed_list(envs: gym.vector.VectorEnv) -> bool:
    """Whether ``envs.reset`` takes one seed per env: Gymnasium's ``SyncVectorEnv`` and
    ``AsyncVectorEnv``, a vecaccel vector env, or any vector env that holds its envs in
    ``envs``.

    Example:
        >>> envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point")
        >>> takes_seed_list(envs)
        False
        >>> envs.close()
    """
    from vecaccel.vec_env import VecEnv

    if isinstance(envs, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv, VecEnv)):
        return True
    return isinstance(getattr(envs, "envs", None), (list, tuple))


def unbatch_infos(infos: dict, count: int) -> list[dict]:
    """One info dict per env from batched ``infos`` over ``count`` envs (masked keys only).

    Numbers keep their NumPy type (an ``int32`` entry stays ``numpy.int32``) and bools become
    Python's, so that batching the dicts again, as Gymnasium does, gives arrays of the dtypes
    the inner vector env returned.

    Example:
        >>> unbatch_infos({"x": np.array([1, 2]), "_x": np.array([False, True])}, 2)
        [{}, {'x': np.int64(2)}]
    """
    out: list[dict] = [{} for _ in range(count)]
    for key, value in infos.items():
        if key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        rows = range(count) if mask is None else np.flatnonzero(mask).tolist()
        if isinstance(value, dict):
            parts = unbatch_infos(value, count)
            for j in rows:
                out[j][key] = parts[j]
        else:
            for j in rows:
                item = value[j]
                # Gymnasium batches a NumPy number into an array of its dtype, but a NumPy bool
                # into an object array: a bool goes back as Python's
                out[j][key] = bool(item) if isinstance(item, np.bool_) else item
    return out
