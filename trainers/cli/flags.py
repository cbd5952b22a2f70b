"""The flags of ``vecaccel train ALGO``, generated from the algorithm's config dataclass.

Each field becomes a flag (its docstring the ``--help`` text); earlier spellings of renamed
settings stay as flags of their own. Nothing here imports torch or an algorithm at module level:
an algorithm's flags are added only when its sub-command is parsed.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from vecaccel.cli import ArgumentParser
from vecaccel.trainers import registry

__all__ = ["AlgorithmParser", "ConfigAction", "algorithm_class", "presets"]

#: config fields that have a common flag of their own
_COMMON_FIELDS = {"env_id", "num_envs", "backend", "seed", "device", "preset"}


# -- resolving an algorithm lazily, through the registry ---------------------------------------


def algorithm_class(algo: str) -> type:
    """The class of the algorithm registered as ``algo`` (imports it, and torch)."""
    return registry.get(algo).load_class()


def presets(algo: str) -> dict[str, dict[str, Any]]:
    """The named settings of the algorithm registered as ``algo``."""
    return registry.get(algo).load_presets()


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


class AlgorithmParser(ArgumentParser):
    """An algorithm's sub-parser whose config flags are added when it is first used.

    Importing an algorithm imports torch; deferring it keeps ``vecaccel --help`` and every other
    command free of torch.

    Args:
        algo: the algorithm's name in :mod:`vecaccel.trainers.registry`.
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
