"""``vecaccel train ALGO --async``: new runs, resumed runs and the options they record.

The command line's asynchronous runs end to end (``vecaccel.cli.main``, which the ``vecaccel``
command runs): the flags, the line a run ends with, fixed-lag runs that repeat, resumes that go
on asynchronously with the options their checkpoint records, and resumes that cannot start
leaving the run as it was.
"""

from __future__ import annotations

import pytest
import torch
from helpers import TINY_ASYNC_DQN, run_main

from vecaccel.cli import main
from vecaccel.trainers.algos.dqn import DQN

torch.set_num_threads(1)

TINY = TINY_ASYNC_DQN


@pytest.fixture(scope="module")
def fixed_lag_ppo_runs(tmp_path_factory):
    """Two runs of ``vecaccel train ppo --async --async-fixed-lag`` with one seed, in ``a`` and
    ``b``: 96 steps, three updates of 2 envs x 16 steps."""
    root = tmp_path_factory.mktemp("fixed-lag-ppo")
    assert train_fixed_lag_ppo(root / "a") == 0 and train_fixed_lag_ppo(root / "b") == 0
    return root


def train_fixed_lag_ppo(run_dir, *extra) -> int:
    return main(
        [
            "train", "ppo", "--async", "--async-fixed-lag", "--env", "CartPole-v1",
            "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
            "--total-timesteps", "96", "--seed", "4", "--torch-threads", "1",
            "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard", *extra,
        ]
    )  # fmt: skip


def test_cli_async_fixed_lag_runs_repeat(fixed_lag_ppo_runs, tmp_path, capsys) -> None:
    from vecaccel.trainers import PPO

    a, b = PPO.load(fixed_lag_ppo_runs / "a"), PPO.load(fixed_lag_ppo_runs / "b")
    assert a.global_step == b.global_step == 96
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    capsys.readouterr()
    assert train_fixed_lag_ppo(tmp_path / "c", "--async-weight-sync-period", "2") == 2
    assert "--async-fixed-lag needs --async-weight-sync-period 1, got 2" in capsys.readouterr().err


def test_cli_async_a2c(tmp_path) -> None:
    code = main(
        [
            "train", "a2c", "--async", "--env", "CartPole-v1", "--backend", "serial",
            "--num-envs", "2", "--num-steps", "5", "--total-timesteps", "300",
            "--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard",
            "--torch-threads", "1", "--async-weight-sync-period", "2",
        ]
    )  # fmt: skip
    assert code == 0
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "charts/policy_lag" in header
    from vecaccel.trainers import A2C

    assert A2C.load(tmp_path).global_step == 300


