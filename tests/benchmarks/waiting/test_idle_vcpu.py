"""``benchmarks/waiting/idle_vcpu.py``: every kind of wait runs before its batches, in turn, and the
records hold their medians (the figure itself comes from a long run)."""

from __future__ import annotations

import time

import pytest

from tests.support.bench_scripts import load_benchmark

pytest.importorskip("ale_py")


def _load():
    return load_benchmark("waiting/idle_vcpu")


def test_each_wait_lasts_its_gap_and_each_kind_is_measured():
    bench = _load()
    for name, wait in bench.waits(0.004).items():
        start = time.perf_counter()
        wait()
        assert time.perf_counter() - start >= 0.004 - 1e-4, name
    records = bench.measure(batches=3, gap=0.002, num_envs=2, cpu=None)
    assert [r["wait"] for r in records] == list(bench.waits(0.002))
    for r in records:
        assert r["batches"] == 3 and r["num_envs"] == 2 and r["gap_ms"] == 2.0
        assert 0 < r["median_batch_ms"] and 0 < r["mean_batch_ms"]


def test_refuses_a_gap_shorter_than_its_spins():
    bench = _load()
    with pytest.raises(SystemExit):
        bench.main(["--gap-ms", "0.5"])
