"""``make_vec``: turn an env id, an env function or a list of them into a vecaccel ``VecEnv``."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from vecaccel.env_ids import unknown_env_id_message
from vecaccel.manager import BackendInfo, get_backend, register_envs
from vecaccel.vector import make_env, parse_autoreset_mode

__all__ = ["make_vec", "EnvFactory"]


class EnvFactory:
    """A picklable zero-argument env function for a registered Gymnasium id.

    It lets plugins register their envs inside the worker process too, which matters under the
    ``spawn`` and ``forkserver`` start methods where the child starts from a fresh interpreter.

    Example:
        >>> env = EnvFactory("CartPole-v1")()
        >>> env.spec.id
        'CartPole-v1'
        >>> env.close()
    """

    def __init__(self, env_id: str, kwargs: dict[str, Any] | None = None) -> None:
        self.env_id = env_id
        self.kwargs = dict(kwargs or {})

    def __call__(self) -> gym.Env:
        register_envs()
        return gym.make(self.env_id, **self.kwargs)

    def __repr__(self) -> str:
        return f"EnvFactory({self.env_id!r}, {self.kwargs!r})"


def _env_fns(
    env: str | Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
    num_envs: int | None,
    env_kwargs: dict[str, Any] | None,
) -> list[Callable[[], gym.Env]]:
    if isinstance(env, str):
        register_envs()
        if env not in gym.registry:
            try:
                gym.spec(env)  # raises a helpful error with close matches
            except gym.error.Error as exc:
                raise ValueError(unknown_env_id_message(env, exc)) from None
        if num_envs is None:
            raise ValueError("num_envs is required when env is an environment id")
        return [EnvFactory(env, env_kwargs) for _ in range(num_envs)]
    if isinstance(env, EnvSpec):
        raise TypeError(f"make_vec takes an env id, not an EnvSpec: pass its id {env.id!r}")
    if isinstance(env, gym.Env) or not (callable(env) or isinstance(env, Iterable)):
        # every sub-environment needs an instance of its own, so an existing one cannot serve
        what = "an env instance" if isinstance(env, gym.Env) else type(env).__name__
        raise TypeError(
            "make_vec takes an env id (e.g. 'CartPole-v1'), a zero-argument callable that "
            "returns a new env (e.g. lambda: gym.make('CartPole-v1')), or a list of such "
            f"callables; got {env!r} ({what})"
        )
    if env_kwargs:
        raise ValueError("env_kwargs only applies when env is an environment id")
    if callable(env):
        if num_envs is None:
            raise ValueError("num_envs is required when env is a single env function")
        return [env] * num_envs
    env_fns = list(env)
    if not env_fns:
        raise ValueError("a vector env needs at least one env function")
    for index, fn in enumerate(env_fns):
        if not callable(fn):
            raise TypeError(f"env function {index} is not callable: {fn!r}")
    if num_envs is not None and num_envs != len(env_fns):
        raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env functions were given")
    return env_fns


def _required_positional(fn: Any) -> tuple[int, float] | None:
    """``(required, most)`` positional arguments ``fn`` takes, or ``None`` where its signature
    cannot be read (a builtin, say): then it is called as it is, and its own error stands."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    varargs = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    return required, math.inf if varargs else len(positional)


