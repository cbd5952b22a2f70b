"""The flags of ``vecaccel train ALGO``, generated from the algorithm's config dataclass.

Each field becomes a flag (its docstring the ``--help`` text); earlier spellings of renamed
settings stay as flags of their own. Nothing here imports torch or an algorithm at module level:
an algorithm's flags are added only when its sub-command is parsed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import types
import typing
from typing import Any

__all__ = ["ALGORITHMS", "AlgorithmParser", "ConfigAction", "algorithm_class", "presets"]

#: algorithm name -> (module, class), imported when first needed.
ALGORITHMS: dict[str, tuple[str, str]] = {
    "a2c": ("vecaccel.trainers.algos.a2c", "A2C"),
    "ppo": ("vecaccel.trainers.algos.ppo", "PPO"),
    "dqn": ("vecaccel.trainers.algos.dqn", "DQN"),
    "c51": ("vecaccel.trainers.algos.dqn", "C51"),
    "rainbow": ("vecaccel.trainers.algos.dqn", "Rainbow"),
}

#: config fields that have a common flag of their own
_COMMON_FIELDS = {"env_id", "num_envs", "backend", "seed", "device", "preset"}


# -- resolving an algorithm lazily ------------------------------------------------------------


def algorithm_class(algo: str) -> type:
    module_path, class_name = ALGORITHMS[algo]
    return getattr(importlib.import_module(module_path), class_name)


def _config_class(algo: str) -> type:
    return algorithm_class(algo).config_cls


def presets(algo: str) -> dict[str, dict[str, Any]]:
    return dict(getattr(importlib.import_module(ALGORITHMS[algo][0]), "PRESETS", {}))


def _aliases(config_cls: type) -> dict[str, str]:
    """Earlier flag spellings of ``config_cls``'s settings: old name -> current field.

    They are the config's renamed settings (``ALIASES``) and the keywords its constructor takes
    beside its fields (``InitVar`` spellings converted on the way in).
    """
    fields = {field.name for field in dataclasses.fields(config_cls)}
    aliases = dict(getattr(config_cls, "ALIASES", {}))
    for name in inspect.signature(config_cls).parameters:
        if name not in fields and name not in aliases:
            aliases[name] = name
    return aliases


def _field_docs(config_cls: type) -> dict[str, str]:
    from vecaccel.trainers.config import config_help

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


class AlgorithmParser(argparse.ArgumentParser):
    """An algorithm's sub-parser whose config flags are added when it is first used.

    Importing an algorithm imports torch; deferring it keeps ``vecaccel --help`` and every other
    command free of torch.
    """

    def __init__(self, *args: Any, algo: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.algo = algo
        self._populated = False
        #: why the algorithm cannot be imported (torch not installed, say), if it cannot
        self.import_error: ImportError | None = None

    def _populate(self) -> None:
        if self._populated or not self.algo:
            return
        self._populated = True
        try:
            config_cls = _config_class(self.algo)
        except ImportError as exc:
            from vecaccel.trainers.cli.errors import missing_dependency

            self.import_error = exc
            self.epilog = missing_dependency(f"vecaccel train {self.algo}", exc)
            return
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
        class_defaults = algorithm_class(self.algo).defaults
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

        for old, new in _aliases(config_cls).items():
            flag = "--" + old.replace("_", "-")
            if flag in self._option_string_actions:
                continue
            hint = hints.get(new, str)
            spec = _flag_spec(getattr(hint, "type", hint))  # an InitVar holds its type
            if new == old:  # a keyword converted on the way in: its own docstring says how
                help_text = docs.get(old, "").replace("%", "%%")
            else:
                help_text = f"the earlier spelling of --{new.replace('_', '-')}"
            group.add_argument(
                flag,
                action=ConfigAction,
                field=old,
                dest="_unused_" + old,
                default=argparse.SUPPRESS,
                type=spec.get("type", str),
                metavar=spec.get("metavar", new.upper()),
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
