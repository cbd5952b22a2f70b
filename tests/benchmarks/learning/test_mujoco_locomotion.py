"""``benchmarks/learning/mujoco_locomotion.py``: a resumable run on a tiny budget, and the
report from run files of any coverage."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from bench_scripts import load_benchmark, runs_in_this_process

from vecaccel.bench import RunRecord, load_result

pytest.importorskip("mujoco")
pytest.importorskip("rliable")


def _fake_run(bench, runs, arm, task, seed, score, steps=5000, seconds=2.0):
    """A run file as ``one`` writes it: 5 points rising evenly to ``score``."""
    curve = [
        {"step": steps * (i + 1) // 5, "wall_s": seconds * (i + 1), "episodes": 3 * (i + 1),
         "return": score * (i + 1) / 5}
        for i in range(5)
    ]  # fmt: skip
    summary = {"score": score, "episodes": 15, "wall_s": seconds * 5, "steps": steps,
               "steps_per_s": steps / (seconds * 5)}  # fmt: skip
    RunRecord("python benchmarks/learning/mujoco_locomotion.py run", "learning/mujoco_locomotion").write(
        bench.run_file(runs, arm, task, seed), curve, summary=summary, arm=arm, task=task,
        seed=seed, total_steps=steps, preset="mujoco", changes={}, config={},
    )  # fmt: skip


@pytest.fixture
def bench_here(monkeypatch):
    """The script with its runs called in this process, ``run``'s and those ``pace`` hands to
    ``run_seeds``."""
    with runs_in_this_process(monkeypatch, "learning/mujoco_locomotion") as bench:
        yield bench


def test_a_tiny_run_writes_its_file_and_a_second_call_skips_it(bench_here, tmp_path, capsys):
    """Real training: PPO's plain defaults on 2 Hopper envs, 256 steps."""
    bench = bench_here
    runs = tmp_path / "runs"
    argv = ["run", "--tasks", "Hopper-v5", "--seeds", "1", "--steps", "256", "--preset", "none",
            "--set", "num_envs=2", "--set", "num_steps=64", "--set", "backend='serial'",
            "--arm", "tiny", "--runs", str(runs)]  # fmt: skip
    assert bench.main(argv) == 0
    path = bench.run_file(runs, "tiny", "Hopper-v5", 1)
    written = json.loads(path.read_text())
    meta, summary = written["meta"], written["summary"]
    assert (meta["task"], meta["arm"], meta["preset"], meta["seed"]) == (
        "Hopper-v5",
        "tiny",
        "none",
        1,
    )
    assert meta["changes"] == {"num_envs": 2, "num_steps": 64, "backend": "serial"}
    assert meta["config"]["num_envs"] == 2 and meta["config"]["env_id"] == "Hopper-v5"
    assert summary["steps"] >= 256 and summary["episodes"] > 0 and written["results"]
    assert math.isclose(summary["steps_per_s"], summary["steps"] / summary["wall_s"])
    capsys.readouterr()
    stamp = path.stat().st_mtime_ns
    assert bench.main(argv) == 0
    assert capsys.readouterr().out == ""  # nothing left to run
    assert path.stat().st_mtime_ns == stamp


