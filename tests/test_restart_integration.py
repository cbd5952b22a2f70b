"""Restarted envs through the SB3 adapter, the sampler and checkpoints (issue 7, sections 1, 3)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import vecaccel
from tests.async_envs import counter


def _failing_fns():
    return [functools.partial(counter, tag, fail_on=3 if tag == 1 else -1) for tag in range(4)]


def test_sb3_adapter_reports_a_restart_as_a_truncation():
    from vecaccel.sb3 import VecAccelEnv

    venv = VecAccelEnv(_failing_fns(), backend="shm", num_workers=2, on_worker_failure="restart")
    try:
        venv.reset()
        for _ in range(3):
            obs, rewards, dones, infos = venv.step(np.zeros(4, dtype=np.int64))
        assert dones.tolist() == [False, True, False, False]
        info = infos[1]
        assert info["worker_restarted"] and "ValueError: boom" in info["restart_reason"]
        assert info["TimeLimit.truncated"] is True  # bootstrapped, not a terminal state
        assert "terminal_observation" in info
        assert obs[1][1] == 0.0  # the rebuilt env starts a new episode
        obs, rewards, dones, infos = venv.step(np.zeros(4, dtype=np.int64))
        assert not dones.any()  # and keeps stepping
    finally:
        venv.close()


def test_sampler_bootstraps_a_restart_and_does_not_count_it_as_an_episode():
    envs = vecaccel.make_vec(
        _failing_fns(),
        backend="shm",
        num_workers=2,
        on_worker_failure="restart",
        autoreset_mode="SameStep",
    )

    def policy(obs):
        return torch.zeros(obs.shape[0], dtype=torch.int64), {}

    try:
        sampler = vecaccel.Sampler(envs, policy, horizon=5)
        batch = sampler.collect()
        assert batch.truncated[2].tolist() == [False, True, False, False]
        assert not batch.terminated.any()
        # the truncated step bootstraps from a final observation
        assert tuple(map(int, batch.final_index[0])) == (2, 1)
        # CounterEnv episodes are 50 steps: nothing finished in 5 steps, the restart included
        assert sampler.pop_episodes().returns == []
    finally:
        envs.close()


KILL_DURING_SAVE = textwrap.dedent(
    """
    import os, signal, sys, threading, torch
    from vecaccel.trainers.checkpoint import save_checkpoint
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
    from vecaccel.trainers.checkpoint import CheckpointError, load_checkpoint

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
