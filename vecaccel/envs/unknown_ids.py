"""What to tell a user whose Gymnasium id does not resolve: the package a namespace comes from
and the vecaccel extra that installs it, or the registered id they most likely meant.

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
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable

from vecaccel.errors import closest_name

__all__ = [
    "NAMESPACE_PACKAGES",
    "env_error_message",
    "env_id_hint",
    "namespace_hint",
    "unknown_env_id_message",
]

#: Gymnasium namespaces that an installable package registers: namespace -> (the module to
#: import, the distribution to install, the vecaccel extra that brings it).
NAMESPACE_PACKAGES: dict[str, tuple[str, str, str]] = {
    "ALE": ("ale_py", "ale-py", "atari"),
    "MinAtar": ("minatar", "minatar", "minatar"),
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