def test_a_preset_ppo_lacks_is_refused_before_any_run(tmp_path, capsys):
    bench = load_benchmark("learning/mujoco_locomotion")
    with pytest.raises(SystemExit):
        bench.main(["run", "--preset", "no-such-preset", "--runs", str(tmp_path / "runs")])
    assert "PPO has no preset 'no-such-preset'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_the_report_reads_whatever_runs_exist(tmp_path):
    bench = load_benchmark("learning/mujoco_locomotion")
    runs, out = tmp_path / "runs", tmp_path / "out"
    runs.mkdir()
    out.mkdir()
    # the preset: 3 seeds on Hopper and HalfCheetah, one on Ant; a shorter run of another setting
    for seed, hopper, cheetah in ((1, 2000.0, 1442.0), (2, 2383.0, 2884.0), (3, 2600.0, 721.0)):
        _fake_run(bench, runs, "mujoco", "Hopper-v5", seed, hopper)
        _fake_run(bench, runs, "mujoco", "HalfCheetah-v5", seed, cheetah)
    _fake_run(bench, runs, "mujoco", "Ant-v5", 2, 1327.0)
    _fake_run(bench, runs, "envs16", "Hopper-v5", 1, 900.0, steps=2500)
    payload = bench.write_report(runs, out, "report", budget=5000, reps=200)

    rows = {(row["arm"], row["task"]): row for row in payload["results"]}
    hopper = rows[("mujoco", "Hopper-v5")]
    assert hopper["scores"] == [2000.0, 2383.0, 2600.0] and hopper["median"] == 2383.0
    assert (hopper["cleanrl"], hopper["cleanrl_std"], hopper["rl_zoo"]) == (2383.0, 272.0, 2410.0)
    assert rows[("mujoco", "Ant-v5")]["cleanrl"] is None  # CleanRL published no Ant row
    summary = payload["summary"]["iqm"]
    # the aggregate counts the seeds every task of the setting has: Ant has seed 2 alone
    assert summary["mujoco"]["tasks"] == ["HalfCheetah-v5", "Hopper-v5", "Ant-v5"]
    assert summary["mujoco"]["seeds"] == [2]
    # scores over CleanRL's (rl-zoo's for Ant): 2, 1 and 1; the IQM of three is their middle
    assert math.isclose(summary["mujoco"]["iqm"], 4 / 3)
    assert "envs16" not in summary  # shorter than the budget
    written = load_result(out / "mujoco_locomotion.json")
    assert written["meta"]["benchmark"] == "learning/mujoco_locomotion"
    assert len(written["meta"]["runs"]) == 8 and written["meta"]["reference"]["Ant-v5"] == 1327.0
    table = (out / "mujoco_locomotion.md").read_text()
    assert table.startswith(
        "8 run files.\n\n- envs16: Hopper-v5 seed 1; no run of HalfCheetah-v5, Walker2d-v5, "
        "Ant-v5, Humanoid-v5\n- mujoco: HalfCheetah-v5 seeds 1, 2, 3; Hopper-v5 seeds 1, 2, 3; "
        "Ant-v5 seed 2; no run of Walker2d-v5, Humanoid-v5\n"
    )
    assert (
        "| mujoco | Hopper-v5 | 3 | 2,000, 2,383, 2,600 | 2,328 ± 248 | 2,383 ± 272 | 2,410 |"
        in table
    )
    assert "| mujoco | HalfCheetah-v5, Hopper-v5, Ant-v5 | 2 | 1.33 |" in table
    assert (out / "mujoco_locomotion.png").stat().st_size > 0


def test_a_version_check_has_its_row_but_stays_out_of_the_aggregate(tmp_path):
    bench = load_benchmark("learning/mujoco_locomotion")
    runs, out = tmp_path / "runs", tmp_path / "out"
    runs.mkdir()
    out.mkdir()
    _fake_run(bench, runs, "mujoco", "Ant-v5", 1, 1327.0)
    # on another seed than Ant-v5's: counted, it would leave the aggregate no common seed
    _fake_run(bench, runs, "mujoco", "Ant-v4", 2, 2654.0)
    _fake_run(bench, runs, "mujoco", "Humanoid-v4", 3, 716.0)
    payload = bench.write_report(runs, out, "report", budget=5000, reps=200)
    rows = {row["task"]: row for row in payload["results"]}
    assert list(rows) == ["Ant-v5", "Ant-v4", "Humanoid-v4"]
    assert rows["Ant-v4"]["rl_zoo"] == 1327.0 and rows["Humanoid-v4"]["cleanrl"] == 716.0
    summary = payload["summary"]["iqm"]["mujoco"]
    assert summary["tasks"] == ["Ant-v5"] and summary["seeds"] == [1]
    table = (out / "mujoco_locomotion.md").read_text()
    assert (
        "- mujoco: Ant-v5 seed 1; Ant-v4 seed 2; Humanoid-v4 seed 3; no run of HalfCheetah-v5,"
        in table
    )
    assert "| mujoco | Ant-v4 | 1 | 2,654 |" in table


