"""``make_vec``: build a vecaccel ``VecEnv`` on a registered backend from an env source (or
what a user passes, resolved into one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from vecaccel.envs.source import EnvSource, checked_num_envs
from vecaccel.manager import BackendInfo, get_backend
from vecaccel.vec_env import parse_autoreset_mode

__all__ = ["make_vec"]


def _make_multiagent(
    source: EnvSource,
    backend: tuple[BackendInfo, Any],
    autoreset_mode: str | AutoresetMode,
    options: dict[str, Any],
) -> gym.vector.VectorEnv[Any, Any, Any]:
    from vecaccel.adapters.agent_rows import MultiAgentVecEnv
    from vecaccel.adapters.stacked_agents import StackedAgentsFn

    stacked = EnvSource(tuple(StackedAgentsFn(fn, i) for i, fn in enumerate(source)))
    vec_env = _build(stacked, backend, autoreset_mode, options)
    assert source.observation_space is not None and source.action_space is not None
    return MultiAgentVecEnv(
        vec_env, list(source.agents), source.observation_space, source.action_space
    )


def _checked_backend(backend: str, options: dict[str, Any]) -> tuple[BackendInfo, Any]:
    """The backend's registry entry and its checked options (``None`` for a backend that
    declares none): a misspelled option is refused here, before any env is built."""
    info = get_backend(backend)
    checked = None if info.options is None else info.options.from_kwargs(backend, options)
    return info, checked


def _build(
    source: EnvSource,
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
        return info.factory(source, autoreset_mode=autoreset_mode, **options)
    return info.factory(source, autoreset_mode=autoreset_mode, options=checked)


def make_vec(
    env: EnvSource | str | Callable[..., Any] | Sequence[Callable[[], Any]],
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
            such callables (one per sub-environment); a PettingZoo env function or module path
            (one row per agent); or an :class:`~vecaccel.envs.source.EnvSource` resolved
            already. With ``vectorized=True``: a vector env function
            ``fn(n) -> gymnasium.vector.VectorEnv``, or an id whose spec has a
            ``vector_entry_point``. Anything but an env source is resolved into one first
            (:meth:`~vecaccel.envs.source.EnvSource.resolve`).
        num_envs: how many sub-environments (required unless ``env`` is a list).
        backend: the registered backend to use; see ``vecaccel.list_backends()``.
        autoreset_mode: Gymnasium's ``AutoresetMode`` (or its string value).
        env_kwargs: keyword arguments for ``gymnasium.make`` when ``env`` is an id.
        vectorized: build one batched vector env per worker over its slice of the envs
            (see :mod:`vecaccel.envs.vectorized_slices`), instead of one env per env. Its autoreset
            mode must be ``autoreset_mode``; the build fails naming both otherwise.
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
            the backend is unknown, or an option's value is out of range or does not fit
            ``num_envs`` (a batch bound above it); with ``vectorized``,
            if the id has no vector entry point or the vector env's autoreset mode is not
            ``autoreset_mode``.
        gymnasium.error.DependencyNotInstalled: if the id is registered but its envs need a
            package that is not installed (a MuJoCo env without ``mujoco``); the message names
            the vecaccel extra that installs it, and no worker starts.

    Example:
        >>> import vecaccel
        >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape
        (2, 4)
        >>> envs.close()
    """
    num_envs = checked_num_envs(num_envs)
    checked = _checked_backend(backend, options)  # before an env function is called
    source = EnvSource.resolve(
        env,
        num_envs,
        env_kwargs=env_kwargs,
        vectorized=vectorized,
        autoreset_mode=autoreset_mode,
    )
    try:
        if source.multiagent:
            return _make_multiagent(source, checked, autoreset_mode, options)
        if checked[1] is not None:
            checked[1].check_num_envs(len(source))
        return _build(source, checked, autoreset_mode, options)
    finally:
        source.close_unused()
