"""The ``vecaccel`` command line: ``vecaccel backends``, ``vecaccel bench``, and plugin commands.

Plugins add sub-commands through the ``vecaccel_add_commands`` hook (the trainers add ``train``
and ``eval`` that way), so this module never imports them.

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
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pluggy

__all__ = ["build_parser", "main"]


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


def _add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    from vecaccel.bench import DEFAULT_BACKENDS, DEFAULT_NUM_ENVS, PEERS

    parser = subparsers.add_parser(
        "bench",
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
        "-o",
        "--option",
        action="append",
        metavar="BACKEND.KEY=VALUE",
        help="an option for one vecaccel backend, e.g. -o shm.num_workers=2 (repeatable)",
    )
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument("--plot", metavar="OUT.png", help="plot steps/s against num_envs")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(handler=_bench_command)


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

    parser = argparse.ArgumentParser(
        prog="vecaccel",
        description="Fast, safe vectorized environments for deep RL.",
    )
    parser.add_argument("--version", action="version", version=f"vecaccel {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")

    backends = subparsers.add_parser(
        "backends",
        help="list the registered backends and the plugins that provide them",
        description="List the registered vector-env backends and the plugins providing them.",
    )
    backends.add_argument("--json", action="store_true", help="print JSON instead of a table")
    backends.set_defaults(handler=_backends_command)

    _add_bench_parser(subparsers)
    from vecaccel.tune import add_parser as add_tune_parser

    add_tune_parser(subparsers)
    _add_plugin_commands(get_plugin_manager(), subparsers)
    return parser


def _add_plugin_commands(pm: pluggy.PluginManager, subparsers: argparse._SubParsersAction) -> None:
    """Call each plugin's ``vecaccel_add_commands`` on its own, in registration order.

    A plugin whose command cannot be added (its name is taken, say) is reported with a warning
    naming it, instead of breaking every command, ``--help`` included.
    """
    from vecaccel.manager import DISABLE_ENV_VAR, PluginWarning

    for impl in pm.hook.vecaccel_add_commands.get_hookimpls():
        # only the arguments it asks for, as pluggy calls a hook: specs may grow
        arguments = {
            name: value for name, value in (("subparsers", subparsers),) if name in impl.argnames
        }
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
        The exit code: 0 on success, 2 for a usage error.

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
    return code


if __name__ == "__main__":
    raise SystemExit(main())
