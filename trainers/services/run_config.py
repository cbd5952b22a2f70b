"""The run's settings on disk: ``config.json`` in the run directory, written when a run starts
and read back by ``vecaccel train ALGO --config FILE``.

The file holds the algorithm's name, the step total of the run and every field of its config
(the preset's values and the flags given, resolved), as readable JSON: a run can be read,
compared and started again from it, as rl-baselines3-zoo's ``config.yml`` and CleanRL's
tracked ``args`` allow. ``--config`` reads YAML too (``.yaml``, ``.yml``) where PyYAML is
installed.

Example:
    >>> import tempfile
    >>> from vecaccel.trainers.config.settings import RunConfig
    >>> folder = tempfile.mkdtemp()
    >>> path = write_run_config(folder, "ppo", RunConfig(env_id="CartPole-v1", seed=3), 4096)
    >>> saved = read_run_config(path)
    >>> saved.algorithm, saved.total_timesteps, saved.config["seed"]
    ('ppo', 4096, 3)
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "CONFIG_NAME",
    "SavedRunConfig",
    "config_values",
    "read_run_config",
    "write_run_config",
]

#: The file a run's settings go to, in its run directory.
CONFIG_NAME = "config.json"


class SavedRunConfig(NamedTuple):
    """What a run's config file holds."""

    algorithm: str
    total_timesteps: int | None
    config: dict[str, Any]


def write_run_config(
    run_dir: str | os.PathLike[str], algorithm: str, config: Any, total_timesteps: int
) -> Path:
    """Write ``config`` (a config dataclass) of an ``algorithm`` run to ``total_timesteps`` env
    steps as ``run_dir/config.json`` (atomically); return its path."""
    values = dataclasses.asdict(config)
    document = {
        "algorithm": algorithm,
        "total_timesteps": int(total_timesteps),
        "config": values,
    }
    path = Path(run_dir) / CONFIG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2, default=_jsonable) + "\n")
    os.replace(temporary, path)
    return path


def _jsonable(value: Any) -> Any:
    """A value JSON has no type for, as the nearest it has (tuples are lists already)."""
    if hasattr(value, "item"):  # a NumPy scalar
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} {value!r} cannot be written to {CONFIG_NAME}")


def read_run_config(path: str | os.PathLike[str]) -> SavedRunConfig:
    """Read a run's config file (JSON; YAML where PyYAML is installed).

    Raises:
        ValueError: the file cannot be read or is not a run's config, with what is wrong.
    """
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_NAME
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                f"{path} is YAML, and reading YAML needs PyYAML (pip install pyyaml); "
                "or give the run's config.json"
            ) from None
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {exc}") from None
    else:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("config"), dict):
        raise ValueError(
            f"{path} is not a run's config: expected an object with 'algorithm', "
            "'total_timesteps' and 'config' (the file a run writes to its run directory)"
        )
    algorithm = document.get("algorithm")
    total = document.get("total_timesteps")
    if not isinstance(algorithm, str) or not (total is None or isinstance(total, int)):
        raise ValueError(f"{path}: 'algorithm' must be a name and 'total_timesteps' an integer")
    return SavedRunConfig(algorithm, total, dict(document["config"]))


def config_values(values: dict[str, Any], config_cls: type[Any]) -> dict[str, Any]:
    """``values`` read from a file, with the lists JSON made of ``config_cls``'s tuple fields
    (``hidden_sizes``) turned back into tuples."""
    out = dict(values)
    for field in dataclasses.fields(config_cls):
        if isinstance(out.get(field.name), list):
            default = field.default
            if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            if isinstance(default, tuple) or "tuple" in str(field.type):
                out[field.name] = tuple(out[field.name])
    return out
