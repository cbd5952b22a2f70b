"""The ``vecaccel`` command line, and its built-in commands ``backends``, ``bench`` and ``tune``.

Every sub-command comes through the ``vecaccel_add_commands`` hook: this module is a built-in
plugin that adds ``backends``, ``bench`` and ``tune`` with it, as the trainers add ``train`` and
``eval`` and a third-party package adds its own. The hook hands each plugin a :class:`Commands`;
every parser is an :class:`ArgumentParser`, which takes flags only as spelled in full and answers
a misspelled one with the closest real one.

Example:
    >>> from vecaccel.cli import main
    >>> main(["backends"])  # doctest: +ELLIPSIS
    name...plugin...description
    ...
    0
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from vecaccel import hookimpl
from vecaccel.errors import closest_name, did_you_mean

if TYPE_CHECKING:
    import pluggy

__all__ = ["ArgumentParser", "Commands", "build_parser", "main", "suggest_flag"]

#: Where a sub-parser that met arguments it does not know records itself on the namespace, so
#: that the error names its flags (and prints its usage) rather than the top-level parser's.
_UNRECOGNIZED_BY = "_vecaccel_unrecognized_by"


def suggest_flag(flag: str, known: Iterable[str]) -> str | None:
    """The flag of ``known`` that ``flag`` most likely meant, or ``None``.

    Underscores for dashes and a different case count as the same spelling; otherwise the
    closest spelling wins, if one is close.

    Example:
        >>> known = ["--num-envs", "--total-steps", "--seed"]
        >>> suggest_flag("--num_envs", known), suggest_flag("--num-env", known)
        ('--num-envs', '--num-envs')
        >>> suggest_flag("--Total-Steps", known), suggest_flag("--gpu", known) is None
        ('--total-steps', True)
    """
    return closest_name(flag, [option for option in known if option.startswith("-")], cutoff=0.75)


def _looks_like_flag(arg: str) -> bool:
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False  # a negative number


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser as every ``vecaccel`` command has it.

    Flags are taken only as spelled in full (``allow_abbrev=False``: ``--num-env`` is not
    ``--num-envs``), and an unknown flag or choice is answered with the closest real one:
    ``unrecognized arguments: --num_envs 4; did you mean --num-envs?``. Sub-parsers added to it
    are of its class too.

    Example:
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--num-envs", type=int)
        >>> parser.parse_args(["--num-envs", "4"]).num_envs
        4
        >>> parser.unrecognized_message(["--num_envs", "4"])
        'unrecognized arguments: --num_envs 4; did you mean --num-envs?'
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def unrecognized_message(self, extras: Sequence[str]) -> str:
        """argparse's message for ``extras``, with the flags they most likely meant."""
        hints = []
        for arg in extras:
            flag = arg.split("=", 1)[0]
            if _looks_like_flag(arg):
                meant = suggest_flag(flag, self._option_string_actions)
                if meant is not None:
                    hints.append((flag, meant))
        message = f"unrecognized arguments: {' '.join(extras)}"
        if len(hints) == 1:
            return f"{message}; did you mean {hints[0][1]}?"
        if hints:
            meant = ", ".join(f"{right} for {wrong}" for wrong, right in hints)
            return f"{message}; did you mean {meant}?"
        return message

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        # the innermost parser records itself first (a sub-parser's namespace is copied up)
        if extras and not hasattr(namespace, _UNRECOGNIZED_BY):
            setattr(namespace, _UNRECOGNIZED_BY, self)
        return namespace, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        owner = vars(namespace).pop(_UNRECOGNIZED_BY, self)
        if extras:
            # by its method, not its class: under ``python -m vecaccel.cli`` this module is
            # loaded twice, and the trainers' parsers derive from the other copy's class
            if not hasattr(owner, "unrecognized_message"):
                owner = self
            owner.error(owner.unrecognized_message(extras))
        return namespace

    def short_usage(self) -> str:
        """The usage line an error ends with: argparse's where it fits on one line, else
        ``usage: PROG [options]; see PROG --help`` (a command with many flags has a usage of
        dozens of lines, which would bury the error above it).

        Example:
            >>> parser = ArgumentParser(prog="demo")
            >>> parser.short_usage()
            'usage: demo [-h]'
            >>> for index in range(30):
            ...     _ = parser.add_argument(f"--option-{index}")
            >>> parser.short_usage()
            'usage: demo [options]; see demo --help'
        """
        usage = self.format_usage().strip()
        if "\n" not in usage:
            return usage
        return f"usage: {self.prog} [options]; see {self.prog} --help"

    def error(self, message: str) -> Any:  # type: ignore[override]
        """Exit with code 2 after printing ``PROG: error: MESSAGE`` and then
        :meth:`short_usage`: the error first, as the line a reader looks for."""
        # "argument COMMAND: invalid choice: 'trian' (choose from 'train', 'eval')"
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if match is not None:
            choices = re.findall(r"'([^']*)'", match.group(2))
            message += did_you_mean(match.group(1), choices)
        self.exit(2, f"{self.prog}: error: {message}\n{self.short_usage()}\n")


