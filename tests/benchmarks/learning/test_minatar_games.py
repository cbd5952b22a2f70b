"""``benchmarks/learning/minatar_games.py``: resumable runs, and a report from partial results."""

from __future__ import annotations

import json
import math

import pytest
from bench_scripts import load_benchmark, runs_in_this_process

from vecaccel.bench import RunRecord, load_result

pytest.importorskip("minatar")
pytest.importorskip("rliable")


def _fake_run(bench, runs, algo, game, setting, seed, score, points=5, seconds=2.0, config=None):
    """A run file as ``one`` writes it, with a made-up curve rising to ``score``, ``seconds``
    a point."""
    curve = [
        {"step": 1000 * (i + 1), "wall_s": seconds * (i + 1), "episodes": 10 * (i + 1),
         "return": score * (i + 1) / points}
        for i in range(points)
    ]  # fmt: skip
    summary = {"score": score, "episodes": 10 * points, "wall_s": seconds * points,
               "steps": 1000 * points, "steps_per_s": 500.0}  # fmt: skip
    RunRecord("python benchmarks/learning/minatar_games.py run", "learning/minatar_games").write(
        bench.run_file(runs, algo, game, setting, seed), curve, summary=summary, algo=algo,
        game=game, setting=setting, seed=seed, total_steps=1000 * points, config=config or {},
    )  # fmt: skip


@pytest.fixture
def bench_here(monkeypatch):
    """The script with its runs called in this process, ``run``'s and those ``race`` and
    ``pace`` hand to ``run_seeds``; ``minatar-original`` below runs in a child."""
    with runs_in_this_process(monkeypatch, "learning/minatar_games") as bench:
        yield bench


def test_the_report_reads_whatever_runs_exist(tmp_path):
    bench = load_benchmark("learning/minatar_games")
    runs, out = tmp_path / "runs", tmp_path / "out"
    runs.mkdir()
    out.mkdir()
    # PPO: three seeds on Breakout, one on Freeway (its aggregate counts seed 1 on both games);
    # DQN: Breakout only; the PPO batch-size arm: one seed; PPO under bf16 (128 envs): one seed
    for seed, score in ((1, 12.0), (2, 20.0), (3, 16.0)):
        _fake_run(bench, runs, "ppo", "Breakout", "preset", seed, score)
    _fake_run(bench, runs, "ppo", "Freeway", "preset", 1, 55.0)
    _fake_run(bench, runs, "dqn", "Breakout", "preset", 2, 5.0)
    _fake_run(bench, runs, "ppo", "Breakout", "envs16", 1, 11.0, points=3)
    _fake_run(bench, runs, "ppo", "Asterix", "envs128-mb4-bf16", 1, 30.0)
    # the fake runs' 5,000 steps stand for the published budget; 200 resamples: the intervals
    # below are of one run a game
    payload = bench.write_report(
        runs, out, "python benchmarks/learning/minatar_games.py report", frames=5000, reps=200
    )

    rows = {(row["arm"], row["game"]): row for row in payload["results"]}
    breakout = rows[("PPO", "Breakout")]
    assert breakout["scores"] == [12.0, 20.0, 16.0] and breakout["median"] == 16.0
    assert breakout["at or above DQN"] and not breakout["at or above AC(lambda)"]
    envs16 = rows[("PPO envs16", "Breakout")]
    assert envs16["steps"] == 3000 and envs16["at or above DQN"] is None  # a shorter budget
    assert rows[("PPO envs128-mb4-bf16", "Asterix")]["scores"] == [30.0]
    summary = payload["summary"]["iqm"]
    assert "PPO envs16" not in summary  # nor in the aggregate
    assert summary["PPO"]["games"] == ["Breakout", "Freeway"] and summary["PPO"]["seeds"] == [1]
    assert summary["DQN"]["seeds"] == [2]
    # one run a game: the IQM is the mean of the two normalised scores, and so is every interval
    assert math.isclose(summary["PPO"]["iqm"], (12.0 / 10.0 + 55.0 / 50.0) / 2)
    assert summary["PPO"]["ci95"][0] <= summary["PPO"]["iqm"] <= summary["PPO"]["ci95"][1]
    assert payload["summary"]["batch_claim"] == []  # no large batch to set against envs16 yet
    written = load_result(out / "minatar_games.json")
    assert written["meta"]["benchmark"] == "learning/minatar_games"
    assert len(written["meta"]["runs"]) == 7
    table = (out / "minatar_games.md").read_text()
    assert "| PPO | Breakout | 3 | 12.0, 20.0, 16.0 | 16.0 | 10.0 | 17.5 |" in table
    assert (out / "minatar_games.png").stat().st_size > 0
    assert (out / "minatar_games_batch.png").stat().st_size > 0
    assert (out / "minatar_games_bf16.png").stat().st_size > 0
    # a comparison plot is drawn only once a run of its own setting exists
    (runs / "ppo-Asterix-envs128-mb4-bf16-s1.json").unlink()
    (out / "again").mkdir()
    bench.write_report(runs, out / "again", "report", frames=5000, reps=200)
    assert (out / "again" / "minatar_games_batch.png").exists()
    assert not (out / "again" / "minatar_games_bf16.png").exists()