def _name_of(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _check_env_fn_kind(env: Any, vectorized: bool) -> None:
    """Refuse, before anything is called, an env function of the other kind than
    ``vectorized`` says: a per-env ``fn()`` with ``vectorized=True``, or a vector env function
    ``fn(n)`` without it."""
    if vectorized:
        if isinstance(env, str) or not callable(env):
            return  # an id, or VectorEnvFn's own error for what is not a function
        arity = _required_positional(env)
        if arity is not None and not arity[0] <= 1 <= arity[1]:
            raise TypeError(
                "vectorized=True takes a vector env function fn(n) -> gymnasium.vector.VectorEnv "
                f"that builds n envs at once, but {_name_of(env)} takes no argument: a per-env "
                "function fn() -> gymnasium.Env goes without vectorized=True "
                f"(make_vec({_name_of(env)}, num_envs))"
            )
        return
    if isinstance(env, str) or isinstance(env, gym.Env):
        return
    fns = [env] if callable(env) else env if isinstance(env, list) else []
    for index, fn in enumerate(fns):
        arity = _required_positional(fn) if callable(fn) else None
        if arity is not None and arity[0] >= 1:
            which = "" if callable(env) else f" (env function {index})"
            raise TypeError(
                f"make_vec calls each env function as fn() -> gymnasium.Env, but "
                f"{_name_of(fn)}{which} needs {arity[0]} argument(s): for a vector env function "
                "fn(n) -> gymnasium.vector.VectorEnv pass vectorized=True "
                f"(make_vec({_name_of(fn)}, num_envs, vectorized=True))"
            )


@functools.lru_cache(maxsize=1)
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _pettingzoo_installed() -> bool:
    return "pettingzoo" in sys.modules or _installed("pettingzoo")


def _find_multiagent(
    env: Any, num_envs: int | None, env_kwargs: dict[str, Any] | None
) -> tuple[Any, Any]:
    """``(env functions, env 0)`` when ``env`` makes PettingZoo envs, else ``(None, env)`` with
    ``env`` as given, or with its first function handing over the env made to look at it.

    A Gymnasium id never imports anything here, and a callable is only called (once) when
    PettingZoo is installed: nothing else can make a PettingZoo env, and a function may import
    it itself.
    """
    from vecaccel import multiagent

    if isinstance(env, str):
        register_envs()
        if env in gym.registry:
            return None, env
        fn = multiagent.module_env_fn(env, env_kwargs)
        if fn is None:
            return None, env
        if num_envs is None:
            raise ValueError("num_envs is required when env is a module path")
        probe = make_env(fn, 0)
        if not multiagent.is_multiagent_env(probe):
            raise TypeError(
                f"module {env!r} made {type(probe).__name__}, not a PettingZoo ParallelEnv or AECEnv"
            )
        return [fn] * num_envs, probe
    if isinstance(env, (gym.Env, EnvSpec)) or not _pettingzoo_installed():
        return None, env
    if callable(env):
        fns = None
        first = env
    elif isinstance(env, list) and env and all(callable(fn) for fn in env):
        fns = list(env)
        first = fns[0]
    else:
        return None, env
    if env_kwargs:
        first = multiagent.ParallelEnvFn(first, env_kwargs)
    if fns is None and num_envs is None:
        return None, env  # the usual error for a single function without num_envs
    probe = make_env(first, 0)
    if multiagent.is_multiagent_env(probe):
        if fns is None:
            return [first] * num_envs, probe  # type: ignore[operator]  # set: checked above
        if env_kwargs:
            return [multiagent.ParallelEnvFn(fn, env_kwargs) for fn in fns], probe
        return fns, probe
    if env_kwargs:
        probe.close()
        return None, env
    handed = multiagent.HandOver(env if fns is None else fns[0], probe)
    return None, handed if fns is None else [handed, *fns[1:]]


def _make_multiagent(
    env_fns: list[Callable[[], Any]],
    probe: Any,
    num_envs: int | None,
    backend: tuple[BackendInfo, Any],
    autoreset_mode: str | AutoresetMode,
    options: dict[str, Any],
) -> gym.vector.VectorEnv[Any, Any, Any]:
    from vecaccel.multiagent import StackedAgentsFn, as_parallel, common_spaces
    from vecaccel.multiagent_vec import MultiAgentVecEnv

    try:
        if num_envs is not None and num_envs != len(env_fns):
            raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env functions were given")
        probe = as_parallel(probe)
        agents, observation_space, action_space = common_spaces(probe, 0)
    except BaseException:
        probe.close()
        raise
    stacked = [StackedAgentsFn(fn, i, probe if i == 0 else None) for i, fn in enumerate(env_fns)]
    try:
        vec_env = _build(stacked, backend, autoreset_mode, options)
    finally:
        stacked[0].close_unused()
    return MultiAgentVecEnv(vec_env, agents, observation_space, action_space)


def _checked_backend(backend: str, options: dict[str, Any]) -> tuple[BackendInfo, Any]:
    """The backend's registry entry and its checked options (``None`` for a backend that
    declares none): a misspelled option is refused here, before any env is built."""
    info = get_backend(backend)
    checked = None if info.options is None else info.options.from_kwargs(backend, options)
    return info, checked


def _are_slice_fns(env_fns: list[Any], num_envs: int | None) -> bool:
    """Whether ``env_fns`` are the env functions of vectorized slices (one vector env
    function for all), handed on as they are."""
    from vecaccel.vectorized import is_vectorized, vector_env_fn_of

    if not is_vectorized(env_fns):
        return False
    vector_env_fn_of(env_fns, 0)  # one vector env function for all, or a TypeError
    if num_envs is not None and num_envs != len(env_fns):
        raise ValueError(f"num_envs={num_envs} but {len(env_fns)} env functions were given")
    return True


def _slice_fns(
    env: Any,
    num_envs: int | None,
    autoreset_mode: str | AutoresetMode,
    env_kwargs: dict[str, Any] | None,
) -> list[Callable[[], gym.Env]]:
    """The env functions of vectorized slices: ``num_envs`` of :class:`SliceEnvFn` naming one
    checked vector env function (built once here with one env, so that a wrong autoreset mode
    fails before any worker starts)."""
    from vecaccel.vectorized import SliceEnvFn, VectorEnvFn

    if num_envs is None:
        raise ValueError("num_envs is required with vectorized=True")
    vector_fn = VectorEnvFn(env, parse_autoreset_mode(autoreset_mode), env_kwargs)
    vector_fn(1).close()
    return [SliceEnvFn(vector_fn)] * num_envs


def _build(
    env_fns: Sequence[Callable[[], Any]],
    backend: tuple[BackendInfo, Any],
    autoreset_mode: str | AutoresetMode,
    options: dict[str, Any],
) -> gym.vector.VectorEnv[Any, Any, Any]:
    info, checked = backend
    mode = parse_autoreset_mode(autoreset_mode)
    if mode not in info.autoreset_modes:
        claimed = ", ".join(m.value for m in info.autoreset_modes)
        raise ValueError(
            f"backend {info.name!r} does not implement autoreset_mode={mode.value!r}; it "
            f"implements: {claimed}"
        )
    if checked is None:  # a backend that declares no options gets them as given
        return info.factory(env_fns, autoreset_mode=autoreset_mode, **options)
    return info.factory(env_fns, autoreset_mode=autoreset_mode, options=checked)


def make_vec(
    env: str | Callable[[], gym.Env] | Sequence[Callable[[], gym.Env]],
    num_envs: int | None = None,
    *,
    backend: str = "shm",
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    env_kwargs: dict[str, Any] | None = None,
    vectorized: bool = False,
    **options: Any,
) -> gym.vector.VectorEnv:
    """Create a vectorized environment.

    Args:
        env: a registered Gymnasium id, a zero-argument callable returning an env, or a list of
            such callables (one per sub-environment). With ``vectorized=True``: a vector env
            function ``fn(n) -> gymnasium.vector.VectorEnv``, or an id whose spec has a
            ``vector_entry_point``.
        num_envs: how many sub-environments (required unless ``env`` is a list).
        backend: the registered backend to use; see ``vecaccel.list_backends()``.
        autoreset_mode: Gymnasium's ``AutoresetMode`` (or its string value).
        env_kwargs: keyword arguments for ``gymnasium.make`` when ``env`` is an id.
        vectorized: build one batched vector env per worker over its slice of the envs
            (see :mod:`vecaccel.vectorized`), instead of one env per env. Its autoreset mode
            must be ``autoreset_mode``; the build fails naming both otherwise.
        **options: backend options, e.g. ``num_workers``, ``context``, ``copy``,
            ``step_timeout_s``; each backend's are one dataclass of
            :mod:`vecaccel.options` (``ShmOptions`` for ``shm``...). Alias spellings such as
            ``step_timeout`` are accepted too.

    Returns:
        A ``gymnasium.vector.VectorEnv``.

    Raises:
        TypeError: if ``env`` is not one of the above (an env instance, say), ``num_envs`` is
            not an integer, or an option is not one of the backend's (the message names the
            closest one); raised before any worker starts.
        ValueError: if ``num_envs`` is below 1, the list of env functions is empty, the id or
            the backend is unknown, or an option's value is out of range; with ``vectorized``,
            if the id has no vector entry point or the vector env's autoreset mode is not
            ``autoreset_mode``.

    Example:
        >>> import vecaccel
        >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape
        (2, 4)
        >>> envs.close()
    """
    if num_envs is not None:
        # NumPy integers (a count read from an array or a config) are integers too; a bool is not
        if not isinstance(num_envs, numbers.Integral) or isinstance(num_envs, bool):
            raise TypeError(f"num_envs must be an integer, got {num_envs!r}")
        num_envs = int(num_envs)
        if num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs}")
    if isinstance(env, Iterable) and not isinstance(env, (str, gym.Env)) and not callable(env):
        env = list(env)  # looked at twice below: a generator would be spent
    checked = _checked_backend(backend, options)  # before an env function is called
    _check_env_fn_kind(env, vectorized)
    # before the first env is built here: a user's function calling gym.make("ALE/Pong-v5")
    # finds the namespaces of installed plugin packages, as the workers do
    register_envs()
    if not vectorized and isinstance(env, list) and _are_slice_fns(env, num_envs):
        # a block of another vector env's slice env functions (a Ray shard's): built as such
        return _build(env, checked, autoreset_mode, options)
    if vectorized:
        return _build(
            _slice_fns(env, num_envs, autoreset_mode, env_kwargs), checked, autoreset_mode, options
        )
    multiagent_fns, env = _find_multiagent(env, num_envs, env_kwargs)
    if multiagent_fns is not None:
        return _make_multiagent(multiagent_fns, env, num_envs, checked, autoreset_mode, options)
    try:
        env_fns = _env_fns(env, num_envs, env_kwargs)
        return _build(env_fns, checked, autoreset_mode, options)
    finally:
        if isinstance(env, list) and env and hasattr(env[0], "close_unused"):
            env[0].close_unused()
        elif hasattr(env, "close_unused"):
            env.close_unused()
