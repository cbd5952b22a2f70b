"""The off-policy family's checkpoint: networks, optimizer, counters, RNG states, replay files.

The format is plain data (``weights_only`` loadable): the config, the observation space as
shape, dtype and bounds, the online and target networks, Adam's state, the counters, every RNG
state, the runner's loop state, and the name and id of the replay file written beside it (on
several ranks, every rank's).
"""

from __future__ import annotations

import dataclasses
import glob
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vecaccel.trainers.checkpoints.format import (
    CHECKPOINT_NAME,
    CheckpointError,
    checkpoint_file,
    load_checkpoint,
    save_checkpoint,
    usable_device,
)
from vecaccel.trainers.config.settings import config_from_dict, resolve_aliases
from vecaccel.trainers.replay.files import write_replay
from vecaccel.trainers.run import distributed
from vecaccel.trainers.run.seeding import get_rng_state, restore_rank_rng_state, split_seed

__all__ = [
    "load_off_policy",
    "replay_entry",
    "restore_counters",
    "save_off_policy",
    "write_run_checkpoint",
]


def save_off_policy(
    agent: Any, path: Path, replay: bool, rank_replays: list[dict[str, Any]] | None
) -> Path:
    """Write ``agent``'s checkpoint to ``path`` (see :meth:`OffPolicyAlgorithm.save
    <vecaccel.trainers.algos.off_policy.OffPolicyAlgorithm.save>`); replay files it no longer names are deleted."""
    import gymnasium as gym

    space = agent.observation_space
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"saving supports Box observation spaces, got {space}")
    path = Path(path)
    state = {
        "algorithm": type(agent).__name__,
        "env_id": agent.env_id,
        "config": {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(agent.config).items()
        },
        "observation": {
            "shape": list(space.shape),
            "dtype": str(np.dtype(space.dtype)),
            "low": torch.as_tensor(np.asarray(space.low, dtype=np.float64)),
            "high": torch.as_tensor(np.asarray(space.high, dtype=np.float64)),
        },
        "num_actions": int(agent.action_space.n),
        "action_start": int(agent.action_space.start),
        "q_network": agent.q_network.state_dict(),
        "target_network": agent.target_network.state_dict(),
        "optimizer": agent.optimizer.state_dict(),
        "global_step": agent.global_step,
        "num_updates": agent.num_updates,
        "rng": get_rng_state(),
        "agent_rng": agent.rng.bit_generator.state,
        "async": bool(agent.async_run),
        "async_options": dict(agent.async_options),
    }
    if agent.loop_state is not None:
        state["loop"] = dict(agent.loop_state)
    keep: set[str] = set()
    if rank_replays is not None:
        state["replay"] = dict(rank_replays[0])  # what a single process loads
        state["rank_replays"] = [dict(entry) for entry in rank_replays]
        keep = {entry["file"] for entry in rank_replays}
    elif replay and agent.buffer is not None:
        token = f"{agent.global_step}-{secrets.token_hex(4)}"
        state["replay"] = replay_entry(agent, write_replay(agent.buffer, path, token), token)
        keep = {state["replay"]["file"]}
    written = save_checkpoint(path, state)
    # the replay files of earlier saves, and the partial one of a save that was killed, are of no use now
    stem = glob.escape(path.stem)
    for pattern in (f"{stem}.replay-*.npz", f".{stem}.replay-*.npz.*.tmp"):
        for stale in path.parent.glob(pattern):
            if stale.name not in keep:
                stale.unlink(missing_ok=True)
    return written


def write_run_checkpoint(agent: Any, run_dir: Path | None, replay: bool) -> Path | None:
    """``agent``'s checkpoint in its run directory (see :meth:`OffPolicyAlgorithm.write_checkpoint
    <vecaccel.trainers.algos.off_policy.OffPolicyAlgorithm.write_checkpoint>`); every rank calls this."""
    if agent.run_dir is None:  # no rank writes checkpoints: nothing to gather either
        return None
    # every rank writes its replay file into the run directory; rank 0 the checkpoint
    path = Path(run_dir if run_dir is not None else agent.run_dir) / CHECKPOINT_NAME
    ranks = None
    if replay and agent.world_size > 1 and agent.buffer is not None:
        token = f"{agent.global_step}-r{distributed.rank()}-{secrets.token_hex(4)}"
        ranks = distributed.all_gather_object(
            replay_entry(agent, write_replay(agent.buffer, path, token), token)
        )
    if not agent.is_main:
        return None
    if ranks is not None:
        return agent.save_with_replay(path, rank_replays=ranks)
    return save_off_policy(agent, path, replay, None)


def replay_entry(agent: Any, file: Path, token: str) -> dict[str, Any]:
    """What a checkpoint records of the replay file ``file`` that ``agent`` wrote."""
    return {
        "file": file.name,
        "token": token,
        "buffer": type(agent.buffer).__name__,
        "n_step": agent.buffer.n_step,
        # a prioritized tree holds priority ** alpha (see PrioritizedReplayBuffer.restored)
        "alpha": getattr(agent.buffer, "alpha", None),
        "rng": agent.buffer.rng.bit_generator.state,
        "agent_rng": agent.rng.bit_generator.state,
        "global_rng": get_rng_state(),  # this rank's torch, NumPy and Python states
    }