def test_an_arm_s_interval_does_not_move_when_another_arm_lands(tmp_path):
    """The bootstrap of each arm draws from its own fixed seed: DQN's interval is the same
    before and after A2C's runs (read first) exist, and the same files give the same report."""
    bench = load_benchmark("learning/minatar_games")
    runs = tmp_path / "runs"
    runs.mkdir()
    for seed, scores in ((1, (6.0, 40.0)), (2, (9.0, 52.0)), (3, (8.0, 47.0))):
        for game, score in zip(("Breakout", "Freeway"), scores):
            _fake_run(bench, runs, "dqn", game, "preset", seed, score)
    alone = bench.aggregate(bench.load_runs(runs), reps=200, frames=5000)
    assert alone["DQN"]["ci95"][0] < alone["DQN"]["ci95"][1]  # the seeds differ: an interval
    for seed, score in ((1, 12.0), (2, 20.0), (3, 16.0)):
        _fake_run(bench, runs, "a2c", "Breakout", "preset", seed, score)
    beside = bench.aggregate(bench.load_runs(runs), reps=200, frames=5000)
    assert beside["DQN"] == alone["DQN"] and "A2C" in beside
    assert bench.aggregate(bench.load_runs(runs), reps=200, frames=5000) == beside


def test_the_batch_claim_compares_at_the_smaller_budget(tmp_path):
    bench = load_benchmark("learning/minatar_games")
    runs = tmp_path / "runs"
    runs.mkdir()
    # PPO: 256 envs end at 11-13 and 16 envs at 10-14, both over 5 points, 256 envs in half
    # the seconds; DQN: batch 32 over
    # 3 points against the preset's 5, whose curve is read up to 3,000 steps (its 3rd point)
    for seed, small, large in ((1, 10.0, 11.0), (2, 14.0, 12.0), (3, 12.0, 13.0)):
        _fake_run(bench, runs, "ppo", "Breakout", "envs16", seed, small)
        _fake_run(bench, runs, "ppo", "Breakout", "envs256", seed, large, seconds=1.0)
    for seed in (1, 2):
        _fake_run(bench, runs, "dqn", "Breakout", "batch32", seed, 6.0, points=3)
        _fake_run(bench, runs, "dqn", "Breakout", "preset", seed, 25.0)
    claim = bench.write_report(runs, tmp_path, "report")["summary"]["batch_claim"]

    ppo, dqn = claim
    assert (ppo["algo"], ppo["small"], ppo["large"], ppo["budget"]) == ("ppo", "envs16", "envs256",
                                                                       5000)  # fmt: skip
    assert [seed["return"] for seed in ppo["arms"]["envs256"]["seeds"]] == [11.0, 12.0, 13.0]
    assert ppo["arms"]["envs16"]["return"] == 12.0 and ppo["arms"]["envs256"]["return"] == 12.0
    # a curve rising evenly to its score over 5 points averages 3/5 of it
    assert math.isclose(ppo["arms"]["envs16"]["mean_return"], 12.0 * 3 / 5)
    assert ppo["holds"] is True and ppo["wall_s_ratio"] == 0.5
    # the preset's 5M-like run, cut at batch 32's budget: 3/5 of 25 at its 3rd point
    # 256 envs end at 5 s, when 16 envs' runs are at their 2nd point: 2/5 of 10, 14 and 12
    assert ppo["small_return_at_large_wall_s"] == 4.8
    assert dqn["budget"] == 3000 and dqn["arms"]["preset"]["return"] == 15.0
    assert dqn["arms"]["preset"]["wall_s"] == 6.0
    assert dqn["holds"] is None  # two seeds: not judged
    table = (tmp_path / "minatar_games.md").read_text()
    assert (
        "| PPO | Breakout | 16 envs | 256 envs | 0.0M | 10.0, 14.0, 12.0; 11.0, 12.0, 13.0 |"
        in table
    )
    assert "| DQN | Breakout | batch 32 | batch 512 (preset) |" in table
    assert "not judged (under 3 seeds)" in table
    assert (tmp_path / "minatar_games_batch.png").stat().st_size > 0
    # a large batch that ends far above both arms' seed ranges holds; far below, it does not
    # (the claim as write_report takes it, without redrawing the plots)
    _fake_run(bench, runs, "dqn", "Breakout", "batch32", 3, 6.0, points=3)
    _fake_run(bench, runs, "dqn", "Breakout", "preset", 3, 25.0)
    assert bench.batch_claim(bench.load_runs(runs))[1]["holds"]
    for seed in (1, 2, 3):
        _fake_run(bench, runs, "dqn", "Breakout", "batch32", seed, 40.0, points=3)
    assert bench.batch_claim(bench.load_runs(runs))[1]["holds"] is False


