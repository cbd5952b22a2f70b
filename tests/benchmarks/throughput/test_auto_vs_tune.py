"""``benchmarks/throughput/auto_vs_tune.py``: tunes an env, times the best configuration and auto's choice
side by side, and writes the ratio with the tune table (the figures come from a long run)."""

from __future__ import annotations

import json

from tests.support.bench_scripts import run_benchmark


def test_script_writes_the_ratio(tmp_path):
    out = tmp_path / "auto.json"
    done = run_benchmark(
        "throughput/auto_vs_tune",
        *("--workload", "CartPole-v1=2", "--seconds", "0.1", "--trials", "2", "--json", str(out)),
    )
    assert done.returncode == 0, done.stderr
    (record,) = json.loads(out.read_text())["results"]
    assert record["env"] == "CartPole-v1" and record["num_envs"] == 2
    assert record["auto"].startswith("auto->")
    # the best is the fastest trial tune timed, auto's own setting among them
    assert any(row["config"] == record["best"] for row in record["tune"])
    assert len(record["auto_steps_per_s"]) == len(record["best_steps_per_s"]) == 2
    assert record["auto_over_best"] > 0
    assert any(row["config"] == record["auto"] for row in record["tune"])
