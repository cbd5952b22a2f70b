"""Data-parallel training under ``torchrun``: gloo, CPU, 2 ranks, tiny budgets.

These tests start real ``torchrun`` processes on the loopback address and bound each with a
timeout: synchronous and asynchronous runs, killed ranks and samplers, SIGTERM and resume. The
tests that start their ranks in-process are in ``test_distributed_ranks.py``.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

HERE = Path(__file__).parents[2] / "support"
ROOT = Path(__file__).parents[3]

WORKER = HERE / "dist_worker.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", VECACCEL_DIST_TIMEOUT="30", PYTHONUNBUFFERED="1")
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run(
        cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


#: The runs of ``dist_worker.py`` whose results the tests below check, trained one after
#: another by one launch of two ranks (starting torchrun and two ranks that import torch costs
#: more than most of these runs). The fixed-lag run comes first and again last: the two must
#: repeat exactly although one runs first in its process and the other follows other runs.
FIXED_LAG = "dqn-async:400:fixed-lag"
SHARED_RUNS = (
    FIXED_LAG,
    "ppo:128",
    "dqn:128",
    "ppo-async:128",
    "dqn-async:1600",
    "ppo:128:norm",
    "ppo-async:128:norm",
    FIXED_LAG,
)


def _run_worker(tmp_path: Path, *runs: str) -> dict:
    """Run ``dist_worker.py`` on 2 ranks, training ``runs`` one after another; what rank 0
    wrote, by run."""
    out = tmp_path / "result.json"
    specs = [arg for run in runs for arg in ("--train", run)]
    _run(
        _torchrun("--standalone", "--nproc_per_node", "2", str(WORKER), "--out", str(out), *specs),
        timeout=240,
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory) -> dict:
    return _run_worker(tmp_path_factory.mktemp("shared-runs"), *SHARED_RUNS)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_parameters_identical_and_batch_is_sum_over_ranks(algo: str, shared_runs: dict) -> None:
    result = shared_runs[f"{algo}:128"]
    assert result["world_size"] == 2
    first, second = result["checksums"]
    assert first == second  # bit-identical parameters after several updates
    assert result["updates"] >= 2
    # the step budget is global: each rank collected half, the sum is the run's count
    assert sum(result["local_steps"]) == result["global_step"] == 128
    if algo == "ppo":
        # effective batch = sum of the ranks' batches; linear lr scaling sees that batch
        assert result["batch_size"] == sum(result["local_batch"]) == 32
        assert result["lr_scale"] == pytest.approx(32 / 16)
    else:
        assert result["lr_scale"] == pytest.approx(2 * 8 / 32)


#: How long a job may take to end after one of its processes is killed: the surviving rank's
#: collective fails at once when it sees the closed connection, and at the latest after the
#: collective timeout (``VECACCEL_DIST_TIMEOUT``, 30 s here); torchrun's own SIGTERM-then-SIGKILL
#: of the survivors takes 30 s more at most. Past this the job hangs.
JOB_END_BOUND_S = 30 + 30 + 30


def _kill_and_expect_job_failure(job: subprocess.Popen, pid: int, out: Path) -> str:
    """SIGKILL ``pid``: the job must then end with an error and without a result, bounded by the
    collective timeout (a hung job fails the test with ``TimeoutExpired``)."""
    os.kill(pid, signal.SIGKILL)
    output, _ = job.communicate(timeout=JOB_END_BOUND_S)
    assert job.returncode != 0, output[-3000:]
    assert not out.exists()
    return output


def _preempt(command: list[str], run_dir: Path) -> tuple[int, str]:
    """Start ``vecaccel train ...`` (``command``), wait (90 s at most) until it has logged 3
    metric rows, then SIGTERM its launcher as a scheduler preempting the job does; return the
    launcher's exit code and what the job printed."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "vecaccel", *command],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and launcher.poll() is None:
            if (run_dir / "metrics.csv").exists() and len(_metrics(run_dir)) >= 3:
                break
            time.sleep(0.2)
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=60)
    finally:
        _reap(launcher)
    return launcher.returncode, output