def test_relabel_moves_runs_whose_config_is_the_new_setting(tmp_path):
    bench = load_benchmark("learning/minatar_games")
    narrow = {"num_envs": 128, "num_minibatches": 4, "num_steps": 32, "ent_coef": 0.01}
    for game in ("Breakout", "Freeway"):
        _fake_run(bench, tmp_path, "ppo", game, "former", 1, 10.0, config=narrow)
    _fake_run(bench, tmp_path, "ppo", "Breakout", "preset", 1, 5.0, config={"num_envs": 256})
    moved = bench.relabel(tmp_path, "ppo", "former", "envs128-mb4")
    assert [path.name for path in moved] == [
        "ppo-Breakout-envs128-mb4-s1.json",
        "ppo-Freeway-envs128-mb4-s1.json",
    ]
    assert not list(tmp_path.glob("*former*"))
    written = json.loads(moved[0].read_text())
    assert written["meta"]["setting"] == "envs128-mb4" and written["summary"]["score"] == 10.0
    # the preset's runs trained on 256 envs: they are not what envs16 means, and stay
    with pytest.raises(ValueError, match="num_envs=256.*now means num_envs=16"):
        bench.relabel(tmp_path, "ppo", "preset", "envs16")
    assert (tmp_path / "ppo-Breakout-preset-s1.json").exists()
    with pytest.raises(SystemExit):
        bench.main(["relabel", "--algo", "ppo", "--from", "preset", "--to", "envs16",
                    "--runs", str(tmp_path)])  # fmt: skip
    # nothing is overwritten, and nothing moves when one file cannot
    _fake_run(bench, tmp_path, "ppo", "Freeway", "former", 1, 11.0, config=narrow)
    _fake_run(bench, tmp_path, "ppo", "Asterix", "former", 1, 12.0, config=narrow)
    with pytest.raises(ValueError, match="ppo-Freeway-envs128-mb4-s1.json exists"):
        bench.relabel(tmp_path, "ppo", "former", "envs128-mb4")
    assert (tmp_path / "ppo-Asterix-former-s1.json").exists()
    assert json.loads((tmp_path / "ppo-Freeway-envs128-mb4-s1.json").read_text())["summary"][
        "score"] == 10.0  # fmt: skip


def test_relabel_reads_bf16_auto_by_what_it_came_to(tmp_path):
    """A run of ``bf16="auto"`` trained in bf16 where the hardware had it: it is a bf16 run,
    and not a float32 one."""
    bench = load_benchmark("learning/minatar_games")
    narrow = {"num_envs": 128, "num_minibatches": 4}
    _fake_run(bench, tmp_path, "ppo", "Breakout", "old-bf16", 1, 6.0,
              config={**narrow, "bf16": "auto", "bf16_in_force": True})  # fmt: skip
    with pytest.raises(ValueError, match="bf16='auto'.*now means.*bf16='off'"):
        bench.relabel(tmp_path, "ppo", "old-bf16", "envs128-mb4")
    moved = bench.relabel(tmp_path, "ppo", "old-bf16", "envs128-mb4-bf16")
    assert [path.name for path in moved] == ["ppo-Breakout-envs128-mb4-bf16-s1.json"]
    _fake_run(bench, tmp_path, "ppo", "Freeway", "old-fp32", 1, 60.0,
              config={**narrow, "bf16": "auto", "bf16_in_force": False})  # fmt: skip
    with pytest.raises(ValueError, match="bf16='auto'.*now means.*bf16='on'"):
        bench.relabel(tmp_path, "ppo", "old-fp32", "envs128-mb4-bf16")


def test_an_empty_folder_gives_an_empty_report(tmp_path):
    bench = load_benchmark("learning/minatar_games")
    payload = bench.write_report(tmp_path, tmp_path, "report")
    assert payload["results"] == [] and "summary" not in payload
    assert not (tmp_path / "minatar_games.png").exists()


