"""Errors and faults of the process backends, under fork and under spawn.

Every test also checks, through the ``leak_check`` fixture, that ``close()`` leaves no child
process and no ``/dev/shm`` entry behind.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from backend_matrix import options_for, select
from gymnasium import spaces
from helpers import LONG_PROMPT, NUM_ENVS, as_numpy, close_promptly, make_backend, zeros

import vecaccel
from vecaccel.testing.envs import CounterEnv, counter_fns
from vecaccel.testing.envs import env_pid as worker_pid
from vecaccel.testing.leaks import leaked_shm, process_gone, shm_entries, wait_until


def exit_worker(env: gym.Env, code: int = 4) -> None:
    """A function for ``call(fn)`` that ends the worker process at once."""
    os._exit(code)


class WrongShapeEnv(gym.Env):
    """Observes ``Box(0, 10, (3,))``; with ``kind`` set, its steps return a wrong shape."""

    WRONG = {
        "scalar": lambda: np.float32(5.0),
        "short": lambda: np.ones(1, dtype=np.float32),
        "long": lambda: np.ones(4, dtype=np.float32),
    }

    def __init__(self, kind: str | None = None) -> None:
        self.kind = kind
        self.observation_space = spaces.Box(0.0, 10.0, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action):
        obs = self.WRONG[self.kind]() if self.kind else np.zeros(3, dtype=np.float32)
        return obs, 0.0, False, False, {}


class ResetHangEnv(CounterEnv):
    """A ``CounterEnv`` whose reset hangs once a flag file appears (the file is taken first,
    so the env rebuilt after its worker was killed resets normally)."""

    def __init__(self, flag: str) -> None:
        super().__init__()
        self.flag = flag

    def reset(self, *, seed=None, options=None):
        try:
            os.remove(self.flag)
        except FileNotFoundError:
            pass
        else:
            time.sleep(60)
        return super().reset(seed=seed, options=options)


pytestmark = pytest.mark.usefixtures("leak_check")


#: Generous bound for "reported quickly, never hangs" (the 1 s target is measured by
#: benchmarks/reliability/lifecycle.py, not asserted here).
PROMPT = 5.0


ACTIONS = np.zeros(NUM_ENVS, dtype=np.int64)


def make(process_backend, context, faulty=None, **options):
    return vecaccel.make_vec(
        counter_fns(NUM_ENVS, faulty),
        backend=process_backend,
        num_workers=2,
        context=context,
        **options,
    )


def counters(obs) -> list[int]:
    return obs[:, 0].tolist()


def close_twice(envs) -> None:
    started = time.monotonic()
    envs.close()
    envs.close()
    assert envs.closed
    assert time.monotonic() - started < PROMPT


# ---------------------------------------------------------------------------------------------
# an exception inside an env


def test_exception_in_step(process_backend, context):
    envs = make(process_backend, context, {3: {"fault_step": 2}})
    try:
        envs.reset(seed=0)
        assert counters(envs.step(ACTIONS)[0]) == [1, 1, 1, 1]
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(ACTIONS)
        error = info.value
        assert isinstance(error, RuntimeError)
        assert error.env_indices == (3,)
        assert "ValueError" in str(error) and "boom in step 2" in str(error)
        assert "ValueError: boom in step 2" in error.remote_traceback
        assert "testing/envs.py" in error.remote_traceback  # the worker's own frames
        # a reset starts the failed env over; then every env steps on
        envs.reset()
        assert counters(envs.step(ACTIONS)[0]) == [3, 3, 3, 3]
    finally:
        close_twice(envs)


def test_sys_exit_in_an_env_is_that_envs_error(process_backend, context):
    """``sys.exit`` inside an env's step is reported like any exception, naming the env, and
    the worker lives on: it would otherwise die and report only its exit code."""
    envs = make(process_backend, context, {3: {"fault": "sys_exit", "fault_step": 2}})
    try:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(ACTIONS)
        assert info.value.env_indices == (3,)
        assert "env 3 raised SystemExit in step" in str(info.value), str(info.value)
        envs.reset()
        assert counters(envs.step(ACTIONS)[0]) == [3, 3, 3, 3]
    finally:
        close_twice(envs)


def test_exception_in_reset(process_backend, context):
    envs = make(process_backend, context, {1: {"fault_reset": 2}})
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.reset(seed=1)
        error = info.value
        assert error.env_indices == (1,)
        assert "ValueError" in str(error) and "boom in reset 2" in str(error)
        assert "reset" in error.remote_traceback
        obs, _ = envs.reset(seed=2)  # the third reset succeeds
        assert counters(obs) == [0, 0, 0, 0]
        assert counters(envs.step(ACTIONS)[0]) == [1, 1, 1, 1]
    finally:
        close_twice(envs)


def test_exceptions_in_several_workers_name_every_env(process_backend, context):
    envs = make(process_backend, context, {0: {"fault_step": 1}, 3: {"fault_step": 1}})
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(ACTIONS)
        assert info.value.env_indices == (0, 3)
        assert info.value.remote_traceback.count("boom in step 1") >= 2
    finally:
        close_twice(envs)


def test_failed_env_is_not_silently_reused(process_backend):
    """After an env raised, stepping again without a reset must not pretend all is well."""
    envs = make(process_backend, "fork", {2: {"fault_step": 1}})
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError):
            envs.step(ACTIONS)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(ACTIONS)
        assert 2 in info.value.env_indices
    finally:
        close_twice(envs)


# ---------------------------------------------------------------------------------------------
# a worker that dies

DEATHS = {
    # kind: (exit code, words the message must contain)
    "sigkill": (-signal.SIGKILL, "SIGKILL"),
    "segfault": (-signal.SIGSEGV, "SIGSEGV"),
    "exit": (3, "code 3"),
}


def _assert_dead_worker_error(error, kind):
    exitcode, words = DEATHS[kind]
    assert isinstance(error, vecaccel.WorkerError)
    assert error.env_indices == (0, 1)  # every env of the dead worker
    assert error.exitcode == exitcode
    assert words in str(error) and "[0, 1]" in str(error), str(error)


@pytest.mark.parametrize("kind", list(DEATHS))
def test_worker_death_in_step(process_backend, context, kind):
    envs = make(process_backend, context, {1: {"fault": kind, "fault_step": 2}})
    try:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        started = time.monotonic()
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(ACTIONS)
        assert time.monotonic() - started < PROMPT
        _assert_dead_worker_error(info.value, kind)
        # the vector env stays broken, with a clear error, and never hangs
        for call in (lambda: envs.step(ACTIONS), lambda: envs.reset(), lambda: envs.call("steps")):
            started = time.monotonic()
            with pytest.raises(vecaccel.WorkerError):
                call()
            assert time.monotonic() - started < PROMPT
    finally:
        close_twice(envs)


def test_worker_death_in_reset(process_backend, context):
    envs = make(process_backend, context, {2: {"fault": "exit", "fault_reset": 1, "exit_code": 7}})
    try:
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.reset(seed=0)
        assert info.value.env_indices == (2, 3)
        assert info.value.exitcode == 7
    finally:
        close_twice(envs)


def test_worker_death_in_call(process_backend):
    envs = make(process_backend, "fork")
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.call_indices(exit_worker, [2], code=4)
        assert info.value.env_indices == (2, 3)
        assert info.value.exitcode == 4
        with pytest.raises(vecaccel.WorkerError):
            envs.step(ACTIONS)
    finally:
        close_twice(envs)


def test_worker_killed_while_idle(process_backend, context):
    envs = make(process_backend, context)
    try:
        envs.reset(seed=0)
        pids = envs.call(worker_pid)
        assert pids[0] == pids[1] != pids[2] == pids[3] != os.getpid()
        os.kill(pids[2], signal.SIGKILL)
        wait_until(lambda: process_gone(pids[2]))
        started = time.monotonic()
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(ACTIONS)
        assert time.monotonic() - started < PROMPT
        assert info.value.env_indices == (2, 3)
        assert info.value.exitcode == -signal.SIGKILL
    finally:
        close_twice(envs)


def test_worker_killed_while_parent_waits(process_backend, context):
    # env 0 sleeps 30 s in its second step; its worker is killed while the parent waits
    envs = make(process_backend, context, {0: {"sleep_step": 2, "sleep_seconds": 30.0}})
    try:
        envs.reset(seed=0)
        pid = envs.call_indices(worker_pid, [0])[0]
        envs.step(ACTIONS)
        envs.step_async(ACTIONS)
        killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        try:
            with pytest.raises(vecaccel.WorkerError) as info:
                envs.step_wait()
        finally:
            killer.join()
        assert time.monotonic() - started < PROMPT
        assert info.value.env_indices == (0, 1)
        assert "SIGKILL" in str(info.value)
    finally:
        close_twice(envs)


# ---------------------------------------------------------------------------------------------
# step_wait(timeout)


def _timeout_once(envs):
    envs.reset(seed=0)
    assert counters(envs.step(ACTIONS)[0]) == [1, 1, 1, 1]
    envs.step_async(ACTIONS)
    with pytest.raises(TimeoutError) as info:  # the builtin, not a private class
        envs.step_wait(timeout=0.1)
    assert isinstance(info.value, TimeoutError)


def test_timeout_then_step_never_returns_stale_result(process_backend, context):
    envs = make(process_backend, context, {1: {"sleep_step": 2, "sleep_seconds": 1.0}})
    try:
        _timeout_once(envs)
        try:
            obs = envs.step(ACTIONS)[0]
        except vecaccel.WorkerError:
            pass  # refusing is allowed; returning the late step-2 result is not
        else:
            assert counters(obs) == [3, 3, 3, 3]
            assert counters(envs.step(ACTIONS)[0]) == [4, 4, 4, 4]
    finally:
        close_twice(envs)


def test_timeout_then_keep_waiting(process_backend, context):
    envs = make(process_backend, context, {3: {"sleep_step": 2, "sleep_seconds": 0.6}})
    try:
        _timeout_once(envs)
        obs = envs.step_wait()  # asked for explicitly: the step that was late
        assert counters(obs[0]) == [2, 2, 2, 2]
        assert counters(envs.step(ACTIONS)[0]) == [3, 3, 3, 3]
    finally:
        close_twice(envs)


def test_timeout_then_reset_is_fresh(process_backend):
    envs = make(process_backend, "fork", {0: {"sleep_step": 2, "sleep_seconds": 0.6}})
    try:
        _timeout_once(envs)
        obs, _ = envs.reset(seed=1)
        assert counters(obs) == [2, 2, 2, 2]  # the late step finished first, then the reset
        assert counters(envs.step(ACTIONS)[0]) == [3, 3, 3, 3]
    finally:
        close_twice(envs)


def test_timeout_then_close_does_not_wait_for_the_step(process_backend, context):
    envs = make(process_backend, context, {2: {"sleep_step": 2, "sleep_seconds": 60.0}})
    try:
        _timeout_once(envs)
    finally:
        close_twice(envs)  # within PROMPT although env 2 sleeps for a minute


def test_timeout_on_a_step_that_never_finishes(process_backend):
    envs = make(
        process_backend,
        "fork",
        {2: {"sleep_step": 2, "sleep_seconds": 60.0}},
        drain_timeout=0.2,
    )
    try:
        _timeout_once(envs)
        started = time.monotonic()
        with pytest.raises((vecaccel.WorkerError, TimeoutError)):
            envs.step(ACTIONS)  # never the stale result, never a hang
        assert time.monotonic() - started < PROMPT
    finally:
        close_twice(envs)


# ---------------------------------------------------------------------------------------------
# bad actions


def test_bad_actions_never_reach_the_workers(process_backend, context):
    envs = make(process_backend, context)
    try:
        envs.reset(seed=0)
        bad = {
            "out of range": (np.array([0, 1, 2, 0]), ("Discrete(2)", "env 2")),
            "negative": (np.array([0, -1, 0, 0]), ("Discrete(2)", "env 1")),
            "wrong shape": (np.zeros((NUM_ENVS, 2), dtype=np.int64), ("Discrete(2)", "shape")),
            "too few": (np.zeros(NUM_ENVS - 1, dtype=np.int64), ("Discrete(2)",)),
            "floats": (np.full(NUM_ENVS, 0.5), ("Discrete(2)", "float64")),
            "strings": (np.array(["a"] * NUM_ENVS), ("Discrete(2)",)),
        }
        for name, (actions, words) in bad.items():
            with pytest.raises(ValueError) as info:
                envs.step(actions)
            for word in words:
                assert word in str(info.value), (name, str(info.value))
        # nothing was stepped by the bad calls: the counters show one step
        assert counters(envs.step(ACTIONS)[0]) == [1, 1, 1, 1]
        with pytest.raises(ValueError):
            envs.step_async(np.array([5, 0, 0, 0]))
        assert counters(envs.step(ACTIONS)[0]) == [2, 2, 2, 2]
    finally:
        close_twice(envs)


# ---------------------------------------------------------------------------------------------
# what cannot be pickled: an error, and the protocol stays in step


def test_unpicklable_info_is_an_env_error(process_backend, context):
    envs = make(process_backend, context, {1: {"lock_info_step": 2}})
    try:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(ACTIONS)
        assert info.value.env_indices == (1,)
        assert "pickle" in str(info.value) and "TypeError" in str(info.value)
        envs.reset()  # the worker lives on: env 1 starts over and every env steps again
        assert counters(envs.step(ACTIONS)[0]) == [3, 3, 3, 3]
    finally:
        close_twice(envs)


def test_unpicklable_arguments_and_results(process_backend):
    envs = make(process_backend, "fork")
    try:
        envs.reset(seed=0)
        lock = threading.Lock()
        # values for envs on both workers, one unpicklable: nothing may reach either worker
        with pytest.raises(Exception, match="pickle"):
            envs.set_attr_indices("tag", [1, lock], [0, 2])
        with pytest.raises(Exception, match="pickle"):
            envs.call("reset", options={"lock": lock})
        with pytest.raises(Exception, match="pickle"):
            envs.reset(options={"lock": lock})
        # an unpicklable result is the env's error, not a dead worker
        with pytest.raises(vecaccel.WorkerError, match="pickle"):
            envs.call_indices(lambda env: threading.Lock(), [3])
        # every reply was read: the next commands get their own answers
        assert counters(envs.step(ACTIONS)[0]) == [1, 1, 1, 1]
        assert envs.get_attr("steps") == (1, 1, 1, 1)
        assert envs.call(lambda env, k: env.unwrapped.steps * k, 10) == (10, 10, 10, 10)
        assert counters(envs.step(ACTIONS)[0]) == [2, 2, 2, 2]
    finally:
        close_twice(envs)


# ---------------------------------------------------------------------------------------------
# workers exit by themselves when the parent is SIGKILLed

PARENT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[2])
    import vecaccel
    from vecaccel.testing.envs import counter_fns
    from vecaccel.testing.envs import env_pid as worker_pid

    def main():
        envs = vecaccel.make_vec(counter_fns(4), backend=sys.argv[3], num_workers=2,
                                 context=sys.argv[1])
        envs.reset(seed=0)
        print(" ".join(str(pid) for pid in sorted(set(envs.call(worker_pid)))), flush=True)
        time.sleep(120)

    if __name__ == "__main__":
        main()
    """
)


