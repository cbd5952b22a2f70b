"""``vecaccel bench``: the table, JSON and plot it writes, its workloads, and its usage errors."""

from __future__ import annotations

import importlib.util
import json
import pickle
import statistics

import pytest
import torch
from helpers import run_main

import vecaccel
from vecaccel import bench
from vecaccel.cli import main

torch.set_num_threads(1)


@pytest.mark.parametrize(
    "backend,options",
    [
        ("async", {"batch_size": 2, "num_workers": 1}),
        ("action_server", {"alternating": True, "num_workers": 1}),
    ],
    ids=["async-batch_size-2", "action_server-alternating"],
)
def test_bench_measures_backends_that_return_part_of_the_envs(backend, options):
    """``vecaccel bench`` samples actions for the envs a step returns, not ``num_envs`` whatever
    the backend, so a configuration returning fewer envs per step (``-o async.batch_size=2``)
    runs, and its rate counts the batch returned per call, not ``num_envs`` steps."""
    from vecaccel.bench import run_benchmark

    results = run_benchmark(
        "CartPole-v1",
        [4],
        backends=[backend],
        peers=[],
        seconds=0.05,
        warmup=0.0,
        backend_options={backend: options},
    )
    (entry,) = results
    assert entry["status"] == "ok", entry["reason"]
    assert entry["steps_per_s"] > 0


def test_bench_writes_table_json_and_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    peers = "raw,ceiling,gym-sync,gym-async,sb3-dummy,envpool"
    code = main(
        [
            "bench",
            "--env", "CartPole-v1",
            "--num-envs", "1,2",
            "--seconds", "0.02",
            "--warmup", "0",
            "--backends", "serial",
            "--peers", peers,
            "-o", "serial.copy=False",
            "--json", str(out_json),
            "--plot", str(out_png),
            "-q",
        ]
    )  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    assert "| CartPole-v1 | 2 | vecaccel-serial |" in table

    payload = json.loads(out_json.read_text())
    assert payload == bench.load_result(out_json)  # the one result format, as it was written
    meta = payload["meta"]
    assert meta["format"] == bench.RESULT_FORMAT and meta["benchmark"] == "vecaccel bench"
    assert meta["command"].startswith("vecaccel bench --env CartPole-v1")
    assert meta["options"]["backend_options"] == {"serial": {"copy": False}}
    results = payload["results"]
    by_key = {(r["impl"], r["num_envs"]): r for r in results}
    (ceiling,) = [r for r in results if r["impl"] == "ceiling"]
    assert meta["ceilings"] == [
        {
            "env": "CartPole-v1",
            "steps_per_s": ceiling["steps_per_s"],
            "processes": ceiling["num_envs"],
        }
    ]
    assert by_key[("raw", 1)]["status"] == "ok"
    for n in (1, 2):
        for impl in ("vecaccel-serial", "gym-sync", "gym-async"):
            entry = by_key[(impl, n)]
            assert entry["status"] == "ok", entry
            assert entry["steps_per_s"] > 0
        serial = by_key[("vecaccel-serial", n)]
        assert serial["vs_raw"] == pytest.approx(
            serial["steps_per_s"] / by_key[("raw", 1)]["steps_per_s"]
        )
        assert serial["vs_gym_sync"] > 0 and serial["vs_gym_async"] > 0
    for impl in ("sb3-dummy", "envpool"):  # optional peers: measured when installed
        assert {by_key[(impl, n)]["status"] for n in (1, 2)} <= {"ok", "skipped"}
    assert all(r["status"] != "error" for r in results), results

    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--backends", "no-such-backend", "--seconds", "0.01", "-q"]) == 2
    err = capsys.readouterr().err
    assert "no-such-backend" in err and "serial" in err
    assert main(["bench", "-o", "num_workers=2", "-q"]) == 2
    assert main(["bench", "--peers", "raw,nope", "-q"]) == 2
    assert main(["bench", "--env", "CartPole-v1,NoSuchEnv-v0", "-q"]) == 2
    assert main(["bench", "--seconds", "0", "-q"]) == 2


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


def test_default_backends_are_the_registered_ones() -> None:
    registered = vecaccel.list_backends()
    assert bench.default_backends() == [b for b in bench.DEFAULT_BACKENDS if b in registered]


def test_pong_env_function_pickles_by_reference() -> None:
    target = bench.resolve_env("PONG")
    assert pickle.loads(pickle.dumps(target.env_fn)) is bench.make_pong_env
    assert target.envpool_kwargs["frame_skip"] == 4
    assert target.envpool_kwargs["repeat_action_probability"] == 0.0


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale-py not installed")
def test_pong_preset_steps() -> None:
    env = bench.make_pong_env()
    try:
        assert env.observation_space.shape == (84, 84)
        assert env.action_space.n == 6
    finally:
        env.close()
    results = bench.run_benchmark(
        "pong", [1], backends=["serial"], peers=["raw"], seconds=0.01, warmup=0.0
    )
    assert [r["status"] for r in results] == ["ok", "ok"]