def test_cli_async_dqn_run_names_its_files_and_goes_on_async_when_resumed(tmp_path, capsys) -> None:
    """``--async`` with a weight-sync period of 4: the run logs the replay ratio and the policy
    lag, and its closing line names the files to open, as a synchronous run's does; a resume
    goes on asynchronously with the period the run recorded."""
    from vecaccel.trainers.checkpoints.format import load_checkpoint

    common = [
        "--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard",
    ]  # fmt: skip
    code = main(
        [
            "train", "dqn", "--async", "--env", "CartPole-v1", "--backend", "serial",
            "--total-timesteps", "600", "--learning-starts", "100", "--batch-size", "16",
            "--replay-ratio", "2", "--torch-threads", "1", "--async-weight-sync-period", "4",
            *common,
        ]
    )  # fmt: skip
    assert code == 0
    assert (tmp_path / "checkpoint.pt").exists()
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "charts/replay_ratio" in header and "charts/policy_lag" in header
    closing = capsys.readouterr().err.strip().splitlines()[-1]
    assert closing == (
        f"run directory: {tmp_path}  checkpoint: {tmp_path / 'checkpoint.pt'}  "
        f"learning curve: {tmp_path / 'learning_curve.png'}"
    ), closing
    assert load_checkpoint(tmp_path / "checkpoint.pt")["async"] is True
    assert (
        main(["train", "dqn", "--resume", str(tmp_path), "--total-timesteps", "1000", *common]) == 0
    )
    err = capsys.readouterr().err
    assert "(async, weight sync period 4)" in err and "async DQN: 400 env steps" in err, err
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["global_step"] == 1000 and state["async"] is True
    assert state["off_policy"]["replay"]["file"].startswith("checkpoint.replay-1000-")
    # one replay file: the one the checkpoint names
    assert [p.name for p in tmp_path.glob("*.npz")] == [state["off_policy"]["replay"]["file"]]
    # a finished run says so
    assert (
        main(["train", "dqn", "--resume", str(tmp_path), "--total-timesteps", "1000", *common]) == 0
    )
    assert "the run is complete" in capsys.readouterr().err
    # --sync goes on synchronously, from the async run's replay buffer
    updates = state["num_updates"]
    assert main(["train", "dqn", "--resume", str(tmp_path), "--total-timesteps", "1200", "--sync",
                 *common]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "resuming dqn from" in err and "(async)" not in err, err
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["global_step"] == 1200 and state["async"] is False
    # it trained from the loaded buffer at once: 200 steps x ratio 2 / batch 16, no warm-up
    assert state["num_updates"] - updates >= 200 * 2 // 16 - 2


def test_cli_async_dqn_fixed_lag_repeats_and_resumes_with_it(tmp_path, capsys) -> None:
    from vecaccel.trainers.checkpoints.format import load_checkpoint

    def run(run_dir, *extra):
        return main(
            [
                "train", "dqn", "--async", "--async-fixed-lag", "--env", "CartPole-v1",
                "--backend", "serial", "--total-timesteps", "600", "--learning-starts", "100",
                "--batch-size", "16", "--replay-ratio", "2", "--torch-threads", "1",
                "--seed", "2", "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard",
                *extra,
            ]
        )  # fmt: skip

    assert run(tmp_path / "a") == 0 and run(tmp_path / "b") == 0
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert a["num_updates"] == b["num_updates"] == (600 - 100) * 2 // 16
    assert a["async_options"] == {"weight_sync_period": 1, "fixed_lag": True}
    for network in ("q_network", "target_network"):
        a_net, b_net = a["off_policy"][network], b["off_policy"][network]
        assert all(torch.equal(a_net[k], b_net[k]) for k in a_net)
    capsys.readouterr()
    common = ["--run-dir", str(tmp_path / "a"), "--no-progress", "--no-tensorboard"]
    assert main(["train", "dqn", "--resume", str(tmp_path / "a"), "--total-timesteps", "800",
                 *common]) == 0  # fmt: skip
    assert "resuming DQN (async, weight sync period 1, fixed lag) from" in capsys.readouterr().err
    state = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert state["global_step"] == 800 and state["async_options"] == {
        "weight_sync_period": 1,
        "fixed_lag": True,
    }
    # the resumed run trained from the loaded buffer, without learning_starts' warm-up again
    # (that would leave (200 - 100) x ratio 2 / batch 16 = 12 updates)
    assert state["num_updates"] - a["num_updates"] >= 20
    assert main(["train", "dqn", "--resume", str(tmp_path / "a"), "--total-timesteps", "900",
                 "--no-async-fixed-lag", *common]) == 0  # fmt: skip
    assert "resuming DQN (async, weight sync period 1) from" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "a" / "checkpoint.pt")["async_options"] == {
        "weight_sync_period": 1,
        "fixed_lag": False,
    }


