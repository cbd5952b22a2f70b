"""The ``ray`` backend ends quietly: ``close()``, Ctrl-C while Ray starts, and SIGINT or SIGTERM
of a training run print no traceback from Ray and none of its crash reports, whether the
backend started Ray or the user did, and leave no Ray process behind.

Every run is its own process (signals, and what it prints), inside the module's loopback-only
network namespace; the bounds on time only catch a hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.ray_cluster import loopback_ray, ray_start
from vecaccel.testing.leaks import descendants, wait_until

ray = pytest.importorskip("ray")

#: What Ray prints when one of its processes dies badly, and what no clean end shows.
ALARMS = ("Traceback", "Check failed", "StackTrace", "likely discovered a bug in Ray", "SystemExit")

#: Seconds a run may take: generous, only so that a hung run fails the test.
BOUND_S = 240


@pytest.fixture(scope="module", autouse=True)
def loopback_net():
    with loopback_ray() as isolated:
        yield isolated


def run_env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("RAY_AUTH") and name != "RAY_ADDRESS"
    }
    return {**env, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", **extra}


def assert_quiet(text: str) -> None:
    found = [alarm for alarm in ALARMS if alarm in text]
    assert not found, f"{found} in:\n{text[-4000:]}"


def _command_lines(pids: set[int]) -> dict[int, str]:
    lines = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                lines[pid] = file.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return lines


def as_from_a_terminal() -> None:
    """In a child before it runs: SIGINT with its default disposition and not blocked, as a
    program started from a shell has it, whatever the test process inherited from its own
    launcher (pytest-xdist's worker)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def wait_for_process(parent: subprocess.Popen, marker: str) -> None:
    """Wait until a process below ``parent`` has ``marker`` in its command line."""

    def found() -> bool:
        assert parent.poll() is None, parent.communicate()
        return any(marker in line for line in _command_lines(descendants(parent.pid)).values())

    assert wait_until(found, BOUND_S, interval=0.05), f"no {marker} process started"


def assert_nothing_left(pids: set[int]) -> None:
    def gone() -> bool:
        left = descendants(os.getpid()) & pids
        return not {pid for pid in left if not _is_zombie(pid)}

    assert wait_until(gone, 60), _command_lines(descendants(os.getpid()) & pids)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


USER_STARTED = textwrap.dedent(
    """
    import time
    import ray
    import vecaccel

    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
             num_cpus=2, logging_level="WARNING")
    for _ in range(2):  # the second on the Ray the first close() left running
        envs = vecaccel.make_vec("CartPole-v1", 4, backend="ray", num_shards=1, num_workers=1)
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        envs.close()
    time.sleep(3)  # what the shards printed as they ended reaches the driver within a second
    ray.shutdown()
    print("closed")
    """
)


def test_close_is_quiet_when_the_user_started_ray(tmp_path):
    """Shard actors end as Ray means actors to end: no crash report from their workers."""
    done = subprocess.run(
        [sys.executable, "-c", USER_STARTED],
        env=run_env(tmp_path, RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"),
        capture_output=True,
        text=True,
        timeout=BOUND_S,
    )
    assert done.returncode == 0 and done.stdout.strip() == "closed", done.stdout + done.stderr
    assert_quiet(done.stderr)


STARTING = textwrap.dedent(
    """
    import vecaccel

    envs = vecaccel.make_vec("CartPole-v1", 2, backend="ray", num_shards=1, num_workers=1)
    print("started", flush=True)
    """
)


def test_ctrl_c_while_ray_starts_ends_at_once_with_one_line_and_leaves_nothing(tmp_path):
    """Ctrl-C while the backend's local Ray starts: a ``KeyboardInterrupt`` saying so, none of
    Ray's frames in its traceback, and every process Ray had started stopped."""
    process = subprocess.Popen(
        [sys.executable, "-c", STARTING],
        env=run_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        wait_for_process(process, "gcs_server")
        started = descendants(process.pid)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=BOUND_S)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGINT, out + err
    assert out == "", out
    assert err.rstrip().splitlines()[-1] in (
        "KeyboardInterrupt: interrupted while starting a local Ray",
        "KeyboardInterrupt: interrupted while starting the Ray shards",
    ), err
    assert "site-packages/ray" not in err, err
    assert_nothing_left(started)
    assert not (tmp_path / ".ray").exists()


def _train_argv(run_dir: Path, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "vecaccel.cli", "train", "ppo", "--env", "CartPole-v1"]
    argv += ["--backend", "ray", "--num-envs", "4", "--num-steps", "8", "--num-workers", "1"]
    argv += ["--backend-option", "num_shards=1", "--no-progress", "--torch-threads", "1"]
    argv += ["--no-tensorboard", "--total-timesteps", "100000000", "--run-dir", str(run_dir)]
    return [*argv, *extra]


def _rows_written(metrics: Path) -> int:
    try:
        return max(len(metrics.read_text().splitlines()) - 1, 0)
    except OSError:
        return 0


def test_ctrl_c_while_ray_starts_under_train_prints_one_line(tmp_path):
    pytest.importorskip("torch")
    process = subprocess.Popen(
        _train_argv(tmp_path / "run"),
        env=run_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        wait_for_process(process, "gcs_server")
        started = descendants(process.pid)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=BOUND_S)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGINT, out + err
    assert err.rstrip().splitlines()[-1] in (
        "interrupted while starting a local Ray",
        "interrupted while starting the Ray shards",
    ), err
    assert_quiet(err)
    assert_nothing_left(started)


@pytest.mark.parametrize("signum, ray_started_by", [
    (signal.SIGINT, "the backend"),
    (signal.SIGTERM, "ray start"),
])  # fmt: skip
def test_a_signalled_training_run_ends_quietly(tmp_path, signum, ray_started_by):
    """SIGINT or SIGTERM while training: the checkpoint, the exit code (128 + the signal), one
    line, and none of Ray's crash reports, on a local Ray or on a cluster the user started."""
    pytest.importorskip("torch")
    run_dir = tmp_path / "run"
    env = run_env(tmp_path, RAY_AUTH_MODE="disabled")
    head = (
        ray_start({"HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"})
        if ray_started_by == "ray start"
        else contextlib.nullcontext()
    )
    extra: tuple[str, ...] = ()
    with head as address:
        if address:
            extra = ("--backend-option", f"address={address}")
        process = subprocess.Popen(
            _train_argv(run_dir, *extra),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_from_a_terminal,
        )
        try:
            # the header is written as the logger opens, before the run's signal handlers are
            # in place; a row is written only once training has begun
            metrics = run_dir / "metrics.csv"
            assert wait_until(lambda: _rows_written(metrics) > 0, BOUND_S, 0.1)
            process.send_signal(signum)
            out, err = process.communicate(timeout=BOUND_S)
        finally:
            process.kill()
    assert process.returncode == 128 + signum, out + err
    assert f"interrupted by {signal.Signals(signum).name}" in err, err
    assert (run_dir / "checkpoint.pt").exists()
    assert_quiet(err)
