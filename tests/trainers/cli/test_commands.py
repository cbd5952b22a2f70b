"""``vecaccel train`` and ``vecaccel eval``, contributed by the trainers' plugin module: flags,
presets, resume, evaluation, and usage errors.
"""

from __future__ import annotations

import csv
import importlib.util
import multiprocessing
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import run_main
from toy_envs import SHIFTED_ID

from vecaccel.cli import build_parser, main
from vecaccel.trainers import DQN
from vecaccel.trainers.checkpoints.format import load_checkpoint

torch.set_num_threads(1)

pytestmark = pytest.mark.usefixtures("trainers_plugin")


def train(*argv: str) -> int:
    return main(["train", *argv, "--no-progress", "--torch-threads", "1"])


TINY_PPO = ["--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16"]


def test_building_the_parser_does_not_import_torch():
    code = (
        "import sys\n"
        "import vecaccel.trainers.cli.commands as m\n"
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
    for flag in ("--env", "--backend", "--num-envs", "--total-timesteps", "--seed", "--device",
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
    assert train("ppo", *TINY_PPO, "--total-timesteps", "128", "--checkpoint-every", "2",
                 "--run-dir", str(run_dir)) == 0  # fmt: skip
    for name in ("checkpoint.pt", "metrics.csv", "learning_curve.png"):
        assert (run_dir / name).exists(), name
    assert any((run_dir / "tb").iterdir())

    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(run_dir), "--total-timesteps", "192",
                 "--no-progress"]) == 0  # fmt: skip
    steps = [int(row["step"]) for row in csv.DictReader(open(run_dir / "metrics.csv"))]
    assert steps[-1] == 192 and steps == sorted(steps)
    closing = capsys.readouterr().err.strip().splitlines()[-1]
    assert closing == (
        f"run directory: {run_dir}  checkpoint: {run_dir / 'checkpoint.pt'}  "
        f"learning curve: {run_dir / 'learning_curve.png'}"
    ), closing

    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "ppo on CartPole-v1: 2 episodes" in out


def test_a_misspelled_preset_gets_a_did_you_mean(capsys):
    assert run_main(["train", "ppo", "--env", "CartPole-v1", "--preset", "cartpol"]) == 2
    assert "did you mean 'cartpole'?" in capsys.readouterr().err


def test_preset_and_explicit_flags(tmp_path):
    run_dir = tmp_path / "run"
    assert train("a2c", "--preset", "cartpole", "--backend", "serial", "--num-envs", "2",
                 "--total-timesteps", "40", "--run-dir", str(run_dir)) == 0  # fmt: skip
    from vecaccel.trainers.checkpoints.format import load_checkpoint

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
                 "--total-timesteps", "8", "--run-dir", str(run_dir), "--no-tensorboard") == 0  # fmt: skip
    video = tmp_path / "play.mp4"
    assert main(["eval", str(run_dir), "--episodes", "1", "--stochastic",
                 "--video", str(video)]) == 0  # fmt: skip
    assert video.stat().st_size > 1000


