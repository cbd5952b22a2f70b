"""``benchmarks/gpu/gpu_run.py --smoke``: every part of the GPU benchmark, run on the CPU."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from bench_scripts import load_benchmark

from vecaccel.bench import RESULT_FORMAT, load_result

pytest.importorskip("ale_py")

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
    "benchmarks",
    "gpu",
    "gpu_run.py",
)


#: below ``--smoke``'s own sizes: each timed loop 0.1 s, 2 envs (one a half) in the two action
#: server parts and in PPO, 64 transitions before DQN's updates, PPO's 2 x 16 samples in one
#: minibatch (each of its updates is a second or more of CPU under bf16)
SMALLER = ("--seconds", "0.1", "--check-envs", "2", "--server-envs", "2", "--dqn-fill", "64",
           "--ppo-envs", "2", "--ppo-minibatch", "32")  # fmt: skip


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=280
    )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_run")
    completed = run_script("--smoke", *SMALLER, str(out))
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = load_result(out / "gpu_run.json")
    return out, report, {record["part"]: record for record in report["results"]}


def test_smoke_runs_every_part_and_writes_one_json_and_one_plot(smoke):
    out, report, parts = smoke
    assert sorted(os.listdir(out)) == ["gpu_run.json", "gpu_run.png"]
    assert (out / "gpu_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meta = report["meta"]
    assert meta["format"] == RESULT_FORMAT and meta["benchmark"] == "gpu/gpu_run"
    assert meta["complete"] is True
    assert meta["device"] == "cpu" and meta["cuda_version"] == torch.version.cuda
    # ``nice -n N`` in front when the test runs niced
    assert re.match(r"(nice -n \d+ )?python benchmarks/gpu/gpu_run\.py --smoke ", meta["command"])
    assert meta["usable_cpus"] >= 1 and meta["versions"]["vecaccel"]
    assert [r["part"] for r in report["results"]] == ["check", "action_server", "dqn", "ppo"]
    for record in parts.values():
        assert record["status"] == "ok", record
        assert record["seconds"] > 0
        # no GPU: no memory figure and no busy share, rather than zeros
        assert record["max_memory_allocated_bytes"] is None
        assert record["gpu_busy_share"] is None and record["gpu_busy_samples"] == 0


def test_check_part_reports_the_action_server_checks_and_both_rates(smoke):
    _, _, parts = smoke
    check = parts["check"]
    assert check["checks"] == {
        "device": "cpu",
        "num_envs": 2,
        "steps": 30,
        "pinned_staging": None,
        "halves_exact": True,
    }
    rates = check["steps_per_s"]
    assert set(rates) == {"alternating=False", "alternating=True"}
    assert all(rate > 0 for rate in rates.values())


def test_action_server_part_compares_three_loops_with_the_same_policy(smoke):
    _, _, parts = smoke
    server = parts["action_server"]
    rates = server["steps_per_s"]
    assert set(rates) == {"shm", "action_server", "action_server_alternating"}
    assert all(rate > 0 for rate in rates.values())
    assert math.isclose(
        server["alternating_vs_shm"], rates["action_server_alternating"] / rates["shm"]
    )
    # the parts alone, and the bounds they set
    assert server["env_step_ms"] > 0 and server["forward_ms"] > 0
    slower = max(server["env_step_ms"], server["forward_ms"]) / 1e3
    assert math.isclose(server["overlap_bound_steps_per_s"], 2 / slower)
    assert server["serial_bound_steps_per_s"] < server["overlap_bound_steps_per_s"]


def test_ppo_part_trains_with_bf16_channels_last_and_a_scaled_learning_rate(smoke):
    _, _, parts = smoke
    ppo = parts["ppo"]
    settings = ppo["settings"]
    assert settings["bf16"] is True and settings["channels_last"] is True
    assert settings["alternating"] is True
    assert settings["batch_size"] == 2 * 16
    assert math.isclose(settings["lr_scale"], math.sqrt(32 / 1024))
    curve = ppo["curve"]
    assert curve, "no update recorded"
    # the run stops at the first update past its wall-clock budget: every point is one update
    assert [p["updates"] for p in curve] == list(range(1, len(curve) + 1))
    assert [p["agent_steps"] for p in curve] == [32 * p["updates"] for p in curve]
    assert all(a["seconds"] < b["seconds"] for a, b in zip(curve, curve[1:]))
    assert ppo["agent_steps"] == curve[-1]["agent_steps"]
    assert ppo["sps"] > 0 and 0 < ppo["update_share"] < 1
    for point in curve:  # Pong episodes outlast a smoke run; a return, when there is one, is one
        assert point["running_mean_return"] is None or -21 <= point["running_mean_return"] <= 21


def test_dqn_part_measures_each_batch_size(smoke):
    _, _, parts = smoke
    dqn = parts["dqn"]
    assert [row["batch_size"] for row in dqn["rates"]] == [8, 32]
    for row in dqn["rates"]:
        assert row["updates"] >= 1 and row["updates_per_s"] > 0 and row["update_only_per_s"] > 0
        assert math.isclose(row["samples_per_s"], row["updates_per_s"] * row["batch_size"])
    assert dqn["settings"]["categorical"] is True  # the atari-c51 preset


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_without_cuda_a_full_run_refuses_and_names_the_way_out(tmp_path, capsys):
    gpu_run = load_benchmark("gpu/gpu_run")
    with pytest.raises(SystemExit) as refused:
        gpu_run.main([str(tmp_path / "out")])
    assert refused.value.code == 2
    assert "no CUDA device here: use --smoke" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sigterm_during_ppo_keeps_its_curve_and_draws_the_plot(tmp_path):
    out = tmp_path / "out"
    report = out / "gpu_run.json"
    # 2 envs and their 32 samples in one minibatch: the first update comes sooner
    argv = [sys.executable, SCRIPT, "--smoke", "--parts", "ppo", "--ppo-seconds", "600",
            "--ppo-envs", "2", "--ppo-minibatch", "32", str(out)]  # fmt: skip
    process = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # PPO saves its first update's point at once: wait for it (the run goes on 600 s)
        for _ in range(2400):
            if process.poll() is not None:
                break
            try:
                ppo = load_result(report)["results"][0]
            except (OSError, ValueError, IndexError):  # not written yet, or half written
                ppo = {}
            if ppo.get("curve"):
                break
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read()[-3000:]
        process.terminate()
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
    assert process.returncode != 0
    written = load_result(report)
    ppo = written["results"][0]
    assert written["meta"]["complete"] is False
    assert ppo["status"] == "interrupted", stderr[-3000:]
    assert ppo["error"].startswith(("TrainingInterrupted", "KeyboardInterrupt"))
    assert ppo["curve"] and ppo["curve"][0]["updates"] == 1
    assert (out / "gpu_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
