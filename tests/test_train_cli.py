"""``vecaccel train`` and ``vecaccel eval``, contributed by the trainers' plugin module."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import vecaccel.trainers.cli as trainers_cli
from vecaccel import get_plugin_manager
from vecaccel.cli import build_parser, main

torch.set_num_threads(1)

PLUGIN_NAME = "vecaccel.trainers.cli"


@pytest.fixture(autouse=True)
def trainers_plugin():
    """Register the trainers' commands unless DEFAULT_PLUGINS already does."""
    pm = get_plugin_manager()
    registered_here = not pm.is_registered(trainers_cli)
    if registered_here:
        pm.register(trainers_cli, name=PLUGIN_NAME)
    yield
    if registered_here:
        pm.unregister(trainers_cli)


def train(*argv: str) -> int:
    return main(["train", *argv, "--no-progress", "--torch-threads", "1"])


TINY_PPO = ["--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16"]


def test_building_the_parser_does_not_import_torch():
    code = (
        "import sys\n"
        "import vecaccel.trainers.cli as m\n"
        "from vecaccel import get_plugin_manager\n"
        "pm = get_plugin_manager()\n"
        "pm.is_registered(m) or pm.register(m)\n"
        "from vecaccel.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print('torch' in sys.modules)\n"
    )
    # the action-server backend needs torch itself; leave it out to see what this module adds
    env = {**os.environ, "VECACCEL_DISABLE_PLUGINS": "vecaccel.plugins.action_server"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "False"


def test_algorithm_help_lists_config_docstrings(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "ppo", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--clip-coef" in text and "Surrogate clipping coefficient" in text
    assert "--anneal-lr, --no-anneal-lr" in text
    assert "--preset" in text and "cartpole" in text
    for flag in ("--env", "--backend", "--num-envs", "--total-steps", "--seed", "--device",
                 "--run-dir", "--resume"):  # fmt: skip
        assert flag in text


def test_flags_become_config_fields():
    args = build_parser().parse_args(
        [
            "train",
            "a2c",
            "--env",
            "CartPole-v1",
            "--no-anneal-lr",
            "--hidden-sizes",
            "32,16",
            "--gae-lambda",
            "0.9",
            "--atari",
            "false",
            "--preset",
            "cartpole",
        ]  # fmt: skip
    )
    assert args.algo == "a2c" and args.env == "CartPole-v1" and args.preset == "cartpole"
    assert args.config == {
        "anneal_lr": False,
        "hidden_sizes": (32, 16),
        "gae_lambda": 0.9,
        "atari": False,
    }


def test_train_resume_and_eval(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train("ppo", *TINY_PPO, "--total-steps", "128", "--checkpoint-every", "2",
                 "--run-dir", str(run_dir)) == 0  # fmt: skip
    for name in ("checkpoint.pt", "metrics.csv", "learning_curve.png"):
        assert (run_dir / name).exists(), name
    assert any((run_dir / "tb").iterdir())

    assert main(["train", "ppo", "--resume", str(run_dir), "--total-steps", "192",
                 "--no-progress"]) == 0  # fmt: skip
    steps = [int(row["step"]) for row in csv.DictReader(open(run_dir / "metrics.csv"))]
    assert steps[-1] == 192 and steps == sorted(steps)

    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "ppo on CartPole-v1: 2 episodes" in out


def test_preset_and_explicit_flags(tmp_path):
    run_dir = tmp_path / "run"
    assert train("a2c", "--preset", "cartpole", "--backend", "serial", "--num-envs", "2",
                 "--total-steps", "40", "--run-dir", str(run_dir)) == 0  # fmt: skip
    from vecaccel.trainers.checkpoint import load_checkpoint

    config = load_checkpoint(run_dir / "checkpoint.pt")["config"]
    assert config["num_envs"] == 2  # the flag beats the preset
    assert config["ent_coef"] == 0.0 and config["anneal_lr"] is False  # from the preset


def test_eval_reports_a_corrupt_checkpoint(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"\x00" * 64)
    assert main(["eval", str(bad)]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert main(["train", "ppo", "--resume", str(tmp_path), "--no-progress"]) == 2


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs ale-py")
def test_eval_records_a_video(tmp_path):
    run_dir = tmp_path / "breakout"
    assert train("ppo", "--env", "BreakoutNoFrameskip-v4", "--backend", "serial",
                 "--num-envs", "2", "--num-steps", "4", "--update-epochs", "1",
                 "--total-steps", "8", "--run-dir", str(run_dir), "--no-tensorboard") == 0  # fmt: skip
    video = tmp_path / "play.mp4"
    assert main(["eval", str(run_dir), "--episodes", "1", "--stochastic",
                 "--video", str(video)]) == 0  # fmt: skip
    assert video.stat().st_size > 1000


@pytest.mark.skipif(
    importlib.util.find_spec("vecaccel.trainers.dqn") is None, reason="no DQN trainer yet"
)
@pytest.mark.parametrize("algo", ["dqn", "rainbow"])
def test_dqn_family_through_the_cli(algo, tmp_path, capsys):
    run_dir = tmp_path / algo
    tiny = ["--env", "CartPole-v1", "--learning-starts", "64", "--batch-size", "16",
            "--buffer-size", "500", "--replay-ratio", "1", "--run-dir", str(run_dir)]  # fmt: skip
    assert train(algo, *tiny, "--total-steps", "160") == 0
    assert (run_dir / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1", "--env", "CartPole-v1"]) == 0
    assert f"{algo} on CartPole-v1" in capsys.readouterr().out


@pytest.mark.skipif(
    importlib.util.find_spec("vecaccel.trainers.dqn") is None, reason="no DQN trainer yet"
)
def test_resume_without_its_replay_file_says_to_pass_no_replay(tmp_path, capsys):
    run_dir = tmp_path / "dqn"
    assert train("dqn", "--env", "CartPole-v1", "--learning-starts", "64", "--batch-size", "16",
                 "--buffer-size", "500", "--replay-ratio", "1", "--run-dir", str(run_dir),
                 "--total-steps", "96", "--no-tensorboard") == 0  # fmt: skip
    [replay] = run_dir.glob("*replay*")
    replay.unlink()
    capsys.readouterr()
    resume = ["train", "dqn", "--resume", str(run_dir), "--total-steps", "128", "--no-progress"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    # the command line's way out, not the Python argument that no flag exposes
    assert "pass --no-replay" in err and "load_replay" not in err, err
    assert main([*resume, "--no-replay"]) == 0
    assert main(["train", "dqn", "--env", "CartPole-v1", "--total-steps", "8", "--no-replay"]) == 2
    assert "--no-replay only applies with --resume" in capsys.readouterr().err
