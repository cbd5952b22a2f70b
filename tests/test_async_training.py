"""Asynchronous training: a sampler process and the optimiser share a replay buffer (DQN family)
or rollouts (PPO, A2C) in shared memory.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import run_main, run_vecaccel

from vecaccel.cli import main
from vecaccel.trainers.algos.dqn import DQN
from vecaccel.trainers.runners.asynchronous.runner import (
    SamplerError,
    learn_async,
    make_async_agent,
)

torch.set_num_threads(1)

TINY = dict(
    batch_size=16,
    buffer_size=2_000,
    learning_starts=200,
    replay_ratio=4.0,
    progress=False,
    tensorboard=False,
    torch_threads=1,
    log_interval=250,
    hidden_sizes=(32, 32),
)


def test_async_replay_ratio_is_enforced_throughout(tmp_path) -> None:
    agent = make_async_agent(DQN, "CartPole-v1", run_dir=str(tmp_path), **TINY)
    stats = learn_async(agent, "CartPole-v1", 3_000)
    assert stats.env_steps == 3_000
    # every transition reached the buffer, those the sampler kept while the lock was taken too
    assert agent.buffer.steps_added == 3_000
    assert abs(stats.replay_ratio - 4.0) <= 0.4, stats
    assert agent.replay_ratio == pytest.approx(stats.replay_ratio)
    # the ratio logged during the run is within 10% once the sampler's allowed lead (16 updates'
    # worth, 64 steps here) is small against the steps since learning started
    logged = [
        (row["step"], float(row["charts/replay_ratio"]))
        for row in agent.logger.history
        if row.get("charts/replay_ratio") is not None and float(row["step"]) >= 1_500
    ]
    assert len(logged) >= 5
    for step, ratio in logged:
        assert abs(ratio - 4.0) <= 0.4, (step, ratio)
    assert stats.updates == pytest.approx((3_000 - 200) * 4.0 / 16, abs=1)
    assert (tmp_path / "checkpoint.pt").exists()
    reloaded = DQN.load(tmp_path / "checkpoint.pt")
    assert reloaded.num_updates == stats.updates
    assert "charts/policy_lag" in agent.logger.history[-1]


def test_dead_sampler_is_reported_within_seconds() -> None:
    agent = make_async_agent(DQN, "CartPole-v1", **TINY)
    killed_at: list[float] = []

    def kill_sampler() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            children = [
                p for p in multiprocessing.active_children() if p.name == "vecaccel-async-sampler"
            ]
            if children and agent.num_updates > 5:
                time.sleep(0.2)
                os.kill(children[0].pid, signal.SIGKILL)
                killed_at.append(time.monotonic())
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_sampler, daemon=True)
    killer.start()
    with pytest.raises(SamplerError) as info:
        learn_async(agent, "CartPole-v1", 10_000_000)
    reported_at = time.monotonic()
    killer.join(timeout=5)
    assert killed_at, "the sampler was never seen"
    assert reported_at - killed_at[0] < 10.0
    assert info.value.exitcode == -signal.SIGKILL
    assert "died" in str(info.value)


@pytest.mark.slow
def test_async_dqn_learns_cartpole() -> None:
    agent = make_async_agent(
        DQN,
        "CartPole-v1",
        preset="cartpole",
        seed=1,
        progress=False,
        tensorboard=False,
        torch_threads=1,
    )
    # a fixed lag makes the run repeat whatever the machine's load (seeds 1-6 end between 189
    # and 368 over the last ten episodes); throttled instead, the interleaving follows the load
    stats = learn_async(agent, "CartPole-v1", 20_000, fixed_lag=True)
    returns = [episode_return for _, episode_return, _ in agent.episode_log]
    # random play scores about 22; other CPUs may round differently, so ask for 100
    assert np.mean(returns[-10:]) >= 100, returns[-20:]
    assert abs(stats.replay_ratio - 32.0) <= 0.1


def _short_async_dqn(seed: int, **options: Any) -> tuple[Any, Any]:
    agent = make_async_agent(
        DQN, "CartPole-v1", seed=seed, prioritized=True, n_step=3, **{**TINY, "buffer_size": 800}
    )
    # forked samplers: three runs a test, and the default spawn is run by the tests around
    stats = learn_async(agent, "CartPole-v1", 1_200, context="fork", **options)
    return agent, stats


def test_async_dqn_with_a_fixed_lag_repeats_exactly() -> None:
    first, stats = _short_async_dqn(seed=5, fixed_lag=True)
    second, _ = _short_async_dqn(seed=5, fixed_lag=True)
    # the replay ratio holds exactly: (1200 - 200) steps x 4 / 16 per batch
    assert stats.env_steps == 1_200 and stats.updates == 250
    assert first.buffer.steps_added == 1_200
    # chunks of half the lead (16 updates' worth = 64 steps): acted on with the weights after
    # the chunk before the last, so 8 to 16 updates behind at each update
    assert 8 <= stats.mean_policy_lag <= 16
    a, b = first.q_network.state_dict(), second.q_network.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert first.episode_log == second.episode_log
    # the whole prioritized buffer too: transitions, sum tree and max priority
    mine, theirs = first.buffer.arrays, second.buffer.arrays
    assert "tree_sum" in mine
    assert all(np.array_equal(mine[name], theirs[name]) for name in mine)
    other, _ = _short_async_dqn(seed=6, fixed_lag=True)
    c = other.q_network.state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_cli_async_flag(tmp_path) -> None:

    code = main(
        [
            "train",
            "dqn",
            "--async",
            "--env",
            "CartPole-v1",
            "--backend",
            "serial",
            "--total-steps",
            "600",
            "--learning-starts",
            "100",
            "--batch-size",
            "16",
            "--replay-ratio",
            "2",
            "--run-dir",
            str(tmp_path),
            "--no-progress",
            "--no-tensorboard",
            "--torch-threads",
            "1",
            "--async-weight-sync-period",
            "4",
        ]
    )
    assert code == 0
    assert (tmp_path / "checkpoint.pt").exists()
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "charts/replay_ratio" in header and "charts/policy_lag" in header


@pytest.mark.slow
def test_async_ppo_learns_cartpole_and_logs_policy_lag() -> None:
    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.ppo import PRESETS
    from vecaccel.trainers.runners.asynchronous.runner import (
        learn_async_on_policy,
        make_async_on_policy_agent,
    )

    config = {k: v for k, v in PRESETS["cartpole"].items() if k != "env_id"}
    agent = make_async_on_policy_agent(
        PPO, "CartPole-v1", backend="serial", torch_threads=1, seed=1, **config
    )
    # a fixed lag makes the run repeat exactly: with the lag left to the scheduler, the last
    # returns of this run ended anywhere from 170 to 500 (40k steps), and once at 247 (60k)
    stats = learn_async_on_policy(agent, 60_000, fixed_lag=True)
    returns = [
        row["charts/episodic_return"]
        for row in agent.logger.history
        if row.get("charts/episodic_return") is not None
    ]
    assert np.mean(returns[-5:]) >= 300, returns[-10:]
    # double buffering with a fixed lag: each batch after the first was collected one update ago
    lags = [row["charts/policy_lag"] for row in agent.logger.history]
    assert lags[0] == 0 and set(lags[1:]) == {1}
    assert 0.5 <= stats.mean_policy_lag <= 1.0


def _short_async_ppo(seed: int, **options: Any) -> tuple[Any, Any]:
    from vecaccel.trainers import PPO
    from vecaccel.trainers.runners.asynchronous.runner import (
        learn_async_on_policy,
        make_async_on_policy_agent,
    )

    agent = make_async_on_policy_agent(
        PPO, "CartPole-v1", backend="serial", torch_threads=1, seed=seed, num_envs=2,
        num_steps=16, num_minibatches=2, update_epochs=2, progress=False, tensorboard=False,
    )  # fmt: skip
    # forked rollout processes: three runs a test, and the default spawn is run by the others
    stats = learn_async_on_policy(agent, 6 * 32, context="fork", **options)
    return agent, stats


def test_async_ppo_with_a_fixed_lag_repeats_exactly() -> None:
    first, stats = _short_async_ppo(seed=5, fixed_lag=True)
    second, _ = _short_async_ppo(seed=5, fixed_lag=True)
    assert stats.updates == 6
    lags = [row["charts/policy_lag"] for row in first.logger.history]
    assert lags == [0, 1, 1, 1, 1, 1]
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other, _ = _short_async_ppo(seed=6, fixed_lag=True)
    c = other.model.state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_cli_async_fixed_lag_runs_repeat(tmp_path, capsys) -> None:
    from vecaccel.trainers import PPO

    def run(run_dir, *extra):
        return main(
            [
                "train", "ppo", "--async", "--async-fixed-lag", "--env", "CartPole-v1",
                "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
                "--total-steps", "96", "--seed", "4", "--torch-threads", "1",
                "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard", *extra,
            ]
        )  # fmt: skip

    assert run(tmp_path / "a") == 0 and run(tmp_path / "b") == 0
    a, b = PPO.load(tmp_path / "a"), PPO.load(tmp_path / "b")
    assert a.global_step == b.global_step == 96
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    capsys.readouterr()
    assert run(tmp_path / "c", "--async-weight-sync-period", "2") == 2
    assert "--async-fixed-lag needs --async-weight-sync-period 1, got 2" in capsys.readouterr().err


def test_fixed_lag_needs_every_updates_weights() -> None:
    from vecaccel.trainers import PPO
    from vecaccel.trainers.runners.asynchronous.runner import (
        learn_async_on_policy,
        make_async_on_policy_agent,
    )

    agent = make_async_on_policy_agent(PPO, "CartPole-v1", backend="serial", num_envs=2)
    with pytest.raises(ValueError, match="weight_sync_period=1.*got weight_sync_period=2"):
        learn_async_on_policy(agent, 64, fixed_lag=True, weight_sync_period=2)


def test_cli_async_a2c(tmp_path) -> None:
    code = main(
        [
            "train", "a2c", "--async", "--env", "CartPole-v1", "--backend", "serial",
            "--num-envs", "2", "--num-steps", "5", "--total-steps", "300",
            "--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard",
            "--torch-threads", "1", "--async-weight-sync-period", "2",
        ]
    )  # fmt: skip
    assert code == 0
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "charts/policy_lag" in header
    from vecaccel.trainers import A2C

    assert A2C.load(tmp_path).global_step == 300


def test_async_dqn_checkpoint_holds_the_replay_buffer_and_resumes(tmp_path) -> None:
    """An async run's checkpoint carries its replay buffer; a loaded agent goes on from its
    counters with that buffer, training from its first steps (no second warm-up)."""
    agent = make_async_agent(DQN, "CartPole-v1", run_dir=str(tmp_path), **TINY)
    first = learn_async(agent, "CartPole-v1", 1_200)
    saved = {name: array.copy() for name, array in agent.buffer.arrays.items()}
    assert first.updates == pytest.approx((1_200 - 200) * 4.0 / 16, abs=1)
    assert sorted(p.name for p in tmp_path.glob("checkpoint.replay-1200-*.npz"))

    resumed = DQN.load(tmp_path)
    assert resumed.async_run and resumed.global_step == 1_200
    assert resumed.num_updates == first.updates
    second = learn_async(resumed, "CartPole-v1", 800, reset_num_timesteps=False)
    assert second.env_steps == 800 and resumed.global_step == 2_000
    # the restored buffer is sampled at once: the replay ratio holds from the first step on
    # (a warm-up of learning_starts would leave (800 - 200) * 4 / 16 = 150 updates)
    assert second.updates >= 800 * 4.0 / 16 - 8, second
    assert resumed.num_updates == first.updates + second.updates
    # the buffer went on from the saved one: the rows it has not written over since are there
    assert resumed.buffer.steps_added == 2_000
    arrays = resumed.buffer.arrays
    saved_cursor, cursor = int(saved["cursor"][0]), int(arrays["cursor"][0])
    assert cursor < saved_cursor  # the ring wrapped round (final observations take rows too)
    for name in ("actions", "rewards", "frames"):
        np.testing.assert_array_equal(
            arrays[name][cursor:saved_cursor], saved[name][cursor:saved_cursor], err_msg=name
        )
    # the CSV goes on from the checkpoint's step
    steps = [float(row["step"]) for row in resumed.logger.history]
    assert steps == sorted(steps) and steps[-1] == 2_000


def test_cli_resume_of_an_async_run_goes_on_async(tmp_path, capsys) -> None:
    from vecaccel.trainers.checkpoint import load_checkpoint

    common = [
        "--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard",
    ]  # fmt: skip
    code = main(
        [
            "train", "dqn", "--async", "--env", "CartPole-v1", "--backend", "serial",
            "--total-steps", "600", "--learning-starts", "100", "--batch-size", "16",
            "--replay-ratio", "2", "--torch-threads", "1", *common,
        ]
    )  # fmt: skip
    assert code == 0
    assert load_checkpoint(tmp_path / "checkpoint.pt")["async"] is True
    capsys.readouterr()
    assert main(["train", "dqn", "--resume", str(tmp_path), "--total-steps", "1000", *common]) == 0
    err = capsys.readouterr().err
    assert "(async)" in err and "async DQN: 400 env steps" in err, err
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["global_step"] == 1000 and state["async"] is True
    assert state["replay"]["file"].startswith("checkpoint.replay-1000-")
    # one replay file: the one the checkpoint names
    assert [p.name for p in tmp_path.glob("*.npz")] == [state["replay"]["file"]]
    # a finished run says so
    assert main(["train", "dqn", "--resume", str(tmp_path), "--total-steps", "1000", *common]) == 0
    assert "the run is complete" in capsys.readouterr().err
    # --sync goes on synchronously, from the async run's replay buffer
    updates = state["num_updates"]
    assert main(["train", "dqn", "--resume", str(tmp_path), "--total-steps", "1200", "--sync",
                 *common]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "resuming dqn from" in err and "(async)" not in err, err
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["global_step"] == 1200 and state["async"] is False
    # it trained from the loaded buffer at once: 200 steps x ratio 2 / batch 16, no warm-up
    assert state["num_updates"] - updates >= 200 * 2 // 16 - 2


def test_cli_async_dqn_fixed_lag_repeats_and_resumes_with_it(tmp_path, capsys) -> None:
    from vecaccel.trainers.checkpoint import load_checkpoint

    def run(run_dir, *extra):
        return main(
            [
                "train", "dqn", "--async", "--async-fixed-lag", "--env", "CartPole-v1",
                "--backend", "serial", "--total-steps", "600", "--learning-starts", "100",
                "--batch-size", "16", "--replay-ratio", "2", "--torch-threads", "1",
                "--seed", "2", "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard",
                *extra,
            ]
        )  # fmt: skip

    assert run(tmp_path / "a") == 0 and run(tmp_path / "b") == 0
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert a["num_updates"] == b["num_updates"] == (600 - 100) * 2 // 16
    assert a["async_options"] == {"fixed_lag": True}
    for network in ("q_network", "target_network"):
        assert all(torch.equal(a[network][k], b[network][k]) for k in a[network])
    capsys.readouterr()
    common = ["--run-dir", str(tmp_path / "a"), "--no-progress", "--no-tensorboard"]
    assert main(["train", "dqn", "--resume", str(tmp_path / "a"), "--total-steps", "800",
                 *common]) == 0  # fmt: skip
    assert "resuming DQN (async, fixed lag) from" in capsys.readouterr().err
    state = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert state["global_step"] == 800 and state["async_options"] == {"fixed_lag": True}
    # the resumed run trained from the loaded buffer, without learning_starts' warm-up again
    # (that would leave (200 - 100) x ratio 2 / batch 16 = 12 updates)
    assert state["num_updates"] - a["num_updates"] >= 20
    assert main(["train", "dqn", "--resume", str(tmp_path / "a"), "--total-steps", "900",
                 "--no-async-fixed-lag", *common]) == 0  # fmt: skip
    assert "resuming DQN (async) from" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "a" / "checkpoint.pt")["async_options"] == {
        "fixed_lag": False
    }


def test_cli_resume_of_an_async_ppo_run_finishes_its_budget(tmp_path, capsys) -> None:
    from vecaccel.trainers import PPO

    common = ["--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard"]
    code = main(
        [
            "train", "ppo", "--async", "--env", "CartPole-v1", "--backend", "serial",
            "--num-envs", "2", "--num-steps", "16", "--total-steps", "64",
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
    assert resumed.update_index == agent.update_index + 2
    # --sync: one more update, synchronously, recorded as such; --async and --sync exclude
    assert main(["train", "ppo", "--resume", str(tmp_path), "--total-steps", "160", "--sync",
                 *common]) == 0  # fmt: skip
    synced = PPO.load(tmp_path)
    assert synced.global_step == 160 and not synced.async_run
    assert synced.update_index == resumed.update_index + 1
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--resume", str(tmp_path), "--async", "--sync", *common])
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_resume_keeps_the_async_options_the_run_was_trained_with(tmp_path, capsys) -> None:
    import csv

    from vecaccel.trainers import PPO

    common = ["--run-dir", str(tmp_path), "--no-progress", "--no-tensorboard"]
    code = main(
        [
            "train", "ppo", "--async", "--async-fixed-lag", "--env", "CartPole-v1",
            "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
            "--total-steps", "64", "--torch-threads", "1", *common,
        ]
    )  # fmt: skip
    assert code == 0
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
    extend_to(160)
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(tmp_path), *common]) == 0
    assert "(async, weight sync period 1, fixed lag)" in capsys.readouterr().err
    resumed = PPO.load(tmp_path)
    assert resumed.global_step == 160
    assert resumed.async_options == {"weight_sync_period": 1, "fixed_lag": True}
    assert lags_from(64) == [0, 1, 1]
    # flags given on resume replace what the run recorded, and are recorded in turn
    extend_to(224)
    assert main(["train", "ppo", "--resume", str(tmp_path), "--no-async-fixed-lag",
                 "--async-weight-sync-period", "2", *common]) == 0  # fmt: skip
    assert "(async, weight sync period 2)" in capsys.readouterr().err
    assert PPO.load(tmp_path).async_options == {"weight_sync_period": 2, "fixed_lag": False}
    # a fixed lag asked for on top of the recorded period 2 is refused, naming both ways out
    extend_to(288)
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
            "--num-envs", "2", "--num-steps", "16", "--total-steps", "32",
            "--torch-threads", "1", "--run-dir", str(tmp_path), "--no-progress",
            "--no-tensorboard",
        ]
    )  # fmt: skip
    assert code == 0
    agent = PPO.load(tmp_path)
    assert agent.global_step == 32 and not agent.async_run


class _EpisodeLoggingCartPole:
    """Factory of a 5-step CartPole that appends a line to ``log`` for every episode it ends
    (the env lives in the sampler process)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, **kwargs: Any) -> Any:
        import gymnasium as gym

        log = self.log

        class EpisodeLog(gym.Wrapper):
            def step(self, action: Any) -> Any:
                result = super().step(action)
                if result[2] or result[3]:
                    with open(log, "a") as file:
                        file.write("end\n")
                return result

        return EpisodeLog(gym.make("CartPole-v1", max_episode_steps=5, **kwargs))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_async_dqn_logs_the_episodes_of_its_last_steps(seed: int, tmp_path) -> None:
    """The throttled sampler counts a step before its queue's feeder thread has sent the
    episodes it ended; the optimiser, seeing the budget done, drained the queue at once and
    could miss them if it drained the queue as soon as it saw the budget done. It waits for
    the sampler to exit, draining meanwhile."""
    import gymnasium as gym

    log = tmp_path / "episodes.txt"
    env_id = f"VecaccelEpisodeLoggingCartPole-{seed}-v0"
    gym.register(id=env_id, entry_point=_EpisodeLoggingCartPole(str(log)))  # fork inherits it
    try:
        agent = make_async_agent(
            DQN,
            env_id,
            seed=seed,
            backend="serial",
            num_envs=2,
            **{**TINY, "buffer_size": 400, "learning_starts": 1_000},  # no update slows the end
        )
        learn_async(agent, env_id, 300, context="fork")
    finally:
        gym.registry.pop(env_id, None)
    assert len(agent.episode_log) == len(log.read_text().split())


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_async_resume_that_cannot_start_leaves_the_checkpoint_as_it_was(tmp_path, algo) -> None:
    """A resume whose sampler/rollout process dies before any step (here an unknown backend,
    which `vecaccel train` refuses up front, reaching the runner directly) must not rewrite the
    run's checkpoint with its options: every later resume would then fail the same way."""
    from vecaccel.trainers import PPO
    from vecaccel.trainers.runners.asynchronous.runner import resume_async

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
    """A period of 0 or less is refused, by the CLI, the on-policy runner and the DQN config,
    rather than trained as 1 without a word."""
    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.dqn import DQNConfig
    from vecaccel.trainers.runners.asynchronous.runner import (
        learn_async_on_policy,
        make_async_on_policy_agent,
    )

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "ppo", "--async", "--env", "CartPole-v1", "--run-dir", str(tmp_path),
              "--async-weight-sync-period", str(period)])  # fmt: skip
    assert exit_info.value.code == 2
    assert "--async-weight-sync-period: must be a positive integer" in capsys.readouterr().err
    agent = make_async_on_policy_agent(PPO, "CartPole-v1", backend="serial", num_envs=2)
    with pytest.raises(ValueError, match=f"weight_sync_period must be at least 1, got {period}"):
        learn_async_on_policy(agent, 64, weight_sync_period=period)
    with pytest.raises(ValueError, match="async_weight_sync_period must be at least 1"):
        DQNConfig(async_weight_sync_period=period)
    with pytest.raises(ValueError, match="async_max_lead must be non-negative"):
        DQNConfig(async_max_lead=-1)
    assert not list(tmp_path.iterdir()), "nothing ran"


