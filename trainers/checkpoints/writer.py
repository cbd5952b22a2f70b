"""Writing the trainers' checkpoint, both families, in the current layout (version 2).

A checkpoint is one dict of plain data (``weights_only`` loadable) in the checksummed file of
:mod:`~vecaccel.trainers.checkpoints.format`. Its header is every algorithm's:

- ``format`` (``"vecaccel-trainer"``), ``version`` (2), ``algorithm`` (the registry name,
  ``"ppo"`` ... ``"rainbow"``) and ``config`` (every field of the algorithm's config);
- ``observation_space`` and ``action_space`` as plain data (:mod:`.spaces`);
- the counters ``global_step``, ``num_updates``, ``target_steps`` (the total of the run a
  resume continues, ``None`` when there is none) and ``elapsed`` (seconds of training);
- ``best_eval_reward``: the best mean reward of the periodic evaluations so far, the one
  ``best.pt`` holds (``None`` before any; files written without it read as ``None``), so that a
  resumed run replaces ``best.pt`` only with a better agent;
- ``rng`` (rank 0's torch, NumPy and Python states) and, from a run on several ranks that
  gathered them, ``rank_rng`` (every rank's); ``async`` and ``async_options`` (how the run
  trained, so that a resume goes on alike);
- ``normalization``, in a checkpoint of a run that normalises observations or rewards: the
  running statistics (``Normalizer.state_dict``: ``obs`` and ``returns``, each ``mean``,
  ``var`` and ``count``), which a loaded agent predicts and trains on with.

Then one section, the family's (``Algorithm.checkpoint_section``, under
``Algorithm.checkpoint_key``):

- A2C's and PPO's: ``model``, ``optimizer`` and the learning-rate schedule
  (``schedule_start_update``, ``schedule_updates``);
- the DQN family's: ``q_network``, ``target_network``, ``optimizer``, ``exploration_rng`` (the
  ε-greedy generator), the runner's ``loop`` counters when a run recorded them;

and, in a section whose algorithm saved its replay buffer, ``replay`` (the entry of the file a
single process reads) and, from several ranks, ``rank_replays`` (every rank's entry).
"""

from __future__ import annotations

import dataclasses
import glob
import secrets
from pathlib import Path
from typing import Any

from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME, save_checkpoint
from vecaccel.trainers.checkpoints.space_serialization import space_to_dict
from vecaccel.trainers.replay.files import write_replay
from vecaccel.trainers.services.seeding import get_rng_state

__all__ = ["FORMAT", "VERSION", "checkpoint_state", "save_agent", "write_run_checkpoint"]

FORMAT = "vecaccel-trainer"
#: the layout this module writes, the one the reader accepts
VERSION = 2


def checkpoint_state(
    agent: Any,
    *,
    rank_rng: list[dict[str, Any]] | None = None,
    replay: dict[str, Any] | None = None,
    rank_replays: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``agent``'s checkpoint as a dict: the header and its family's section (what
    ``agent.checkpoint_section()`` returns, under ``agent.checkpoint_key``).

    Args:
        agent: an algorithm with its networks built.
        rank_rng: every rank's global RNG states, in rank order (a run on several ranks).
        replay: the entry of the replay file written for this checkpoint, if any.
        rank_replays: (several ranks) every rank's replay entry, in rank order.
    """
    section = agent.checkpoint_section()
    if rank_replays is not None:
        section["replay"] = dict(rank_replays[0])  # what a single process loads
        section["rank_replays"] = [dict(entry) for entry in rank_replays]
        rank_rng = [entry["global_rng"] for entry in rank_replays]
    elif replay is not None:
        section["replay"] = replay
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "algorithm": agent.algo_name,
        "config": dataclasses.asdict(agent.config),
        "observation_space": space_to_dict(agent.observation_space),
        "action_space": space_to_dict(agent.action_space),
        "global_step": int(agent.global_step),
        "num_updates": int(agent.num_updates),
        "target_steps": agent.checkpoint_target_steps(),
        "elapsed": float(
            agent.logger.elapsed if agent.logger is not None else agent.elapsed_before
        ),
        "best_eval_reward": (
            None if agent.best_eval_reward is None else float(agent.best_eval_reward)
        ),
        "rng": get_rng_state(),
        "async": bool(agent.async_run),
        "async_options": dict(agent.async_options),
        agent.checkpoint_key: section,
    }
    if rank_rng is not None:
        state["rank_rng"] = rank_rng
    normalizer = getattr(agent, "normalizer", None)
    if normalizer is not None:
        state["normalization"] = normalizer.state_dict()
    return state


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
        replay: write the replay buffer (an agent's ``buffer``, if it has one) beside the checkpoint too
            (``<stem>.replay-<step>-<id>.npz``), named in it with an id the file holds.
        rank_replays: (several ranks) the replay files every rank has written.
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
    section = state[agent.checkpoint_key]
    keep = {item["file"] for item in section.get("rank_replays", [section.get("replay")]) if item}
    stem = glob.escape(path.stem)
    for pattern in (f"{stem}.replay-*.npz", f".{stem}.replay-*.npz.*.tmp"):
        for stale in path.parent.glob(pattern):
            if stale.name not in keep:
                stale.unlink(missing_ok=True)
    return written


def write_run_checkpoint(agent: Any, run_dir: Path | None, replay: bool) -> Path | None:
    """``agent``'s checkpoint in its run directory, written by rank 0; every rank calls this
    at the same point (``run_dir`` may be ``None`` off rank 0). Returns the path written.

    On several ranks what the family gathers from every rank goes into the checkpoint (see
    ``agent.gather_rank_checkpoint``: their RNG states, and with ``replay`` the replay files
    each rank wrote), so that a run resumed on as many ranks continues each rank's streams
    exactly.
    """
    if agent.run_dir is None:  # no rank writes checkpoints: nothing to gather either
        return None
    path = Path(run_dir if run_dir is not None else agent.run_dir) / CHECKPOINT_NAME
    rank_rng, rank_replays = agent.gather_rank_checkpoint(path, replay)
    if not agent.is_main:
        return None
    return save_agent(agent, path, replay=replay, rank_replays=rank_replays, rank_rng=rank_rng)


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
