"""Every hook a vecaccel plugin may implement.

Plugins implement hooks with ``from vecaccel import hookimpl``. Hooks are always called with
keyword arguments, so new arguments can be added to a spec without breaking existing plugins.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from vecaccel.cli import Commands
    from vecaccel.manager import BackendRegistry

hookspec = pluggy.HookspecMarker("vecaccel")


@hookspec
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    """Register vector-environment backends.

    Called whenever the backend registry is read (``list_backends``, ``make_vec``, so that a
    plugin registered at run time is seen at once): keep it cheap and free of side effects.
    Each plugin's implementation is called in turn, in registration order (the built-ins
    first), with the arguments it names (as pluggy calls hooks); an exception raised in it names
    the plugin in a note, and a name registered before is a ``ValueError`` naming both plugins.

    Args:
        registry: call ``registry.add(name, factory, description="", options=None,
            autoreset_modes=None)`` for each backend (``autoreset_modes``: the Gymnasium modes
            it implements, all three unless it says otherwise). ``env_fns`` is a list of zero-argument callables that each return a
            ``gymnasium.Env``, and the factory returns a ``gymnasium.vector.VectorEnv``. A
            backend that declares its options (a :class:`vecaccel.options.BackendOptions`
            subclass) has them checked by ``make_vec`` and is called as
            ``factory(env_fns, autoreset_mode=mode, options=checked)``; one that declares none
            is called as ``factory(env_fns, autoreset_mode=mode, **options)``.

    Returns:
        Nothing; every plugin's implementation is called (not ``firstresult``).
    """


@hookspec
def vecaccel_register_envs() -> None:
    """Register Gymnasium environments that an installed package provides.

    Called once before ``vecaccel.make_vec`` resolves an environment id, so that ids such as
    ``"ALE/Pong-v5"`` work without the user's ``gym.register_envs(ale_py)`` line.

    Returns:
        Nothing; every plugin's implementation is called (not ``firstresult``).
    """


@hookspec
def vecaccel_add_commands(commands: Commands) -> None:
    """Add sub-commands to the ``vecaccel`` command line.

    Called once while the command-line parser is built, for each plugin on its own in
    registration order (the built-ins first: ``backends``, ``bench`` and ``tune`` from
    :mod:`vecaccel.cli`, then ``train`` and ``eval`` from the trainers). An exception raised
    here (a command name already taken, say) leaves the plugin's remaining commands out with a
    ``vecaccel.manager.PluginWarning`` naming the plugin; the other commands still work.

    Example of a plugin's implementation::

        @vecaccel.hookimpl
        def vecaccel_add_commands(commands):
            parser = commands.add("hello", say_hello, help="say hello")
            parser.add_argument("--name", default="world")

    Args:
        commands: :class:`vecaccel.cli.Commands`: ``commands.add(name, handler, help=...,
            description=...)`` adds ``vecaccel NAME`` and returns its parser (a
            :class:`vecaccel.cli.ArgumentParser`, argparse's with full flag names only and a
            "did you mean" for misspellings) to add flags to. The handler receives the parsed
            ``argparse.Namespace`` and returns the exit code.

    Returns:
        Nothing; every plugin's implementation is called (not ``firstresult``).
    """


@hookspec
def vecaccel_register_algorithms(registry: MutableMapping[str, Any]) -> None:
    """Register training algorithms: ``vecaccel train NAME``, ``vecaccel eval`` and the loading
    of a checkpoint find them by name.

    Called whenever the trainers' algorithm registry is read (the ``train`` and ``eval``
    commands being built or run, ``vecaccel.trainers.config.registry.get``), so that a plugin
    registered at run time is seen at once: keep it cheap and free of side effects, and import
    no torch (an algorithm names its class by module path, imported when it is used). Each
    plugin's implementation is called in turn, in registration order (the built-in algorithms
    first, from ``vecaccel.trainers.cli.commands``).

    Example of a plugin's implementation::

        @vecaccel.hookimpl
        def vecaccel_register_algorithms(registry):
            from vecaccel.trainers.config.registry import AlgorithmInfo

            registry["reinforce"] = AlgorithmInfo(
                "reinforce", "my_package.reinforce:Reinforce",
                "my_package.reinforce:ReinforceConfig", "REINFORCE with a learned baseline",
            )

    Args:
        registry: algorithm name -> ``vecaccel.trainers.config.registry.AlgorithmInfo``. A name
            set twice, or an info whose ``name`` is not its key, is a ``ValueError``.

    Returns:
        Nothing; every plugin's implementation is called (not ``firstresult``).
    """
