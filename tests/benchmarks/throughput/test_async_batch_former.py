"""``benchmarks/throughput/async_batch_former.py``: times fixed batches and the batch former in
alternating trials and writes each row's share of the ideal and the ages of its batches (the
figures come from a long run)."""

from __future__ import annotations

import json

from tests.support.bench_scripts import run_benchmark


def test_script_writes_every_row_against_the_ideal(tmp_path):
    out = tmp_path / "former.json"
    done = run_benchmark(
        "throughput/async_batch_former",
        *("--num-envs", "4", "--fixed-batch-sizes", "2", "4", "--former", "1", "4", "0.5"),
        *("--step-ms", "0.5", "--policy-ms", "0.5", "--seconds", "0.1", "--trials", "2"),
        *("--json", str(out)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads(out.read_text())
    rows = {row["config"]: row for row in written["results"]}
    assert set(rows) == {"fixed batch_size=2", "fixed batch_size=4", "former 1..4, wait 0.5 ms"}
    assert rows["fixed batch_size=2"]["mean_batch"] == 2.0
    assert rows["fixed batch_size=4"]["mean_batch"] == 4.0
    assert 1.0 <= rows["former 1..4, wait 0.5 ms"]["mean_batch"] <= 4.0
    ideal = written["summary"]["ideal_steps_per_s"]
    for row in rows.values():
        assert len(row["trials_steps_per_s"]) == 2
        assert row["share_of_ideal"] == row["steps_per_s"] / ideal
        assert 0.0 <= row["age_mean_ms"] <= row["age_max_ms"]
    assert len(written["meta"]["rounds"]) == 2