def test_an_empty_folder_gives_a_report_that_says_so(tmp_path):
    bench = load_benchmark("learning/mujoco_locomotion")
    payload = bench.write_report(tmp_path / "none-yet", tmp_path, "report")
    assert payload["results"] == [] and "summary" not in payload
    assert (tmp_path / "mujoco_locomotion.md").read_text().startswith("0 run files.\n")
    # a result file holds measured rows: none is written, nor a plot
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mujoco_locomotion.md"]


def test_pace_times_the_preset_beside_its_env_alone_and_projects_a_full_run(bench_here, tmp_path):
    bench = bench_here
    # one update of the preset's 32 x 64 batch, after its envs alone for 0.1 s
    argv = ["pace", "--tasks", "Hopper-v5", "--seeds", "1", "--steps", "2048",
            "--ceiling-s", "0.1", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    written = load_result(tmp_path / "mujoco_pace.json")
    (run,) = written["results"]
    assert run["task"] == "Hopper-v5" and run["steps"] >= 2048
    assert run["env_steps_per_s"] > 0 and run["steady_steps_per_s"] > 0
    rest = (bench.STEPS - run["steps"]) / run["steady_steps_per_s"]
    assert run["projected_wall_s"] == pytest.approx(run["wall_s"] + rest)
    summary = written["summary"]["Hopper-v5"]
    assert summary["median_projected_wall_s"] == pytest.approx(run["projected_wall_s"])
    assert summary["median_env_only_wall_s"] == pytest.approx(bench.STEPS / run["env_steps_per_s"])
    assert summary["goal_met"] == (run["projected_wall_s"] <= summary["goal_wall_s"] == 300.0)
    files = [path.name for path in (tmp_path / "mujoco_pace_runs").iterdir()]
    assert files == ["Hopper-v5-steps2048-s1.json"]


@pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None,
    reason="EnvPool's MuJoCo twins need envpool (pip install 'vecaccel[envpool]')",
)
def test_pace_alternates_the_env_sources_of_each_task(tmp_path):
    bench = load_benchmark("learning/mujoco_locomotion")
    argv = ["pace", "--tasks", "Hopper-v5", "--seeds", "1", "--steps", "2048",
            "--ceiling-s", "0.5", "--env-sources", "gymnasium", "envpool", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    written = load_result(tmp_path / "mujoco_pace.json")
    runs = {run["task"]: run for run in written["results"]}
    assert sorted(runs) == ["Hopper-v5", "Hopper-v5+envpool"]
    assert runs["Hopper-v5"]["env_source"] == "gymnasium"
    assert runs["Hopper-v5+envpool"]["env_source"] == "envpool"
    assert written["summary"]["Hopper-v5+envpool"]["goal_wall_s"] == 300.0
    files = sorted(path.name for path in (tmp_path / "mujoco_pace_runs").iterdir())
    assert files == ["Hopper-v5+envpool-steps2048-s1.json", "Hopper-v5-steps2048-s1.json"]


def test_pace_arms_name_the_env_source_beside_the_default_one(capsys):
    bench = load_benchmark("learning/mujoco_locomotion")
    assert bench.pace_arm("Hopper-v5", "gymnasium") == "Hopper-v5"
    assert bench.pace_arm("Hopper-v5", "envpool") == "Hopper-v5+envpool"
    with pytest.raises(SystemExit):
        bench.main(["pace", "--env-sources", "brax"])
    assert "invalid choice: 'brax'" in capsys.readouterr().err
