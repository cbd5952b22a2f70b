"""Writing the trainers' checkpoint, both families, in the current layout (version 2).

A checkpoint is one dict of plain data (``weights_only`` loadable) in the checksummed file of
:mod:`~vecaccel.trainers.checkpoints.format`. Its header is every algorithm's:

- ``format`` (``"vecaccel-trainer"``), ``version`` (2), ``algorithm`` (the registry name,
  ``"ppo"`` ... ``"rainbow"``) and ``config`` (every field of the algorithm's config);
- ``observation_space`` and ``action_space`` as plain data (:mod:`.spaces`);
- the counters ``global_step``, ``num_updates``, ``target_steps`` (the total of the run a
  resume continues, ``None`` when there is none) and ``elapsed`` (seconds of training);
- ``rng`` (rank 0's torch, NumPy and Python states) and, from a run on several ranks that
  gathered them, ``rank_rng`` (every rank's); ``async`` and ``async_options`` (how the run
  trained, so that a resume goes on alike).

Then one section, named by the family:

- ``on_policy``: ``model``, ``optimizer`` and the learning-rate schedule
  (``schedule_start_update``, ``schedule_updates``);
- ``off_policy``: ``q_network``, ``target_network``, ``optimizer``, ``exploration_rng`` (the
  ε-greedy generator), the runner's ``loop`` counters when a run recorded them, and, when the
  replay buffer was saved, ``replay`` (the entry of the file a single process reads) and, from
  several ranks, ``rank_replays`` (every rank's entry).
"""

from __future__ import annotations

import dataclasses
import glob
import secrets
from pathlib import Path
from typing import Any

from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME, save_checkpoint
from vecaccel.trainers.checkpoints.spaces import space_to_dict
from vecaccel.trainers.replay.files import write_replay
from vecaccel.trainers.run import distributed
from vecaccel.trainers.run.seeding import get_rng_state

__all__ = ["FORMAT", "VERSION", "checkpoint_state", "save_agent", "write_run_checkpoint"]

FORMAT = "vecaccel-trainer"
#: the layout this module writes; :mod:`.legacy` reads the earlier ones into it
VERSION = 2


