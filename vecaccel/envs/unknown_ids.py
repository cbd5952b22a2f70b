"""What to tell a user whose Gymnasium id does not resolve: the package a namespace comes from
and the vecaccel extra that installs it, or the registered id they most likely meant; and for a
registered id whose package is missing (Gymnasium registers its MuJoCo envs whether or not
``mujoco`` is installed), the extra that installs it.

Gymnasium's own messages already suggest a close name inside a namespace (``MinAtar/Breakot-v1``:
did you mean ``Breakout``?) and a close namespace (``Minatar/...``: did you mean ``MinAtar``?).
They cannot say that a namespace belongs to a package that is not installed, nor that a bare
``Breakout-v1`` is a MinAtar game: :func:`env_id_hint` adds those.

Example:
    >>> from gymnasium.error import NameNotFound
    >>> env_id_hint("MinAtar/Breakout-v1", installed=lambda module: False)
    "the MinAtar namespace comes from the 'minatar' package, which is not installed: pip install 'vecaccel[minatar]'"
    >>> env_id_hint("CartPol-v1") is None
    True
    >>> missing_package_message("Hopper-v5", installed=lambda module: False)
    "Hopper-v5 is one of Gymnasium's MuJoCo envs and needs the 'mujoco' package, which is not installed: pip install 'vecaccel[mujoco]'"
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable

from vecaccel.errors import closest_name

__all__ = [
    "ENTRY_POINT_PACKAGES",
    "NAMESPACE_PACKAGES",
    "entry_point_module",
    "env_error_message",
    "env_id_hint",
    "missing_package_message",
    "namespace_hint",
    "unknown_env_id_message",
    "uses_mujoco",
]

#: Gymnasium namespaces that an installable package registers: namespace -> (the module to
#: import, the distribution to install, the vecaccel extra that brings it).
NAMESPACE_PACKAGES: dict[str, tuple[str, str, str]] = {
    "ALE": ("ale_py", "ale-py", "atari"),
    "MinAtar": ("minatar", "minatar", "minatar"),
}

#: Gymnasium's own envs that need a package Gymnasium does not install: the module path their
#: entry points start with -> (what the envs are called, the module to import, the
#: distribution to install, the vecaccel extra that brings it).
ENTRY_POINT_PACKAGES: dict[str, tuple[str, str, str, str]] = {
    "gymnasium.envs.mujoco.": ("Gymnasium's MuJoCo envs", "mujoco", "mujoco", "mujoco"),
}


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _namespace_of(env_id: str) -> str | None:
    head, sep, _ = env_id.partition("/")
    return head if sep else None


def env_id_hint(env_id: str, installed: Callable[[str], bool] = _installed) -> str | None:
    """One sentence that helps with an ``env_id`` Gymnasium could not resolve, or ``None``.

    Args:
        env_id: the id as the user wrote it.
        installed: whether a module can be imported (a parameter for tests).

    Returns:
        The package and extra to install when the id's namespace (in any letter case) belongs
        to one that is missing; else the registered namespaced id whose name matches a bare
        id of one of :data:`NAMESPACE_PACKAGES` (``Breakout-v1`` -> ``MinAtar/Breakout-v1``);
        else ``None``.
    """
    namespace = _namespace_of(env_id)
    if namespace is not None:
        for known, (module, distribution, extra) in NAMESPACE_PACKAGES.items():
            if namespace.lower() == known.lower() and not installed(module):
                return (
                    f"the {known} namespace comes from the {distribution!r} package, which is "
                    f"not installed: pip install 'vecaccel[{extra}]'"
                )
        return None
    import gymnasium as gym

    from vecaccel.manager import register_envs

    register_envs()  # a namespace is in Gymnasium's registry once its plugin has registered it
    wanted = env_id.lower()
    namespaced = {  # the ids of the packages' namespaces only: Gymnasium's own (phys2d/...)
        registered.partition("/")[2].lower(): registered  # are variants of ids it has bare
        for registered in gym.registry
        if _namespace_of(registered) in NAMESPACE_PACKAGES
    }
    meant = closest_name(wanted, namespaced, cutoff=0.85)
    return None if meant is None else f"did you mean {meant!r}?"


def entry_point_module(env_id: str) -> str | None:
    """The module path of the entry point of the registered id ``env_id``, read from
    Gymnasium's registry without importing the env; ``None`` for an id Gymnasium cannot
    resolve.

    Example:
        >>> entry_point_module("HalfCheetah-v5")
        'gymnasium.envs.mujoco.half_cheetah_v5'
        >>> entry_point_module("NoSuchEnv-v0") is None
        True
    """
    import gymnasium as gym

    from vecaccel.manager import register_envs

    register_envs()
    try:
        spec = gym.spec(env_id)
    except Exception:  # noqa: BLE001 - any id Gymnasium cannot resolve has no entry point
        return None
    entry = spec.entry_point
    if isinstance(entry, str):
        return entry.partition(":")[0]
    return getattr(entry, "__module__", None)


def uses_mujoco(env_id: str) -> bool:
    """Whether the registered id ``env_id`` is made by a MuJoCo module (its entry point's
    module path names ``mujoco``, as Gymnasium's ``HalfCheetah-v5`` and the like do), found
    without importing the env or MuJoCo. An id that is not registered gives False.

    Example:
        >>> uses_mujoco("Hopper-v5"), uses_mujoco("CartPole-v1")
        (True, False)
    """
    return "mujoco" in (entry_point_module(env_id) or "").lower()


def missing_package_message(
    env_id: str, installed: Callable[[str], bool] = _installed
) -> str | None:
    """The sentence for a registered ``env_id`` whose envs need a package of
    :data:`ENTRY_POINT_PACKAGES` that is not installed, naming the extra that installs it;
    ``None`` where nothing is missing.

    Args:
        env_id: a Gymnasium id.
        installed: whether a module can be imported (a parameter for tests).
    """
    module_path = entry_point_module(env_id)
    if module_path is None:
        return None
    for prefix, (envs, module, distribution, extra) in ENTRY_POINT_PACKAGES.items():
        if (module_path + ".").startswith(prefix) and not installed(module):
            return (
                f"{env_id} is one of {envs} and needs the {distribution!r} package, which is "
                f"not installed: pip install 'vecaccel[{extra}]'"
            )
    return None


def unknown_env_id_message(env_id: str, error: BaseException) -> str:
    """``unknown environment id ...: <Gymnasium's message>``, with :func:`env_id_hint`'s
    sentence where it has one."""
    hint = env_id_hint(env_id)
    message = f"unknown environment id {env_id!r}: {error}"
    return f"{message.rstrip('.')}; {hint}" if hint else message


#: Gymnasium's message for an id whose namespace no registered env has.
_NAMESPACE_NOT_FOUND = re.compile(r"Namespace (\S+) not found")


def namespace_hint(
    error: BaseException, installed: Callable[[str], bool] = _installed
) -> str | None:
    """One sentence for a ``gymnasium.error.NamespaceNotFound`` that an env function raised (a
    ``gym.make("ALE/Pong-v5")`` of its own), or ``None`` for any other error.

    Args:
        error: what the env function raised.
        installed: whether a module can be imported (a parameter for tests).

    Returns:
        The package and extra to install for a namespace of :data:`NAMESPACE_PACKAGES` whose
        package is missing; the registration line for one whose package is installed; else
        how Gymnasium registers a namespace.

    Example:
        >>> from gymnasium.error import NamespaceNotFound
        >>> error = NamespaceNotFound("Namespace MinAtar not found. Have you installed ...?")
        >>> namespace_hint(error, installed=lambda module: False)
        "the MinAtar namespace comes from the 'minatar' package, which is not installed: pip install 'vecaccel[minatar]'"
        >>> namespace_hint(ValueError("Namespace ALE not found")) is None
        True
    """
    from gymnasium.error import NamespaceNotFound

    found = _NAMESPACE_NOT_FOUND.search(str(error))
    if not isinstance(error, NamespaceNotFound) or found is None:
        return None
    namespace = found.group(1)
    for known, (module, _, _) in NAMESPACE_PACKAGES.items():
        if namespace.lower() == known.lower():
            if installed(module):
                return (
                    f"{module} is installed but did not register the {known} namespace in this "
                    f"process: import {module}; gymnasium.register_envs({module}) before "
                    "gymnasium.make"
                )
            return env_id_hint(f"{namespace}/", installed)
    return (
        f"Gymnasium knows the {namespace} namespace only once the package that provides it "
        "has registered its envs in this process: import that package (and call "
        "gymnasium.register_envs(package) for Gymnasium 1.x) inside the env function, or from "
        "a plugin's vecaccel_register_envs hook, which vecaccel runs in every worker"
    )


def env_error_message(error: BaseException) -> str:
    """``str(error)``, with :func:`namespace_hint`'s sentence where it has one: what the
    error of an env function says wherever the env was built (caller or worker).

    Example:
        >>> env_error_message(ValueError("bad"))
        'bad'
    """
    hint = namespace_hint(error)
    message = str(error)
    return f"{message.rstrip('.')}; {hint}" if hint else message
