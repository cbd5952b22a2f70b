"""The flags of ``vecaccel train ALGO``: those every algorithm has, its family's, and one per
field of its config dataclass.

Each config field becomes a flag (its docstring the ``--help`` text). Nothing here imports torch or an algorithm at module level:
an algorithm's flags are added only when its sub-command is parsed.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vecaccel.cli import ArgumentParser
from vecaccel.trainers.config import registry

__all__ = [
    "AlgorithmParser",
    "BackendOptionAction",
    "ConfigAction",
    "add_common_flags",
    "add_mode_flags",
    "algorithm_class",
    "parse_backend_option",
    "positive_int",
    "presets",
]

#: config fields that have a common flag of their own
_COMMON_FIELDS = {"env_id", "num_envs", "backend", "backend_options", "seed", "device", "preset"}


# -- resolving an algorithm lazily, through the registry ---------------------------------------


def algorithm_class(algo: str) -> type[Any]:
    """The class of the algorithm registered as ``algo`` (imports it, and torch)."""
    return registry.get(algo).load_class()


def presets(algo: str) -> dict[str, dict[str, Any]]:
    """The named settings of the algorithm registered as ``algo``."""
    return registry.get(algo).load_presets()


def _field_docs(config_cls: type[Any]) -> dict[str, str]:
    from vecaccel.trainers.config.settings import config_help

    return config_help(config_cls)


# -- flag types from annotations --------------------------------------------------------------


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _optional(parse: Any) -> Any:
    def parse_optional(text: str) -> Any:
        if text.strip().lower() in ("none", "auto", "null", ""):
            return None
        return parse(text)

    parse_optional.__name__ = getattr(parse, "__name__", "value")
    return parse_optional


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _flag_spec(annotation: Any) -> dict[str, Any]:
    """argparse keyword arguments for a dataclass field annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        spec = _flag_spec(inner[0]) if len(inner) == 1 else {"type": str}
        if spec.get("action") is argparse.BooleanOptionalAction:
            return {"type": _optional(_parse_bool), "metavar": "{true,false,auto}"}
        spec["type"] = _optional(spec.get("type", str))
        return spec
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float, str):
        return {"type": annotation}
    if origin in (tuple, list) and args and args[0] is int:
        return {"type": _int_tuple, "metavar": "N,N,..."}
    return {"type": str}


# -- the flags every algorithm has, and its family's ----------------------------------------


def positive_int(text: str) -> int:
    """argparse type: a positive integer, or a message saying what the text is not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def parse_backend_option(text: str) -> tuple[str, Any]:
    """argparse type of ``--backend-option``: ``KEY=VALUE``, the value a Python literal when it
    parses as one (as ``vecaccel bench -o`` reads it), else a string.

    Example:
        >>> parse_backend_option("num_shards=2"), parse_backend_option("address=auto")
        (('num_shards', 2), ('address', 'auto'))
        >>> parse_backend_option("shard_options={'num_workers': 2}")
        ('shard_options', {'num_workers': 2})
    """
    from vecaccel.bench.command import parse_backend_options

    key, sep, _ = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE (num_shards=2, address='ray://head:10001'), got {text!r}"
        )
    value = parse_backend_options([f"backend.{key}={text.partition('=')[2]}"])["backend"][key]
    return key, value


class BackendOptionAction(argparse.Action):
    """Add a ``--backend-option KEY=VALUE`` to ``namespace.config["backend_options"]``."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        config = getattr(namespace, "config", None)
        if config is None:
            config = {}
            namespace.config = config
        key, value = values
        config.setdefault("backend_options", {})[key] = value


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every ``vecaccel train ALGO`` has, whatever the algorithm: env, backend,
    budget, seed, device, run directory, resume, output and ranks."""
    parser.add_argument(
        "--env",
        help="Gymnasium environment id, or the module path of a PettingZoo env "
        "(pettingzoo.butterfly.pistonball_v6: one row per agent, one shared policy); "
        "default: the config's",
    )
    parser.add_argument(
        "--backend",
        help="vecaccel backend (default: the config's); its options with --backend-option, "
        "e.g. --backend ray --backend-option address=auto --backend-option num_shards=4",
    )
    parser.add_argument(
        "--backend-option",
        action=BackendOptionAction,
        type=parse_backend_option,
        metavar="KEY=VALUE",
        dest="_unused_backend_options",
        default=argparse.SUPPRESS,
        help="an option of the backend, repeatable; VALUE is a Python literal or else a string "
        "(ray: address=auto, address='ray://head:10001', num_shards=4, shard_backend=shm, "
        "shard_options={'num_workers':8}, shard_resources={'num_cpus':8}, placement=PACK; "
        "shm: context=spawn, step_timeout_s=30...). Checked before the run starts; kept by "
        "--resume, where options given replace the run's",
    )
    parser.add_argument(
        "--num-envs",
        type=positive_int,
        help="parallel environments (a PettingZoo env: envs, each one row per agent)",
    )
    parser.add_argument(
        "--total-timesteps",
        type=positive_int,
        help="environment steps to train (with --resume: the run's new total; "
        "default there: the budget the run was started with)",
    )
    parser.add_argument("--seed", type=int, help="seed of the run")
    parser.add_argument("--device", help="torch device: cpu, cuda, cuda:1...")
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="directory for logs and checkpoints (default: runs/ALGO-ENV-SEED-TIME, new for "
        "each run); one that holds a run is refused unless --overwrite",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="a new run into a --run-dir that holds one: replace that run's checkpoint, "
        "metrics, curve and TensorBoard files",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="continue the run in DIR from DIR/checkpoint.pt",
    )
    parser.add_argument(
        "--config",
        dest="config_file",
        type=Path,
        metavar="FILE",
        help="start from the settings of FILE, the config.json a run writes to its run "
        "directory (or YAML of the same shape): its algorithm, env, preset, settings and "
        "--total-timesteps; flags given override them",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)"
    )
    parser.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard event files")
    parser.add_argument(
        "--nproc",
        type=positive_int,
        default=None,
        metavar="K",
        help="data-parallel training on K ranks of this machine: launches "
        "`torchrun --standalone --nproc_per_node K -m vecaccel train ...` (each rank its own "
        "envs, with --async its own collector process, gradients all-reduced; --total-timesteps "
        "is the total over ranks)",
    )


def add_mode_flags(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """``--async``/``--sync`` and the asynchronous mode's flags; their help says what the
    algorithm's class does in that mode (``cls.async_help``), and ``--no-replay`` is there for
    a class that keeps a replay buffer (``cls.has_replay``)."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help=f"asynchronous mode: {cls.async_help}",
    )
    if cls.has_replay:
        parser.add_argument(
            "--no-replay",
            dest="no_replay",
            action="store_true",
            help="with --resume: start with an empty replay buffer instead of the one saved "
            "with the checkpoint (when its replay file is missing or corrupt)",
        )
    parser.add_argument(
        "--async-weight-sync-period",
        dest="async_weight_sync_period",
        type=positive_int,
        default=None,
        metavar="K",
        help="with --async: updates between weight copies to the collector process "
        "(default: 1; with --resume: the run's own)",
    )
    parser.add_argument(
        "--async-fixed-lag",
        dest="async_fixed_lag",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"with --async: {cls.async_fixed_lag_help}, so that a seeded run repeats (needs "
        "--async-weight-sync-period 1; default: off; with --resume: as the run was trained)",
    )
    mode.add_argument(
        "--sync",
        dest="sync_mode",
        action="store_true",
        help="synchronous mode, the default for a new run; with --resume: go on "
        "synchronously even if the run was trained with --async (by default a resumed run "
        "keeps the mode its checkpoint records)",
    )