@pytest.mark.skipif(
    importlib.util.find_spec("vecaccel.trainers.algos.dqn") is None, reason="no DQN trainer yet"
)
@pytest.mark.parametrize("algo", ["dqn", "rainbow"])
def test_dqn_family_through_the_cli(algo, tmp_path, capsys):
    run_dir = tmp_path / algo
    tiny = ["--env", "CartPole-v1", "--learning-starts", "64", "--batch-size", "16",
            "--buffer-size", "500", "--replay-ratio", "1", "--run-dir", str(run_dir)]  # fmt: skip
    assert train(algo, *tiny, "--total-timesteps", "160") == 0
    assert (run_dir / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1", "--env", "CartPole-v1"]) == 0
    assert f"{algo} on CartPole-v1" in capsys.readouterr().out


@pytest.mark.skipif(
    importlib.util.find_spec("vecaccel.trainers.algos.dqn") is None, reason="no DQN trainer yet"
)
def test_resume_without_its_replay_file_says_to_pass_no_replay(tmp_path, capsys):
    run_dir = tmp_path / "dqn"
    assert train("dqn", "--env", "CartPole-v1", "--learning-starts", "64", "--batch-size", "16",
                 "--buffer-size", "500", "--replay-ratio", "1", "--run-dir", str(run_dir),
                 "--total-timesteps", "96", "--no-tensorboard") == 0  # fmt: skip
    [replay] = run_dir.glob("*replay*")
    replay.unlink()
    capsys.readouterr()
    resume = ["train", "dqn", "--resume", str(run_dir), "--total-timesteps", "128", "--no-progress"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    # the command line's way out, not the Python argument that no flag exposes
    assert "pass --no-replay" in err and "load_replay" not in err, err
    assert main([*resume, "--no-replay"]) == 0
    assert (
        main(["train", "dqn", "--env", "CartPole-v1", "--total-timesteps", "8", "--no-replay"]) == 2
    )
    assert "--no-replay only applies with --resume" in capsys.readouterr().err


QUIET_TINY_PPO = [
    "--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
    "--no-progress", "--no-tensorboard", "--torch-threads", "1",
]  # fmt: skip


def test_resume_from_a_missing_or_corrupt_run_is_a_usage_error(tmp_path, capsys):
    """Exit 2 with one error line for a missing dir and a garbage checkpoint."""
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "checkpoint.pt").write_bytes(b"garbage")
    for target in ("missing", "corrupt"):
        code = run_main(["train", "ppo", "--resume", str(tmp_path / target), "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and "error: cannot resume" in err, (target, code, err)
        assert run_main(["eval", str(tmp_path / target)]) == 2
        capsys.readouterr()


def test_train_nproc_must_be_positive(tmp_path, capsys):
    """``--nproc 0`` (or -2) is a usage error rather than a silent run on one process, as every
    other count flag (--num-envs, --total-timesteps, --episodes) refuses values below 1."""
    run_dir = tmp_path / "run"
    code = run_main(
        ["train", "ppo", *QUIET_TINY_PPO, "--total-timesteps", "32", "--nproc", "0", "--run-dir",
         str(run_dir)]
    )  # fmt: skip
    capsys.readouterr()
    assert code == 2, (
        f"expected `--nproc 0` to be a usage error (exit 2); got exit {code} and a run in "
        f"{run_dir} (checkpoint written: {(run_dir / 'checkpoint.pt').exists()})"
    )


def test_dqn_and_ppo_with_discrete_start_save_load_predict_and_eval_cli(tmp_path):
    """Discrete(2, start=3): learn, save, load with overrides reaching Adam, predict and
    ``vecaccel eval`` all act in 3..4 (the env raises otherwise)."""
    from vecaccel.cli import main as cli_main
    from vecaccel.trainers.algos.dqn import DQN
    from vecaccel.trainers.algos.ppo import PPO

    agent = DQN(
        SHIFTED_ID, learning_starts=32, batch_size=8, buffer_size=300, hidden_sizes=(16,),
        progress=False, tensorboard=False, device="cpu", num_envs=2, run_dir=str(tmp_path / "dqn"),
    )  # fmt: skip
    try:
        agent.learn(96)
        path = agent.save(tmp_path / "dqn.pt")
    finally:
        agent.close()
    loaded = DQN.load(path, learning_rate=1e-2, adam_eps=1e-3)
    assert loaded.action_space == gym.spaces.Discrete(2, start=3)
    assert [(g["lr"], g["eps"]) for g in loaded.optimizer.param_groups] == [(1e-2, 1e-3)]
    actions, _ = loaded.predict(np.zeros((6, 4), np.float32), deterministic=False)
    assert set(actions.tolist()) <= {3, 4}
    assert cli_main(["eval", str(path), "--episodes", "1"]) == 0

    ppo = PPO(
        SHIFTED_ID, backend="serial", num_envs=2, num_steps=8, seed=0, torch_threads=1,
        tensorboard=False, run_dir=str(tmp_path / "ppo"),
    )  # fmt: skip
    try:
        ppo.learn(32)
        ppo_path = ppo.save(tmp_path / "ppo.pt")
    finally:
        ppo.close()
    for deterministic in (True, False):
        actions, _ = PPO.load(ppo_path).predict(np.zeros((6, 4), np.float32), deterministic)
        assert set(actions.tolist()) <= {3, 4}
    assert cli_main(["eval", str(ppo_path), "--episodes", "1", "--stochastic"]) == 0


QUIET = ["--no-progress", "--no-tensorboard"]


def run_cli(argv: list[str]) -> int:
    """The exit code of ``vecaccel ARGV``; an exception escaping ``main`` fails the test."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - the point is that none should escape
        pytest.fail(f"`vecaccel {' '.join(argv)}` raised {type(exc).__name__}: {exc}")


# -- command line: usage errors ---------------------------------------------------------------

TINY_PPO_4_STEPS = [
    "--env",
    "CartPole-v1",
    "--backend",
    "serial",
    "--num-envs",
    "2",
    "--num-steps",
    "4",
]


@pytest.mark.parametrize(
    "argv",
    [
        ["ppo", *TINY_PPO_4_STEPS, "--lr-scaling", "bogus", "--total-timesteps", "8"],
        ["ppo", *TINY_PPO_4_STEPS, "--activation", "bogus", "--total-timesteps", "8"],
        ["ppo", "--env", "CartPole-v1", "--backend", "nosuch", "--total-timesteps", "8"],
        [
            "ppo",
            "--env",
            "CartPole-v1",
            "--backend",
            "serial",
            "--num-envs",
            "0",
            "--total-timesteps",
            "8",
        ],
        ["ppo", *TINY_PPO_4_STEPS, "--num-minibatches", "0", "--total-timesteps", "8"],
        ["ppo", *TINY_PPO_4_STEPS, "--total-timesteps", "-5"],
        ["ppo", "--env", "NoSuchEnv-v9", "--backend", "serial", "--total-timesteps", "8"],
        ["dqn", "--env", "Pendulum-v1", "--total-timesteps", "8"],
        ["dqn", "--env", "CartPole-v1", "--loss", "bogus", "--total-timesteps", "8"],
    ],  # fmt: skip
    ids=[
        "lr-scaling",
        "activation",
        "backend",
        "num-envs-0",
        "num-minibatches-0",
        "negative-total-timesteps",
        "unknown-env",
        "dqn-on-box-actions",
        "dqn-loss",
    ],
)
def test_cli_bad_arguments_are_usage_errors(argv, tmp_path, capsys):
    """A bad value on the command line is a usage error: exit code 2 and a one-line message on
    stderr, not a Python traceback (exit 1) -- or, for a negative budget, a silent success."""
    code = run_cli(["train", *argv, "--run-dir", str(tmp_path / "run"), *QUIET,
                    "--torch-threads", "1"])  # fmt: skip
    assert code == 2
    # one line; argparse's own errors add the short usage line under it, not the flags' page
    first, *rest = capsys.readouterr().err.splitlines()
    prog = f"vecaccel train {argv[0]}"
    assert first.startswith(("error: ", f"{prog}: error: ")), first
    assert rest in ([], [f"usage: {prog} [options]; see {prog} --help"]), rest


@pytest.mark.parametrize("mode", [[], ["--async"]], ids=["sync", "async"])
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_cli_misspelled_env_id_is_the_env_layers_one_line(algo, mode, tmp_path, capsys):
    """The line ``make_vec`` raises for the id, before any worker starts (``shm`` would start
    two here), the asynchronous collector's included: not a worker's traceback."""
    import vecaccel

    with pytest.raises(ValueError) as caught:
        vecaccel.make_vec("CartPol-v1", 2)
    assert run_cli(["train", algo, "--env", "CartPol-v1", "--backend", "shm", "--num-envs",
                    "2", "--total-timesteps", "8", "--run-dir", str(tmp_path / "run"),
                    *mode, *QUIET]) == 2  # fmt: skip
    assert multiprocessing.active_children() == []
    err = capsys.readouterr().err
    assert err == f"error: {caught.value}\n"
    assert "did you mean" in err.lower() and "CartPole" in err


def test_cli_preset_line_comes_only_after_the_arguments_are_checked(tmp_path, capsys):
    """CartPole-v1 takes the ``cartpole`` preset by itself; a misspelled backend is the one
    line a run with it prints, and a valid run announces the preset before it trains."""
    run = ["train", "ppo", "--env", "CartPole-v1", "--total-timesteps", "8", *QUIET]
    assert run_cli([*run, "--backend", "shmm", "--run-dir", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err == (
        "error: unknown backend 'shmm'; did you mean 'shm'? registered backends: "
        f"{', '.join(sorted(__import__('vecaccel').list_backends()))}\n"
    )
    assert run_cli([*run, "--backend", "serial", "--num-envs", "2", "--num-steps", "4",
                    "--torch-threads", "1", "--run-dir", str(tmp_path / "b")]) == 0  # fmt: skip
    assert capsys.readouterr().err.startswith("preset: cartpole, made for CartPole-v1")


@pytest.mark.parametrize(
    "algo, source",
    [("a2c", "ppo"), ("dqn", "ppo"), ("ppo", "dqn"), ("c51", "dqn")],
    ids=["a2c-resumes-ppo", "dqn-resumes-ppo", "ppo-resumes-dqn", "c51-resumes-dqn"],
)
def test_cli_resume_of_another_algorithms_run_is_a_usage_error(
    algo, source, checkpoints, tmp_path, capsys
):
    """``vecaccel train ALGO --resume DIR`` where DIR holds another algorithm's run must say so
    (exit 2), not raise (CheckpointError, KeyError) or go on training the other algorithm under
    this one's name (C51 resuming a plain DQN run trains plain DQN)."""
    code = run_cli(["train", algo, "--resume", str(checkpoints / source), "--total-timesteps", "8",
                    "--run-dir", str(tmp_path / "run"), *QUIET])  # fmt: skip
    assert code == 2
    assert "error" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_cli_resume_on_an_env_with_other_spaces_is_a_usage_error(
    algo, checkpoints, tmp_path, capsys
):
    """``--resume DIR --env Acrobot-v1`` for a CartPole run: the network cannot act in Acrobot
    (6 observations, 3 actions), so both families exit 2 with a message, neither ignoring
    ``--env`` nor ending in a traceback."""
    code = run_cli(["train", algo, "--resume", str(checkpoints / algo), "--env", "Acrobot-v1",
                    "--total-timesteps", "8", "--run-dir", str(tmp_path / "run"), *QUIET])  # fmt: skip
    assert code == 2
    assert "error" in capsys.readouterr().err.lower()


@pytest.mark.parametrize(
    "extra", [["--env", "CartPole-v1"], ["--episodes", "0"]], ids=["other-env", "zero-episodes"]
)
def test_cli_eval_bad_arguments_are_usage_errors(extra, checkpoints, capsys):
    """``vecaccel eval`` of a Pendulum agent with ``--env CartPole-v1`` raises an IndexError from
    the network, and ``--episodes 0`` a ValueError from ``np.min``; both should be exit 2."""
    code = run_cli(["eval", str(checkpoints / "pendulum"), *extra])
    assert code == 2
    assert "error" in capsys.readouterr().err.lower()


def test_cli_resume_of_an_unfinished_dqn_run_finishes_its_budget(tmp_path, capsys):
    """``--total-timesteps`` says: "with --resume: ... default there: the budget the run was started
    with". The DQN family does so as PPO/A2C do: its checkpoint records the run's budget
    (``loop["horizon"]``) and ``learn()`` finishes it."""
    run_dir = tmp_path / "dqn"
    agent = DQN("CartPole-v1", learning_starts=32, batch_size=8, buffer_size=300,
                replay_ratio=1.0, run_dir=str(run_dir), progress=False, tensorboard=False,
                torch_threads=1, device="cpu", seed=0)  # fmt: skip
    agent.learn(160, callback=lambda a: a.global_step < 80)  # stopped half way: a checkpoint
    agent.close()
    assert load_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 80
    code = run_cli(["train", "dqn", "--resume", str(run_dir), *QUIET])
    assert code == 0, capsys.readouterr().err
    assert load_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 160
