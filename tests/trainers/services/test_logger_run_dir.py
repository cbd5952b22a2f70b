"""A run directory is never overwritten by accident.

``vecaccel train`` into a directory that holds a run exits 2 with one ``error:`` line naming
``--resume``, a new ``--run-dir`` and ``--overwrite``; without ``--run-dir`` every run gets a
new directory; from Python a new run refuses a directory another process's run wrote.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CHILD_TIMEOUT

from vecaccel.cli import main
from vecaccel.trainers.services.logger import (
    RUN_FILES,
    RunDirInUseError,
    RunLogger,
    check_run_dir,
    unused_run_dir,
)

torch.set_num_threads(1)

pytestmark = pytest.mark.usefixtures("trainers_plugin")

ROOT = Path(__file__).resolve().parents[3]

#: One update of a tiny PPO run.
TINY = [
    "ppo",
    "--env",
    "CartPole-v1",
    "--backend",
    "serial",
    "--num-envs",
    "2",
    "--num-steps",
    "16",
    "--total-timesteps",
    "32",
    "--no-progress",
    "--torch-threads",
    "1",
]


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_train_into_a_used_run_dir_exits_2_and_leaves_the_run_alone(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", *TINY, "--run-dir", str(run_dir)]) == 0
    before = _files(run_dir)
    assert "checkpoint.pt" in before and "metrics.csv" in before
    capsys.readouterr()

    assert main(["train", *TINY, "--run-dir", str(run_dir), "--seed", "2"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    assert lines[0].startswith(f"error: {run_dir} already holds a run"), err
    for way in (f"--resume {run_dir}", "--run-dir", "--overwrite"):
        assert way in lines[0], lines[0]
    assert _files(run_dir) == before  # nothing was touched

    # --overwrite: the new run replaces the old one; TensorBoard keeps one run's events
    (run_dir / "notes.txt").write_text("mine")
    assert main(["train", *TINY, "--run-dir", str(run_dir), "--overwrite", "--seed", "2"]) == 0
    after = _files(run_dir)
    assert after["checkpoint.pt"] != before["checkpoint.pt"]
    assert len([name for name in after if name.startswith("tb/")]) == len(
        [name for name in before if name.startswith("tb/")]
    )
    assert after["notes.txt"] == b"mine"  # only the run's own files go

    # --resume continues the run in place, as the error says
    assert main(["train", "ppo", "--resume", str(run_dir), "--total-timesteps", "64",
                 "--no-progress", "--torch-threads", "1"]) == 0  # fmt: skip


def test_a_resumed_run_never_writes_over_another_run(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    for run_dir in (first, second):
        assert main(["train", *TINY, "--run-dir", str(run_dir)]) == 0
    theirs = _files(second)
    resume = ["train", "ppo", "--resume", str(first), "--total-timesteps", "64", "--no-progress",
              "--torch-threads", "1"]  # fmt: skip
    capsys.readouterr()

    # continued into a directory that holds another run: refused, as a new run would be
    assert main([*resume, "--run-dir", str(second)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {second} already holds a run"), err
    assert _files(second) == theirs
    # --overwrite means nothing for a run continued in place: refused, naming the way
    mine = _files(first)
    assert main([*resume, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --overwrite replaces the run in a new run's --run-dir"), err
    assert "--run-dir" in err.split(";")[1] and _files(first) == mine
    # under --nproc, refused by the launcher before any rank starts
    assert main([*resume, "--run-dir", str(second), "--nproc", "2"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {second} already holds a run")
    assert main([*resume, "--overwrite", "--nproc", "2"]) == 2
    assert capsys.readouterr().err.startswith("error: --overwrite replaces")
    # with --overwrite, the continued run replaces the other one
    assert main([*resume, "--run-dir", str(second), "--overwrite"]) == 0
    assert _files(second)["checkpoint.pt"] != theirs["checkpoint.pt"]
    assert _files(first) == mine  # the source run stays as it was


def test_without_run_dir_each_run_gets_a_new_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # in the same second too: the second gets a -2
        assert main(["train", *TINY]) == 0
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2, runs
    assert all(re.fullmatch(r"ppo-CartPole-v1-1-\d{8}-\d{6}(-\d+)?", name) for name in runs)
    for name in runs:
        assert (tmp_path / "runs" / name / "checkpoint.pt").is_file()


def test_make_run_names_no_fixed_run_dir():
    """`make run` twice leaves two runs: its train line lets each run pick a new directory."""
    out = subprocess.run(
        ["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    line = next(line for line in out.splitlines() if "vecaccel train" in line)
    assert "--run-dir" not in line and "--overwrite" not in line, line


def test_check_run_dir_refuses_a_run_and_overwrite_removes_only_its_files(tmp_path):
    check_run_dir(tmp_path / "new")  # not there yet: free
    check_run_dir(tmp_path)  # empty: free
    (tmp_path / "data.npz").write_bytes(b"x")
    check_run_dir(tmp_path)  # other files: free
    for name in RUN_FILES:
        (tmp_path / name).mkdir() if name == "tb" else (tmp_path / name).write_bytes(b"")
    with pytest.raises(RunDirInUseError) as caught:
        check_run_dir(tmp_path)
    assert caught.value.files == [
        "checkpoint.pt", "metrics.csv", "learning_curve.png", "tb/", "config.json", "best.pt"
    ]  # fmt: skip
    assert isinstance(caught.value, FileExistsError)
    (tmp_path / "checkpoint.replay-100-r0-ab12.npz").write_bytes(b"")  # the run's replay
    check_run_dir(tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.npz"]


def test_unused_run_dir_counts_up_past_used_names(tmp_path):
    base = tmp_path / "ppo-x"
    assert unused_run_dir(base) == base
    for path in (base, tmp_path / "ppo-x-2"):
        path.mkdir()
        (path / "metrics.csv").write_text("step\n")
    assert unused_run_dir(base) == tmp_path / "ppo-x-3"


ANOTHER_PROCESS_RUN = """
import sys
from vecaccel.trainers.services.logger import RunLogger
logger = RunLogger(sys.argv[1], 10, use_tensorboard=False, progress=False)
logger.log(10, {"charts/episodic_return": 1.0})
logger.close()
"""


def test_a_new_python_run_refuses_another_process_run_but_goes_on_with_its_own(tmp_path):
    theirs = tmp_path / "theirs"
    subprocess.run(
        [sys.executable, "-c", ANOTHER_PROCESS_RUN, str(theirs)],
        check=True,
        timeout=CHILD_TIMEOUT,
    )
    csv_before = (theirs / "metrics.csv").read_bytes()
    with pytest.raises(RunDirInUseError, match=r"ALGO\.load\("):
        RunLogger(theirs, 10, use_tensorboard=False, progress=False)
    assert (theirs / "metrics.csv").read_bytes() == csv_before
    # resuming it is what the message offers, and is allowed
    RunLogger(theirs, 20, use_tensorboard=False, progress=False, resume_step=10).close()

    # a run of this process: a second learn() counting from zero writes there again
    mine = tmp_path / "mine"
    for _ in range(2):
        logger = RunLogger(mine, 10, use_tensorboard=False, progress=False)
        logger.log(10, {"charts/episodic_return": 1.0})
        logger.close()
