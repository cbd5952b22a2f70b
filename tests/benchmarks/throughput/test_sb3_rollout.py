"""``benchmarks/throughput/sb3_rollout.py``: its interleaved mode runs, pairs updates, and refuses rounds.

The figures themselves come from long runs; here a tiny CartPole configuration checks that
every configuration gets its updates, in rotating order, and that the paired ratios are the
per-update quotients of the rates the records hold."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.support.bench_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("throughput/sb3_rollout")


def test_paired_ratios_are_per_update_quotients(bench):
    records = [
        {"vec_env": "subproc", "rollout_sps_per_update": [100.0, 200.0, 50.0]},
        {"vec_env": "vecaccel-shm", "rollout_sps_per_update": [130.0, 220.0, 80.0]},
    ]
    bench.add_paired_ratios(records)
    shm = records[1]
    assert shm["paired_x_subproc"] == [1.3, 1.1, 1.6]
    assert shm["paired_x_subproc_median"] == 1.3
    assert records[0]["paired_x_subproc"] == [1.0, 1.0, 1.0]
    assert "paired_x_dummy" not in shm  # no DummyVecEnv in this run


def test_interleave_refuses_rounds(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--interleave", "--rounds", "2"])


def test_interleaved_run_times_every_configuration(bench, tmp_path, leak_check):
    out = tmp_path / "run.json"
    args = [
        "--interleave",
        "--workloads",
        "cartpole",
        "--vec-envs",
        "dummy,vecaccel-shm",
        "--updates",
        "3",
        "--n-envs",
        "2",
        "--n-steps",
        "16",
        "--n-epochs",
        "1",
        "--batch-size",
        "16",
        "--json",
        str(out),
    ]
    assert bench.main(args) == 0
    records = {r["vec_env"]: r for r in json.loads(out.read_text())["results"]}
    assert set(records) == {"dummy", "vecaccel-shm"}
    for record in records.values():
        assert record["updates"] == 3 and record["steps"] == 3 * 2 * 16
        assert len(record["rollout_sps_per_update"]) == 3
        assert (
            record["rollout_seconds"] > 0 and record["learn_seconds"] >= record["rollout_seconds"]
        )
    shm = records["vecaccel-shm"]
    expected = [
        a / b
        for a, b in zip(shm["rollout_sps_per_update"], records["dummy"]["rollout_sps_per_update"])
    ]
    assert shm["paired_x_dummy"] == pytest.approx(expected, abs=1e-3)
    assert shm["paired_x_dummy_median"] == pytest.approx(statistics.median(expected), abs=1e-3)
