"""Training without its optional packages: each is hidden from a fresh interpreter, which then
runs the command line. Without TensorBoard or matplotlib a run still writes what it can and says
once what it goes without; without torch ``vecaccel train`` is a one-line usage error, and the
commands that do not need torch still work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

#: argv: the modules to hide (comma-separated), then the ``vecaccel`` arguments
HIDE_AND_RUN = """
import importlib.abc
import sys

hidden = sys.argv[1].split(",")


class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == module or name.startswith(module + ".") for module in hidden):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Hidden())
from vecaccel.cli import main

raise SystemExit(main(sys.argv[2:]))
"""

#: a tiny PPO run on the serial backend
TINY_RUN = [
    "train", "ppo", "--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2",
    "--num-steps", "32", "--total-timesteps", "128", "--no-progress",
]  # fmt: skip


def run_hidden(hidden: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HIDE_AND_RUN, hidden, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_without_tensorboard_a_run_writes_the_rest_and_says_how_to_get_it(tmp_path) -> None:
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    done = run_hidden("tensorboard", [*TINY_RUN, "--run-dir", str(run_dir)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    told = lines_with(done.stderr, "tensorboard is not installed")
    assert len(told) == 1, done.stderr
    assert "pip install tensorboard" in told[0] and "pip install 'vecaccel[train]'" in told[0]
    names = {path.name for path in run_dir.iterdir()}
    assert {"metrics.csv", "checkpoint.pt", "learning_curve.png"} <= names
    assert "tb" not in names


def test_without_matplotlib_or_tqdm_a_run_has_no_plot_nor_progress_bar_and_says_so(
    tmp_path,
) -> None:
    """One run without both, its progress bar asked for: each absence is said once."""
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    argv = [arg for arg in TINY_RUN if arg != "--no-progress"]
    done = run_hidden("matplotlib,tqdm", [*argv, "--run-dir", str(run_dir)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    told = lines_with(done.stderr, "matplotlib is not installed")
    assert len(told) == 1 and "learning_curve.png" in told[0], done.stderr
    assert len(lines_with(done.stderr, "tqdm is not installed")) == 1, done.stderr
    names = {path.name for path in run_dir.iterdir()}
    assert {"metrics.csv", "checkpoint.pt"} <= names and "learning_curve.png" not in names


def test_without_torch_train_is_a_one_line_usage_error(tmp_path) -> None:
    # a flag only the trainer knows (--num-steps) must not turn it into argparse's complaint
    done = run_hidden("torch", [*TINY_RUN, "--run-dir", str(tmp_path / "run")], tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: vecaccel train ppo needs torch")
    assert "pip install 'vecaccel[torch]'" in done.stderr
    assert "pip install 'vecaccel[train]'" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv",
    [["backends"], ["train", "dqn", "--help"], ["--help"]],
    ids=["backends", "train-help", "help"],
)
def test_without_torch_the_other_commands_work(tmp_path, argv: list[str]) -> None:
    done = run_hidden("torch", argv, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_without_torch_eval_is_a_one_line_usage_error(tmp_path) -> None:
    done = run_hidden("torch", ["eval", str(tmp_path)], tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: vecaccel eval needs torch")
    assert done.stderr.count("\n") == 1, done.stderr