class ConfigAction(argparse.Action):
    """Store a config field's value under ``namespace.config[field]``."""

    def __init__(self, option_strings: list[str], dest: str, field: str = "", **kwargs: Any):
        self.field = field
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        config = getattr(namespace, "config", None)
        if config is None:
            config = {}
            namespace.config = config
        if self.nargs == 0:
            values = not (option_string or "").startswith("--no-")
        config[self.field] = values


class AlgorithmParser(ArgumentParser):
    """An algorithm's sub-parser whose config flags are added when it is first used.

    Importing an algorithm imports torch; deferring it keeps ``vecaccel --help`` and every other
    command free of torch.

    Args:
        algo: the algorithm's name in :mod:`vecaccel.trainers.config.registry`.
        add_class_flags: called as ``add_class_flags(parser, cls)`` once the algorithm's class
            is imported, for the flags that depend on what the class is (its family's).
    """

    def __init__(
        self,
        *args: Any,
        algo: str = "",
        add_class_flags: Callable[[argparse.ArgumentParser, type], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.algo = algo
        self.add_class_flags = add_class_flags
        self._populated = False
        #: why the algorithm cannot be imported (torch not installed, say), if it cannot
        self.import_error: ImportError | None = None

    def _populate(self) -> None:
        if self._populated or not self.algo:
            return
        self._populated = True
        try:
            cls = algorithm_class(self.algo)
        except ImportError as exc:
            from vecaccel.trainers.cli.errors import missing_dependency

            self.import_error = exc
            self.epilog = missing_dependency(f"vecaccel train {self.algo}", exc)
            return
        config_cls = cls.config_cls
        if self.add_class_flags is not None:
            self.add_class_flags(self, cls)
        docs = _field_docs(config_cls)
        hints = typing.get_type_hints(config_cls)
        named = presets(self.algo)
        if named:
            self.add_argument(
                "--preset",
                choices=[*sorted(named), "none"],
                help="start from a named configuration (explicit flags override it); default: "
                "the one made for --env, if there is one; none: the plain defaults",
            )
        group = self.add_argument_group(f"{self.algo} configuration")
        class_defaults = cls.defaults
        for field in dataclasses.fields(config_cls):
            flag = "--" + field.name.replace("_", "-")
            negative = "--no-" + field.name.replace("_", "-")
            taken = self._option_string_actions
            if field.name in _COMMON_FIELDS or flag in taken or negative in taken:
                continue
            spec = _flag_spec(hints.get(field.name, str))
            default = field.default if field.default is not dataclasses.MISSING else None
            if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = field.default_factory()  # type: ignore[misc]
            default = class_defaults.get(field.name, default)
            help_text = docs.get(field.name, "").replace("%", "%%")
            help_text = f"{help_text} (default: {default!r})".strip()
            if spec.get("action") is argparse.BooleanOptionalAction:
                group.add_argument(
                    flag,
                    negative,
                    action=ConfigAction,
                    field=field.name,
                    nargs=0,
                    dest="_unused_" + field.name,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
            else:
                group.add_argument(
                    flag,
                    action=ConfigAction,
                    field=field.name,
                    dest="_unused_" + field.name,
                    default=argparse.SUPPRESS,
                    type=spec.get("type", str),
                    metavar=spec.get("metavar", field.name.upper()),
                    help=help_text,
                )

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._populate()
        wants_help = any(arg in ("-h", "--help") for arg in args or ())
        if self.import_error is not None and not wants_help:
            # one line and exit code 2, before the flags only the trainer knows are refused
            self.exit(2, f"{self.epilog}\n")
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._populate()
        return super().format_help()
