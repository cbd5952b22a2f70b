"""Readers of the layouts written before the current version, each into the current form.

Two layouts came before version 2: A2C and PPO wrote version 1 (``"format":
"vecaccel-trainer"``, counters ``update_index``), and DQN, C51 and Rainbow wrote a layout with no
version (keyed by ``"algorithm"``, the class name, with a ``Box`` observation as shape, dtype and
bounds). Their configs may spell settings as those versions did (``checkpoint_period``,
``log_interval``, ``log_every`` in updates). In every layout, the DQN family's ``bf16`` may be
the ``True``/``False`` it once was: it reads as ``"on"``/``"off"``, the values A2C's and PPO's
always had. Each reader maps a file's keys onto the current
layout and adds nothing a resume would read differently, so an old checkpoint loads and resumes
as it did.

Example:
    >>> import torch
    >>> old = {"algorithm": "C51", "observation": {"shape": [2], "dtype": "float32",
    ...     "low": torch.zeros(2, dtype=torch.float64), "high": torch.ones(2, dtype=torch.float64)},
    ...     "num_actions": 3, "config": {}, "global_step": 8, "num_updates": 2, "rng": {},
    ...     "agent_rng": {}, "q_network": {}, "target_network": {}, "optimizer": {}}
    >>> state = upgrade(old)
    >>> state["version"], state["algorithm"], state["action_space"]["n"], state["target_steps"]
    (2, 'c51', 3, None)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["layout_version", "upgrade"]

#: the version of the layout :func:`upgrade` returns (``layout.VERSION``, kept here too so that
#: this module does not import the writer)
CURRENT = 2
#: the ``"format"`` of every versioned layout
FORMAT = "vecaccel-trainer"
#: what :func:`layout_version` calls the off-policy layout that had no version field
UNVERSIONED = 0
#: settings the earlier layouts' configs name otherwise: their name -> the current one
RENAMED_SETTINGS = {"checkpoint_period": "checkpoint_every", "log_interval": "log_every_steps"}
#: settings whose values earlier configs spell otherwise: name -> {earlier value: current}
RESPELLED_VALUES = {"bf16": {False: "off", True: "on"}}


def layout_version(state: dict[str, Any]) -> int | None:
    """The layout version of a loaded checkpoint dict; ``None`` for a dict no trainer wrote."""
    if state.get("format") == FORMAT and isinstance(state.get("version"), int):
        return int(state["version"])
    if "format" not in state and "algorithm" in state and "q_network" in state:
        return UNVERSIONED
    return None


def upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` in the current layout (itself when it is already).

    Raises:
        ValueError: a dict no trainer wrote, or a version newer than this one reads.
    """
    version = layout_version(state)
    if version is None:
        raise ValueError("it is not a vecaccel trainer checkpoint")
    if version == CURRENT:
        config = _current_values(state["config"])
        return state if config is state["config"] else {**state, "config": config}
    if version > CURRENT:
        raise ValueError(
            f"it was written in checkpoint version {version}, newer than the {CURRENT} this "
            "vecaccel reads: upgrade vecaccel to load it"
        )
    if version == UNVERSIONED:
        return _from_unversioned_off_policy(state)
    if version == 1:
        return _from_version_1_on_policy(state)
    raise ValueError(f"checkpoint version {version} is unknown")


def _from_version_1_on_policy(state: dict[str, Any]) -> dict[str, Any]:
    """Version 1, A2C's and PPO's: the same header with ``algo`` and ``update_index``."""
    upgraded = {
        "format": FORMAT,
        "version": CURRENT,
        "algorithm": state["algo"],
        "config": _current_config(state["config"]),
        "observation_space": state["observation_space"],
        "action_space": state["action_space"],
        "global_step": state["global_step"],
        "num_updates": state["update_index"],
        "target_steps": state["target_steps"],
        "elapsed": state.get("elapsed", 0.0),
        "rng": state["rng"],
        "async": state.get("async", False),
        "async_options": state.get("async_options", {}),
        "on_policy": {
            "model": state["model"],
            "optimizer": state["optimizer"],
            "schedule_start_update": state["schedule_start_update"],
            "schedule_updates": state["schedule_updates"],
        },
    }
    if "rank_rng" in state:
        upgraded["rank_rng"] = state["rank_rng"]
    return upgraded


def _from_unversioned_off_policy(state: dict[str, Any]) -> dict[str, Any]:
    """The DQN family's layout before versions: a ``Box`` observation as shape, dtype and
    float64 bounds, a ``Discrete`` action space as ``num_actions`` (and ``action_start``, 0
    when absent), each rank's global RNG states inside its replay entry."""
    observation = state["observation"]
    dtype = str(observation["dtype"])
    shape = tuple(observation["shape"])
    torch_dtype = _torch_dtype(dtype)
    config = _current_config(state["config"])
    if state.get("env_id") is not None and config.get("env_id") is None:
        config["env_id"] = state["env_id"]
    section: dict[str, Any] = {
        "q_network": state["q_network"],
        "target_network": state["target_network"],
        "optimizer": state["optimizer"],
        "exploration_rng": state["agent_rng"],
    }
    for key in ("loop", "replay", "rank_replays"):
        if key in state:
            section[key] = state[key]
    upgraded = {
        "format": FORMAT,
        "version": CURRENT,
        "algorithm": str(state["algorithm"]).lower(),
        "config": config,
        "observation_space": {
            "type": "Box",
            # the bounds went through float64; cast back as the old reader did
            "low": observation["low"].reshape(shape).to(torch_dtype),
            "high": observation["high"].reshape(shape).to(torch_dtype),
            "dtype": dtype,
        },
        "action_space": {
            "type": "Discrete",
            "n": int(state["num_actions"]),
            "start": int(state.get("action_start", 0)),
        },
        "global_step": state["global_step"],
        "num_updates": state["num_updates"],
        # the run's total was its loop's horizon; without loop state, no run to continue
        "target_steps": int(state["loop"]["horizon"]) if "loop" in state else None,
        "elapsed": 0.0,
        "rng": state["rng"],
        "async": state.get("async", False),
        "async_options": state.get("async_options", {}),
        "off_policy": section,
    }
    ranks = state.get("rank_replays")
    if ranks is not None and all("global_rng" in entry for entry in ranks):
        upgraded["rank_rng"] = [entry["global_rng"] for entry in ranks]
    return upgraded


def _current_config(config: dict[str, Any]) -> dict[str, Any]:
    """An earlier layout's config with the current setting names: a renamed setting takes its
    current name (unless the config has both), and ``log_every``, A2C's and PPO's log period in
    updates, becomes ``log_every_steps`` with the rank's batch (``num_envs * num_steps``)."""
    current = {key: value for key, value in config.items() if key not in RENAMED_SETTINGS}
    for old, new in RENAMED_SETTINGS.items():
        if old in config and new not in config:
            current[new] = config[old]
    log_every = current.pop("log_every", None)
    if log_every is not None and "log_every_steps" not in current:
        current["log_every_steps"] = int(log_every) * current["num_envs"] * current["num_steps"]
    return _current_values(current)


def _current_values(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each setting of :data:`RESPELLED_VALUES` in its current spelling
    (``config`` itself when none needs it)."""
    respelled = {
        name: values[config[name]]
        for name, values in RESPELLED_VALUES.items()
        if isinstance(config.get(name), bool)
    }
    return {**config, **respelled} if respelled else config


def _torch_dtype(name: str) -> torch.dtype:
    import numpy as np

    return torch.from_numpy(np.zeros(0, dtype=np.dtype(name))).dtype
