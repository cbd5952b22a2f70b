"""The env source: what a user passed as ``env``, resolved once into the envs to build.

A user names the envs of a vector env in one of several ways: a Gymnasium id, a zero-argument
env function, a list of them, a vector env function ``fn(n)`` (``vectorized=True``), a
PettingZoo env function or the module path of a PettingZoo env. :meth:`EnvSource.resolve` is
the one place that tells these apart; everything after it (``make_vec``, every backend,
``tune``, ``bench``, the trainers) reads the answer from the :class:`EnvSource` it returns.

A backend receives the env source as its ``env_fns``: it is a sequence of zero-argument env
functions, as the hook contract promises, and carries what the functions alone do not say
(vectorized slices or not, the id). A backend called directly with a plain list reads the same
facts through :meth:`EnvSource.of`.

Example:
    >>> source = EnvSource.resolve("CartPole-v1", 3)
    >>> source.num_envs, source.env_id, source.vectorized, source.multiagent
    (3, 'CartPole-v1', False, False)
    >>> env = source[0]()
    >>> env.spec.id
    'CartPole-v1'
    >>> env.close()
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import numbers
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from vecaccel.envs.env_fns import EnvCall, PrebuiltEnvFn, make_gym_env, make_pettingzoo_env
from vecaccel.envs.unknown_ids import missing_package_message, unknown_env_id_message
from vecaccel.manager import register_envs
from vecaccel.vec_env import make_env, parse_autoreset_mode

__all__ = ["EnvSource", "checked_num_envs"]


def checked_num_envs(num_envs: Any) -> int | None:
    """``num_envs`` as an ``int`` (``None`` stays ``None``).

    NumPy integers (a count read from an array or a config) are integers too; a bool is not.

    Raises:
        TypeError: if it is not an integer.
        ValueError: if it is below 1.

    Example:
        >>> import numpy as np
        >>> checked_num_envs(np.int64(4)), checked_num_envs(None)
        (4, None)
    """
    if num_envs is None:
        return None
    if not isinstance(num_envs, numbers.Integral) or isinstance(num_envs, bool):
        raise TypeError(f"num_envs must be an integer, got {num_envs!r}")
    num_envs = int(num_envs)
    if num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs}")
    return num_envs


def _check_count(num_envs: int | None, count: int) -> None:
    if num_envs is not None and num_envs != count:
        raise ValueError(f"num_envs={num_envs} but {count} env functions were given")


@dataclass(frozen=True, eq=False)
class EnvSource(Sequence[Callable[[], Any]]):
    """The envs a vector env is built from, with what every backend needs to know about them.

    Make one with :meth:`resolve` (from what a user passes to ``make_vec``) or :meth:`of`
    (from the env functions a backend is handed). It is a sequence of its env functions, so it
    goes wherever a list of env functions does; a slice is the env source of those envs.

    Attributes:
        env_fns: one picklable zero-argument env function per env (under ``fork``, ``spawn``
            and ``forkserver``). For vectorized slices, each is a
            :class:`vecaccel.envs.vectorized_slices.SliceEnvFn` of one vector env function; for a
            multi-agent source, each returns a PettingZoo env.
        vectorized: the envs are the sub-envs of vectorized slices (one vector env per worker).
        multiagent: the env functions make PettingZoo envs (``make_vec`` stacks their agents).
        env_id: the Gymnasium id or PettingZoo module path the user gave, else ``None``.
        observation_space: the observation space of env 0 (for a multi-agent source, of each
            agent) where an env was made to look at it, else ``None``: an env is only made
            where today's rules need one, so that no trajectory changes.
        action_space: the action space, likewise.
        agents: a multi-agent source's possible agents (row order), else ``()``.
    """

    env_fns: tuple[Callable[[], Any], ...]
    vectorized: bool = False
    multiagent: bool = False
    env_id: str | None = None
    observation_space: gym.Space | None = field(default=None, repr=False)
    action_space: gym.Space | None = field(default=None, repr=False)
    agents: tuple[str, ...] = ()

    # -- a sequence of env functions ----------------------------------------------------------

    @property
    def num_envs(self) -> int:
        """How many envs (for a multi-agent source: envs, not agent rows)."""
        return len(self.env_fns)

    def __len__(self) -> int:
        return len(self.env_fns)

    @overload
    def __getitem__(self, index: int) -> Callable[[], Any]: ...

    @overload
    def __getitem__(self, index: slice) -> EnvSource: ...

    def __getitem__(self, index: int | slice) -> Callable[[], Any] | EnvSource:
        if isinstance(index, slice):
            return replace(self, env_fns=self.env_fns[index])
        return self.env_fns[index]

    def __iter__(self) -> Iterator[Callable[[], Any]]:
        return iter(self.env_fns)

    # -- what a backend reads ------------------------------------------------------------------

    @classmethod
    def of(cls, env_fns: Sequence[Callable[[], Any]]) -> EnvSource:
        """The env source of the env functions a backend is handed: ``env_fns`` itself where it
        is one, else the facts read from the functions (vectorized slices or not).

        Example:
            >>> EnvSource.of([lambda: None]).vectorized
            False
        """
        if isinstance(env_fns, EnvSource):
            return env_fns
        from vecaccel.envs.vectorized_slices import SliceEnvFn

        fns = tuple(env_fns)
        return cls(fns, vectorized=bool(fns) and isinstance(fns[0], SliceEnvFn))

    def vector_env_fn(self, start: int = 0) -> Any:
        """The one vector env function of a vectorized source (its envs being ``start`` and on
        of a larger one, for the message).

        Raises:
            TypeError: if some env functions are not sub-envs of that vector env function.
        """
        from vecaccel.envs.vectorized_slices import vector_env_fn_of

        return vector_env_fn_of(self.env_fns, start)

    def close_unused(self) -> None:
        """Close the env made to look at the source if no env function call took it."""
        if self.env_fns and hasattr(self.env_fns[0], "close_unused"):
            self.env_fns[0].close_unused()

    @staticmethod
    def id_of(env: Any) -> str | None:
        """The id (or PettingZoo module path) ``env`` names, where it is one rather than envs
        already built or functions to build them.

        Example:
            >>> EnvSource.id_of("CartPole-v1"), EnvSource.id_of(lambda: None)
            ('CartPole-v1', None)
        """
        if isinstance(env, EnvSource):
            return env.env_id
        return env if isinstance(env, str) else None

    @staticmethod
    def is_module_path(env: Any) -> bool:
        """Whether ``env`` is the module path of a PettingZoo env (a module with
        ``parallel_env``, or ``env``/``raw_env`` for AEC, such as
        ``pettingzoo.butterfly.pistonball_v6``) rather than a Gymnasium id: the rule
        :meth:`resolve` goes by, read without making an env. An env source answers for the
        module path it was resolved from.

        Only a dotted name of an importable module qualifies, so a Gymnasium id never imports
        anything here.

        Example:
            >>> EnvSource.is_module_path("CartPole-v1"), EnvSource.is_module_path("ALE/Pong-v5")
            (False, False)
            >>> EnvSource.is_module_path("pettingzoo.butterfly.pistonball_v6")
            True
        """
        if isinstance(env, EnvSource):
            return env.multiagent and env.env_id is not None
        return isinstance(env, str) and _module_env_fn(env, None) is not None

    @staticmethod
    def check_id(env_id: str) -> None:
        """Refuse, in the caller's process, an id that names no registered env: the check
        :meth:`resolve` makes before any env or worker process is built, for callers that
        wrap an id in env functions of their own (the trainers' wrappers) before resolving
        them. A PettingZoo module path passes.

        Raises:
            ValueError: ``unknown environment id ...``, with Gymnasium's close names and
                :func:`~vecaccel.envs.unknown_ids.env_id_hint`'s sentence (the package a
                namespace comes from, the namespaced id meant).
            gymnasium.error.DependencyNotInstalled: the id is registered but its envs need a
                package that is missing (``Hopper-v5`` without ``mujoco``); the message names
                the vecaccel extra that installs it
                (:func:`~vecaccel.envs.unknown_ids.missing_package_message`).

        Example:
            >>> EnvSource.check_id("CartPole-v1")
            >>> EnvSource.check_id("CartPol-v1")
            Traceback (most recent call last):
            ...
            ValueError: unknown environment id 'CartPol-v1': Environment `CartPol` doesn't exist. Did you mean: `CartPole`?
        """
        register_envs()  # the namespaces of installed plugin packages (ALE/, MinAtar/)
        if env_id in gym.registry:
            # Gymnasium registers its MuJoCo envs whether or not mujoco is installed: without
            # this check every worker would fail to make its env, each with a traceback
            missing = missing_package_message(env_id)
            if missing is not None:
                raise gym.error.DependencyNotInstalled(missing)
            return
        if EnvSource.is_module_path(env_id):
            return
        try:
            gym.spec(env_id)  # raises a helpful error with close matches
        except gym.error.Error as exc:
            raise ValueError(unknown_env_id_message(env_id, exc)) from None

    # -- what the user passed --------------------------------------------------------------------

    @classmethod
    def resolve(
        cls,
        env: Any,
        num_envs: int | None = None,
        *,
        env_kwargs: dict[str, Any] | None = None,
        vectorized: bool = False,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    ) -> EnvSource:
        """Resolve what a user passed as ``env`` (see ``make_vec``) into an env source.

        An env source passes through (its size checked against ``num_envs``). A Gymnasium id
        makes no env here. Where PettingZoo is installed, a function is called once to see
        whether it makes a PettingZoo env; the env it made then serves as env 0, so that every
        function is called as often as without the look. With ``vectorized=True`` the vector
        env function is built once with one env, so that a wrong autoreset mode fails before
        any worker starts.

        Args:
            env: an id, an env function, a list of env functions, a vector env function (with
                ``vectorized``), a PettingZoo env function or module path, or an env source.
            num_envs: how many envs (required unless ``env`` is a list or an env source).
            env_kwargs: keyword arguments for ``gymnasium.make`` (an id), the PettingZoo env
                function, or the vector entry point.
            vectorized: ``env`` builds one vector env per worker over its slice of the envs.
            autoreset_mode: the mode a vector env function's envs must have.

        Raises:
            TypeError: for what is none of the above (an env instance, say), a ``num_envs``
                that is not an integer, or an env function of the other kind than
                ``vectorized`` says.
            ValueError: for an unknown id, an empty list, a ``num_envs`` that is missing,
                below 1 or not the list's length, or ``env_kwargs`` where they do not apply.

        Example:
            >>> EnvSource.resolve([lambda: gym.make("CartPole-v1")] * 2).num_envs
            2
            >>> EnvSource.resolve("CartPole-v1")
            Traceback (most recent call last):
            ...
            ValueError: num_envs is required when env is an environment id
        """
        if isinstance(env, EnvSource):
            if env_kwargs:
                raise ValueError("env_kwargs only apply where the env source is made")
            _check_count(checked_num_envs(num_envs), env.num_envs)
            return env
        num_envs = checked_num_envs(num_envs)
        if isinstance(env, Iterable) and not isinstance(env, (str, gym.Env)) and not callable(env):
            env = list(env)  # looked at more than once below: a generator would be spent
        _check_env_fn_kind(env, vectorized)
        # before the first env is built here: a user's function calling gym.make("ALE/Pong-v5")
        # finds the namespaces of installed plugin packages, as the workers do
        register_envs()
        if vectorized:
            return _slice_source(env, num_envs, autoreset_mode, env_kwargs)
        if isinstance(env, list) and _are_slice_fns(env):
            # a block of another vector env's slice env functions (a Ray shard's)
            _check_count(num_envs, len(env))
            return cls(tuple(env), vectorized=True)
        multiagent, env = _multiagent_source(env, num_envs, env_kwargs)
        if multiagent is not None:
            return multiagent
        return _single_agent_source(env, num_envs, env_kwargs)


def _env_fns(
    env: Any, num_envs: int | None, env_kwargs: dict[str, Any] | None
) -> list[Callable[[], gym.Env]]:
    if isinstance(env, str):
        EnvSource.check_id(env)
        if num_envs is None:
            raise ValueError("num_envs is required when env is an environment id")
        return [EnvCall(make_gym_env, env, **(env_kwargs or {})) for _ in range(num_envs)]
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
    _check_count(num_envs, len(env_fns))
    return env_fns


def _single_agent_source(
    env: Any, num_envs: int | None, env_kwargs: dict[str, Any] | None
) -> EnvSource:
    env_fns = _env_fns(env, num_envs, env_kwargs)
    # the env made to look at, if any: its spaces are known without making another
    handed = env_fns[0].instance if isinstance(env_fns[0], PrebuiltEnvFn) else None
    return EnvSource(
        tuple(env_fns),
        env_id=env if isinstance(env, str) else None,
        observation_space=getattr(handed, "observation_space", None),
        action_space=getattr(handed, "action_space", None),
    )


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


def _are_slice_fns(env_fns: list[Any]) -> bool:
    """Whether ``env_fns`` are the env functions of vectorized slices (one vector env
    function for all, else a ``TypeError``)."""
    source = EnvSource.of(env_fns)
    if source.vectorized:
        source.vector_env_fn()
    return source.vectorized


def _slice_source(
    env: Any,
    num_envs: int | None,
    autoreset_mode: str | AutoresetMode,
    env_kwargs: dict[str, Any] | None,
) -> EnvSource:
    """``num_envs`` :class:`~vecaccel.envs.vectorized_slices.SliceEnvFn` naming one checked vector env
    function (built once here with one env, so that a wrong autoreset mode fails before any
    worker starts)."""
    from vecaccel.envs.vectorized_slices import SliceEnvFn, VectorEnvFn

    if num_envs is None:
        raise ValueError("num_envs is required with vectorized=True")
    vector_fn = VectorEnvFn(env, parse_autoreset_mode(autoreset_mode), env_kwargs)
    vector_fn(1).close()
    return EnvSource(
        (SliceEnvFn(vector_fn),) * num_envs,
        vectorized=True,
        env_id=env if isinstance(env, str) else None,
    )


_MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _module_env_fn(path: str, env_kwargs: dict[str, Any] | None) -> Callable[[], Any] | None:
    """The env function of module path ``path`` where that module makes PettingZoo envs (it
    has ``parallel_env``, or ``raw_env`` for AEC), else ``None``; a string that is no dotted
    name of an importable module imports nothing."""
    if not _MODULE_PATH.match(path):
        return None
    try:
        if importlib.util.find_spec(path.split(".")[0]) is None:
            return None
        module = importlib.import_module(path)
    except ImportError:
        return None
    if not (hasattr(module, "parallel_env") or hasattr(module, "raw_env")):
        return None
    return EnvCall(make_pettingzoo_env, path, **(env_kwargs or {}))


@functools.lru_cache(maxsize=1)
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _pettingzoo_installed() -> bool:
    return "pettingzoo" in sys.modules or _installed("pettingzoo")


def _multiagent_source(
    env: Any, num_envs: int | None, env_kwargs: dict[str, Any] | None
) -> tuple[EnvSource | None, Any]:
    """``(the multi-agent source, env)`` where ``env`` makes PettingZoo envs, else
    ``(None, env)``, with ``env`` as given or with its function (or its list's first) handing
    over the env made to look at it.

    A Gymnasium id never imports anything here, and a function is only called (once) where
    PettingZoo is installed: nothing else can make a PettingZoo env, and a function may import
    it itself.
    """
    from vecaccel.adapters import stacked_agents

    if isinstance(env, str):
        if env in gym.registry:
            return None, env
        fn = _module_env_fn(env, env_kwargs)
        if fn is None:
            return None, env
        if num_envs is None:
            raise ValueError("num_envs is required when env is a module path")
        probe = make_env(fn, 0)
        if not stacked_agents.is_multiagent_env(probe):
            raise TypeError(
                f"module {env!r} made {type(probe).__name__}, not a PettingZoo ParallelEnv or AECEnv"
            )
        return _stacked_source([fn] * num_envs, probe, env), env
    if isinstance(env, (gym.Env, EnvSpec)) or not _pettingzoo_installed():
        return None, env
    if callable(env):
        if num_envs is None:
            return None, env  # the usual error for a single function without num_envs
        fns = [env] * num_envs
    elif isinstance(env, list) and env and all(callable(fn) for fn in env):
        _check_count(num_envs, len(env))
        fns = list(env)
    else:
        return None, env
    if env_kwargs:
        fns = [EnvCall(fn, **env_kwargs) for fn in fns]
    probe = make_env(fns[0], 0)
    if stacked_agents.is_multiagent_env(probe):
        return _stacked_source(fns, probe, None), env
    if env_kwargs:
        probe.close()
        return None, env
    handed = PrebuiltEnvFn(fns[0], probe)
    return None, handed if callable(env) else [handed, *env[1:]]


def _stacked_source(fns: list[Callable[[], Any]], probe: Any, env_id: str | None) -> EnvSource:
    from vecaccel.adapters import stacked_agents

    try:
        probe = stacked_agents.as_parallel(probe)
        agents, observation_space, action_space = stacked_agents.common_spaces(probe, 0)
    except BaseException:
        probe.close()
        raise
    return EnvSource(
        (PrebuiltEnvFn(fns[0], probe), *fns[1:]),
        multiagent=True,
        env_id=env_id,
        observation_space=observation_space,
        action_space=action_space,
        agents=tuple(agents),
    )