def test_cli_resume_of_an_async_ppo_run_finishes_its_budget(tmp_path, capsys) -> None:
    from vecaccel.trainers import PPO

    common = ["--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard"]
    code = main(
        [
            "train", "ppo", "--async", "--env", "CartPole-v1", "--backend", "serial",
            "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "64",
            "--torch-threads", "1", *common,
        ]
    )  # fmt: skip
    assert code == 0
    # stop it half way by hand: the checkpoint of an interrupted run, 32 of 64 steps done
    agent = PPO.load(tmp_path)
    assert agent.async_run and agent.global_step == 64 and agent.target_steps == 64
    agent.set_target_steps(128)
    agent.save(tmp_path / "checkpoint.pt")
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(tmp_path), *common]) == 0
    assert "resuming PPO (async, weight sync period 1) from" in capsys.readouterr().err
    resumed = PPO.load(tmp_path)
    assert resumed.global_step == 128 and resumed.async_run
    assert resumed.num_updates == agent.num_updates + 2
    # --sync: one more update, synchronously, recorded as such; --async and --sync exclude
    assert main(["train", "ppo", "--resume", str(tmp_path), "--total-timesteps", "160", "--sync",
                 *common]) == 0  # fmt: skip
    synced = PPO.load(tmp_path)
    assert synced.global_step == 160 and not synced.async_run
    assert synced.num_updates == resumed.num_updates + 1
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--resume", str(tmp_path), "--async", "--sync", *common])
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_resume_keeps_the_async_options_the_run_was_trained_with(
    fixed_lag_ppo_runs, tmp_path, capsys
) -> None:
    import csv
    import shutil

    from vecaccel.trainers import PPO

    shutil.copytree(fixed_lag_ppo_runs / "b", tmp_path, dirs_exist_ok=True)
    common = ["--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard"]
    agent = PPO.load(tmp_path)
    assert agent.async_options == {"weight_sync_period": 1, "fixed_lag": True}

    def extend_to(steps: int) -> None:
        loaded = PPO.load(tmp_path)
        loaded.set_target_steps(steps)
        loaded.save(tmp_path / "checkpoint.pt")

    def lags_from(step: int) -> list[float]:
        with open(tmp_path / "metrics.csv", newline="") as f:
            rows = [row for row in csv.DictReader(f) if float(row["step"]) > step]
        return [float(row["charts/policy_lag"]) for row in rows]

    # no flags: the fixed lag goes on (lag 0 for the resumed run's first batch, then exactly 1)
    extend_to(192)
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(tmp_path), *common]) == 0
    assert "(async, weight sync period 1, fixed lag)" in capsys.readouterr().err
    resumed = PPO.load(tmp_path)
    assert resumed.global_step == 192
    assert resumed.async_options == {"weight_sync_period": 1, "fixed_lag": True}
    assert lags_from(96) == [0, 1, 1]
    # flags given on resume replace what the run recorded, and are recorded in turn
    extend_to(256)
    assert main(["train", "ppo", "--resume", str(tmp_path), "--no-async-fixed-lag",
                 "--async-weight-sync-period", "2", *common]) == 0  # fmt: skip
    assert "(async, weight sync period 2)" in capsys.readouterr().err
    assert PPO.load(tmp_path).async_options == {"weight_sync_period": 2, "fixed_lag": False}
    # a fixed lag asked for on top of the recorded period 2 is refused, naming both ways out
    extend_to(320)
    assert main(["train", "ppo", "--resume", str(tmp_path), "--async-fixed-lag", *common]) == 2
    err = capsys.readouterr().err
    assert "fixed lag needs a weight-sync period of 1, got 2" in err
    assert "--no-async-fixed-lag" in err
    # training synchronously clears them: a later --async resume starts from the defaults
    assert main(["train", "ppo", "--resume", str(tmp_path), "--sync", *common]) == 0
    synced = PPO.load(tmp_path)
    assert not synced.async_run and synced.async_options == {}


def test_cli_sync_flag_on_a_new_run_trains_synchronously(tmp_path) -> None:
    from vecaccel.trainers import PPO

    code = main(
        [
            "train", "ppo", "--sync", "--env", "CartPole-v1", "--backend", "serial",
            "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "32",
            "--torch-threads", "1", "--run-dir", str(tmp_path), "--no-progress",
            "--no-tensorboard",
        ]
    )  # fmt: skip
    assert code == 0
    agent = PPO.load(tmp_path)
    assert agent.global_step == 32 and not agent.async_run


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_async_resume_that_cannot_start_leaves_the_checkpoint_as_it_was(tmp_path, algo) -> None:
    """A resume whose sampler/rollout process dies before any step (here an unknown backend,
    which `vecaccel train` refuses up front, reaching the runner directly) must not rewrite the
    run's checkpoint with its options: every later resume would then fail the same way."""
    from vecaccel.trainers import PPO
    from vecaccel.trainers.cli.async_flags import resume_async

    run_dir = tmp_path / "run"
    if algo == "ppo":
        cls, config = PPO, dict(num_envs=2, num_steps=8, update_epochs=1)
    else:
        cls, config = DQN, dict(batch_size=8, buffer_size=200, learning_starts=16)
    agent = cls(
        "CartPole-v1", backend="serial", torch_threads=1, tensorboard=False, progress=False,
        run_dir=str(run_dir), hidden_sizes=(16,), **config,
    )  # fmt: skip
    agent.learn(32)
    agent.close()
    before = (run_dir / "checkpoint.pt").read_bytes()
    with pytest.raises(Exception, match="nosuch"):
        resume_async(cls, str(run_dir), "CartPole-v1", 64, backend="nosuch", progress=False)
    assert (run_dir / "checkpoint.pt").read_bytes() == before


