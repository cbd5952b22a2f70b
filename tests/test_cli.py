"""The ``vecaccel`` command line: ``backends``, ``bench``, plugin commands, ``python -m vecaccel``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import pickle
import statistics
import subprocess
import sys
from collections.abc import Iterator

import pytest

import vecaccel
from vecaccel import bench
from vecaccel.cli import build_parser, main
from vecaccel.manager import PluginWarning, _reset_plugin_manager


@pytest.fixture
def fresh_plugin_manager() -> Iterator[None]:
    """Build the plugin manager anew for the test, and again for whatever runs next."""
    _reset_plugin_manager()
    yield
    _reset_plugin_manager()


def test_backends_lists_builtin_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "plugin", "description"]
    serial = next(line for line in lines if line.startswith("serial "))
    assert "vecaccel.plugins.serial" in serial
    assert "reference" in serial


def test_backends_json_matches_list_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == vecaccel.list_backends()


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "backends" in capsys.readouterr().out


def test_plugins_add_commands(
    fresh_plugin_manager: None, capsys: pytest.CaptureFixture[str]
) -> None:
    class HelloPlugin:
        @vecaccel.hookimpl
        def vecaccel_add_commands(self, subparsers: argparse._SubParsersAction) -> None:
            parser = subparsers.add_parser("hello", help="say hello")
            parser.add_argument("--name", default="world")
            parser.set_defaults(handler=lambda args: print(f"hello {args.name}") or 3)

    vecaccel.get_plugin_manager().register(HelloPlugin(), name="test-hello")
    assert main(["hello", "--name", "vecaccel"]) == 3
    assert capsys.readouterr().out == "hello vecaccel\n"


def test_bench_writes_table_json_and_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    peers = "raw,gym-sync,gym-async,sb3-dummy,envpool"
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
    assert payload["meta"]["command"].startswith("vecaccel bench --env CartPole-v1")
    assert payload["meta"]["options"]["backend_options"] == {"serial": {"copy": False}}
    results = payload["results"]
    by_key = {(r["impl"], r["num_envs"]): r for r in results}
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


def test_python_dash_m_vecaccel() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vecaccel", "backends"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "vecaccel.plugins.serial" in done.stdout


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vecaccel {vecaccel.__version__}"


def test_bench_refuses_an_output_path_that_is_a_folder(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "--env", "CartPole-v1", "--num-envs", "2", "--backends", "serial",
                 "--peers", "none", "--seconds", "0.02", "--json", str(tmp_path), "-q"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2 and str(tmp_path) in captured.err and "folder" in captured.err
    assert "steps/s" not in captured.out  # refused before measuring


def test_plugin_command_clash_warns_naming_the_plugin(
    fresh_plugin_manager: None, capsys: pytest.CaptureFixture[str]
) -> None:
    class TakesTune:
        @vecaccel.hookimpl
        def vecaccel_add_commands(self, subparsers: argparse._SubParsersAction) -> None:
            subparsers.add_parser("tune").set_defaults(handler=lambda args: 7)

    vecaccel.get_plugin_manager().register(TakesTune(), name="test-takes-tune")
    with pytest.warns(PluginWarning, match="'test-takes-tune'.*VECACCEL_DISABLE"):
        parser = build_parser()
    from vecaccel import tune

    assert parser.parse_args(["tune", "CartPole-v1"]).handler is tune.main  # the built-in kept
