"""Where workers run: ``WorkerPool.send_all`` signals the workers so that they start at once.

Workers note the CPU they replied from (``views.last_cpu``); the parent signals the ones that
last ran on its own CPU last, and (``spread=True``, lock-step steps) narrows the affinity of a
worker that last ran on the same CPU as another one to a free CPU for one step, giving it back
before the next. None of this may change what the envs compute, and a nudge must never outlive
the step it was made for.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import vecaccel
import vecaccel.worker.pool as pool_module
from vecaccel.worker import Command, current_cpu

linux_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or current_cpu() < 0,
    reason="needs sched_getcpu and sched_setaffinity (Linux)",
)
two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two usable CPUs",
)


def _shm(num_envs: int, num_workers: int, context: str = "fork", **options):
    return vecaccel.make_vec(
        "CartPole-v1",
        num_envs,
        backend="shm",
        num_workers=num_workers,
        context=context,
        autoreset_mode="SameStep",
        **options,
    )


@pytest.fixture
def two_workers(leak_check):
    """4 CartPole envs on two fork workers, reset; closed (and checked for leaks) afterwards."""
    envs = _shm(4, 2)
    try:
        envs.reset(seed=0)
        yield envs
    finally:
        envs.close()


@linux_affinity
def test_current_cpu_is_one_this_process_may_use():
    assert current_cpu() in os.sched_getaffinity(0)


@linux_affinity
def test_workers_report_the_cpu_they_replied_from(context, leak_check):
    envs = _shm(4, 2, context)
    try:
        views = envs.pool.views
        envs.reset(seed=0)
        allowed = os.sched_getaffinity(0)
        assert all(int(cpu) in allowed for cpu in views.last_cpu)
        views.last_cpu[:] = -7
        envs.step(np.zeros(4, dtype=np.int64))
        assert all(int(cpu) in allowed for cpu in views.last_cpu)
    finally:
        envs.close()


@linux_affinity
def test_workers_on_the_callers_cpu_are_signalled_last(monkeypatch, leak_check):
    envs = _shm(6, 3)
    try:
        envs.reset(seed=0)
        pool = envs.pool
        here = 5  # pretend: the caller runs on CPU 5, worker 0 last ran there too
        monkeypatch.setattr(pool_module, "current_cpu", lambda: here)
        pool.views.last_cpu[:] = [here, 0, 1]
        order: list[int] = []
        real_send = pool.send
        monkeypatch.setattr(
            pool, "send", lambda w, command: (order.append(w.index), real_send(w, command))
        )
        envs.step(np.zeros(6, dtype=np.int64))
        assert order == [1, 2, 0]
    finally:
        envs.close()


@linux_affinity
@two_cpus
def test_crowded_workers_are_spread_for_one_step_then_given_back_every_cpu(two_workers):
    pool = two_workers.pool
    allowed = sorted(os.sched_getaffinity(0))
    w0, w1 = pool.workers
    here = current_cpu()
    other = next(cpu for cpu in allowed if cpu != here)
    pool.views.last_cpu[:] = [other, other]  # both last ran on the CPU the caller is not on
    pool._spread(pool.workers, here)
    assert os.sched_getaffinity(w0.process.pid) == set(allowed)
    assert os.sched_getaffinity(w1.process.pid) == {here}  # the free CPU: the caller's
    assert w1.nudged and not w0.nudged
    assert int(pool.views.last_cpu[1]) == here
    pool.views.last_cpu[:] = [allowed[0], allowed[1]]  # apart now: nothing to spread
    pool._spread(pool.workers, here)
    assert os.sched_getaffinity(w1.process.pid) == set(allowed)
    assert not w1.nudged


@two_cpus
def test_spreading_changes_nothing_the_envs_compute(context, leak_check):
    """Lock-step steps with the spreading on (crowding forced before each step) give what the
    in-process reference gives, and no worker keeps a narrowed affinity after its step."""
    num_envs = 6
    envs = _shm(num_envs, 3, context)
    reference = vecaccel.make_vec(
        "CartPole-v1", num_envs, backend="serial", autoreset_mode="SameStep"
    )
    try:
        obs, _ = envs.reset(seed=3)
        ref_obs, _ = reference.reset(seed=3)
        np.testing.assert_array_equal(obs, ref_obs)
        rng = np.random.default_rng(0)
        for _ in range(60):
            envs.pool.views.last_cpu[:] = 0  # every worker "last ran" on CPU 0
            actions = rng.integers(0, 2, size=num_envs)
            out = envs.step(actions)
            ref = reference.step(actions)
            for got, want in zip(out[:4], ref[:4]):
                np.testing.assert_array_equal(got, want)
        envs.pool.send_all([], Command.STEP, spread=True)  # nothing to send: a no-op
        allowed = os.sched_getaffinity(0)
        for w in envs.pool.workers:
            assert w.nudged or os.sched_getaffinity(w.process.pid) == allowed
    finally:
        envs.close()
        reference.close()


@linux_affinity
@two_cpus
def test_a_dead_worker_is_reported_not_raised_by_the_nudge(two_workers):
    pool = two_workers.pool
    victim = pool.workers[1]
    victim.process.kill()
    victim.process.join(5)
    assert pool._set_affinity(victim, [0]) is False
    pool.views.last_cpu[:] = 0
    with pytest.raises(vecaccel.WorkerError):
        two_workers.step(np.zeros(4, dtype=np.int64))