def test_single_rank_async_ppo_error_inside_an_update_keeps_the_last_checkpoint(tmp_path) -> None:
    """An update that fails after stepping the optimizer (backward_step's FloatingPointError on
    a later minibatch) leaves weights part-way through an update the counters do not count: the
    run's last checkpoint must stay as it was, as after an error on several ranks."""
    from vecaccel.trainers import PPO
    from vecaccel.trainers.checkpoint import load_checkpoint
    from vecaccel.trainers.runners.asynchronous.runner import (
        learn_async_on_policy,
        make_async_on_policy_agent,
    )

    agent = make_async_on_policy_agent(
        PPO, "CartPole-v1", backend="serial", num_envs=2, num_steps=16, update_epochs=1,
        num_minibatches=2, run_dir=str(tmp_path), hidden_sizes=(16,), torch_threads=1,
        seed=0, progress=False, tensorboard=False,
    )  # fmt: skip
    learn_async_on_policy(agent, 64, poll_interval=0.001)
    checkpoint = tmp_path / "checkpoint.pt"
    before = checkpoint.read_bytes()
    assert load_checkpoint(checkpoint)["update_index"] == 2
    update, calls = agent.update, []

    def failing_update(batch, progress_remaining):
        calls.append(1)
        if len(calls) == 2:  # the second update of this call: one minibatch stepped, then NaN
            with torch.no_grad():
                for p in agent.model.parameters():
                    p.add_(1.0)
            raise FloatingPointError("update 3: the gradient norm is nan")
        return update(batch, progress_remaining)

    agent.update = failing_update
    with pytest.raises(FloatingPointError, match="gradient norm is nan"):
        learn_async_on_policy(agent, 96, poll_interval=0.001)
    assert len(calls) == 2
    assert checkpoint.read_bytes() == before, "no checkpoint of a half-done update"


