"""``benchmarks/throughput/auto_vectorized.py``: times auto beside the simple ways in alternating
trials, records each trial's choice, and leaves the EnvPool row pending without EnvPool (the
figures come from a long run)."""

from __future__ import annotations

import importlib.util
import json

from tests.support.bench_scripts import load_benchmark, run_benchmark


def test_script_writes_every_trial_and_auto_against_the_better_simple_way(tmp_path):
    out = tmp_path / "auto.json"
    done = run_benchmark(
        "throughput/auto_vectorized",
        *("--num-envs", "64", "--seconds", "0.05", "--warmup", "0", "--trials", "2"),
        *("--pong", "--json", str(out)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(out.read_text())
    rows = {row.get("impl"): row for row in written["results"] if row.get("num_envs") == 64}
    assert set(rows) >= {"native", "shm", "hybrid", "auto", "ceiling"}
    assert all(len(rows[name]["trials"]) == 2 for name in rows)
    assert rows["auto"]["x_better_simple"] > 0
    choices = written["meta"]["auto_choices"]["CartPole-v1 n=64"]
    assert len(choices) == 2 and all(choice.startswith("serial") for choice in choices)
    assert written["summary"]["CartPole-v1 n=64"] == rows["auto"]["x_better_simple"]
    if importlib.util.find_spec("envpool") is None:
        (pending,) = [row for row in written["results"] if "pending" in row]
        assert "EnvPool is not installed" in pending["pending"]
    else:  # which backend auto picks for EnvPool depends on its measured threads: only recorded
        pong = written["meta"]["auto_choices"]["Pong-v5 (EnvPool) n=16"]
        assert len(pong) == 2
        assert all(choice.split("(")[0] in {"serial", "shm", "hybrid"} for choice in pong), pong


def test_the_summary_compares_best_with_best_and_median_with_median():
    module = load_benchmark("throughput/auto_vectorized")
    trials = {
        ("E", 4, "native"): [10.0, 6.0, 8.0],
        ("E", 4, "shm"): [4.0, 12.0, 5.0],
        ("E", 4, "auto"): [9.0, 9.0, 3.0],
    }
    rows = {row["impl"]: row for row in module.summarize(trials)}
    assert rows["auto"]["x_better_simple"] == 9.0 / 12.0
    assert rows["auto"]["x_better_simple_median"] == 9.0 / 8.0
    assert rows["shm"]["x_native"] == 12.0 / 10.0