def restore_counters(
    agent: Any, state: dict[str, Any], load_replay: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Set a loaded agent's counters and generators from ``state``, rank by rank.

    Returns:
        The RNG states now in force (for an exact resume) and the replay entry this rank
        reads, if any (``None`` with ``load_replay=False`` or when the checkpoint has none).
    """
    agent.global_step = int(state["global_step"])
    agent.num_updates = int(state["num_updates"])
    agent.async_run = bool(state.get("async", False))
    agent.async_options = dict(state.get("async_options", {}))
    # every rank's global states where the checkpoint has them (rank replays), else rank
    # 0's: rank 0 restores them, a rank r > 0 re-seeds from (its seed, r, the checkpoint's
    # counters) so that the ranks keep distinct streams, as in a fresh run
    resume_point = (agent.global_step, agent.num_updates)
    ranks = state.get("rank_replays")
    rank_states = None
    if ranks is not None and all("global_rng" in entry for entry in ranks):
        rank_states = [entry["global_rng"] for entry in ranks]
    rng_state = restore_rank_rng_state(
        state["rng"], agent.config.seed, *resume_point, rank_states=rank_states
    )
    agent.rng.bit_generator.state = state["agent_rng"]
    replay = state.get("replay") if load_replay else None
    rank = distributed.rank()
    if ranks is not None and len(ranks) == agent.world_size:
        # each rank of a run on as many ranks goes on with its own experience
        entry = ranks[rank]
        agent.rng.bit_generator.state = entry["agent_rng"]
        state["agent_rng"] = entry["agent_rng"]
        if replay is not None:
            replay = entry
    elif rank > 0:
        # rank 0's exploration and replay-sampling generators (the checkpoint has none of
        # this rank's): re-seeded like the global ones, or this rank would explore and
        # draw its batches exactly as rank 0 does
        agent.rng = np.random.default_rng(split_seed(agent.config.seed, 0xE5, rank, *resume_point))
        state["agent_rng"] = agent.rng.bit_generator.state
        if replay is not None:
            sampling = np.random.default_rng(
                split_seed(agent.config.seed, 0xB5, rank, *resume_point)
            )
            replay = {**replay, "rng": sampling.bit_generator.state}
    return rng_state, replay


def load_off_policy(
    cls: type, path: Path, env: Any, load_replay: bool, overrides: dict[str, Any]
) -> Any:
    """A ``cls`` agent (DQN or a subclass) rebuilt from the checkpoint at ``path`` (see
    :meth:`OffPolicyAlgorithm.load
    <vecaccel.trainers.algos.off_policy.OffPolicyAlgorithm.load>`)."""
    import gymnasium as gym

    path = checkpoint_file(path)
    state = load_checkpoint(path)
    algorithm = state.get("algorithm")
    # DQN loads any of the family's checkpoints (their configs say what they are)
    if algorithm is None or (cls.algo_name != "dqn" and algorithm != cls.__name__):
        raise CheckpointError(
            f"{path} holds a {algorithm or state.get('algo')!r} checkpoint, not {cls.__name__!r}"
        )
    values = {
        **resolve_aliases(cls.config_cls, state["config"]),
        **resolve_aliases(cls.config_cls, overrides),
    }
    if "device" not in overrides and "device" in values:
        values["device"] = usable_device(values["device"])
    config = config_from_dict(cls.config_cls, values)
    agent = cls(env=None, config=config)
    observation = state["observation"]
    dtype = np.dtype(observation["dtype"])
    agent.observation_space = gym.spaces.Box(
        observation["low"].numpy().astype(dtype),
        observation["high"].numpy().astype(dtype),
        tuple(observation["shape"]),
        dtype,
    )
    # a checkpoint without a start holds an action space that starts at 0
    agent.action_space = gym.spaces.Discrete(
        state["num_actions"], start=int(state.get("action_start", 0))
    )
    agent.env_id = state.get("env_id")
    agent.build_networks()
    agent.q_network.load_state_dict(state["q_network"])
    agent.target_network.load_state_dict(state["target_network"])
    agent.optimizer.load_state_dict(state["optimizer"])
    # load_state_dict brings back the saved param_groups, hyperparameters included; the
    # config in force (overrides, or a batch size that rescales the rate) decides them, and
    # the Adam moments alone carry over. DQN has no lr schedule, so the rate is constant.
    for group in agent.optimizer.param_groups:
        group["lr"] = agent.learning_rate
        group["eps"] = config.adam_eps
    rng_state, replay = restore_counters(agent, state, load_replay)
    if replay is not None:
        # a replay entry without the buffer's n_step or alpha takes the saved config's
        saved = state["config"]
        replay = {"n_step": saved.get("n_step"), "alpha": saved.get("priority_alpha"), **replay}
    resume = None
    if "loop" in state:  # a checkpoint without loop state: learn() starts afresh
        agent.loop_state = dict(state["loop"])
        agent.target_steps = int(state["loop"]["horizon"])
        resume = {
            **state["loop"],
            "rng": rng_state,
            "agent_rng": state["agent_rng"],
            "exact": replay is not None,
        }
    agent.set_resume_point(path, replay, resume)
    if env is not None:
        agent.attach_env(env)
        if replay is not None:  # read now, so that a bad replay file fails here
            agent.buffer = agent.make_buffer(agent.envs.num_envs)
            agent.restore_replay(agent.buffer)
    return agent
