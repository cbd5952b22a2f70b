"""``benchmarks/learning/mujoco_race.py``: the three arms (vecaccel, CleanRL's vendored script,
SB3 with VecNormalize) each stopped by the one rule, each run kept in its own file."""

from __future__ import annotations

import pytest
from bench_scripts import load_benchmark, runs_in_this_process

from vecaccel.bench import load_result

pytest.importorskip("mujoco")
pytest.importorskip("stable_baselines3")
pytest.importorskip("tyro")


@pytest.fixture
def bench_here(monkeypatch):
    """The script with vecaccel's and SB3's runs called in this process; CleanRL's stays in its
    child, as its script, stopped mid-run, leaves its TensorBoard writer's thread behind."""
    with runs_in_this_process(
        monkeypatch, "learning/mujoco_race", lambda kwargs: kwargs["arm"] == "cleanrl"
    ) as bench:
        yield bench


def test_every_arm_stops_at_the_target_and_a_second_race_reads_the_runs(bench_here, tmp_path):
    """A target every policy passes at once (window 2): each arm stops at its second episode,
    long before its budget. vecaccel's arm takes PPO's plain defaults here (its preset is the
    trainers' to write)."""
    bench = bench_here
    argv = ["--task", "Hopper-v5", "--target", "-1000", "--window", "2", "--max-steps", "4096",
            "--seeds", "1", "--preset", "none", "--set", "num_envs=2", "--set", "num_steps=64",
            "--set", "backend='serial'", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    written = load_result(tmp_path / "mujoco_race_Hopper-v5.json")
    assert written["meta"]["benchmark"] == "learning/mujoco_race"
    assert written["meta"]["changes"] == {"num_envs": 2, "num_steps": 64, "backend": "serial"}
    runs = {run["arm"]: run for run in written["results"]}
    assert sorted(runs) == ["cleanrl", "sb3", "vecaccel"]
    for arm, run in runs.items():
        assert run["reached"] is not None, arm
        assert run["reached"]["step"] == run["steps"] < 4096, arm
        assert run["episodes"] >= 2 and run["steps_per_s"] > 0, arm
    # CleanRL's episodes come from its own printed lines, one env: its steps are its global_step
    assert runs["cleanrl"]["config"] == {"script": "cleanrl_ppo_continuous_action.py"}
    assert runs["sb3"]["config"]["n_steps"] == 512 and runs["sb3"]["config"]["gamma"] == 0.999
    summary = written["summary"]
    assert [summary[arm]["reached"] for arm in ("vecaccel", "cleanrl", "sb3")] == ["1 of 1"] * 3
    assert sorted(summary["time_to_target_ratio"]) == ["cleanrl", "sb3"]
    assert all(ratio > 0 for ratio in summary["time_to_target_ratio"].values())
    files = sorted(path.name for path in (tmp_path / "mujoco_race_runs").iterdir())
    assert files == [
        f"{arm}-Hopper-v5-target-1000-w2-s1.json" for arm in ("cleanrl", "sb3", "vecaccel")
    ]
    assert bench.main(argv) == 0  # every run is read back, none made again
    again = load_result(tmp_path / "mujoco_race_Hopper-v5.json")
    assert again["results"] == written["results"]


def test_a_preset_ppo_lacks_is_refused_before_any_run(tmp_path, capsys):
    bench = load_benchmark("learning/mujoco_race")
    with pytest.raises(SystemExit):
        bench.main(["--preset", "no-such-preset", "--out", str(tmp_path)])
    assert "PPO has no preset 'no-such-preset'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cleanrl_lines_feed_the_curve_and_stop_its_script():
    bench = load_benchmark("learning/mujoco_race")
    curve = bench.ReturnCurve(1000, stop_at=50.0, window=2)
    lines = bench.EpisodeLines(curve)
    lines.write("SPS: 120\nglobal_step=40, episodic_return=[30.5]\nglobal_step=9")
    assert curve.returns == [30.5] and lines.step == 40
    with pytest.raises(bench.RaceStop):
        lines.write("0, episodic_return=80.0\n")  # a line split across two writes
    assert curve.reached == {"step": 90, "wall_s": curve.reached["wall_s"]}


@pytest.mark.parametrize("task", ["Hopper-v5", "HalfCheetah-v5"])
def test_rl_zoo_settings_are_the_sb3_arms_in_vecaccels_names(task):
    from vecaccel.trainers.algos.ppo import PPOConfig

    bench = load_benchmark("learning/mujoco_race")
    zoo = bench.RL_ZOO_PPO[task]
    config = PPOConfig(env_id=task, **bench.rl_zoo_settings(task))
    minibatch = config.num_envs * config.num_steps // config.num_minibatches
    assert config.num_steps == zoo["n_steps"] and minibatch == zoo["batch_size"]
    assert config.update_epochs == zoo["n_epochs"] and config.gamma == zoo["gamma"]
    assert config.learning_rate == zoo["learning_rate"] and config.clip_coef == zoo["clip_range"]
    assert config.log_std_init == -2.0 and config.hidden_sizes == (256, 256)
    assert config.norm_obs and config.norm_reward and not config.anneal_lr


def test_the_rl_zoo_preset_trains_vecaccels_arm_on_the_sb3_arms_settings(bench_here, tmp_path):
    """``--preset rl-zoo`` with ``--set`` over it: the run's recorded config is rl-zoo's
    Hopper setting on the envs and steps set."""
    argv = ["--task", "Hopper-v5", "--target", "-1000", "--window", "2", "--max-steps", "2048",
            "--seeds", "1", "--arms", "vecaccel", "--preset", "rl-zoo", "--set", "num_envs=2",
            "--set", "num_steps=64", "--set", "backend='serial'", "--out", str(tmp_path)]  # fmt: skip
    assert bench_here.main(argv) == 0
    (run,) = load_result(tmp_path / "mujoco_race_Hopper-v5.json")["results"]
    assert run["reached"] is not None
    config = run["config"]
    assert (config["num_envs"], config["num_steps"], config["num_minibatches"]) == (2, 64, 16)
    assert (config["gamma"], config["activation"], config["log_std_init"]) == (0.999, "relu", -2.0)
    assert config["hidden_sizes"] == [256, 256] and config["update_epochs"] == 5


def test_a_race_of_peers_alone_keeps_no_ratio_to_vecaccel(bench_here, tmp_path):
    argv = ["--task", "Hopper-v5", "--target", "-1000", "--window", "2", "--max-steps", "4096",
            "--seeds", "1", "--arms", "sb3", "--out", str(tmp_path)]  # fmt: skip
    assert bench_here.main(argv) == 0
    summary = load_result(tmp_path / "mujoco_race_Hopper-v5.json")["summary"]
    assert summary["sb3"]["reached"] == "1 of 1"
    assert summary["time_to_target_ratio"] == {}
