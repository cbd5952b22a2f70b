"""``vecaccel bench``: the table, JSON and plot it writes, its ratios, ``--vectorized``, and its
usage errors."""

from __future__ import annotations

import json

import pytest
from helpers import run_main

from vecaccel import bench
from vecaccel.bench import load_result
from vecaccel.cli import main


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


def test_the_command_line_takes_vectorized(capsys, tmp_path):
    out_json = tmp_path / "bench.json"
    code = run_main(
        [
            "bench", "--vectorized", "--num-envs", "4", "--backends", "serial", "--peers", "none",
            "--seconds", "0.02", "--warmup", "0", "-q", "--json", str(out_json),
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "native vector env" in out and "| native |" in out
    written = load_result(out_json)
    (ceiling,) = [r for r in written["results"] if r["impl"] == "ceiling"]
    (noted,) = written["meta"]["ceilings"]
    assert noted["vector_env"] is True and noted["num_envs"] == 4
    assert noted["steps_per_s"] == ceiling["steps_per_s"] and 1 <= noted["processes"] <= 4