QUIET_TINY_PPO = [
    "--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
    "--no-progress", "--no-tensorboard", "--torch-threads", "1",
]  # fmt: skip


def test_failed_async_resume_leaves_the_run_resumable(tmp_path, capsys):
    """``vecaccel train ppo --resume DIR --async --backend nosuch`` (a typo): the rollout process
    dies before its first step, and the run's checkpoint must not record backend 'nosuch' and
    async=True, or every later plain ``--resume DIR`` would fail the same way."""
    run_dir = tmp_path / "run"
    assert run_main(["train", "ppo", *QUIET_TINY_PPO, "--total-steps", "32", "--run-dir",
                     str(run_dir)]) == 0  # fmt: skip
    capsys.readouterr()
    checkpoint = run_dir / "checkpoint.pt"
    before = checkpoint.read_bytes()
    done = run_vecaccel(
        ["train", "ppo", "--resume", str(run_dir), "--async", "--backend", "nosuch",
         "--total-steps", "64", "--no-progress", "--no-tensorboard"],
        tmp_path,
    )  # fmt: skip
    rewritten = checkpoint.read_bytes() != before
    after = run_vecaccel(
        ["train", "ppo", "--resume", str(run_dir), "--total-steps", "64", "--no-progress",
         "--no-tensorboard"],
        tmp_path,
    ).returncode if rewritten else 0  # fmt: skip
    assert not rewritten and done.returncode == 2, (
        "expected the unknown backend to be refused with exit 2 before anything runs, and the "
        f"checkpoint left as it was; got exit {done.returncode} "
        f"(stderr tail {done.stderr[-200:]!r}), checkpoint rewritten: {rewritten}, and a plain "
        f"--resume afterwards exits {after}"
    )


