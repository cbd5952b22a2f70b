"""One benchmark run over backends, peers and ``num_envs``: the median over repeats, skipped and
failed implementations reported beside the measured ones, the ceiling measured in the same run
(one per ``num_envs`` for batched simulators) with each rate's share of it, and the arguments
refused before anything is measured."""

from __future__ import annotations

import statistics

import pytest

import vecaccel
from vecaccel import bench
from vecaccel.bench import run_benchmark
from vecaccel.bench.sweep import parse_list, parse_workloads


def test_run_benchmark_repeats_and_reports_skips() -> None:
    results = bench.run_benchmark(
        "CartPole-v1",
        [2],
        backends=["serial"],
        peers=["raw", "gym-sync"],
        seconds=0.01,
        warmup=0.0,
        repeat=2,
    )
    assert [(r["impl"], r["status"]) for r in results] == [
        ("raw", "ok"),
        ("vecaccel-serial", "ok"),
        ("gym-sync", "ok"),
    ]
    for entry in results:
        assert len(entry["samples"]) == 2
        assert entry["steps_per_s"] == pytest.approx(statistics.median(entry["samples"]))

    table = bench.format_table(
        [*results, {**results[0], "impl": "envpool", "status": "skipped", "reason": "absent"}]
    )
    assert "envpool num_envs=1: skipped (absent)" in table


def test_a_failing_implementation_is_reported_and_the_others_are_measured() -> None:
    lines: list[str] = []
    results = run_benchmark(
        "CartPole-v1",
        [2],
        backends=["serial"],
        peers=["gym-sync"],
        seconds=0.01,
        warmup=0.0,
        repeat=2,
        backend_options={"serial": {"no_such_option": 1}},
        progress=lines.append,
    )
    rows = {r["impl"]: r for r in results}
    failed = rows["vecaccel-serial"]
    assert failed["status"] == "error" and "no_such_option" in failed["reason"]
    assert failed["steps_per_s"] is None and failed["share_of_ceiling"] is None
    assert rows["gym-sync"]["status"] == "ok" and len(rows["gym-sync"]["samples"]) == 2
    # a failed implementation is not tried again in the next repeat
    assert sum("vecaccel-serial" in line for line in lines) == 1, lines


def test_default_backends_are_the_registered_ones() -> None:
    registered = vecaccel.list_backends()
    assert bench.default_backends() == [b for b in bench.DEFAULT_BACKENDS if b in registered]


def test_run_benchmark_measures_the_ceiling_in_the_same_run_and_each_share():
    from vecaccel.worker import usable_cpus

    results = bench.run_benchmark(
        "CartPole-v1",
        [2],
        backends=["serial"],
        peers=["raw", "ceiling"],
        seconds=0.02,
        warmup=0.0,
        repeat=2,
    )
    rows = {r["impl"]: r for r in results}
    ceiling = rows["ceiling"]
    assert ceiling["status"] == "ok" and ceiling["kind"] == "ceiling", ceiling
    assert ceiling["num_envs"] == usable_cpus() and len(ceiling["samples"]) == 2
    for entry in results:
        assert entry["ceiling_steps_per_s"] == ceiling["steps_per_s"]
        assert entry["share_of_ceiling"] == pytest.approx(
            entry["steps_per_s"] / ceiling["steps_per_s"]
        )
    assert rows["ceiling"]["vs_raw"] == pytest.approx(
        ceiling["steps_per_s"] / rows["raw"]["steps_per_s"]
    )


# ---------------------------------------------------------------------------------------------
# batched simulators: beside their native vector env, a ceiling per num_envs


def test_vectorized_sweep_has_a_ceiling_per_num_envs():
    results = run_benchmark(
        "CartPole-v1",
        [4, 8],
        backends=["serial", "shm"],
        peers=[],
        seconds=0.02,
        warmup=0.0,
        backend_options={"shm": {"num_workers": 2}},
        vectorized=True,
    )
    found = {(r["impl"], r["num_envs"]): r for r in results}
    assert set(found) == {
        (impl, n)
        for impl in ("ceiling", "native", "vecaccel-serial", "vecaccel-shm")
        for n in (4, 8)
    }
    assert all(r["status"] == "ok" for r in results), [r["reason"] for r in results]
    for n in (4, 8):
        ceiling = found[("ceiling", n)]["steps_per_s"]
        shm = found[("vecaccel-shm", n)]
        assert shm["ceiling_steps_per_s"] == ceiling
        assert shm["share_of_ceiling"] == pytest.approx(shm["steps_per_s"] / ceiling)


def test_vectorized_needs_a_vector_entry_point():
    with pytest.raises(ValueError, match="no vector_entry_point"):
        run_benchmark("Acrobot-v1", [4], backends=["serial"], peers=[], vectorized=True)


# ---------------------------------------------------------------------------------------------
# arguments


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"backends": ["no-such-backend"]}, "no-such-backend"),
        ({"peers": ["raw", "nope"]}, "unknown peer"),
        ({"num_envs_list": [2, 0]}, "num_envs must be positive"),
        ({"num_envs_list": []}, "num_envs must be positive"),
        ({"seconds": 0}, "seconds must be positive"),
        ({"warmup": -1.0}, "warmup not negative"),
        ({"repeat": 0}, "repeat must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_measured(arguments, message):
    lines: list[str] = []
    settings = {"num_envs_list": [2], "backends": ["serial"], "peers": ["raw"], "seconds": 0.01}
    with pytest.raises(ValueError, match=message):
        run_benchmark("CartPole-v1", progress=lines.append, **{**settings, **arguments})
    assert lines == []


def test_lists_and_workloads_are_parsed_from_their_command_line_spelling():
    assert parse_list(" shm,, async ,") == ["shm", "async"]
    assert parse_list(("shm",)) == ["shm"] and parse_list(None) is None
    assert parse_workloads(["pong=8,16", "CartPole-v1=2"], {}) == {
        "pong": [8, 16],
        "CartPole-v1": [2],
    }
    default = {"pong": [8]}
    assert parse_workloads([], default) == default and parse_workloads(None, default) is not default
    for bad in ("pong", "pong=8,x", "=8", "pong="):
        with pytest.raises(ValueError, match="a workload is ENV=N1,N2"):
            parse_workloads([bad], {})