@pytest.mark.parametrize("period", [0, -1])
def test_weight_sync_period_below_one_is_refused(tmp_path, capsys, period) -> None:
    """A period of 0 or less is refused, by the CLI and the runner, rather than trained as 1
    without a word."""
    from vecaccel.trainers import DQN, PPO, AsyncRunner
    from vecaccel.trainers.algos.dqn import DQNConfig

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "ppo", "--async", "--env", "CartPole-v1", "--run-dir", str(tmp_path),
              "--async-weight-sync-period", str(period)])  # fmt: skip
    assert exit_info.value.code == 2
    assert "--async-weight-sync-period: must be a positive integer" in capsys.readouterr().err
    agent = PPO(None, env_id="CartPole-v1", backend="serial", num_envs=2)
    with pytest.raises(ValueError, match=f"weight_sync_period must be at least 1, got {period}"):
        AsyncRunner(agent).run(64, weight_sync_period=period)
    with pytest.raises(SystemExit):
        main(["train", "dqn", "--async", "--env", "CartPole-v1", "--run-dir", str(tmp_path),
              "--async-weight-sync-period", str(period)])  # fmt: skip
    dqn = DQN(env=None, env_id="CartPole-v1", backend="serial", num_envs=2)
    with pytest.raises(ValueError, match=f"weight_sync_period must be at least 1, got {period}"):
        AsyncRunner(dqn).run(64, weight_sync_period=period)
    with pytest.raises(ValueError, match="async_max_lead must be non-negative"):
        DQNConfig(async_max_lead=-1)
    assert not list(tmp_path.iterdir()), "nothing ran"


QUIET_TINY_PPO = [
    "--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
    "--no-progress", "--no-tensorboard", "--torch-threads", "1",
]  # fmt: skip


def test_failed_async_resume_leaves_the_run_resumable(tmp_path, capsys):
    """``vecaccel train ppo --resume DIR --async --backend nosuch`` (a typo): the rollout process
    dies before its first step, and the run's checkpoint must not record backend 'nosuch' and
    async=True, or every later plain ``--resume DIR`` would fail the same way."""
    run_dir = tmp_path / "run"
    assert run_main(["train", "ppo", *QUIET_TINY_PPO, "--total-timesteps", "32", "--run-dir",
                     str(run_dir)]) == 0  # fmt: skip
    capsys.readouterr()
    checkpoint = run_dir / "checkpoint.pt"
    before = checkpoint.read_bytes()
    code = run_main(
        ["train", "ppo", "--resume", str(run_dir), "--async", "--backend", "nosuch",
         "--total-timesteps", "64", "--no-progress", "--no-tensorboard"]
    )  # fmt: skip
    err = capsys.readouterr().err
    rewritten = checkpoint.read_bytes() != before
    after = run_main(
        ["train", "ppo", "--resume", str(run_dir), "--total-timesteps", "64", "--no-progress",
         "--no-tensorboard"]
    ) if rewritten else 0  # fmt: skip
    assert not rewritten and code == 2, (
        "expected the unknown backend to be refused with exit 2 before anything runs, and the "
        f"checkpoint left as it was; got exit {code} (stderr tail {err[-200:]!r}), checkpoint "
        f"rewritten: {rewritten}, and a plain --resume afterwards exits {after}"
    )