def test_runs_write_their_files_and_a_second_call_skips_them(bench_here, tmp_path, capsys):
    """Real training on a tiny budget: one PPO run (one update of the preset's 256 x 32 batch)
    and SB3's PPO on the same work."""
    bench = bench_here
    runs = tmp_path / "runs"
    common = ["--games", "Breakout", "--seeds", "1", "--steps", "256", "--runs", str(runs)]
    assert bench.main(["run", "--algos", "ppo", *common]) == 0
    assert bench.main(["run", "--algos", "ppo", "--setting", "sb3", *common]) == 0
    for setting in ("preset", "sb3"):
        written = json.loads(bench.run_file(runs, "ppo", "Breakout", setting, 1).read_text())
        assert written["meta"]["env_id"] == "MinAtar/Breakout-v0"
        assert written["summary"]["steps"] >= 8192 and written["summary"]["episodes"] > 0
        assert written["results"], "the curve has points"
    # the run file says which arithmetic the run trained in: the preset's float32
    preset = json.loads(bench.run_file(runs, "ppo", "Breakout", "preset", 1).read_text())
    assert preset["meta"]["config"]["bf16_in_force"] is False
    capsys.readouterr()
    stamp = bench.run_file(runs, "ppo", "Breakout", "preset", 1).stat().st_mtime_ns
    assert bench.main(["run", "--algos", "ppo", *common]) == 0
    assert capsys.readouterr().out == ""  # nothing left to run
    assert bench.run_file(runs, "ppo", "Breakout", "preset", 1).stat().st_mtime_ns == stamp


def test_pqn_runs_write_their_files_and_set_the_batch_claim(bench_here, tmp_path):
    """PQN's preset (one rollout of 128 envs x 32 steps) and its 32-env arm, trained for real
    on a tiny budget: each writes its run file, and the report sets the two against each other
    in the batch-size claim."""
    bench = bench_here
    runs = tmp_path / "runs"
    common = ["--games", "Breakout", "--seeds", "1", "--steps", "256", "--runs", str(runs)]
    assert bench.main(["run", "--algos", "pqn", *common]) == 0
    assert bench.main(["run", "--algos", "pqn", "--setting", "envs32", *common]) == 0
    for setting, envs in (("preset", 128), ("envs32", 32)):
        written = json.loads(bench.run_file(runs, "pqn", "Breakout", setting, 1).read_text())
        assert written["meta"]["env_id"] == "MinAtar/Breakout-v0"
        assert written["meta"]["config"]["num_envs"] == envs
        assert written["meta"]["config"]["num_minibatches"] == 32
        assert written["summary"]["steps"] == envs * 32 and written["summary"]["episodes"] > 0
    claim = bench.write_report(runs, tmp_path, "report")["summary"]["batch_claim"]
    assert [(row["algo"], row["small"], row["large"]) for row in claim] == [
        ("pqn", "envs32", "preset")
    ]
    assert (
        "| PQN | Breakout | 32 envs | 128 envs (preset) |"
        in (tmp_path / "minatar_games.md").read_text()
    )


def test_sb3_dqn_run_trains_with_the_preset_s_schedule(bench_here, tmp_path):
    """SB3's DQN on the DQN preset's work, past its learning start, so gradient steps run: the
    run file records the replay ratio held (one step of 512 per 64-env vector step) and the
    plain max target SB3 trains with."""
    bench = bench_here
    runs = tmp_path / "runs"
    argv = ["run", "--algos", "dqn", "--setting", "sb3", "--games", "Breakout", "--seeds", "1"]
    # 80 vector steps of 64 envs: the last two are past the preset's 5,000-step learning start
    assert bench.main([*argv, "--steps", "5120", "--runs", str(runs)]) == 0
    written = json.loads(bench.run_file(runs, "dqn", "Breakout", "sb3", 1).read_text())
    assert written["summary"]["steps"] >= 5120 and written["summary"]["episodes"] > 0
    config = written["meta"]["config"]
    assert config["batch_size"] == 512 and config["gradient_steps"] == 1
    assert config["double"] is False
    assert bench.arm_name("dqn", "sb3") == "SB3 DQN"


