"""Workers that look for their next command before sleeping do so only while the commands come
within their spin: after a longer gap a worker sleeps at once, and it spins again once the
commands come close together."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import vecaccel

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")

SPIN_US = 400_000  # a spin long enough to tell from sleeping by the CPU time it burns
GAP_S = 0.6  # longer than the spin


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_over_gap(pid: int) -> float:
    """The worker's CPU seconds while the caller waits ``GAP_S`` before its next command."""
    before = _cpu_seconds(pid)
    time.sleep(GAP_S)
    return _cpu_seconds(pid) - before


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_workers_spin_only_while_the_commands_come_within_the_spin(context, leak_check):
    envs = vecaccel.make_vec(
        "CartPole-v1", 2, backend="shm", num_workers=1, worker_spin_us=SPIN_US, context=context
    )
    actions = np.zeros(2, dtype=np.int64)
    try:
        pid = envs.pool.workers[0].process.pid
        envs.reset(seed=0)
        envs.step(actions)  # right after the reset: the worker spins after it
        spun = _cpu_over_gap(pid)
        envs.step(actions)  # came after the spin ended: the worker sleeps at once after it
        slept = _cpu_over_gap(pid)
        envs.step(actions)
        envs.step(actions)  # close behind the one before: the worker spins again
        spun_again = _cpu_over_gap(pid)
        envs.step(actions)
    finally:
        envs.close()
    # a spinning worker burns CPU through its spin, a sleeping one next to none
    assert spun > 0.1 * SPIN_US / 1e6
    assert spun_again > 0.1 * SPIN_US / 1e6
    assert slept < 0.05 * SPIN_US / 1e6


def test_spin_changes_no_result():
    """Spinning workers and sleeping ones step the same envs to the same results."""
    kwargs = dict(num_workers=2, autoreset_mode="SameStep")
    spinning = vecaccel.make_vec("CartPole-v1", 4, backend="shm", worker_spin_us=300, **kwargs)
    sleeping = vecaccel.make_vec("CartPole-v1", 4, backend="shm", worker_spin_us=0, **kwargs)
    try:
        np.testing.assert_array_equal(spinning.reset(seed=3)[0], sleeping.reset(seed=3)[0])
        rng = np.random.default_rng(1)
        for step in range(200):
            actions = rng.integers(0, 2, size=4)
            if step % 50 == 49:
                time.sleep(0.01)  # a gap longer than the spin now and then
            for got, want in zip(spinning.step(actions)[:4], sleeping.step(actions)[:4]):
                np.testing.assert_equal(got, want)
    finally:
        spinning.close()
        sleeping.close()
