"""Replay buffers in checkpoints: the ``.npz`` beside ``checkpoint.pt`` written atomically and
read straight into a buffer, refused when it is missing, corrupt, another checkpoint's, or of
another buffer or config; a loaded agent reads it when it trains, not to predict."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete
from helpers import TINY_DQN

from vecaccel.trainers.algos.dqn import Rainbow
from vecaccel.trainers.checkpoints.format import CheckpointError, load_checkpoint, save_checkpoint
from vecaccel.trainers.replay.buffer import ReplayBuffer
from vecaccel.trainers.replay.files import restore_replay, write_replay
from vecaccel.trainers.replay.prioritized import PrioritizedReplayBuffer

torch.set_num_threads(1)

SPACE = Box(-10.0, 10.0, (3,), np.float32)


def filled(cls: type = ReplayBuffer, capacity: int = 40, **kwargs) -> ReplayBuffer:
    """A buffer of 2 envs holding 25 vector steps, episodes ending in both ways."""
    buffer = cls(SPACE, Discrete(3), capacity, num_envs=2, n_step=2, seed=0, **kwargs)
    for step in range(25):
        buffer.add(
            np.full((2, 3), step, np.float32),
            [step % 3, (step + 1) % 3],
            [1.0, -0.5 * step],
            [step % 7 == 6, False],
            [False, step % 5 == 4],
            final_obs=np.full((2, 3), -step, np.float32),
        )
    return buffer


def entry(buffer: ReplayBuffer, file, token: str) -> dict:
    return {"file": file.name, "token": token, "buffer": type(buffer).__name__,
            "n_step": buffer.n_step, "alpha": getattr(buffer, "alpha", None),
            "rng": buffer.rng.bit_generator.state}  # fmt: skip


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_written_buffer_reads_back_equal_and_samples_the_same(cls, tmp_path) -> None:
    buffer = filled(cls)
    checkpoint = tmp_path / "checkpoint.pt"
    path = write_replay(buffer, checkpoint, "25-abcd")
    assert path == tmp_path / "checkpoint.replay-25-abcd.npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "no temporary file left"
    copy = cls(SPACE, Discrete(3), 40, num_envs=2, n_step=2, seed=7)
    restore_replay(copy, checkpoint, entry(buffer, path, "25-abcd"))
    for name, array in buffer.arrays.items():
        np.testing.assert_array_equal(copy.arrays[name], array, err_msg=name)
    sample = {} if cls is ReplayBuffer else {"beta": 0.5}
    for x, y in zip(buffer.sample(16, **sample), copy.sample(16, **sample)):
        np.testing.assert_array_equal(x, y)


def test_a_buffer_of_another_config_or_type_is_refused(tmp_path) -> None:
    buffer = filled()
    checkpoint = tmp_path / "checkpoint.pt"
    path = write_replay(buffer, checkpoint, "25-abcd")
    smaller = ReplayBuffer(SPACE, Discrete(3), 20, num_envs=2, n_step=2)
    with pytest.raises(CheckpointError, match=r"was the config changed\?.*load_replay=False"):
        restore_replay(smaller, checkpoint, entry(buffer, path, "25-abcd"))
    prioritized = filled(PrioritizedReplayBuffer)
    with pytest.raises(CheckpointError, match="holds a ReplayBuffer.*PrioritizedReplayBuffer"):
        restore_replay(prioritized, checkpoint, entry(buffer, path, "25-abcd"))


def test_replay_file_is_validated(tmp_path) -> None:
    config = dict(TINY_DQN, backend="serial", num_envs=2, seed=3, torch_threads=1,
                  checkpoint_every=0, run_dir=str(tmp_path))  # fmt: skip
    agent = Rainbow(env="CartPole-v1", **config)
    agent.learn(120)
    agent.close()
    path = tmp_path / "checkpoint.pt"
    (replay,) = tmp_path.glob("checkpoint.replay-*.npz")
    good = replay.read_bytes()

    # predicting needs no replay file; training does, and says how to do without
    replay.unlink()
    assert Rainbow.load(path).num_updates == agent.num_updates
    with pytest.raises(CheckpointError, match="missing.*load_replay=False"):
        Rainbow.load(path, env="CartPole-v1")
    empty = Rainbow.load(path, env="CartPole-v1", load_replay=False, run_dir=None)
    empty.learn(60, reset_num_timesteps=False)  # refills the buffer, as before replay files
    assert empty.global_step == 180
    empty.close()

    corrupt = bytearray(good)
    with zipfile.ZipFile(io.BytesIO(good)) as archive:  # a byte inside the stored frames
        frames = archive.getinfo("frames.npy")
    corrupt[frames.header_offset + frames.file_size // 2 + 100] ^= 0xFF
    for damaged in (bytes(corrupt), good[: len(good) // 2]):
        replay.write_bytes(damaged)
        with pytest.raises(CheckpointError, match="truncated or corrupt"):
            Rainbow.load(path, env="CartPole-v1")

    # a replay file left by another checkpoint is refused, not silently used
    replay.write_bytes(good)
    state = load_checkpoint(path)
    state["off_policy"]["replay"]["token"] = "0-00000000"
    save_checkpoint(path, state)
    with pytest.raises(CheckpointError, match="another checkpoint"):
        Rainbow.load(path, env="CartPole-v1")

    # a checkpoint from before replay files and loop state still loads and trains
    for key in ("replay", "loop"):
        state["off_policy"].pop(key)
    state["config"].pop("checkpoint_replay")
    save_checkpoint(path, state)
    old = Rainbow.load(path, env="CartPole-v1", run_dir=None)
    assert old.buffer is None and old.global_step == 120
    with pytest.raises(ValueError, match="needs total_timesteps"):
        old.learn()
    old.learn(60, reset_num_timesteps=False)
    assert old.global_step == 180
    old.close()
