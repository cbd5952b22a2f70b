"""``vecaccel train``'s run files: the config a run writes, ``--config`` reading it back, the run's
length said when whole rollouts take it past the total asked, and periodic evaluation."""

from __future__ import annotations

import json

import pytest
import torch

from vecaccel.cli import main
from vecaccel.trainers.services.run_config import read_run_config

torch.set_num_threads(1)

pytestmark = pytest.mark.usefixtures("trainers_plugin")

TINY_PPO = ["--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16"]


def train(*argv: str) -> int:
    return main(["train", *argv, "--no-progress", "--no-tensorboard", "--torch-threads", "1"])


def test_a_runs_config_file_starts_the_same_run_again(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    assert train("ppo", *TINY_PPO, "--seed", "7", "--learning-rate", "0.001",
                 "--total-timesteps", "64", "--run-dir", str(first)) == 0  # fmt: skip
    saved = read_run_config(first)
    assert saved.total_timesteps == 64 and saved.config["learning_rate"] == 0.001
    capsys.readouterr()
    assert train("ppo", "--config", str(first / "config.json"), "--run-dir", str(second)) == 0
    assert "preset:" not in capsys.readouterr().err  # the file's settings apply as they are
    again = read_run_config(second)
    assert again.total_timesteps == 64
    assert {k: v for k, v in again.config.items() if k != "run_dir"} == {
        k: v for k, v in saved.config.items() if k != "run_dir"
    }
    from vecaccel.trainers import PPO

    a, b = (PPO.load(run / "checkpoint.pt") for run in (first, second))
    try:  # the same seed and settings: the same run
        for x, y in zip(a.model.parameters(), b.model.parameters()):
            assert torch.equal(x, y)
    finally:
        a.close()
        b.close()


def test_flags_override_the_config_file(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert train("ppo", *TINY_PPO, "--total-timesteps", "32", "--run-dir", str(first)) == 0
    assert train("ppo", "--config", str(first), "--seed", "11", "--total-timesteps", "64",
                 "--run-dir", str(second)) == 0  # fmt: skip
    again = read_run_config(second)
    assert (again.config["seed"], again.total_timesteps) == (11, 64)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["dqn", "--config", "{first}"],
            "is the config of a ppo run; train it with `vecaccel train ppo",
        ),
        (["ppo", "--config", "{missing}"], "cannot read the config file"),
        (["ppo", "--config", "{first}", "--resume", "{first}"], "--config starts a new run"),
    ],
)
def test_a_config_file_that_does_not_fit_is_a_usage_error(tmp_path, capsys, argv, message):
    first = tmp_path / "first"
    assert train("ppo", *TINY_PPO, "--total-timesteps", "32", "--run-dir", str(first)) == 0
    capsys.readouterr()
    paths = {"first": str(first), "missing": str(tmp_path / "nothing.json")}
    assert train(*(arg.format(**paths) for arg in argv)) == 2
    assert message in capsys.readouterr().err


def test_the_run_says_where_it_ends_when_whole_rollouts_pass_the_total(tmp_path, capsys):
    assert train("ppo", *TINY_PPO, "--total-timesteps", "40", "--run-dir", str(tmp_path / "a")) == 0
    out = capsys.readouterr().out
    assert "training to step 64, not 40: the run collects 32 env steps at a time (2 times)" in out
    assert train("ppo", *TINY_PPO, "--total-timesteps", "64", "--run-dir", str(tmp_path / "b")) == 0
    assert "training to step" not in capsys.readouterr().out


def test_eval_every_keeps_the_best_agent_and_logs_its_scores(tmp_path):
    run = tmp_path / "run"
    assert train("ppo", *TINY_PPO, "--total-timesteps", "64", "--eval-every", "32",
                 "--eval-episodes", "2", "--run-dir", str(run)) == 0  # fmt: skip
    assert (run / "best.pt").exists()
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval/mean_reward", "eval/std_reward", "eval/best_mean_reward"} <= set(header)
    assert json.loads((run / "config.json").read_text())["config"]["eval_every"] == 32
