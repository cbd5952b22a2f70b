"""The checkpoint format: atomic writes, clear errors for corrupt or mismatched checkpoints, and
loading across devices.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from vecaccel.trainers import A2C, DQN, PPO
from vecaccel.trainers.checkpoints.format import CheckpointError, load_checkpoint, save_checkpoint

torch.set_num_threads(1)


def test_load_refuses_another_algorithm(tmp_path):
    agent = A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=4)
    agent.save(tmp_path / "a2c.pt")
    agent.close()
    with pytest.raises(CheckpointError, match="a2c"):
        PPO.load(tmp_path / "a2c.pt")


def test_corrupt_checkpoints_raise_clear_errors(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"weights": torch.arange(1000.0), "step": 3})
    assert load_checkpoint(path)["step"] == 3
    data = path.read_bytes()

    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path)

    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)

    path.write_bytes(b"")
    with pytest.raises(CheckpointError):
        load_checkpoint(path)

    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError):
        load_checkpoint(path)

    torch.save([1, 2, 3], path)  # a plain torch file that is not a dict
    with pytest.raises(CheckpointError, match="not a dict"):
        load_checkpoint(path)

    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    assert issubclass(CheckpointError, ValueError)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"version": 1})

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", failing_replace)
    with pytest.raises(OSError):
        save_checkpoint(path, {"version": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left


def test_load_with_an_env_of_other_spaces_is_refused(checkpoints):
    """``PPO.load(path, env="Acrobot-v1")`` documents ``env`` as the env to continue training on:
    an id is not ignored in favour of the checkpoint's CartPole, and an env the saved network
    cannot act in is refused."""
    try:
        agent = PPO.load(checkpoints / "ppo", env="Acrobot-v1", backend="serial")
    except (ValueError, CheckpointError):
        return
    env_id = agent.config.env_id
    agent.close()
    pytest.fail(f"loaded onto Acrobot-v1 without complaint; the agent trains on {env_id}")


# -- checkpoints ------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_load_on_cpu_of_a_checkpoint_trained_on_cuda(algo, checkpoints, tmp_path):
    """A checkpoint written by a run with ``device="cuda"`` (here: the CartPole checkpoint with
    its recorded device changed, as such a run records it) cannot be loaded on a machine
    without CUDA: ``load`` maps the tensors to the CPU but then builds the network on the
    recorded device ("Torch not compiled with CUDA enabled"). SB3's ``load`` uses
    ``device="auto"``; the trainers should fall back to a device that exists."""
    state = load_checkpoint(checkpoints / algo / "checkpoint.pt")
    state["config"]["device"] = "cuda:0"
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    cls = PPO if algo == "ppo" else DQN
    agent = cls.load(path)
    actions, _ = agent.predict(np.zeros(4, dtype=np.float32), deterministic=True)
    assert int(actions) in (0, 1)


KILL_DURING_SAVE = textwrap.dedent(
    """
    import os, signal, sys, threading, torch
    from vecaccel.trainers.checkpoints.format import save_checkpoint
    path = sys.argv[1]
    save_checkpoint(path, {"weights": torch.zeros(10), "step": 1})
    big = {"weights": torch.randn(20_000_000), "step": 2}
    # die in the middle of writing the second checkpoint
    threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    while True:
        save_checkpoint(path, big)
    """
)


def test_checkpoint_killed_mid_write_leaves_the_previous_one(tmp_path):
    from vecaccel.trainers.checkpoints.format import CheckpointError, load_checkpoint

    path = tmp_path / "checkpoint.pt"
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_DURING_SAVE)
    result = subprocess.run([sys.executable, str(script), str(path)], timeout=120)
    assert result.returncode == -signal.SIGKILL
    state = load_checkpoint(path)  # whichever checkpoint is there is whole
    assert state["step"] in (1, 2)
    leftovers = [p for p in os.listdir(tmp_path) if p not in ("checkpoint.pt", script.name)]
    # a partial temporary file may remain, but it is never mistaken for the checkpoint
    for name in leftovers:
        with pytest.raises(CheckpointError):
            load_checkpoint(tmp_path / name)
