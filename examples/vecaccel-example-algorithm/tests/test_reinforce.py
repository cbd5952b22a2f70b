"""REINFORCE keeps the trainers' contract, and trains from the command line.

``vecaccel.trainers.testing.check_algorithm`` trains it synchronously and asynchronously,
resumes it from a checkpoint bit for bit, saves, loads and predicts; the command-line tests run
``vecaccel train reinforce`` as a user does, by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import vecaccel
from vecaccel.cli import main
from vecaccel.trainers.checkpoints.format import load_checkpoint
from vecaccel.trainers.config.registry import algorithms
from vecaccel.trainers.testing import check_algorithm

torch.set_num_threads(1)

SMALL = dict(num_envs=2, num_steps=16, hidden_sizes=(16,))
FLAGS = [
    "--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
    "--torch-threads", "1", "--no-progress", "--no-tensorboard",
]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def example_algorithm() -> Iterator[None]:
    """The algorithm comes through its entry point once the package is installed; from a source
    checkout (the package importable, not installed) it is registered here."""
    if "reinforce" in algorithms():
        yield
        return
    import vecaccel_example_algorithm

    manager = vecaccel.get_plugin_manager()
    manager.register(vecaccel_example_algorithm, name="reinforce")
    yield
    manager.unregister(vecaccel_example_algorithm)


def test_reinforce_keeps_the_trainers_contract() -> None:
    check_algorithm("reinforce", total_timesteps=192, **SMALL)


def test_cli_trains_resumes_and_evaluates(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert (
        main(["train", "reinforce", *FLAGS, "--total-timesteps", "64", "--run-dir", str(run_dir)])
        == 0
    )
    assert load_checkpoint(run_dir / "checkpoint.pt")["algorithm"] == "reinforce"
    assert main(["train", "reinforce", "--resume", str(run_dir), "--total-timesteps", "128",
                 "--no-progress", "--no-tensorboard"]) == 0  # fmt: skip
    assert load_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 128
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0  # found through the registry


def test_cli_trains_async(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "reinforce", "--async", *FLAGS, "--total-timesteps", "64"]
    assert main([*argv, "--run-dir", str(run_dir)]) == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["async"] is True and state["global_step"] == 64
    assert main(["train", "reinforce", "--resume", str(run_dir), "--total-timesteps", "96",
                 "--no-progress", "--no-tensorboard"]) == 0  # fmt: skip
    assert load_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 96
