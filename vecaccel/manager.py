"""The plugin manager and the backend registry that plugins fill.

Built-in backends are ordinary plugins named in :data:`DEFAULT_PLUGINS`; they are imported
only when the plugin manager is first built, so ``import vecaccel`` stays light.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy
from gymnasium.vector import AutoresetMode, VectorEnv

from vecaccel import hookspecs
from vecaccel.errors import did_you_mean
from vecaccel.options import BackendOptions

__all__ = [
    "DEFAULT_PLUGINS",
    "DISABLE_ENV_VAR",
    "BackendInfo",
    "BackendRegistry",
    "PluginWarning",
    "get_plugin_manager",
    "list_backends",
    "get_backend",
    "register_envs",
    "unknown_backend_message",
]

#: Module paths of the plugins that ship with vecaccel, registered like third-party ones.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "vecaccel.plugins.serial",
    "vecaccel.plugins.shm",
    "vecaccel.plugins.asynchronous",
    "vecaccel.plugins.action_server",
    "vecaccel.plugins.auto",
    "vecaccel.plugins.ray",
    "vecaccel.plugins.envs",
    "vecaccel.cli",
    "vecaccel.trainers.cli.commands",
)

#: Comma-separated plugin names (as registered, or entry-point names) to leave out.
DISABLE_ENV_VAR = "VECACCEL_DISABLE_PLUGINS"

ENTRY_POINT_GROUP = "vecaccel"

BackendFactory = Callable[..., VectorEnv[Any, Any, Any]]


class PluginWarning(UserWarning):
    """A plugin was left out, or one of its contributions was, because it failed."""


@dataclass(frozen=True)
class BackendInfo:
    """One registered backend."""

    name: str
    factory: BackendFactory
    description: str
    plugin: str
    options: type[BackendOptions] | None = None
    """The backend's options, checked by ``make_vec``; ``None``: passed on unchecked."""
    autoreset_modes: tuple[AutoresetMode, ...] = tuple(AutoresetMode)
    """The autoreset modes the backend implements; ``make_vec`` refuses the others, and
    :func:`vecaccel.testing.check_backend` checks each of these against ``SyncVectorEnv``."""


class BackendRegistry(Mapping[str, BackendInfo]):
    """The typed registry handed to ``vecaccel_register_backends``.

    Example:
        >>> registry = BackendRegistry()
        >>> registry.add("mine", lambda env_fns, **options: None, "my backend")
        >>> sorted(registry)
        ['mine']
    """

    def __init__(self) -> None:
        self._backends: dict[str, BackendInfo] = {}
        self._current_plugin = "<unknown>"

    def add(
        self,
        name: str,
        factory: BackendFactory,
        description: str = "",
        *,
        options: type[BackendOptions] | None = None,
        autoreset_modes: Iterable[AutoresetMode | str] | None = None,
    ) -> None:
        """Register ``factory`` under ``name``.

        Args:
            name: the name users pass as ``make_vec(..., backend=name)``.
            factory: builds the vector env. With ``options``, it is called as
                ``factory(env_fns, autoreset_mode=mode, options=checked)``, ``checked`` an
                instance of ``options``; without, as ``factory(env_fns, autoreset_mode=mode,
                **kwargs)`` with the keyword arguments as given.
            description: one line for ``vecaccel backends``.
            options: a :class:`vecaccel.options.BackendOptions` subclass declaring the
                backend's options, so that ``make_vec`` checks them (aliases, misspellings,
                values) before the backend starts anything.
            autoreset_modes: the Gymnasium autoreset modes the backend implements (default:
                all three); ``make_vec`` refuses any other with a ``ValueError``.

        Raises:
            ValueError: if ``name`` is taken by another plugin or is not a non-empty string,
                or ``autoreset_modes`` is empty or names an unknown mode.
            TypeError: if ``factory`` is not callable, or ``options`` not a ``BackendOptions``
                subclass.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"backend name must be a non-empty string, got {name!r}")
        if not callable(factory):
            raise TypeError(f"backend {name!r}: factory must be callable, got {factory!r}")
        if options is not None and not (
            isinstance(options, type) and issubclass(options, BackendOptions)
        ):
            raise TypeError(
                f"backend {name!r}: options must be a BackendOptions subclass, got {options!r}"
            )
        modes = _autoreset_modes(name, autoreset_modes)
        if name in self._backends:
            other = self._backends[name].plugin
            raise ValueError(
                f"backend {name!r} is registered twice (by {other!r} and {self._current_plugin!r}"
                f"); set {DISABLE_ENV_VAR}={self._current_plugin} to leave the second one out"
            )
        self._backends[name] = BackendInfo(
            name, factory, description, self._current_plugin, options, modes
        )

    def __getitem__(self, name: str) -> BackendInfo:
        return self._backends[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._backends)

    def __len__(self) -> int:
        return len(self._backends)


def _autoreset_modes(
    name: str, modes: Iterable[AutoresetMode | str] | None
) -> tuple[AutoresetMode, ...]:
    if modes is None:
        return tuple(AutoresetMode)
    if isinstance(modes, (str, AutoresetMode)):
        modes = [modes]
    parsed: list[AutoresetMode] = []
    for mode in modes:
        try:
            parsed.append(AutoresetMode(mode))
        except ValueError:
            valid = ", ".join(m.value for m in AutoresetMode)
            raise ValueError(
                f"backend {name!r}: unknown autoreset mode {mode!r}; valid: {valid}"
            ) from None
    if not parsed:
        raise ValueError(f"backend {name!r}: autoreset_modes must name at least one mode")
    return tuple(dict.fromkeys(parsed))


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_envs_registered = False


def _disabled_names() -> set[str]:
    raw = os.environ.get(DISABLE_ENV_VAR, "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def get_plugin_manager() -> pluggy.PluginManager:
    """Return the process-wide plugin manager, building it on first use.

    It holds the specs of :mod:`vecaccel.hookspecs`, the built-in plugins, and every plugin of
    the ``vecaccel`` entry-point group, minus those named in ``VECACCEL_DISABLE_PLUGINS``.
    Plugins registered on it later with ``pm.register(module)`` are honoured.

    Example:
        >>> pm = get_plugin_manager()
        >>> pm.has_plugin("vecaccel.plugins.serial")
        True
    """
    global _manager
    with _lock:
        if _manager is not None:
            return _manager
        pm = pluggy.PluginManager("vecaccel")
        pm.add_hookspecs(hookspecs)
        disabled = _disabled_names()
        for name in disabled:
            pm.set_blocked(name)
        for module_path in DEFAULT_PLUGINS:
            if module_path in disabled or module_path.rsplit(".", 1)[-1] in disabled:
                continue
            try:
                module = importlib.import_module(module_path)
            except ImportError as exc:
                # a built-in plugin whose optional dependency is missing (torch) is left out
                if getattr(exc, "name", None) in ("torch",):
                    continue
                raise
            pm.register(module, name=module_path)
        _load_entry_points(pm)
        pm.check_pending()
        _manager = pm
        return pm


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Register the plugins of the entry-point group one at a time.

    pluggy's ``load_setuptools_entrypoints`` stops at the first plugin that fails to import,
    with a traceback that never says it came from a plugin; here a broken third-party plugin is
    left out with a warning that names it and the way to skip it, and the others still load.
    """
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        name = entry_point.name
        if pm.get_plugin(name) is not None or pm.is_blocked(name):
            continue
        dist = getattr(entry_point, "dist", None)
        source = f"dist {dist.name}" if dist is not None else entry_point.value
        where = f"plugin {name!r} ({source})"
        try:
            plugin = entry_point.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is left out with a warning
            _warn_plugin(f"{where} failed to import: {type(exc).__name__}: {exc}", name)
            continue
        try:
            pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            _warn_plugin(f"{where} could not be registered: {exc}", name)


