"""SIGINT or SIGTERM during ``vecaccel train`` writes a checkpoint, and ``--resume`` continues it."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_main

from vecaccel.trainers.checkpoints.format import load_checkpoint

ROOT = Path(__file__).parents[3]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _rows(run_dir: Path) -> int:
    try:
        with open(run_dir / "metrics.csv", newline="") as file:
            return sum(1 for _ in csv.DictReader(file))
    except (FileNotFoundError, csv.Error):
        return 0


CASES = {
    "ppo": (
        ["ppo", "--num-envs", "2", "--num-steps", "16", "--log-every-steps", "1"],
        signal.SIGTERM,
        "global_step",
    ),
    "dqn": (
        ["dqn", "--learning-starts", "100", "--batch-size", "16", "--log-every-steps", "50"],
        signal.SIGINT,
        "global_step",
    ),
    "dqn-async": (
        ["dqn", "--async", "--learning-starts", "100", "--batch-size", "16"]
        + ["--log-every-steps", "50"],
        signal.SIGTERM,
        "global_step",
    ),
    "dqn-async-fixed-lag": (
        ["dqn", "--async", "--async-fixed-lag", "--learning-starts", "100", "--batch-size", "16"]
        + ["--log-every-steps", "50"],
        signal.SIGINT,
        "global_step",
    ),
}


@pytest.mark.parametrize("algo", sorted(CASES))
def test_signal_saves_checkpoint_and_resume_continues(algo: str, tmp_path: Path, capsys) -> None:
    flags, signum, step_key = CASES[algo]
    run_dir = tmp_path / "run"
    common = ["--backend", "serial", "--no-progress", "--no-tensorboard", "--torch-threads", "1"]
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vecaccel",
            "train",
            *flags,
            "--env",
            "CartPole-v1",
            "--total-timesteps",
            "100000000",
            "--run-dir",
            str(run_dir),
            *common,
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while _rows(run_dir) < 3 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        assert _rows(run_dir) >= 3, job.stdout.read() if job.poll() is not None else "no rows"
        job.send_signal(signum)
        output, _ = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 128 + signum, output[-3000:]
    assert "checkpoint saved" in output, output[-3000:]
    state = load_checkpoint(run_dir / "checkpoint.pt")
    step = int(state[step_key])
    assert step > 0

    # the resume runs in this process: what is checked is the checkpoint the signal wrote, and
    # the interpreter and torch the signalled run needed are started once per case, not twice
    capsys.readouterr()
    code = run_main(
        ["train", flags[0], "--resume", str(run_dir), "--total-timesteps", str(step + 64), *common]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.out[-2000:] + captured.err[-2000:]
    assert f"at step {step}" in captured.err
    assert int(load_checkpoint(run_dir / "checkpoint.pt")[step_key]) >= step + 64
