"""Reading the trainers' checkpoint: the file into its layout, and the header every family restores.

:func:`read_checkpoint` loads a file (see :mod:`~vecaccel.trainers.checkpoints.writer` for the
layout). :func:`load_agent` hands it to the algorithm's class, which rebuilds an agent from it
(``Algorithm.from_checkpoint``) with the helpers here: :func:`check_checkpoint_algorithm`,
:func:`recorded_config` (the config recorded, with the caller's changes) and
:func:`restore_header` (the counters and run mode), then its family's own section.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vecaccel.trainers.checkpoints.format import (
    CheckpointError,
    checkpoint_file,
    load_checkpoint,
    usable_device,
)
from vecaccel.trainers.checkpoints.writer import FORMAT, VERSION
from vecaccel.trainers.config.settings import ENV_SOURCE_ALIASES

if TYPE_CHECKING:
    from vecaccel.trainers.algos.base import Algorithm

__all__ = [
    "check_checkpoint_algorithm",
    "load_agent",
    "read_checkpoint",
    "recorded_config",
    "restore_header",
]

#: settings whose values configs of this layout may spell otherwise: name -> {earlier: current}
RESPELLED_VALUES: dict[str, dict[Any, str]] = {
    "bf16": {False: "off", True: "on"},
    "env_source": dict(ENV_SOURCE_ALIASES),
}
#: settings configs of this layout may hold that are no longer config fields
DROPPED_SETTINGS = ("async_weight_sync_period",)


def read_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """The trainer checkpoint at ``path`` (a file or a run directory).

    Raises:
        FileNotFoundError: there is no file.
        CheckpointError: the file is corrupt or truncated, not a trainer's checkpoint, or of
            another layout version than this one reads.
    """
    path = checkpoint_file(path)
    state = load_checkpoint(path, map_location=map_location)
    if state.get("format") != FORMAT or not isinstance(state.get("version"), int):
        raise CheckpointError(f"cannot read {path}: it is not a vecaccel trainer checkpoint")
    version = int(state["version"])
    if version != VERSION:
        newer = "newer than" if version > VERSION else "other than"
        raise CheckpointError(
            f"cannot read {path}: it was written in checkpoint version {version}, {newer} the "
            f"{VERSION} this vecaccel reads"
            + (": upgrade vecaccel to load it" if version > VERSION else "")
        )
    config = {k: v for k, v in state["config"].items() if k not in DROPPED_SETTINGS}
    for name, values in RESPELLED_VALUES.items():
        value = config.get(name)
        if isinstance(value, (bool, str)) and value in values:
            config[name] = values[value]
    return {**state, "config": config}


def load_agent(cls: type[Algorithm], path: Path, env: Any, options: dict[str, Any]) -> Any:
    """A ``cls`` agent rebuilt from the checkpoint at ``path`` (see
    :meth:`Algorithm.load <vecaccel.trainers.algos.base.Algorithm.load>`): ``options`` are
    config fields to change and the family's loading options.

    Raises:
        CheckpointError: the file cannot be read, or holds another algorithm's checkpoint.
    """
    return cls.from_checkpoint(checkpoint_file(path), env, dict(options))


def check_checkpoint_algorithm(cls: type[Algorithm], state: dict[str, Any], path: Path) -> None:
    """Raise unless ``state`` is a checkpoint of ``cls``: its family's section is there, and
    the algorithm is ``cls``'s (a class whose ``loads_family`` is true loads any of its family,
    whose configs say what they are, as DQN loads C51 and Rainbow).

    Raises:
        CheckpointError: the checkpoint is another algorithm's.
    """
    algorithm = state["algorithm"]
    if cls.checkpoint_key not in state or (algorithm != cls.algo_name and not cls.loads_family):
        raise CheckpointError(f"{path} holds a {algorithm!r} checkpoint, not {cls.algo_name!r}")


def recorded_config(state: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The config values the checkpoint records, with ``overrides`` winning; a recorded device
    this machine lacks becomes one it has."""
    values = {**state["config"], **overrides}
    if "device" not in overrides and "device" in values:
        values["device"] = usable_device(values["device"])
    return values


def restore_header(agent: Any, state: dict[str, Any]) -> None:
    """Restore the counters, the best evaluation and the run mode every family saves, and the
    normalisation statistics into the agent's normaliser (built for its observation space)
    where both exist.

    Raises:
        CheckpointError: the saved observation statistics do not have the shape of the
            agent's observations (both shapes in the message).
    """
    agent.global_step = int(state["global_step"])
    agent.num_updates = int(state["num_updates"])
    target = state["target_steps"]
    agent.target_steps = None if target is None else int(target)
    agent.elapsed_before = float(state.get("elapsed", 0.0))
    best = state.get("best_eval_reward")  # files of earlier releases lack it: no best yet
    agent.best_eval_reward = None if best is None else float(best)
    agent.async_run = bool(state.get("async", False))
    agent.async_options = dict(state.get("async_options", {}))
    saved, normalizer = state.get("normalization"), getattr(agent, "normalizer", None)
    if saved is not None and normalizer is not None:
        try:
            normalizer.load_state_dict(saved)
        except ValueError as exc:
            raise CheckpointError(f"cannot restore the checkpoint's normalisation: {exc}") from exc
