"""``benchmarks/waiting/self_scheduling.py``: every unit steps once per step, whichever chain claims it,
and the script runs under spawn (the figure itself comes from a long run)."""

from __future__ import annotations

import json

import pytest

from tests.support.bench_scripts import load_benchmark, run_benchmark

pytest.importorskip("ale_py")


@pytest.mark.parametrize("pin", [False, True])
def test_every_unit_is_claimed_once_per_step(pin):
    bench = load_benchmark("waiting/self_scheduling")
    chains = bench.Chains(units=4, heads=2, total_envs=4, pin=pin, context="fork")
    try:
        for _ in range(3):
            chains.step()
            # 2 heads started, 2 units claimed, and each chain's end claimed past the last
            assert chains.counter.value == 4 + 2
    finally:
        chains.close()
    assert not any(p.is_alive() for p in chains.procs)


def test_lockstep_is_the_case_of_one_unit_per_chain():
    bench = load_benchmark("waiting/self_scheduling")
    chains = bench.Chains(units=2, heads=2, total_envs=2, pin=False, context="fork")
    try:
        chains.step()
        assert chains.counter.value == 2 + 2  # nothing to claim: both chains end at once
    finally:
        chains.close()


def test_a_dead_unit_is_an_error_not_a_hang():
    bench = load_benchmark("waiting/self_scheduling")
    chains = bench.Chains(units=2, heads=2, total_envs=2, pin=False, context="fork")
    try:
        chains.procs[1].kill()
        chains.procs[1].join()
        with pytest.raises(RuntimeError, match="unit 1 died"):
            chains.step()
    finally:
        chains.close()


def test_units_must_divide_the_envs():
    bench = load_benchmark("waiting/self_scheduling")
    with pytest.raises(ValueError, match="divide"):
        bench.Chains(units=3, heads=2, total_envs=16, pin=False, context="fork")
    with pytest.raises(SystemExit):
        bench.main(["--units", "3"])


def test_measure_records_each_configuration():
    bench = load_benchmark("waiting/self_scheduling")
    records = bench.measure(
        [2, 4], rounds=2, steps=3, pin=False, total_envs=4, context="fork", pause=lambda: None
    )
    assert [r["units"] for r in records] == [2, 4]
    assert [r["envs_per_unit"] for r in records] == [2, 1]
    for r in records:
        assert r["steps"] == 2 and r["mean_ms"] > 0 and r["median_ms"] > 0 and not r["pin"]


def test_script_under_spawn_writes_its_records(tmp_path):
    out = tmp_path / "chains.json"
    # one env a unit: each spawned process loads one Pong ROM, not eight
    args = ["--units", "2", "--envs", "2", "--rounds", "1", "--steps", "3", "--pin", "yes"]
    proc = run_benchmark("waiting/self_scheduling", *args, "--context", "spawn", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())["results"]
    assert [(r["units"], r["envs_per_unit"], r["pin"]) for r in records] == [(2, 1, True)]
    assert all(r["steps"] == 1 for r in records)
