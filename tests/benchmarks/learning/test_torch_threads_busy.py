"""``benchmarks/learning/torch_threads_busy.py``: its busy loops are other processes that end with
the block, and the summary sets the default beside the best fixed count of each condition (the
figure itself comes from a long run)."""

from __future__ import annotations

import os
import time

import pytest

from tests.support.bench_scripts import load_benchmark


def _load():
    return load_benchmark("learning/torch_threads_busy")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_busy_loops_are_not_children_and_end_with_the_block():
    bench = _load()
    with bench.busy_loops(2) as pids:
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        for pid in pids:
            with open(f"/proc/{pid}/stat") as stat:
                assert int(stat.read().split(") ")[1].split()[1]) != os.getpid()
    deadline = time.monotonic() + 10.0  # SIGKILL lands, then init reaps them
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_busy_loops_started_by_setsid_lead_their_own_group():
    bench = _load()
    mine = os.getsid(0)
    with bench.busy_loops(1, nice=19, setsid=True) as (pid,):
        assert os.getsid(pid) == pid != mine  # setsid made it the leader of its own
    with bench.busy_loops(1) as (pid,):
        assert os.getsid(pid) == mine


def test_the_summary_compares_the_default_with_the_best_fixed_count():
    bench = _load()
    rows = [
        {"game": "minatar", "busy": busy, "threads": threads, "steps_per_s": sps}
        for busy, threads, sps in [
            (0, 0, 900.0), (0, 1, 500.0), (0, 2, 1000.0),
            (1, 0, 480.0), (1, 1, 500.0), (1, 1, 500.0), (1, 2, 50.0),
        ]
    ]  # fmt: skip
    quiet, busy = bench.summarize(rows, [0, 1, 2])
    assert (quiet["busy"], quiet["best_fixed"]) == (0, 2)
    assert quiet["default_vs_best"] == pytest.approx(0.9)
    assert quiet["one_thread_vs_best"] == pytest.approx(0.5)
    assert (busy["best_fixed"], busy["default_vs_best"]) == (1, pytest.approx(0.96))
    assert busy["steps_per_s"] == {"0": 480.0, "1": 500.0, "2": 50.0}


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_niced_training_run_keeps_a_core_busy_and_ends_with_the_block():
    bench = _load()
    with bench.busy_loops(1, nice=19, kind="train") as (pid,):
        assert _alive(pid)
        with open(f"/proc/{pid}/stat") as stat:
            assert int(stat.read().split(") ")[1].split()[16]) == 19  # its nice value
        with open(f"/proc/{pid}/cmdline") as cmdline:
            assert "train\0pqn" in cmdline.read()
    deadline = time.monotonic() + 10.0
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
