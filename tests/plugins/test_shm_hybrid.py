"""The ``hybrid`` backend: the caller steps the first ``inline_envs`` envs while ``shm`` workers
step the rest. The contract tests compare it with ``SyncVectorEnv`` step by step; these cover
what the inline share adds: errors, timeouts, control calls and masked resets across both parts."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import LONG_PROMPT
from toy_envs import tagged_counter

import vecaccel

NUM_ENVS = 4
INLINE = 2  # envs 0 and 1 in this process, 2 and 3 in one worker


def _make(context: str = "fork", faults: dict[int, dict] | None = None):
    faults = faults or {}
    fns = [functools.partial(tagged_counter, tag, **faults.get(tag, {})) for tag in range(NUM_ENVS)]
    return vecaccel.make_vec(
        fns, backend="hybrid", inline_envs=INLINE, num_workers=1, context=context
    )


def _zeros() -> np.ndarray:
    return np.zeros(NUM_ENVS, dtype=np.int64)


def test_defaults_split_the_envs_evenly(leak_check):
    envs = vecaccel.make_vec("CartPole-v1", 6, backend="hybrid", num_workers=2)
    try:
        assert (envs.inline_envs, envs.num_workers) == (2, 2)
        assert [(w.start, w.stop) for w in envs.pool.workers] == [(2, 4), (4, 6)]
    finally:
        envs.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_errors_name_inline_and_worker_envs(context, leak_check):
    envs = _make(context, {1: {"fail_on": 2}, 3: {"fail_on": 2}})
    try:
        envs.reset(seed=0)
        envs.step(_zeros())
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(_zeros())
        assert info.value.env_indices == (1, 3)
        assert "env 1 raised ValueError in step: boom at step 2 in env 1" in str(info.value)
        with pytest.raises(vecaccel.WorkerError, match=r"envs \[1, 3\] failed"):
            envs.step(_zeros())
        obs, _ = envs.reset(seed=0)  # a reset starts them over
        np.testing.assert_array_equal(obs[:, 1], np.zeros(NUM_ENVS))
    finally:
        envs.close()


def test_timed_out_step_is_finished_once(leak_check):
    """The inline envs step once per step, however many step_wait calls a timeout takes."""
    envs = _make(faults={3: {"sleep_on": {2: 1.0}}})
    try:
        envs.reset(seed=0)
        envs.step(_zeros())
        envs.step_async(_zeros())
        with pytest.raises(TimeoutError, match=r"\[2, 3\]"):  # the worker's envs
            envs.step_wait(timeout=0.1)
        obs, *_ = envs.step_wait()
        np.testing.assert_array_equal(obs[:, 1], [2, 2, 2, 2])
        obs, *_ = envs.step(_zeros())
        np.testing.assert_array_equal(obs[:, 1], [3, 3, 3, 3])
    finally:
        envs.close()


def test_control_calls_span_both_parts(leak_check):
    envs = _make()
    try:
        envs.reset(seed=0)
        assert envs.call_indices("tag", [3, 0, -1, 1]) == (3, 0, 3, 1)
        envs.set_attr_indices("tag", [30, 10], [3, 1])
        assert envs.get_attr("tag") == (0, 10, 2, 30)
        envs.set_attr("tag", 7)
        assert envs.get_attr("tag") == (7,) * NUM_ENVS
        with pytest.raises(vecaccel.WorkerError, match="env 0 raised AttributeError"):
            envs.call_indices("no_such_method", [0])
        with pytest.raises(IndexError):
            envs.call_indices("tag", [NUM_ENVS])
    finally:
        envs.close()


def test_masked_reset_across_both_parts(leak_check):
    envs = _make()
    try:
        envs.reset(seed=0)
        for _ in range(3):
            envs.step(_zeros())
        mask = np.array([False, True, True, False])
        obs, _ = envs.reset(seed=5, options={"reset_mask": mask})
        np.testing.assert_array_equal(obs[:, 1], [3, 0, 0, 3])
        assert envs.call("np_random_seed") == (0, 6, 7, 3)  # seed + index, masked envs only
    finally:
        envs.close()


def test_bad_options():
    with pytest.raises(ValueError, match="inline_envs"):
        vecaccel.make_vec("CartPole-v1", 2, backend="shm", inline_envs=2)
    with pytest.raises(ValueError, match="at least 2 envs"):
        vecaccel.make_vec("CartPole-v1", 1, backend="hybrid")


def test_workers_spin_between_steps_only_with_a_core_each():
    """By default hybrid's workers look for the next step before sleeping only when each of
    them (and the caller) has a core; an explicit worker_spin_us always applies."""
    from vecaccel.plugins.shm import HYBRID_WORKER_SPIN_US
    from vecaccel.worker import usable_cpus

    cpus = usable_cpus()
    for workers in (1, cpus):
        envs = vecaccel.make_vec("CartPole-v1", cpus + 1, backend="hybrid", num_workers=workers)
        try:
            expected = HYBRID_WORKER_SPIN_US / 1e6 if workers < cpus else 0.0
            assert envs.pool.worker_spin_seconds == expected
        finally:
            envs.close()
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="shm", num_workers=1)
    try:
        assert envs.pool.worker_spin_seconds == 0.0  # shm blocks by default
    finally:
        envs.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_spinning_workers_step_fail_and_close_cleanly(context, leak_check):
    """Workers spinning for their next command (half a second here) step exactly like blocking
    ones, a worker killed while it spins is reported at the next step, and close() ends them."""
    import os
    import signal
    import time

    from vecaccel.testing.envs import env_pid as worker_pid
    from vecaccel.testing.leaks import process_gone, wait_until

    options = dict(num_workers=2, context=context, autoreset_mode="SameStep")
    spinning = vecaccel.make_vec("CartPole-v1", 4, backend="shm", worker_spin_us=500_000, **options)
    blocking = vecaccel.make_vec("CartPole-v1", 4, backend="shm", **options)
    try:
        np.testing.assert_array_equal(spinning.reset(seed=5)[0], blocking.reset(seed=5)[0])
        rng = np.random.default_rng(0)
        for _ in range(50):
            actions = rng.integers(0, 2, size=4)
            for got, want in zip(spinning.step(actions)[:4], blocking.step(actions)[:4]):
                np.testing.assert_array_equal(got, want)
        pid = spinning.call_indices(worker_pid, [3])[0]
        os.kill(pid, signal.SIGKILL)  # within its spin after the call
        wait_until(lambda: process_gone(pid))
        started = time.monotonic()
        with pytest.raises(vecaccel.WorkerError) as info:
            spinning.step(np.zeros(4, dtype=np.int64))
        assert time.monotonic() - started < LONG_PROMPT
        assert info.value.env_indices == (2, 3)
    finally:
        spinning.close()
        blocking.close()


def test_bad_worker_spin():
    for bad in (-1, 1e6, "1"):
        with pytest.raises(ValueError, match="worker_spin_us"):
            vecaccel.make_vec("CartPole-v1", 2, backend="shm", num_workers=1, worker_spin_us=bad)