def _warn_plugin(problem: str, name: str) -> None:
    warnings.warn(
        f"{problem}; set {DISABLE_ENV_VAR}={name} to skip it", PluginWarning, stacklevel=3
    )


def _reset_plugin_manager() -> None:
    """Forget the plugin manager (tests use this after changing the environment)."""
    global _manager, _envs_registered
    with _lock:
        _manager = None
        _envs_registered = False


def _collect_backends() -> BackendRegistry:
    pm = get_plugin_manager()
    registry = BackendRegistry()
    # call each implementation on its own so the registry knows which plugin added what, in
    # registration order (pluggy lists them so; it calls them newest first), so that a built-in
    # claims its names before any later plugin and a clash blames the newcomer
    for impl in pm.hook.vecaccel_register_backends.get_hookimpls():
        registry._current_plugin = pm.get_name(impl.plugin) or impl.plugin_name
        # only the arguments it asks for, as pluggy calls a hook: specs may grow
        arguments = {
            name: value for name, value in (("registry", registry),) if name in impl.argnames
        }
        try:
            impl.function(**arguments)
        except Exception as exc:
            if sys.version_info >= (3, 11):  # notes are new in 3.11
                exc.add_note(
                    f"(in plugin {registry._current_plugin!r}, vecaccel_register_backends)"
                )
            raise
    registry._current_plugin = "<unknown>"
    return registry


def list_backends() -> dict[str, dict[str, str]]:
    """Map each backend name to its description and the plugin that provides it.

    Example:
        >>> backends = list_backends()
        >>> backends["serial"]["plugin"]
        'vecaccel.plugins.serial'
    """
    return {
        name: {"description": info.description, "plugin": info.plugin}
        for name, info in _collect_backends().items()
    }


def unknown_backend_message(name: object, registered: Iterable[str]) -> str:
    """What to say about a backend name that is not registered: the names that are, and the
    one ``name`` most likely meant (a different case counts as the same spelling).

    Example:
        >>> unknown_backend_message("Async", ["serial", "shm", "async"])
        "unknown backend 'Async'; did you mean 'async'? registered backends: async, serial, shm"
        >>> unknown_backend_message("gpu", ["serial", "shm"])
        "unknown backend 'gpu'; registered backends: serial, shm"
    """
    known = sorted(registered)
    hint = did_you_mean(name, known) if isinstance(name, str) else ""
    return (
        f"unknown backend {name!r}{hint or ';'} registered backends: {', '.join(known) or 'none'}"
    )


def get_backend(name: str) -> BackendInfo:
    """Return the backend registered as ``name``.

    Raises:
        ValueError: naming the backends that exist, and the one ``name`` most likely meant, if
            ``name`` is unknown.
    """
    registry = _collect_backends()
    try:
        return registry[name]
    except KeyError:
        raise ValueError(unknown_backend_message(name, registry)) from None


def register_envs() -> None:
    """Let plugins register the Gymnasium environments of installed packages (once per process).

    ``make_vec`` runs it in the caller, and the worker processes, Ray shard actors and the
    async trainers' sampler run it before they call an env function, under every start method.
    A backend that builds envs in processes of its own calls it there first: Gymnasium 1.x
    knows a plugin package's namespace (``ALE/``, ``MinAtar/``) only once its registration
    has run in that process.

    Example:
        >>> register_envs()
        >>> import gymnasium as gym
        >>> "CartPole-v1" in gym.registry
        True
    """
    global _envs_registered
    with _lock:
        if _envs_registered:
            return
        get_plugin_manager().hook.vecaccel_register_envs()
        _envs_registered = True