# -- fixed data --------------------------------------------------------------------------------

OBS_DIM = 4


# -- the async runner: no process left behind ------------------------------------------------


def _async_children() -> list[Any]:
    return [
        p
        for p in multiprocessing.active_children()
        if p.name in ("vecaccel-async-sampler", "vecaccel-async-rollout")
    ]


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_async_runner_leaves_no_sampler_when_the_run_directory_is_unusable(
    algo: str, tmp_path: Path
) -> None:
    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.dqn import DQN
    from vecaccel.trainers.runners.asynchronous.runner import (
        learn_async,
        learn_async_on_policy,
        make_async_agent,
    )

    # fork: the sampler process is running at once (with spawn it is still unpickling its spec
    # when the error comes, and dies of the locks the optimiser has freed meanwhile)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad_run_dir = str(blocker / "run")  # cannot be created
    before = {p.pid for p in _async_children()}
    try:
        with pytest.raises(OSError):
            if algo == "dqn":
                agent = make_async_agent(
                    DQN, "CartPole-v1", batch_size=16, buffer_size=500, learning_starts=64,
                    hidden_sizes=(16,), torch_threads=1, progress=False, tensorboard=False,
                    run_dir=bad_run_dir,
                )  # fmt: skip
                learn_async(agent, "CartPole-v1", 2_000, context="fork")
            else:
                agent = PPO(
                    None, env_id="CartPole-v1", num_envs=2, num_steps=8, torch_threads=1,
                    tensorboard=False, run_dir=bad_run_dir,
                )  # fmt: skip
                learn_async_on_policy(agent, 64, context="fork")
        deadline = time.monotonic() + 5.0
        left = [p for p in _async_children() if p.pid not in before]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in _async_children() if p.pid not in before and p.is_alive()]
        assert not left, f"{[p.name for p in left]} still running after learn_async raised"
    finally:
        for proc in _async_children():
            if proc.pid not in before:
                proc.kill()
                proc.join(timeout=5)