def checkpoint_state(
    agent: Any,
    *,
    rank_rng: list[dict[str, Any]] | None = None,
    replay: dict[str, Any] | None = None,
    rank_replays: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``agent``'s checkpoint as a dict: the header and its family's section.

    Args:
        agent: an A2C, PPO, DQN, C51 or Rainbow agent with its networks built.
        rank_rng: every rank's global RNG states, in rank order (a run on several ranks).
        replay: (off-policy) the entry of the replay file written for this checkpoint.
        rank_replays: (off-policy, several ranks) every rank's replay entry, in rank order.
    """
    on_policy = agent.family == "on_policy"
    section = _on_policy_section(agent) if on_policy else _off_policy_section(agent)
    if rank_replays is not None:
        section["replay"] = dict(rank_replays[0])  # what a single process loads
        section["rank_replays"] = [dict(entry) for entry in rank_replays]
        rank_rng = [entry["global_rng"] for entry in rank_replays]
    elif replay is not None:
        section["replay"] = replay
    if on_policy:
        target_steps = agent.target_steps
    else:  # the off-policy runner continues a run from its loop counters alone
        target_steps = None if agent.loop_state is None else int(agent.loop_state["horizon"])
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "algorithm": agent.algo_name,
        "config": dataclasses.asdict(agent.config),
        "observation_space": space_to_dict(agent.observation_space),
        "action_space": space_to_dict(agent.action_space),
        "global_step": int(agent.global_step),
        "num_updates": int(agent.num_updates),
        "target_steps": target_steps,
        "elapsed": float(
            agent.logger.elapsed if agent.logger is not None else agent.elapsed_before
        ),
        "rng": get_rng_state(),
        "async": bool(agent.async_run),
        "async_options": dict(agent.async_options),
        agent.family: section,
    }
    if rank_rng is not None:
        state["rank_rng"] = rank_rng
    return state


def _on_policy_section(agent: Any) -> dict[str, Any]:
    return {
        "model": agent.model.state_dict(),
        "optimizer": agent.optimizer.state_dict(),
        "schedule_start_update": int(agent.schedule_start_update),
        "schedule_updates": int(agent.schedule_updates),
    }


def _off_policy_section(agent: Any) -> dict[str, Any]:
    section = {
        "q_network": agent.q_network.state_dict(),
        "target_network": agent.target_network.state_dict(),
        "optimizer": agent.optimizer.state_dict(),
        "exploration_rng": agent.rng.bit_generator.state,
    }
    if agent.loop_state is not None:
        section["loop"] = dict(agent.loop_state)
    return section


def save_agent(
    agent: Any,
    path: str | Path,
    *,
    replay: bool = False,
    rank_replays: list[dict[str, Any]] | None = None,
    rank_rng: list[dict[str, Any]] | None = None,
) -> Path:
    """Write ``agent``'s checkpoint to ``path`` atomically; returns the path.

    Args:
        agent: the agent to save.
        path: the checkpoint file.
        replay: (off-policy) write the replay buffer beside the checkpoint too
            (``<stem>.replay-<step>-<id>.npz``), named in it with an id the file holds.
        rank_replays: (off-policy, several ranks) the replay files every rank has written.
        rank_rng: every rank's global RNG states (a run on several ranks).

    Replay files beside ``path`` that the new checkpoint does not name are deleted once it is
    written: those of earlier saves, and the partial one of a save that was killed.
    """
    path = Path(path)
    entry = None
    if replay and rank_replays is None and getattr(agent, "buffer", None) is not None:
        token = f"{agent.global_step}-{secrets.token_hex(4)}"
        entry = replay_entry(agent, write_replay(agent.buffer, path, token), token)
    state = checkpoint_state(agent, rank_rng=rank_rng, replay=entry, rank_replays=rank_replays)
    written = save_checkpoint(path, state)
    if agent.family == "off_policy":
        section = state["off_policy"]
        keep = {
            item["file"] for item in section.get("rank_replays", [section.get("replay")]) if item
        }
        stem = glob.escape(path.stem)
        for pattern in (f"{stem}.replay-*.npz", f".{stem}.replay-*.npz.*.tmp"):
            for stale in path.parent.glob(pattern):
                if stale.name not in keep:
                    stale.unlink(missing_ok=True)
    return written


def write_run_checkpoint(agent: Any, run_dir: Path | None, replay: bool) -> Path | None:
    """``agent``'s checkpoint in its run directory, written by rank 0; every rank calls this
    at the same point (``run_dir`` may be ``None`` off rank 0). Returns the path written.

    On several ranks the ranks' states are gathered into the checkpoint, so that a run resumed
    on as many ranks continues each rank's streams exactly: A2C and PPO gather every rank's RNG
    states; the DQN family, with ``replay``, has every rank write its own replay buffer (each
    holds different experience) and gathers the entries naming them, with each rank's
    generators.
    """
    if agent.run_dir is None:  # no rank writes checkpoints: nothing to gather either
        return None
    path = Path(run_dir if run_dir is not None else agent.run_dir) / CHECKPOINT_NAME
    rank_rng = rank_replays = None
    if agent.world_size > 1 and agent.family == "on_policy":
        rank_rng = distributed.all_gather_object(get_rng_state())
    elif agent.world_size > 1 and replay and agent.buffer is not None:
        token = f"{agent.global_step}-r{distributed.rank()}-{secrets.token_hex(4)}"
        rank_replays = distributed.all_gather_object(
            replay_entry(agent, write_replay(agent.buffer, path, token), token)
        )
    if not agent.is_main or (run_dir is None and agent.family == "on_policy"):
        return None
    return save_agent(
        agent,
        path,
        replay=replay and agent.family == "off_policy",
        rank_replays=rank_replays,
        rank_rng=rank_rng,
    )


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
