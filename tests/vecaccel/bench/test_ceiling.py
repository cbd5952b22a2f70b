"""``vecaccel bench --vectorized``: batched simulators beside their native vector env, against the
ceiling of one native vector env per usable CPU."""

from __future__ import annotations

import pytest
from helpers import run_main
from toy_vector_envs import not_a_vector_env

from vecaccel.bench import load_result, run_benchmark
from vecaccel.bench.ceiling import measure_vector_ceiling


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


def test_a_failing_ceiling_process_is_reported():
    with pytest.raises(RuntimeError, match="ceiling measurement failed"):
        measure_vector_ceiling(not_a_vector_env, 4, 0.01, 0.0, 0, processes=2)


def test_the_command_line_takes_vectorized(capsys, tmp_path):
    out_json = tmp_path / "bench.json"
    code = run_main(
        [
            "bench",
            "--vectorized",
            "--num-envs",
            "4",
            "--backends",
            "serial",
            "--peers",
            "none",
            "--seconds",
            "0.02",
            "--warmup",
            "0",
            "-q",
            "--json",
            str(out_json),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "native vector env" in out and "| native |" in out
    written = load_result(out_json)
    (ceiling,) = [r for r in written["results"] if r["impl"] == "ceiling"]
    (noted,) = written["meta"]["ceilings"]
    assert noted["vector_env"] is True and noted["num_envs"] == 4
    assert noted["steps_per_s"] == ceiling["steps_per_s"] and 1 <= noted["processes"] <= 4
