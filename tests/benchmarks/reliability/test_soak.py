"""The CI cut of the soak benchmark: the serial reference (exceptions only) and every backend
that restarts workers holding all its envs, about 12 s of stepping in all.

``benchmarks/reliability/soak.py`` runs in a child process (it owns ``SIGALRM`` for its watchdog); the test
checks its JSON: no hang, no leaked process, ``/dev/shm`` entry or descriptor, no unexpected
error or restart, and every injected fault accounted for.
"""

from __future__ import annotations

import os
import subprocess
import sys

from backend_matrix import REFERENCE_BACKEND, select

from vecaccel.bench import load_result
from vecaccel.testing.leaks import descendants, process_gone

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")

#: The reference takes only the faults that leave its process alive; the others take them all.
BACKENDS = [REFERENCE_BACKEND, *select(restarts_workers=True, envs_in_workers=True)]

#: How long the whole soak may take before the test calls it stuck (it steps for 12 s).
TIMEOUT = 600


def test_soak_one_minute_cut(tmp_path):
    out = tmp_path / "soak.json"
    before = descendants(os.getpid())
    completed = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "reliability", "soak.py"),
            # 3 s a backend; a fault every 150 to 450 env steps gives each backend several
            # (the first five go through every kind), also on a loaded machine
            "--minutes",
            "0.2",
            "--fault-every",
            "300",
            "--step-timeout",
            "1.0",
            "--seed",
            "7",
            "--backends",
            ",".join(BACKENDS),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    report = load_result(out)
    results = {r["backend"]: r for r in report["results"]}
    assert sorted(results) == sorted(BACKENDS)
    for name, r in results.items():
        assert r["hangs"] == 0, (name, r)
        assert r["leaked_processes"] == [] and r["leaked_shm"] == [] and r["leaked_fds"] == []
        assert r["errors"] == [] and r["restarts_unexplained"] == [], (name, r)
        assert r["faults_injected"] >= 1 and r["faults_unaccounted"] == {}, (name, r)
        assert r["faults_accounted"] == r["faults_injected"], (name, r)
        assert r["env_steps"] <= 10_000 * r["faults_injected"], (name, r)
        if name != REFERENCE_BACKEND:  # each fault restarts once, however many envs it takes down
            assert r["env_failures_counted"] == r["faults_accounted"], (name, r)
            assert r["collateral_unreported"] == 0, (name, r)
    assert report["summary"]["ok"] and completed.returncode == 0, (
        completed.stdout + completed.stderr
    )
    assert "Traceback" not in completed.stderr, completed.stderr
    assert all(process_gone(pid) for pid in descendants(os.getpid()) - before)
