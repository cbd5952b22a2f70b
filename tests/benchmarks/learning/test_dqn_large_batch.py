"""``benchmarks/learning/dqn_large_batch.py`` end to end on a tiny budget."""

from __future__ import annotations

from bench_scripts import load_benchmark

from vecaccel.bench import load_result


def test_a_run_stopped_before_learning_starts_is_reported_into_out(tmp_path):
    """The threshold is met before the first gradient update: no replay ratio and no smoothed
    curve yet. The report says so instead of crashing, and lands in ``--out``, leaving the
    committed results alone."""
    bench = load_benchmark("learning/dqn_large_batch")
    committed = {p.name: p.stat().st_mtime_ns for p in bench.RESULTS.glob("dqn_large_batch.*")}
    args = ["--seeds", "1", "--batch-sizes", "32", "64", "--threshold", "5", "--window", "2"]
    # --in-process: the runs share this interpreter (the harness's child processes are tested
    # in test_bench_record.py)
    args += ["--max-steps", "300", "--in-process", "--out", str(tmp_path)]
    assert bench.main(args) == 0
    written = load_result(tmp_path / "dqn_large_batch.json")
    assert (
        written["meta"]["in_process"] and written["meta"]["benchmark"] == "learning/dqn_large_batch"
    )
    results = written["results"]
    assert [run["solved"] for run in results] == [True, True]
    assert all(run["updates"] == 0 and run["replay_ratio"] is None for run in results)
    rows = [line for line in (tmp_path / "dqn_large_batch.md").read_text().splitlines()]
    runs = [row for row in rows if row.startswith("| 32 |") or row.startswith("| 64 |")][:2]
    assert all(
        row.split("|")[6].strip() == "0" and row.split("|")[8].strip() == "-" for row in runs
    )
    assert (tmp_path / "dqn_large_batch.png").exists()
    assert {
        p.name: p.stat().st_mtime_ns for p in bench.RESULTS.glob("dqn_large_batch.*")
    } == committed
