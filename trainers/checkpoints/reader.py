"""Reading the trainers' checkpoint, both families: any layout version into an agent.

:func:`read_checkpoint` loads a file and hands back the current layout (see
:mod:`~vecaccel.trainers.checkpoints.writer`), an older file converted by
:mod:`~vecaccel.trainers.checkpoints.legacy`. :func:`load_agent` rebuilds an agent from it:
the config recorded (with the caller's changes), the networks and optimizer, the counters and
RNG states, then the family's own part (A2C and PPO: the learning-rate schedule and the envs
reset at the run's restart point; the DQN family: the exploration generator, the runner's loop
counters and the replay file read by the next run).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vecaccel.trainers.checkpoints.format import (
    CheckpointError,
    check_env_matches,
    checkpoint_file,
    load_checkpoint,
    usable_device,
)
from vecaccel.trainers.checkpoints.spaces import space_from_dict
from vecaccel.trainers.config.settings import (
    config_from_dict,
    optimizer_settings,
    resolve_device,
)
from vecaccel.trainers.run import distributed
from vecaccel.trainers.run.seeding import restore_rank_rng_state, split_seed

if TYPE_CHECKING:
    from vecaccel.trainers.algos.base import Algorithm

__all__ = ["load_agent", "read_checkpoint"]


def read_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """The trainer checkpoint at ``path`` (a file or a run directory) in the current layout,
    whatever version wrote it.

    Raises:
        FileNotFoundError: there is no file.
        CheckpointError: the file is corrupt or truncated, not a trainer's checkpoint, or of
            a version newer than this one reads.
    """
    from vecaccel.trainers.checkpoints.legacy import upgrade

    path = checkpoint_file(path)
    state = load_checkpoint(path, map_location=map_location)
    try:
        return upgrade(state)
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


def load_agent(cls: type[Algorithm], path: Path, env: Any, options: dict[str, Any]) -> Any:
    """A ``cls`` agent rebuilt from the checkpoint at ``path`` (see
    :meth:`Algorithm.load <vecaccel.trainers.algos.base.Algorithm.load>`).

    ``options``: config fields to change; A2C and PPO also take ``run_dir`` (where a continued
    run logs and checkpoints; default: nowhere) and ``restore_rng`` (default ``True``), the DQN
    family ``load_replay`` (default ``True``).

    Raises:
        CheckpointError: the file cannot be read, or holds another algorithm's checkpoint (DQN
            loads any of its family's: their configs say what they are).
    """
    overrides = dict(options)
    path = checkpoint_file(path)
    if cls.family == "on_policy":
        run_dir = overrides.pop("run_dir", None)
        restore_rng = bool(overrides.pop("restore_rng", True))
        state = read_checkpoint(path, resolve_device(overrides.get("device", "cpu")))
    else:
        load_replay = bool(overrides.pop("load_replay", True))
        state = read_checkpoint(path)
    algorithm = state["algorithm"]
    family_matches = cls.family in state
    if not family_matches or (algorithm != cls.algo_name and cls.algo_name != "dqn"):
        raise CheckpointError(f"{path} holds a {algorithm!r} checkpoint, not {cls.algo_name!r}")
    values = {**state["config"], **overrides}
    if "device" not in overrides and "device" in values:
        values["device"] = usable_device(values["device"])
    if cls.family == "on_policy":
        values["run_dir"] = None if run_dir is None else os.fspath(run_dir)
        return _load_on_policy(cls, state, values, env, restore_rng)
    return _load_off_policy(cls, path, state, values, env, load_replay)


def _restore_header(agent: Any, state: dict[str, Any]) -> None:
    """The counters and run mode every family restores."""
    agent.global_step = int(state["global_step"])
    agent.num_updates = int(state["num_updates"])
    target = state["target_steps"]
    agent.target_steps = None if target is None else int(target)
    agent.elapsed_before = float(state.get("elapsed", 0.0))
    agent.async_run = bool(state.get("async", False))
    agent.async_options = dict(state.get("async_options", {}))


# -- A2C and PPO ---------------------------------------------------------------------------------


def _load_on_policy(
    cls: type[Algorithm], state: dict[str, Any], values: dict[str, Any], env: Any, restore_rng: bool
) -> Any:
    section = state["on_policy"]
    names = {f.name for f in dataclasses.fields(cls.config_cls)}
    values = {key: value for key, value in values.items() if key in names}
    observation_space = space_from_dict(state["observation_space"])
    action_space = space_from_dict(state["action_space"])
    # built without an env, which is attached once the counters say where the run stands; the
    # saved settings are the run's, with no preset applied over them
    recorded_preset = values.pop("preset", None)
    from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm

    # the family's constructor: a subclass's own may take other arguments
    agent: Any = cls.__new__(cls)
    OnPolicyAlgorithm.__init__(
        agent,
        None,
        observation_space=observation_space,
        action_space=action_space,
        preset=None,
        **values,
    )
    agent.config.preset = recorded_preset
    agent.model.load_state_dict(section["model"])
    agent.optimizer.load_state_dict(section["optimizer"])
    _restore_header(agent, state)
    agent.schedule_start_update = int(section["schedule_start_update"])
    agent.schedule_updates = int(section["schedule_updates"])
    if restore_rng:  # each rank's states, or rank 0's and the others re-seed (see there)
        restore_rank_rng_state(
            state["rng"], agent.config.seed, agent.global_step, rank_states=state.get("rank_rng")
        )
    if env is not None:
        if isinstance(env, str):
            agent.config.env_id = env  # the id given, not the one recorded
        agent.attach_env(env)
        try:
            check_env_matches(
                agent.config.env_id,
                agent.envs.single_observation_space,
                agent.envs.single_action_space,
                observation_space,
                action_space,
            )
        except ValueError:
            if agent.owns_envs:
                agent.envs.close()
            raise
        agent.make_sampler()
        if agent.num_updates > 0:
            agent.reset_envs()
    return agent


# -- DQN, C51 and Rainbow --------------------------------------------------------------------------


def _load_off_policy(
    cls: type[Algorithm],
    path: Path,
    state: dict[str, Any],
    values: dict[str, Any],
    env: Any,
    load_replay: bool,
) -> Any:
    section = state["off_policy"]
    config = config_from_dict(cls.config_cls, values)
    saved_optimizer = state["config"].get("optimizer", "adam")
    if config.optimizer != saved_optimizer:
        raise ValueError(
            f"optimizer={config.optimizer!r}: {path} holds the state of {saved_optimizer!r}, "
            f"which the other cannot continue; load it with optimizer={saved_optimizer!r}"
        )
    agent: Any = cls(env=None, config=config)
    agent.observation_space = space_from_dict(state["observation_space"])
    agent.action_space = space_from_dict(state["action_space"])
    agent.env_id = state["config"].get("env_id")
    agent.build_networks()
    agent.q_network.load_state_dict(section["q_network"])
    agent.target_network.load_state_dict(section["target_network"])
    agent.optimizer.load_state_dict(section["optimizer"])
    # load_state_dict brings back the saved param_groups, hyperparameters included; the
    # config in force (overrides, or a batch size that rescales the rate) decides them, and
    # the optimizer's moments alone carry over. DQN has no lr schedule, so the rate is constant.
    for group in agent.optimizer.param_groups:
        group["lr"] = agent.learning_rate
        group.update(optimizer_settings(config))
    _restore_header(agent, state)
    rng_state, exploration_rng, replay = _restore_rank_streams(agent, state, load_replay)
    if replay is not None:
        # a replay entry without the buffer's n_step or alpha takes the saved config's
        saved = state["config"]
        replay = {"n_step": saved.get("n_step"), "alpha": saved.get("priority_alpha"), **replay}
    resume = None
    if "loop" in section:  # a checkpoint without loop state: learn() starts afresh
        agent.loop_state = dict(section["loop"])
        resume = {
            **section["loop"],
            "rng": rng_state,
            "agent_rng": exploration_rng,
            "exact": replay is not None,
        }
    agent.set_resume_point(path, replay, resume)
    if env is not None:
        agent.attach_env(env)
        if replay is not None:  # read now, so that a bad replay file fails here
            agent.buffer = agent.make_buffer(agent.envs.num_envs)
            agent.restore_replay(agent.buffer)
    return agent


def _restore_rank_streams(
    agent: Any, state: dict[str, Any], load_replay: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """Set a loaded off-policy agent's generators from ``state``, rank by rank.

    Returns:
        The global RNG states now in force and the exploration generator's state (for an
        exact resume), and the replay entry this rank reads, if any (``None`` with
        ``load_replay=False`` or when the checkpoint has none).
    """
    section = state["off_policy"]
    # every rank's global states where the checkpoint has them, else rank 0's: rank 0
    # restores them, a rank r > 0 re-seeds from (its seed, r, the checkpoint's counters) so
    # that the ranks keep distinct streams, as in a fresh run
    resume_point = (agent.global_step, agent.num_updates)
    rng_state = restore_rank_rng_state(
        state["rng"], agent.config.seed, *resume_point, rank_states=state.get("rank_rng")
    )
    exploration_rng = section["exploration_rng"]
    agent.rng.bit_generator.state = exploration_rng
    replay = section.get("replay") if load_replay else None
    ranks = section.get("rank_replays")
    rank = distributed.rank()
    if ranks is not None and len(ranks) == agent.world_size:
        # each rank of a run on as many ranks goes on with its own experience
        entry = ranks[rank]
        exploration_rng = entry["agent_rng"]
        agent.rng.bit_generator.state = exploration_rng
        if replay is not None:
            replay = entry
    elif rank > 0:
        # rank 0's exploration and replay-sampling generators (the checkpoint has none of
        # this rank's): re-seeded like the global ones, or this rank would explore and
        # draw its batches exactly as rank 0 does
        agent.rng = np.random.default_rng(split_seed(agent.config.seed, 0xE5, rank, *resume_point))
        exploration_rng = agent.rng.bit_generator.state
        if replay is not None:
            sampling = np.random.default_rng(
                split_seed(agent.config.seed, 0xB5, rank, *resume_point)
            )
            replay = {**replay, "rng": sampling.bit_generator.state}
    return rng_state, exploration_rng, replay
