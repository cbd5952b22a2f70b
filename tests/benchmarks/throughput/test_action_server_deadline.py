"""``benchmarks/throughput/action_server_deadline.py``: times every env at once, fixed halves
and the deadline in alternating trials and writes each row's share of the ideal and the ages of
its batches (the figures come from a long run)."""

from __future__ import annotations

import json

import pytest

from tests.support.bench_scripts import load_benchmark


def test_script_writes_every_row_against_the_ideal(tmp_path):
    out = tmp_path / "deadline.json"
    # in this process: the script's start-up (torch) would cost more than its 0.6 s of trials
    bench = load_benchmark("throughput/action_server_deadline")
    done = bench.main(
        [
            *("--num-envs", "4", "--deadline", "1", "4", "0.5", "--step-ms", "0.5"),
            *("--policy-ms", "0.5", "--policy-per-env-ms", "0.1", "--seconds", "0.1"),
            *("--trials", "2", "--json", str(out)),
        ]
    )
    assert done == 0
    written = json.loads(out.read_text())
    rows = {row["config"]: row for row in written["results"]}
    assert set(rows) == {"every env at once", "alternating halves", "deadline 1..4, wait 0.5 ms"}
    assert rows["every env at once"]["mean_batch"] == 4.0
    assert rows["alternating halves"]["mean_batch"] == 2.0
    assert 1.0 <= rows["deadline 1..4, wait 0.5 ms"]["mean_batch"] <= 4.0
    summary = written["summary"]
    ideal = summary["ideal_steps_per_s"]
    assert 0.0 < summary["ideal_batch"] <= 4.0  # b* lies below num_envs
    for r in written["meta"]["rounds"]:  # each round's ideal from its own inputs
        per_env_step_ms = r["mean_step_ms"] + r["c0_ms"] + r["c1_ms"] * r["ideal_batch"]
        assert r["ideal_steps_per_s"] == pytest.approx(4 / per_env_step_ms * 1e3)
    for row in rows.values():
        assert len(row["trials_steps_per_s"]) == 2
        assert row["share_of_ideal"] == row["steps_per_s"] / ideal
        assert 0.0 <= row["age_mean_ms"] <= row["age_max_ms"]
        assert row["step_ms"] >= 0.5
    assert rows["every env at once"]["age_max_ms"] > 0.0  # fixed batches give their ages too
    assert len(written["meta"]["rounds"]) == 2
