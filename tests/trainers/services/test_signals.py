"""SIGINT or SIGTERM during ``vecaccel train`` writes a checkpoint, and ``--resume`` continues it."""

from __future__ import annotations

import csv
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import run_main

from vecaccel.trainers.checkpoints.format import load_checkpoint


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


def _signal_after_rows(run_dir: Path, signum: int, done: threading.Event) -> list[int]:
    """Send ``signum`` to this process, as a scheduler preempting the job does, once the run in
    ``run_dir`` has logged 3 metric rows (or after 60 s, to stop a run that never gets there);
    the list gets the rows there were when it was sent. Nothing is sent once ``done`` is set."""
    sent: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + 60
        while _rows(run_dir) < 3 and time.monotonic() < deadline and not done.is_set():
            time.sleep(0.1)
        if not done.is_set():
            sent.append(_rows(run_dir))
            os.kill(os.getpid(), signum)

    threading.Thread(target=watch, daemon=True).start()
    return sent


def _unhandled(signum: int, frame: object) -> None:
    raise AssertionError(f"{signal.Signals(signum).name} reached the test, not the run")


@pytest.mark.parametrize("algo", sorted(CASES))
def test_signal_saves_checkpoint_and_resume_continues(algo: str, tmp_path: Path, capsys) -> None:
    flags, signum, step_key = CASES[algo]
    run_dir = tmp_path / "run"
    common = ["--backend", "serial", "--no-progress", "--no-tensorboard", "--torch-threads", "1"]
    # `vecaccel train` runs in this process (`python -m vecaccel` exits with what main returns)
    # and the signal comes from another thread; one that the run's own handler does not take
    # fails the test here rather than end the test process or go unnoticed
    previous = signal.signal(signum, _unhandled)
    done = threading.Event()
    try:
        sent = _signal_after_rows(run_dir, signum, done)
        code = run_main(
            ["train", *flags, "--env", "CartPole-v1", "--total-timesteps", "100000000",
             "--run-dir", str(run_dir), *common]
        )  # fmt: skip
    finally:
        done.set()
        signal.signal(signum, previous)
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert sent and sent[0] >= 3, f"signalled after {sent} metric rows\n" + output[-3000:]
    assert code == 128 + signum, output[-3000:]
    assert "checkpoint saved" in output, output[-3000:]
    state = load_checkpoint(run_dir / "checkpoint.pt")
    step = int(state[step_key])
    assert step > 0

    code = run_main(
        ["train", flags[0], "--resume", str(run_dir), "--total-timesteps", str(step + 64), *common]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.out[-2000:] + captured.err[-2000:]
    assert f"at step {step}" in captured.err
    assert int(load_checkpoint(run_dir / "checkpoint.pt")[step_key]) >= step + 64
