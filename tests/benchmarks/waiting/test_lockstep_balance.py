"""``benchmarks/waiting/lockstep_balance.py``: pinned stepper processes answer every batch, and the
summary's figures follow from the per-batch times (the figure itself comes from a long run)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.bench_scripts import load_benchmark, run_benchmark

pytest.importorskip("ale_py")


def test_summary_of_known_times():
    bench = load_benchmark("waiting/lockstep_balance")
    times = np.array([[0.004, 0.008], [0.004, 0.008], [0.008, 0.004], [0.006, 0.006]])
    record = bench.summarize(times)
    assert record["batches"] == 4 and record["workers"] == 2
    assert record["per_worker_mean_ms"] == [5.5, 6.5]
    assert record["lockstep_ms"] == 7.5  # the slower worker of each batch
    assert record["balanced_ms"] == 6.0
    assert record["penalty"] == 1.25
    assert record["share_over_1.3x"] == 0.75
    # differences -4, -4, +4, 0 ms: lag-1 pairs (-4,-4), (-4,4), (4,0)
    assert record["lag1_corr"] == pytest.approx(np.corrcoef([-4, -4, 4], [-4, 4, 0])[0, 1], 1e-3)


def test_steppers_answer_every_batch_and_exit():
    bench = load_benchmark("waiting/lockstep_balance")
    times = bench.measure(batches=3, gap=0.001, num_envs=1, workers=2, context="fork")
    assert times.shape == (3, 2)
    assert (times > 0).all()
    record = bench.summarize(times)
    assert record["penalty"] >= 1.0
    assert record["lockstep_ms"] >= record["balanced_ms"]


def test_script_under_spawn_writes_its_record(tmp_path):
    out = tmp_path / "lockstep.json"
    # one spawned stepper a pause: two workers under fork are the test above's
    args = ["--batches", "3", "--num-envs", "1", "--workers", "1", "--gap-ms", "1"]
    args += ["--pause", "sleep,forward", "--context", "spawn", "--json", str(out)]
    proc = run_benchmark("waiting/lockstep_balance", *args)
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())["results"]
    assert [r["pause"] for r in records] == ["sleep", "forward"]
    assert [r["gap_ms"] for r in records] == [1.0, None]
    for record in records:
        assert record["batches"] == 3 and record["workers"] == 1 and record["num_envs"] == 1


def test_pins_distinct_cpus_where_it_can():
    bench = load_benchmark("waiting/lockstep_balance")
    cpus = bench.cpus_to_pin(2)
    assert len(cpus) == 2
    if None not in cpus and len(set(bench.os.sched_getaffinity(0))) >= 2:
        assert len(set(cpus)) == 2


@pytest.mark.parametrize("argv", [["--batches", "0"], ["--pause", "sleep,nap"]])
def test_refuses_bad_arguments(argv):
    bench = load_benchmark("waiting/lockstep_balance")
    with pytest.raises(SystemExit):
        bench.main(argv)


def test_measure_names_an_unknown_pause():
    bench = load_benchmark("waiting/lockstep_balance")
    with pytest.raises(ValueError, match="nap"):
        bench.measure(batches=1, gap=0.0, num_envs=1, workers=1, pause="nap")
