"""``benchmarks/throughput/max_concurrency.py``: times envs that share one lock with and without
``max_concurrency=1`` and writes each row's share of the ideal; the cap lets one env into
``step`` at a time, the lock one env hold it (the figures come from a long run)."""

from __future__ import annotations

import json

from tests.support.bench_scripts import run_benchmark


def test_script_writes_both_rows_and_the_cap_holds(tmp_path):
    out = tmp_path / "cap.json"
    done = run_benchmark(
        "throughput/max_concurrency",
        *("--num-envs", "3", "--hold-ms", "1", "--seconds", "0.1", "--trials", "2"),
        *("--json", str(out)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(out.read_text())
    rows = {row["config"]: row for row in written["results"]}
    assert set(rows) == {"no cap", "max_concurrency=1"}
    assert rows["max_concurrency=1"]["most_inside_step"] == 1
    assert all(row["most_holding_lock"] == 1 for row in rows.values())
    ideal = written["summary"]["ideal_steps_per_s"]
    for row in rows.values():
        assert len(row["trials_steps_per_s"]) == 2
        assert row["share_of_ideal"] == row["steps_per_s"] / ideal
        assert row["steps_per_s"] > 0 and row["hold_ms"] >= 1.0