class Commands:
    """The sub-commands of ``vecaccel``, as the ``vecaccel_add_commands`` hook hands them over.

    ``add`` gives a new command its parser (an :class:`ArgumentParser`) and its handler, which
    receives the parsed ``argparse.Namespace`` and returns the exit code.

    Example:
        >>> parser = ArgumentParser(prog="vecaccel")
        >>> commands = Commands(parser.add_subparsers(dest="command"))
        >>> hello = commands.add("hello", lambda args: print("hello", args.name), help="greet")
        >>> _ = hello.add_argument("--name", default="world")
        >>> args = parser.parse_args(["hello"])
        >>> args.handler(args)
        hello world
        >>> "hello" in commands, commands.names
        (True, ['hello'])
    """

    def __init__(self, subparsers: Any) -> None:
        self._subparsers = subparsers

    @property
    def names(self) -> list[str]:
        """The commands added so far, in order."""
        return list(self._subparsers.choices)

    def __contains__(self, name: object) -> bool:
        return name in self._subparsers.choices

    def add(
        self,
        name: str,
        handler: Callable[[argparse.Namespace], int | None],
        *,
        help: str,
        description: str | None = None,
        **parser_options: Any,
    ) -> ArgumentParser:
        """Add ``vecaccel NAME``.

        Args:
            name: the command's name.
            handler: called with the parsed arguments; returns the exit code (``None``: 0).
            help: one line for ``vecaccel --help``.
            description: the text of ``vecaccel NAME --help`` (default: ``help``).
            **parser_options: more keyword arguments of :class:`ArgumentParser` (``epilog``,
                ``formatter_class``...).

        Returns:
            The command's parser, to add its flags to.

        Raises:
            argparse.ArgumentError: if another command has this name.
        """
        parser: ArgumentParser = self._subparsers.add_parser(
            name,
            help=help,
            description=help if description is None else description,
            **parser_options,
        )
        parser.set_defaults(handler=handler)
        return parser


def _backends_command(args: argparse.Namespace) -> int:
    from vecaccel.manager import list_backends

    backends = list_backends()
    if args.json:
        print(json.dumps(backends, indent=2, sort_keys=True))
        return 0
    rows = [("name", "plugin", "description")]
    rows += [(name, info["plugin"], info["description"]) for name, info in sorted(backends.items())]
    name_width = max(len(row[0]) for row in rows)
    plugin_width = max(len(row[1]) for row in rows)
    for name, plugin, description in rows:
        print(f"{name:<{name_width}}  {plugin:<{plugin_width}}  {description}".rstrip())
    return 0


def _bench_command(args: argparse.Namespace) -> int:
    from vecaccel.bench import bench_command

    return bench_command(args)


@hookimpl
def vecaccel_add_commands(commands: Commands) -> None:
    """Add the library's own commands: ``backends``, ``bench`` and ``tune``."""
    backends = commands.add(
        "backends",
        _backends_command,
        help="list the registered backends and the plugins that provide them",
        description="List the registered vector-env backends and the plugins providing them.",
    )
    backends.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_bench_command(commands)
    from vecaccel.tune import add_command as add_tune_command

    add_tune_command(commands)