def _reap(job: subprocess.Popen) -> None:
    """Kill what is left of a job started with ``start_new_session=True``."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=10)


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def test_two_node_loopback_run(tmp_path: Path) -> None:
    """Two torchrun nodes on the loopback address train one run of world 2; tracked (W&B,
    offline), rank 0 alone opens the W&B run."""
    port = _free_port()
    run_dir = tmp_path / "run"
    common = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "vecaccel-test",
        "--local-addr",
        "127.0.0.1",
        "--max-restarts",
        "0",
    ]
    train = [
        "-m",
        "vecaccel",
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--backend",
        "serial",
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--total-timesteps",
        "128",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--no-tensorboard",
        "--torch-threads",
        "1",
        "--track",
    ]
    env = _env()
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", HOME=str(tmp_path))
    env.pop("WANDB_DIR", None)
    nodes = [
        subprocess.Popen(
            _torchrun(*common, "--node-rank", str(node), *train),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=150)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    rows = _metrics(run_dir)
    assert float(rows[-1]["step"]) == 128
    assert float(rows[-1]["charts/world_size"]) == 2
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1


def test_killed_rank_ends_job_with_an_error(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    job = subprocess.Popen(
        _torchrun(
            "--standalone",
            "--nproc_per_node",
            "2",
            "--max-restarts",
            "0",
            str(WORKER),
            "--algo",
            "ppo",
            "--out",
            str(out),
            "--total-timesteps",
            "100000000",
            "--hold",
        ),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        pid_file = tmp_path / "pid-1"
        deadline = time.monotonic() + 90
        while not pid_file.exists() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.1)
        assert pid_file.exists(), "rank 1 never started training"
        time.sleep(0.2)
        _kill_and_expect_job_failure(job, int(pid_file.read_text()), out)
    finally:
        _reap(job)


# -- asynchronous mode on several ranks: a collector process per rank, data-parallel optimisers --


def _process_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # an orphan that exited may wait to be reaped


def test_async_dqn_two_ranks_identical_parameters_and_replay_ratio(shared_runs: dict) -> None:
    result = shared_runs["dqn-async:1600"]
    first, second = result["checksums"]
    assert first == second  # every update all-reduced: bit-identical parameters
    # each rank collected half the budget, and made the updates its ratio allows
    assert result["local_steps"] == [800.0, 800.0] and result["global_step"] == 1600
    learn_from = 50  # learning_starts=100 over 2 ranks
    assert result["updates"] == (800 - learn_from) * 4 // 16
    assert result["replay_ratio"] == pytest.approx(4.0, rel=0.01)
    # the logged (global) ratio holds during the run: the throttle bounds the sampler's lead to
    # 32 steps, under 10% of the steps since learning began from 1,000 global steps on (rows
    # every 200 steps: 3 or more of them from 1,000 to 1,600)
    logged = [(step, ratio) for step, ratio in result["logged_replay_ratio"] if step >= 1000]
    assert len(logged) >= 3
    for step, ratio in logged:
        assert abs(ratio - 4.0) <= 0.4, (step, ratio)
    assert result["logged_world_size"] == 2


def test_async_dqn_two_ranks_with_a_fixed_lag_repeat_exactly(shared_runs: dict) -> None:
    first, second = shared_runs[FIXED_LAG], shared_runs[f"{FIXED_LAG}#2"]
    assert first["checksums"][0] == first["checksums"][1]  # all-reduced updates
    assert first["checksums"] == second["checksums"]  # and the run repeats
    assert first["episode_log"] == second["episode_log"]
    # the ratio holds exactly: 200 steps a rank, from learn_from 50, batches of 16, ratio 4
    assert first["local_steps"] == [200.0, 200.0]
    assert first["updates"] == (200 - 50) * 4 // 16


def test_async_ppo_two_ranks_identical_parameters(shared_runs: dict) -> None:
    result = shared_runs["ppo-async:128"]
    first, second = result["checksums"]
    assert first == second
    assert result["updates"] == 4 and result["global_step"] == 128
    assert result["local_steps"] == [64.0, 64.0]


@pytest.mark.parametrize("spec", ["ppo:128:norm", "ppo-async:128:norm"])
def test_two_ranks_end_with_the_same_normalisation_statistics(spec: str, shared_runs: dict) -> None:
    """Each rank counts its own envs' observations and returns; merged after every batch (by
    the optimiser, from what an async rank's sampler handed over), both ranks hold the same
    statistics of every env step of the run, bit for bit, and train the same parameters."""
    result = shared_runs[spec]
    first, second = result["normalization"]
    assert first == second
    observations, returns = first[:9], first[9:]  # CartPole: 4 means, 4 variances, a count
    assert observations[-1] == returns[-1] == result["global_step"] == 128
    assert not np.allclose(observations[:4], 0.0) and returns[1] != 1.0
    assert result["checksums"][0] == result["checksums"][1]


def test_async_dead_sampler_ends_job_with_an_error(tmp_path: Path) -> None:
    """A rank's collector process killed: the job ends with an error naming it, and no
    collector outlives the job (a killed rank is ``test_killed_rank_ends_job_with_an_error``)."""
    out = tmp_path / "result.json"
    job = subprocess.Popen(
        _torchrun(
            "--standalone", "--nproc_per_node", "2", "--max-restarts", "0", str(WORKER),
            "--algo", "dqn-async", "--out", str(out), "--total-timesteps", "100000000", "--hold",
        ),
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        pid_files = [tmp_path / f"sampler-pid-{rank}" for rank in (0, 1)]
        pid_files += [tmp_path / f"pid-{rank}" for rank in (0, 1)]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and job.poll() is None:
            if all(path.exists() and path.read_text() for path in pid_files):
                break
            time.sleep(0.1)
        assert all(path.exists() for path in pid_files), "the ranks never started updating"
        samplers = [int(path.read_text()) for path in pid_files[:2]]
        output = _kill_and_expect_job_failure(job, samplers[1], out)
        assert "CollectorError" in output and "of rank 1" in output, output[-3000:]
        # no collector process outlives the job: each stops with its rank or when it is orphaned
        deadline = time.monotonic() + 10
        while any(_process_alive(pid) for pid in samplers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_process_alive(pid) for pid in samplers)
    finally:
        _reap(job)


def test_cli_async_nproc_sigterm_checkpoints(tmp_path: Path) -> None:
    from vecaccel.trainers.checkpoints.format import load_checkpoint

    run_dir = tmp_path / "run"
    returncode, output = _preempt(
        [
            "train", "dqn", "--async", "--nproc", "2",
            "--env", "CartPole-v1", "--backend", "serial", "--total-timesteps", "100000000",
            "--learning-starts", "100", "--batch-size", "16", "--replay-ratio", "2",
            "--log-every-steps", "100", "--run-dir", str(run_dir), "--no-progress",
            "--no-tensorboard", "--torch-threads", "1",
        ],
        run_dir,
    )  # fmt: skip
    # the ranks agreed on the stop at the same update: rank 0 saved, all exited with 143
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "checkpoint saved" in output
    rows = _metrics(run_dir)
    assert float(rows[-1]["charts/world_size"]) == 2
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert int(state["num_updates"]) > 0 and int(state["global_step"]) > 0
    # every rank's replay buffer went into the checkpoint, not rank 0's alone
    ranks = state["off_policy"]["rank_replays"]
    assert [entry["token"].split("-")[1] for entry in ranks] == ["r0", "r1"]
    assert all((run_dir / entry["file"]).is_file() for entry in ranks)


def _replay_arrays(run_dir: Path, entry: dict) -> dict:
    with np.load(run_dir / entry["file"]) as archive:
        return {name: archive[name] for name in ("actions", "rewards", "cursor")}


def test_sigterm_checkpoints_every_rank_and_each_resumes_its_own_replay_buffer(
    tmp_path: Path,
) -> None:
    """``--nproc 2`` preempted by SIGTERM: the launcher exits 143 after one checkpoint that holds
    both ranks' replay buffers (their envs are seeded apart, so the buffers differ); the run
    resumed on two ranks trains to its budget as one run of world 2, and each rank gets its own
    buffer back (rank 1 does not restart from rank 0's)."""
    from vecaccel.trainers.checkpoints.format import load_checkpoint

    run_dir = tmp_path / "run"
    common = ["--no-progress", "--no-tensorboard", "--torch-threads", "1"]
    returncode, output = _preempt(
        [
            # shm: torchrun stops a rank with killpg(SIGTERM), which must not reach its workers
            "train", "dqn", "--nproc", "2", "--env", "CartPole-v1", "--backend", "shm",
            "--num-envs", "2", "--total-timesteps", "100000000", "--learning-starts", "64",
            "--batch-size", "8", "--replay-ratio", "4", "--buffer-size", "4000",
            "--log-every-steps", "16", "--run-dir", str(run_dir), *common,
        ],
        run_dir,
    )  # fmt: skip
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "checkpoint saved" in output
    first = load_checkpoint(run_dir / "checkpoint.pt")
    step = int(first["global_step"])
    assert step > 0
    ranks = first["off_policy"]["rank_replays"]
    assert len(ranks) == 2 and first["off_policy"]["replay"]["file"] == ranks[0]["file"]
    before = [_replay_arrays(run_dir, entry) for entry in ranks]
    assert not np.array_equal(before[0]["actions"], before[1]["actions"])
    assert ranks[0]["agent_rng"] != ranks[1]["agent_rng"]

    resumed = _run(
        [
            sys.executable, "-m", "vecaccel", "train", "dqn", "--nproc", "2",
            "--resume", str(run_dir), "--total-timesteps", str(step + 200), *common,
        ]
    )  # fmt: skip
    second = load_checkpoint(run_dir / "checkpoint.pt")
    assert second["global_step"] == step + 200
    rows = _metrics(run_dir)
    assert float(rows[-1]["step"]) == step + 200
    assert float(rows[-1]["charts/world_size"]) == 2
    # one line for the run, from rank 0, not one per rank
    output = resumed.stdout + resumed.stderr
    assert output.count("resuming dqn from") == 1, output[-3000:]
    after = [_replay_arrays(run_dir, entry) for entry in second["off_policy"]["rank_replays"]]
    for rank in (0, 1):  # the rows written before the checkpoint are each rank's own still
        kept = int(before[rank]["cursor"].min())
        assert kept > 0
        for name in ("actions", "rewards"):
            np.testing.assert_array_equal(
                after[rank][name][:kept], before[rank][name][:kept], err_msg=f"rank {rank} {name}"
            )
    # only the files the checkpoint names are left
    names = sorted(entry["file"] for entry in second["off_policy"]["rank_replays"])
    assert sorted(p.name for p in run_dir.glob("*.npz")) == names
