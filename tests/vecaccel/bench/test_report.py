"""The report of a benchmark run: shares of the ceiling from the rates themselves, one table
row per measured configuration with the failed ones noted below it, the machine described,
and a plot written."""

from __future__ import annotations

import json

import pytest

from vecaccel.bench.report import format_table, machine_info, plot_results, shares_of_ceiling


def _row(env: str, impl: str, kind: str, num_envs: int, rate: float | None, **extra) -> dict:
    return {
        "env": env,
        "impl": impl,
        "kind": kind,
        "num_envs": num_envs,
        "status": "ok" if rate else "skipped",
        "reason": "" if rate else "envpool is not installed",
        "steps_per_s": rate,
        "vs_raw": extra.get("vs_raw"),
        "vs_gym_sync": extra.get("vs_gym_sync"),
        "vs_gym_async": None,
    }


RESULTS = [
    _row("CartPole-v1", "raw", "raw", 1, 50_000.0, vs_raw=1.0),
    _row("CartPole-v1", "ceiling", "ceiling", 2, 100_000.0, vs_raw=2.0),
    _row("CartPole-v1", "vecaccel-shm", "vecaccel", 16, 80_000.0, vs_raw=1.6, vs_gym_sync=2.5),
    _row("CartPole-v1", "envpool", "peer", 16, None),
    _row("Pendulum-v1", "vecaccel-shm", "vecaccel", 16, 9_000.0),  # no ceiling measured
]


def test_shares_are_each_rate_over_its_envs_ceiling() -> None:
    shares = shares_of_ceiling(RESULTS)
    assert shares[("CartPole-v1", "vecaccel-shm", 16)] == pytest.approx(0.8)
    assert shares[("CartPole-v1", "raw", 1)] == pytest.approx(0.5)
    assert ("Pendulum-v1", "vecaccel-shm", 16) not in shares
    assert ("CartPole-v1", "envpool", 16) not in shares


def test_the_table_has_a_row_per_measured_configuration_and_notes_the_rest() -> None:
    lines = format_table(RESULTS).splitlines()
    header, rule, *rows = lines[: lines.index("")]
    assert header.count("|") == rule.count("|") == 10
    assert len(rows) == 4
    assert "| CartPole-v1 | 16 | vecaccel-shm | 80,000 | 100,000 | 0.80 | 1.60 | 2.50 |  |" in rows
    assert "| Pendulum-v1 | 16 | vecaccel-shm | 9,000 |  |  |  |  |  |" in rows
    assert lines[-1] == ("- CartPole-v1 envpool num_envs=16: skipped (envpool is not installed)")


def test_the_machine_is_described_in_plain_data() -> None:
    info = machine_info()
    assert json.loads(json.dumps(info)) == info
    assert info["usable_cpus"] >= 1 and info["versions"]["gymnasium"]


def test_the_plot_is_written(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    plot_results(RESULTS, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _rate_row(impl: str, kind: str, num_envs: int, rate: float | None, status: str = "ok") -> dict:
    return {"env": "e", "impl": impl, "kind": kind, "num_envs": num_envs, "status": status,
            "reason": "", "steps_per_s": rate, "vs_raw": None, "vs_gym_sync": None,
            "vs_gym_async": None}  # fmt: skip


def test_the_table_shows_the_ceiling_and_shares_computed_from_the_rates():
    rows = [
        _rate_row("raw", "raw", 1, 1000.0),
        _rate_row("ceiling", "ceiling", 2, 1940.0),
        _rate_row("vecaccel-shm", "vecaccel", 8, 1455.0),
        _rate_row("vecaccel-hybrid", "vecaccel", 8, 1843.0),
        _rate_row("gym-async", "peer", 8, None, status="error"),
    ]
    lines = format_table(rows).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[3:6] == ["steps/s", "ceiling", "share of ceiling"]
    cells = {line.split("|")[3].strip(): line.split("|") for line in lines[2:6]}
    assert cells["vecaccel-shm"][5].strip() == "1,940" and cells["vecaccel-shm"][6] == " 0.75 "
    assert cells["vecaccel-hybrid"][6].strip() == f"{1843 / 1940:.2f}"
    assert cells["ceiling"][6].strip() == "1.00" and cells["raw"][6].strip() == "0.52"
    assert "gym-async num_envs=8: error" in lines[-1]
    shares = shares_of_ceiling(rows)
    assert shares[("e", "vecaccel-shm", 8)] == pytest.approx(1455 / 1940)
    # without a measured ceiling the columns stay empty rather than guessing one
    no_ceiling = format_table([rows[0], rows[2]]).splitlines()[3].split("|")
    assert no_ceiling[5].strip() == "" and no_ceiling[6].strip() == ""