def _add_bench_command(commands: Commands) -> None:
    from vecaccel.bench import DEFAULT_BACKENDS, DEFAULT_NUM_ENVS, PEERS

    parser = commands.add(
        "bench",
        _bench_command,
        help="measure steps/s of vecaccel backends beside Gymnasium, SB3 and EnvPool",
        description=(
            "Measure environment steps per second with random actions (sampled before timing) "
            "for vecaccel backends beside Gymnasium SyncVectorEnv/AsyncVectorEnv, SB3 "
            "SubprocVecEnv/DummyVecEnv and EnvPool (when installed), plus one plain env "
            "stepped in a loop ('raw') and the ceiling: one such process per usable CPU, "
            "summed ('ceiling'). Prints a Markdown table of steps/s, each one's share of the "
            "ceiling, and ratios."
        ),
    )
    parser.add_argument(
        "--env",
        default="CartPole-v1",
        help="comma-separated envs: Gymnasium ids, or 'pong' (AtariPreprocessing over "
        "PongNoFrameskip-v4, 84x84 gray, frame skip 4) (default: %(default)s)",
    )
    parser.add_argument(
        "--num-envs",
        default=",".join(str(n) for n in DEFAULT_NUM_ENVS),
        help="comma-separated sweep of num_envs (default: %(default)s)",
    )
    parser.add_argument(
        "--backends",
        default=None,
        help="comma-separated vecaccel backends (default: those of "
        f"{', '.join(DEFAULT_BACKENDS)} that are registered)",
    )
    parser.add_argument(
        "--peers",
        default=None,
        help=f"comma-separated peers from {', '.join(PEERS)}, or 'none' (default: all; "
        "those not installed are skipped)",
    )
    parser.add_argument(
        "--seconds", type=float, default=2.0, help="timed seconds per measurement (default: 2)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="untimed seconds before each measurement (default: min(1, seconds/4))",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the sweep this many times, report the median"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of resets and actions")
    parser.add_argument(
        "--vectorized",
        action="store_true",
        help="batched simulator: every backend with vectorized=True (one native vector env per "
        "worker, from the id's vector_entry_point), the native vector env alone in one process "
        "('native'), and the ceiling of one native vector env per usable CPU, per num_envs",
    )
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        metavar="BACKEND.KEY=VALUE",
        help="an option for one vecaccel backend, e.g. -o shm.num_workers=2 (repeatable)",
    )
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument("--plot", metavar="OUT.png", help="plot steps/s against num_envs")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def build_parser() -> argparse.ArgumentParser:
    """Build the ``vecaccel`` parser, with the sub-commands plugins add.

    Returns:
        The parser; every sub-command sets ``handler`` in its defaults.

    Example:
        >>> parser = build_parser()
        >>> parser.parse_args(["bench", "--num-envs", "8"]).num_envs
        '8'
    """
    from vecaccel import __version__
    from vecaccel.manager import get_plugin_manager

    parser = ArgumentParser(
        prog="vecaccel",
        description="Fast, safe vectorized environments for deep RL.",
    )
    parser.add_argument("--version", action="version", version=f"vecaccel {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    _add_plugin_commands(get_plugin_manager(), Commands(subparsers))
    return parser


def _add_plugin_commands(pm: pluggy.PluginManager, commands: Commands) -> None:
    """Call each plugin's ``vecaccel_add_commands`` on its own, in registration order (the
    built-ins first, this module's among them).

    A plugin whose command cannot be added (its name is taken, say) is reported with a warning
    naming it, instead of breaking every command, ``--help`` included.
    """
    from vecaccel.manager import DISABLE_ENV_VAR, PluginWarning

    for impl in pm.hook.vecaccel_add_commands.get_hookimpls():
        # only the arguments it asks for, as pluggy calls a hook: specs may grow
        offered = (("commands", commands),)
        arguments = {name: value for name, value in offered if name in impl.argnames}
        try:
            impl.function(**arguments)
        except Exception as exc:  # noqa: BLE001 - a broken plugin is left out with a warning
            name = pm.get_name(impl.plugin) or impl.plugin_name
            warnings.warn(
                f"plugin {name!r} could not add its commands: {exc}; set "
                f"{DISABLE_ENV_VAR}={name} to skip the plugin",
                PluginWarning,
                stacklevel=2,
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``vecaccel`` command line.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 on success, 2 for a usage error, 130 when interrupted by Ctrl-C.

    Example:
        >>> main(["backends", "--json"])  # doctest: +ELLIPSIS
        {
        ...
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    args.argv = argv
    try:
        code = int(handler(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``vecaccel backends | head``): stop quietly, as a process killed
        # by SIGPIPE does, without a traceback now or when Python flushes stdout at exit
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout without a file descriptor
            pass
        return 128 + 13
    except KeyboardInterrupt as interrupt:
        # Ctrl-C before a command's own handler took over (while a backend starts, as Ray's
        # start-up does for seconds): one line, as for any other way the command ends
        print(str(interrupt) or "interrupted", file=sys.stderr)
        return 128 + 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