def test_minatar_original_setting_trains_as_minatar_s_own_dqn(tmp_path):
    """The ``minatar-original`` setting on the DQN preset's envs, past its learning start, in the
    child process ``run`` starts: the run file records MinAtar DQN's choices in force (a batch
    of 32 on every frame, the target every 1,000 frames, the plain max, centred RMSprop at
    2.5e-4, no clipping)."""
    bench = load_benchmark("learning/minatar_games")
    runs = tmp_path / "runs"
    argv = ["run", "--algos", "dqn", "--setting", "minatar-original", "--games", "Breakout"]
    # 80 vector steps of 64 envs pass the preset's 5,000-step learning start: 120 updates of 32
    assert bench.main([*argv, "--seeds", "1", "--steps", "5120", "--runs", str(runs)]) == 0
    written = json.loads(bench.run_file(runs, "dqn", "Breakout", "minatar-original", 1).read_text())
    assert written["summary"]["steps"] >= 5120 and written["summary"]["episodes"] > 0
    config = written["meta"]["config"]
    assert (config["batch_size"], config["replay_ratio"]) == (32, 32.0)
    assert (config["target_update_period"], config["double"]) == (1000, False)
    assert (config["optimizer"], config["learning_rate"]) == ("rmsprop", 2.5e-4)
    assert config["max_grad_norm"] == 0.0 and config["num_envs"] == 64


def test_settings_that_do_not_apply_are_refused():
    bench = load_benchmark("learning/minatar_games")
    for argv in (["--algos", "c51", "--setting", "sb3"], ["--algos", "ppo", "--setting", "batch32"],
                 ["--algos", "dqn", "--setting", "envs16"], ["--algos", "a2c", "--setting", "envs256"],
                 ["--algos", "dqn", "--setting", "envs128-mb4-bf16"],
                 ["--algos", "ppo", "--setting", "rr32"],
                 ["--algos", "c51", "--setting", "max-target"],
                 ["--algos", "rainbow", "--setting", "rmsprop"],
                 ["--algos", "ppo", "--setting", "minatar-original"],
                 ["--algos", "ppo", "--setting", "envs512"],
                 ["--algos", "pqn", "--setting", "envs16"],
                 ["--algos", "pqn", "--setting", "batch512"]):  # fmt: skip
        with pytest.raises(SystemExit):
            bench.main(["run", *argv])


def test_the_race_stops_every_arm_at_the_score(bench_here, tmp_path):
    """vecaccel's PPO and SB3's, one seed each, to a score every policy reaches at once."""
    bench = bench_here
    argv = ["race", "--game", "Breakout", "--score", "0", "--seeds", "1", "--max-steps", "40000",
            "--arms", "vecaccel-fp32", "sb3"]  # fmt: skip
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    written = load_result(tmp_path / "minatar_race.json")
    arms = ["sb3", "vecaccel-fp32"]
    assert sorted(run["library"] for run in written["results"]) == arms
    for run in written["results"]:
        # the first full window of 100 episodes reaches 0: both stop long before the budget
        assert run["reached"]["step"] == run["steps"] < 40000
    summary = written["summary"]
    assert [summary[arm]["reached"] for arm in arms] == ["1 of 1"] * 2
    ratios = summary["time_to_score_ratio"]
    assert sorted(ratios) == ["vecaccel-fp32"] and min(ratios.values()) > 0
    # each run has its own file; a second race reads them instead of running again
    files = sorted(path.name for path in (tmp_path / "minatar_race_runs").iterdir())
    assert files == [f"{arm}-Breakout-score0-s1.json" for arm in arms]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    assert load_result(tmp_path / "minatar_race.json")["results"] == written["results"]


def test_pace_times_each_preset_and_projects_a_full_run(bench_here, tmp_path):
    bench = bench_here
    argv = ["pace", "--game", "Breakout", "--algos", "dqn", "pqn", "--seeds", "1",
            "--steps", "4096", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    written = load_result(tmp_path / "minatar_pace_Breakout.json")
    assert sorted(run["algo"] for run in written["results"]) == ["dqn", "pqn"]
    for run in written["results"]:
        assert run["steps"] >= 4096 and run["steady_steps_per_s"] > 0
        # the steps past these at the steady rate
        rest = (bench.PACE_TARGET_STEPS - run["steps"]) / run["steady_steps_per_s"]
        assert run["projected_wall_s"] == pytest.approx(run["wall_s"] + rest)
    summary = written["summary"]
    ratio = summary["pqn"]["median_projected_wall_s"] / summary["dqn"]["median_projected_wall_s"]
    assert summary["projected_wall_ratio"] == {"pqn": pytest.approx(ratio)}
    files = sorted(path.name for path in (tmp_path / "minatar_pace_runs").iterdir())
    assert files == ["dqn-Breakout-steps4096-s1.json", "pqn-Breakout-steps4096-s1.json"]