def test_workers_exit_when_parent_is_killed(process_backend, context, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    shm_before = shm_entries()
    tests_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
    parent = subprocess.Popen(
        [sys.executable, str(script), context, tests_dir, process_backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = parent.stdout.readline()
        assert line.strip(), parent.stderr.read()
        pids = [int(pid) for pid in line.split()]
        assert len(pids) == 2 and all(not process_gone(pid) for pid in pids)
        parent.kill()
        parent.wait(PROMPT)
        assert wait_until(lambda: all(process_gone(pid) for pid in pids), timeout=PROMPT), [
            pid for pid in pids if not process_gone(pid)
        ]
        assert leaked_shm(shm_before) == set()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
        parent.stderr.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_unpicklable_env_function_error_names_the_env(context, leak_check):
    """An env function that cannot be sent to its worker: the error says which one."""
    lock = threading.Lock()

    def holds_a_lock():
        assert lock is not None  # the closure captures the lock
        return CounterEnv()

    env_fns = counter_fns(NUM_ENVS)
    env_fns[3] = holds_a_lock
    with pytest.raises(Exception) as info:
        make_backend("shm", env_fns, context=context)
    message = str(info.value)
    assert "pickle" in message, message
    assert "env 3" in message or getattr(info.value, "env_indices", None) == (3,), message


@pytest.mark.parametrize("kind", ["scalar", "short", "long"])
@pytest.mark.parametrize("backend", select())
def test_observation_of_the_wrong_shape_is_an_error_naming_the_env(backend, kind, leak_check):
    """An env that returns an observation not of its space's shape must not be broadcast
    silently into the slot (a scalar or a 1-element array fills all 3 elements): it is that
    env's error, as in Gymnasium's ``SyncVectorEnv``."""
    env_fns = [functools.partial(WrongShapeEnv)] * 3 + [functools.partial(WrongShapeEnv, kind)]
    options = options_for(backend, num_workers=2, context="fork")
    envs = vecaccel.make_vec(env_fns, backend=backend, **options)
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError) as info:
            obs, *_, infos = envs.step(zeros(envs))
            row = list(infos.get("env_id", range(NUM_ENVS))).index(3)
            raise AssertionError(f"no error; env 3 observed {obs[row].tolist()}")
        assert info.value.env_indices == (3,)
    finally:
        close_promptly(envs)


# =============================================================================================
# worker deaths in the pooled backends, and a reset that hangs


@pytest.mark.parametrize("backend", select(partial_batches=True, envs_in_workers=True))
def test_pooled_worker_death_in_reset_and_call(backend, leak_check):
    # env 2's worker is SIGKILLed in its second reset
    envs = make_backend(backend, counter_fns(NUM_ENVS, {2: {"fault": "sigkill", "fault_reset": 2}}))
    try:
        envs.reset(seed=0)
        started = time.monotonic()
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.reset(seed=1)
        assert time.monotonic() - started < LONG_PROMPT
        assert info.value.env_indices == (2, 3)
        assert info.value.exitcode == -signal.SIGKILL and "SIGKILL" in str(info.value)
        for call in (lambda: envs.step(zeros(envs)), lambda: envs.get_attr("steps")):
            with pytest.raises(vecaccel.WorkerError):
                call()
    finally:
        close_promptly(envs)
    envs = make_backend(backend, counter_fns(NUM_ENVS))
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.call_indices(exit_worker, [1], code=6)
        assert info.value.env_indices == (0, 1) and info.value.exitcode == 6
        with pytest.raises(vecaccel.WorkerError):
            envs.step(zeros(envs))
    finally:
        close_promptly(envs)


@pytest.mark.parametrize("policy", ["raise", "restart"])
@pytest.mark.parametrize("backend", select(restarts_workers=True, envs_in_workers=True))
def test_step_timeout_ends_a_hung_reset(backend, policy, tmp_path, leak_check):
    """``step_timeout`` covers a worker stuck in ``reset`` (or a call) too, not only in a step:
    the hung reset is an error naming its envs, or under the restart policy the worker is
    replaced and the reset done as asked."""
    flag = str(tmp_path / "hang")
    fns = [functools.partial(ResetHangEnv, flag)] * NUM_ENVS
    envs = make_backend(backend, fns, step_timeout=1.0, on_worker_failure=policy)
    try:
        envs.reset(seed=0)
        open(flag, "w").close()
        started = time.monotonic()
        if policy == "raise":
            with pytest.raises(vecaccel.WorkerError, match="step_timeout") as info:
                envs.reset(seed=1)
            assert set(info.value.env_indices) <= set(range(NUM_ENVS))
        else:
            obs, _ = envs.reset(seed=1)
            assert as_numpy(obs).shape[1:] == (1,)
            assert envs.failures == 1
        assert time.monotonic() - started < LONG_PROMPT + 1.0
    finally:
        close_promptly(envs)
