"""``benchmarks/waiting/lockstep_designs.py``: the bare lock-step answers every step and exits, and the
script measures the designs it is asked for and writes their record (the figures come from a
long run)."""

from __future__ import annotations

import json

import pytest

from tests.support.bench_scripts import load_benchmark, run_benchmark


@pytest.mark.parametrize("spin", [False, True])
def test_bare_lockstep_steps_and_exits(spin):
    bench = load_benchmark("waiting/lockstep_designs")
    env_fn = bench.resolve_env("CartPole-v1").env_fn
    impl = bench.BareLockstep(env_fn, num_envs=3, processes=2, spin=spin)
    try:
        for _ in range(5):
            impl.step()
        assert len(impl.worker_pids()) == 2
    finally:
        impl.close()
    assert all(not proc.is_alive() for proc in impl.procs)


def test_script_writes_its_record(tmp_path):
    out = tmp_path / "designs.json"
    only = ["bare lock-step, block", "shm, workers spin 300 µs", "async, batch 1"]
    done = run_benchmark(
        "waiting/lockstep_designs",
        *("--workload", "CartPole-v1=2", "--seconds", "0.3", "--warmup", "0.1"),
        *("--trials", "1"),
        *(arg for name in only for arg in ("--only", name)),
        *("--json", str(out)),
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["results"]
    measured = {row["design"]: row for row in rows if "share_of_ceiling" in row}
    assert set(measured) == set(only)
    for row in measured.values():
        assert row["steps_per_s"] > 0 and row["share_of_ceiling"] > 0
    assert any(row["design"] == "ceiling" for row in rows)