def test_bench_refuses_an_output_path_that_is_a_folder(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "--env", "CartPole-v1", "--num-envs", "2", "--backends", "serial",
                 "--peers", "none", "--seconds", "0.02", "--json", str(tmp_path), "-q"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2 and str(tmp_path) in captured.err and "folder" in captured.err
    assert "steps/s" not in captured.out  # refused before measuring


# ---------------------------------------------------------------------------------------------
# output paths and ratios


BENCH_TINY = [
    "bench", "--env", "CartPole-v1", "--num-envs", "2", "--backends", "serial",
    "--peers", "none", "--seconds", "0.02", "--warmup", "0", "-q",
]  # fmt: skip


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_output_to_a_missing_directory_is_a_clear_error(flag, tmp_path, capsys):
    """``vecaccel bench --json OUT`` into a folder that does not exist (a typo) is a usage error
    before anything runs, not a FileNotFoundError traceback (exit 1) after the whole benchmark
    that loses its results."""
    out = tmp_path / "no-such-dir" / ("out.json" if flag == "--json" else "out.png")
    try:
        code = run_main([*BENCH_TINY, flag, str(out)])
    except OSError as exc:
        pytest.fail(
            f"expected `vecaccel bench {flag} {out}` to exit 2 with an 'error' line naming the "
            f"path (checked before measuring), got a traceback: {type(exc).__name__}: {exc}"
        )
    err = capsys.readouterr().err
    assert code == 2 and str(out) in err, (code, err)


def test_bench_json_ratios_use_the_same_num_envs_baseline(tmp_path, capsys):
    """Ratios are against gym-sync at the same num_envs and the single raw env."""
    out = tmp_path / "bench.json"
    code = run_main(
        [
            "bench", "--env", "CartPole-v1", "--num-envs", "2,3", "--backends", "serial",
            "--peers", "raw,gym-sync", "--seconds", "0.02", "--warmup", "0", "-q",
            "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    payload = json.loads(out.read_text())
    assert payload["meta"]["command"].startswith("vecaccel bench")
    rows = {(r["impl"], r["num_envs"]): r for r in payload["results"]}
    raw = rows[("raw", 1)]["steps_per_s"]
    for n in (2, 3):
        mine, sync = rows[("vecaccel-serial", n)], rows[("gym-sync", n)]
        assert mine["vs_gym_sync"] == pytest.approx(mine["steps_per_s"] / sync["steps_per_s"])
        assert mine["vs_raw"] == pytest.approx(mine["steps_per_s"] / raw)
        assert sync["vs_gym_sync"] == pytest.approx(1.0) and mine["vs_gym_async"] is None


# ---------------------------------------------------------------------------------------------
# the ceiling: one process per usable CPU, each stepping its own raw env


def _row(impl: str, kind: str, num_envs: int, rate: float | None, status: str = "ok") -> dict:
    return {"env": "e", "impl": impl, "kind": kind, "num_envs": num_envs, "status": status,
            "reason": "", "steps_per_s": rate, "vs_raw": None, "vs_gym_sync": None,
            "vs_gym_async": None}  # fmt: skip


def test_the_table_shows_the_ceiling_and_shares_computed_from_the_rates():
    rows = [
        _row("raw", "raw", 1, 1000.0),
        _row("ceiling", "ceiling", 2, 1940.0),
        _row("vecaccel-shm", "vecaccel", 8, 1455.0),
        _row("vecaccel-hybrid", "vecaccel", 8, 1843.0),
        _row("gym-async", "peer", 8, None, status="error"),
    ]
    lines = bench.format_table(rows).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[3:6] == ["steps/s", "ceiling", "share of ceiling"]
    cells = {line.split("|")[3].strip(): line.split("|") for line in lines[2:6]}
    assert cells["vecaccel-shm"][5].strip() == "1,940" and cells["vecaccel-shm"][6] == " 0.75 "
    assert cells["vecaccel-hybrid"][6].strip() == f"{1843 / 1940:.2f}"
    assert cells["ceiling"][6].strip() == "1.00" and cells["raw"][6].strip() == "0.52"
    assert "gym-async num_envs=8: error" in lines[-1]
    shares = bench.shares_of_ceiling(rows)
    assert shares[("e", "vecaccel-shm", 8)] == pytest.approx(1455 / 1940)
    # without a measured ceiling the columns stay empty rather than guessing one
    no_ceiling = bench.format_table([rows[0], rows[2]]).splitlines()[3].split("|")
    assert no_ceiling[5].strip() == "" and no_ceiling[6].strip() == ""


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


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_ceiling_processes_report_their_steps_or_their_error(context):
    from toy_envs import BrokenStepEnv

    from vecaccel.bench.workloads import BenchEnv

    rate, processes = bench.measure_ceiling(
        bench.resolve_env("CartPole-v1"), 0.01, 0.0, seed=0, processes=2, context=context
    )
    assert rate > 0 and processes == 2
    broken = BenchEnv("broken", BrokenStepEnv, BrokenStepEnv)
    with pytest.raises(RuntimeError, match="this env cannot step"):
        bench.measure_ceiling(broken, 0.01, 0.0, seed=0, processes=2, context=context)


def test_the_clock_simulates_a_policys_latency_before_each_step():
    """``vecaccel tune --policy-ms`` times on this clock: each timed step waits ``policy_s``
    first, so no more than ``num_envs / policy_s`` env steps fit in a second."""
    import functools

    import gymnasium as gym

    from vecaccel.bench.timing import measure
    from vecaccel.bench.workloads import make_gym_env

    build = functools.partial(
        gym.vector.SyncVectorEnv, [functools.partial(make_gym_env, "CartPole-v1")] * 2
    )
    rate, _ = measure("gym-sync", build, 2, seconds=0.05, warmup=0.0, seed=0, policy_s=0.005)
    assert 0 < rate <= 2 / 0.005