# -- the async runners act in a Discrete(n, start) space ---------------------------------------


class _ShiftedCartPole:
    """Factory of CartPole with ``Discrete(2, start=1)`` (actions 1 and 2) that appends every
    action it is sent to ``log`` (the env lives in the sampler process)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, **kwargs: Any) -> Any:
        import gymnasium as gym

        log = self.log

        class ShiftedActions(gym.ActionWrapper):
            def __init__(self, env: Any) -> None:
                super().__init__(env)
                self.action_space = gym.spaces.Discrete(2, start=1)

            def action(self, action: Any) -> int:
                with open(log, "a") as file:
                    file.write(f"{int(action)}\n")
                return int(action) - 1

        return ShiftedActions(gym.make("CartPole-v1", **kwargs))


@pytest.mark.parametrize(("algo", "fixed_lag"), [("dqn", False), ("dqn", True), ("ppo", False)])
def test_async_runner_acts_in_a_discrete_space_with_a_start(
    algo: str, fixed_lag: bool, tmp_path: Path
) -> None:
    """The async DQN sampler and the on-policy rollout process act in ``start..start+n-1``: a
    ``Discrete(2, start=1)`` env gets actions 1..2, never 0 (and the losses index the
    network's outputs with 0..1)."""
    import gymnasium as gym

    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.dqn import DQN
    from vecaccel.trainers.runners.asynchronous.runner import (
        learn_async,
        learn_async_on_policy,
        make_async_agent,
    )

    log = tmp_path / "actions.txt"
    env_id = f"VecaccelScaleOutShiftedCartPole-{algo}-{int(fixed_lag)}-v0"
    # fork: the sampler process inherits this registration
    gym.register(id=env_id, entry_point=_ShiftedCartPole(str(log)))
    try:
        if algo == "dqn":
            agent = make_async_agent(
                DQN, env_id, batch_size=16, buffer_size=500, learning_starts=64,
                hidden_sizes=(16,), torch_threads=1, progress=False, tensorboard=False,
                backend="serial", num_envs=2, async_max_lead=32,
            )  # fmt: skip
            assert agent.action_space.start == 1
            learn_async(agent, env_id, 400, fixed_lag=fixed_lag, context="fork")
            assert agent.num_updates > 0
        else:
            agent = PPO(
                None, env_id=env_id, num_envs=2, num_steps=16, backend="serial",
                torch_threads=1, tensorboard=False,
            )  # fmt: skip
            learn_async_on_policy(agent, 128, context="fork")
            assert agent.update_index > 0
            actions, _ = agent.predict(np.zeros((8, OBS_DIM), np.float32))
            assert set(actions.tolist()) <= {1, 2}
    finally:
        gym.registry.pop(env_id, None)
    sent = [int(line) for line in log.read_text().split()]
    assert sent and set(sent) <= {1, 2}, sorted(set(sent))
