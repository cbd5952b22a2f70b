"""Lifecycle and fault handling in the process backends (``shm``, ``async``,
``action_server``), under the ``fork``, ``spawn`` and ``forkserver`` start methods.

This file adds cases that ``test_faults.py``, ``test_lifecycle.py``, ``test_restart*.py``,
``test_interrupt.py`` and ``test_stateful.py`` do not cover. Risky cases (signals to the test
process, ``os.fork()``) run in a child interpreter with a timeout, so a hang fails the test and
does not stall the suite.
"""

from __future__ import annotations

import functools
import gc
import json
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
from fault_envs import leaked_shm
from gymnasium import spaces
from helpers_envs import (
    CounterEnv,
    child_pids,
    counter_fns,
    exit_worker,
    open_fds,
    process_gone,
    shm_entries,
    wait_until,
    worker_pid,
)

import vecaccel

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
#: Generous bound for "returns at once": it catches hangs, not slowness.
PROMPT = 10.0
#: How long a child interpreter may run before the test calls it stuck.
CHILD_TIMEOUT = 90.0
NUM_ENVS = 4  # two workers: envs [0, 1] and [2, 3]

OPTIONS = {
    "shm": {},
    "async": {"batch_size": NUM_ENVS},
    "action_server": {"device": "cpu"},
}


def make(backend: str, env_fns, context: str = "fork", **options):
    return vecaccel.make_vec(
        env_fns,
        backend=backend,
        num_workers=2,
        context=context,
        **{**OPTIONS.get(backend, {}), **options},
    )


def zeros(envs, n: int = NUM_ENVS):
    actions = np.zeros(n, dtype=np.int64)
    if getattr(envs, "device", None) is not None:  # action_server takes torch tensors
        import torch

        return torch.as_tensor(actions)
    return actions


def as_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def close_promptly(envs) -> None:
    started = time.monotonic()
    envs.close()
    envs.close()
    assert envs.closed
    assert time.monotonic() - started < PROMPT


def run_child(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter (tests dir first on its path); a hang fails."""
    try:
        return subprocess.run(
            [sys.executable, "-c", script, TESTS_DIR, *args],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:  # workers follow their parent out
        raise AssertionError(f"the child hung: {exc.stdout!r} {exc.stderr!r}") from None


def last_json(completed: subprocess.CompletedProcess) -> dict:
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result (rc {completed.returncode}): {completed.stderr}"
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# envs used only under fork (module level, so they pickle by reference)


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


class RebuildFailsEnv(CounterEnv):
    """A ``CounterEnv`` whose constructor raises once ``flag`` exists: a rebuild fails."""

    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            raise ValueError("cannot rebuild: the flag is set")
        super().__init__()


# =============================================================================================
# cases found broken by a review (session 9), fixed since: each describes the behaviour kept


@pytest.mark.parametrize("operation", ["reset", "get_attr"])
@pytest.mark.parametrize("backend", ["shm", "async"])
def test_restart_policy_recovers_a_worker_that_died_while_idle(backend, operation, leak_check):
    """Under ``on_worker_failure="restart"`` a worker killed between calls is started again
    whatever the next call is, not only when it is a ``step``: a ``reset`` (what a user does
    after a failure) or a ``get_attr`` must not leave the vector env broken for good."""
    envs = make(backend, counter_fns(NUM_ENVS), on_worker_failure="restart")
    try:
        envs.reset(seed=0)
        pid = envs.call(worker_pid)[3]
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: process_gone(pid), PROMPT)
        if operation == "reset":
            obs, _ = envs.reset(seed=1)
            assert as_numpy(obs)[:, 0].tolist() == [0, 0, 0, 0]
        else:
            try:
                steps = envs.get_attr("steps")
            except vecaccel.WorkerError as error:  # reporting the lost call is fine...
                assert set(error.env_indices) == {2, 3}
            else:
                assert steps == (0, 0, 0, 0)
        # ...but the env goes on: the dead worker was replaced
        obs, *_ = envs.step(zeros(envs))
        assert as_numpy(obs).shape == (NUM_ENVS, 1)
        assert envs.pool.workers[1].process.is_alive()
        assert envs.failures == 1
    finally:
        close_promptly(envs)


FORK_CHILD_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import vecaccel
    from helpers_envs import counter_fns, process_gone, wait_until, worker_pid

    def main():
        context, backend = sys.argv[2], sys.argv[3]
        options = {"batch_size": 4} if backend == "async" else {}
        envs = vecaccel.make_vec(counter_fns(4), backend=backend, num_workers=2,
                                 context=context, **options)
        envs.reset(seed=0)
        pids = sorted(set(envs.call(worker_pid)))
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child == 0:
            sys.exit(0)  # a plain exit: atexit handlers and finalizers run in the child
        _, status = os.waitpid(child, 0)
        wait_until(lambda: any(process_gone(pid) for pid in pids), 0.5)
        alive = [pid for pid in pids if not process_gone(pid)]
        try:
            obs = envs.step(np.zeros(4, dtype=np.int64))[0]
            step = np.asarray(obs)[:, 0].tolist()
        except Exception as exc:
            step = f"{type(exc).__name__}: {exc}"
        envs.close()
        print(json.dumps({"status": status, "workers": pids, "alive": alive, "step": step}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize(
    "context, backend",
    [("fork", "shm"), ("spawn", "shm"), ("forkserver", "shm"), ("fork", "async")],
)
def test_forked_child_exit_leaves_the_parents_workers_alone(context, backend):
    """A user process that calls ``os.fork()`` after making a vector env: the child's normal
    exit must not end the parent's workers (nor print a traceback); the parent steps on."""
    completed = run_child(FORK_CHILD_SCRIPT, context, backend)
    result = last_json(completed)
    assert result["status"] == 0
    assert result["alive"] == result["workers"], result
    assert result["step"] == [1, 1, 1, 1], result
    assert "Traceback" not in completed.stderr, completed.stderr


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_unpicklable_env_function_error_names_the_env(context, leak_check):
    """An env function that cannot be sent to its worker: the error says which one."""
    lock = threading.Lock()

    def holds_a_lock():
        assert lock is not None  # the closure captures the lock
        return CounterEnv()

    env_fns = counter_fns(NUM_ENVS)
    env_fns[3] = holds_a_lock
    with pytest.raises(Exception) as info:  # noqa: B017 - the type is not the point
        make("shm", env_fns, context=context)
    message = str(info.value)
    assert "pickle" in message, message
    assert "env 3" in message or getattr(info.value, "env_indices", None) == (3,), message


@pytest.mark.parametrize("kind", ["scalar", "short", "long"])
@pytest.mark.parametrize("backend", ["serial", "shm", "async"])
def test_observation_of_the_wrong_shape_is_an_error_naming_the_env(backend, kind, leak_check):
    """An env that returns an observation not of its space's shape must not be broadcast
    silently into the slot (a scalar or a 1-element array fills all 3 elements): it is that
    env's error, as in Gymnasium's ``SyncVectorEnv``."""
    env_fns = [functools.partial(WrongShapeEnv)] * 3 + [functools.partial(WrongShapeEnv, kind)]
    options = {} if backend == "serial" else {"num_workers": 2, "context": "fork"}
    options.update(OPTIONS.get(backend, {}))
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


INTERRUPTED_CALL_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import vecaccel
    from fault_envs import fault_env_fns

    def nap(env, seconds):
        time.sleep(seconds)
        return "napped"

    def slow_env_id(env, seconds):
        time.sleep(seconds)
        return env.unwrapped.env_id

    def attempt(fn):
        try:
            return list(fn())
        except Exception as exc:
            return {"type": type(exc).__name__, "message": str(exc)}

    def main():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C
        envs = vecaccel.make_vec(fault_env_fns(4), backend=sys.argv[2], num_workers=2,
                                 context="fork", **({"batch_size": 4} if sys.argv[2] == "async"
                                                   else {}))
        envs.reset(seed=0, options={})
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            envs.call_indices(nap, [3], 0.8)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        time.sleep(1.0)  # the interrupted call has finished in its worker by now
        first = attempt(lambda: envs.call_indices(slow_env_id, [3], 0.3))
        second = attempt(lambda: envs.call_indices(slow_env_id, [2, 3], 0.3))
        envs.close()
        print(json.dumps({"interrupted": interrupted, "first": first, "second": second}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize("backend", ["shm", "async"])
def test_call_after_an_interrupted_call_gets_its_own_result(backend):
    """Ctrl-C during ``call`` (then carrying on, as in a notebook): the interrupted call's late
    reply must never be returned as the result of a later call. Either the later calls return
    their own results, or they raise a clear error (``WorkerError``/``RuntimeError``)."""
    result = last_json(run_child(INTERRUPTED_CALL_SCRIPT, backend))
    assert result["interrupted"]
    for key, expected in (("first", [3]), ("second", [2, 3])):
        outcome = result[key]
        if isinstance(outcome, dict):
            assert outcome["type"] in ("WorkerError", "RuntimeError"), (key, outcome)
        else:
            assert outcome == expected, (key, result)


@pytest.mark.parametrize("backend", ["shm", "async"])
def test_failed_restart_leaves_a_clear_error(backend, tmp_path, leak_check):
    """A dead worker whose env function raises when it is rebuilt: that error is raised, and
    every later call says the env cannot continue (a ``WorkerError`` naming the envs), not
    "step_async() called twice" or "envs [2, 3] are still stepping"."""
    flag = str(tmp_path / "flag")
    env_fns = [functools.partial(RebuildFailsEnv, flag)] * NUM_ENVS
    envs = make(backend, env_fns, on_worker_failure="restart")
    try:
        envs.reset(seed=0)
        pid = envs.call(worker_pid)[3]
        open(flag, "w").close()
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: process_gone(pid), PROMPT)
        with pytest.raises(vecaccel.WorkerError, match="cannot rebuild"):
            envs.step(zeros(envs))
        for _ in range(2):
            with pytest.raises(vecaccel.WorkerError) as info:
                envs.step(zeros(envs))
            assert {2, 3} & set(info.value.env_indices), str(info.value)
    finally:
        close_promptly(envs)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return True  # no torch: no action_server either; skip
    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_available(), reason="needs a machine without CUDA")
def test_failed_action_server_construction_stops_its_workers_at_once(leak_check):
    """``action_server`` starts its workers, then fails (``device="cuda"`` without a GPU):
    the workers must be stopped before the error is raised, not when the error (whose
    traceback holds the half-built env) is garbage collected."""
    before = child_pids()
    info = None
    try:
        with pytest.raises(RuntimeError) as info:
            vecaccel.make_vec(
                "CartPole-v1", 2, backend="action_server", device="cuda", num_workers=2
            )
        assert info.value.__traceback__ is not None  # the error is still held, as in a notebook
        left = lambda: child_pids() - before  # noqa: E731
        assert wait_until(lambda: not left(), 3.0), f"workers still running: {sorted(left())}"
    finally:
        info = None  # drop the error (and the half-built env its traceback holds)
        gc.collect()


# =============================================================================================
# coverage: behaviour that holds, pinned down for the backends and start methods not yet tested


@pytest.mark.parametrize("backend", ["async", "action_server"])
def test_pooled_worker_death_in_reset_and_call(backend, leak_check):
    # env 2's worker is SIGKILLed in its second reset
    envs = make(backend, counter_fns(NUM_ENVS, {2: {"fault": "sigkill", "fault_reset": 2}}))
    try:
        envs.reset(seed=0)
        started = time.monotonic()
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.reset(seed=1)
        assert time.monotonic() - started < PROMPT
        assert info.value.env_indices == (2, 3)
        assert info.value.exitcode == -signal.SIGKILL and "SIGKILL" in str(info.value)
        for call in (lambda: envs.step(zeros(envs)), lambda: envs.get_attr("steps")):
            with pytest.raises(vecaccel.WorkerError):
                call()
    finally:
        close_promptly(envs)
    envs = make(backend, counter_fns(NUM_ENVS))
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.call_indices(exit_worker, [1], code=6)
        assert info.value.env_indices == (0, 1) and info.value.exitcode == 6
        with pytest.raises(vecaccel.WorkerError):
            envs.step(zeros(envs))
    finally:
        close_promptly(envs)


@pytest.mark.parametrize(
    "backend, context", [("async", "fork"), ("action_server", "fork"), ("shm", "forkserver")]
)
def test_env_constructor_error_in_a_worker_names_the_env(backend, context, leak_check):
    with pytest.raises(vecaccel.WorkerError) as info:
        make(backend, counter_fns(NUM_ENVS, {2: {"fault_init": True}}), context=context)
    assert info.value.env_indices == (2,)
    assert "boom in init" in str(info.value) and "boom in init" in info.value.remote_traceback


@pytest.mark.parametrize(
    "backend, context",
    [("shm", "fork"), ("shm", "spawn"), ("async", "fork"), ("action_server", "fork")],
)
def test_close_with_a_step_in_flight(backend, context, leak_check):
    """``step_async`` (or ``send``) and then ``close()`` without waiting, while an env sleeps
    30 s in that step: close returns at once and leaves nothing behind."""
    envs = make(backend, counter_fns(NUM_ENVS, {3: {"sleep_step": 1, "sleep_seconds": 30.0}}))
    envs.reset(seed=0)
    envs.step_async(zeros(envs))
    pids = [w.process.pid for w in envs.pool.workers]
    close_promptly(envs)
    assert all(process_gone(pid) for pid in pids)


def test_async_partial_batches_then_close(leak_check):
    envs = make("async", counter_fns(NUM_ENVS), batch_size=2)
    envs.reset(seed=0)
    envs.step(np.zeros(2, dtype=np.int64))
    envs.send(np.zeros(2, dtype=np.int64), envs._last_ids)  # two envs stepping, none received
    close_promptly(envs)


def _abandon(backend, context, in_flight):
    envs = make(backend, counter_fns(NUM_ENVS), context=context)
    envs.reset(seed=0)
    pids = [w.process.pid for w in envs.pool.workers]
    if in_flight:
        envs.step_async(zeros(envs))
    return pids  # no close()


@pytest.mark.parametrize(
    "backend, context, in_flight",
    [
        ("async", "fork", True),
        ("action_server", "fork", False),
        ("shm", "spawn", True),
        ("shm", "forkserver", False),
    ],
)
def test_garbage_collection_without_close_cleans_up(backend, context, in_flight, leak_check):
    pids = _abandon(backend, context, in_flight)
    gc.collect()
    assert wait_until(lambda: all(process_gone(pid) for pid in pids), PROMPT)


@pytest.mark.parametrize("backend", ["async", "action_server"])
def test_create_close_cycles_with_failures_leave_no_trace(backend):
    def cycle(kind: str) -> None:
        if kind == "init":
            with pytest.raises(vecaccel.WorkerError):
                make(backend, counter_fns(NUM_ENVS, {3: {"fault_init": True}}))
            return
        envs = make(backend, counter_fns(NUM_ENVS))
        envs.reset(seed=0)
        if kind == "kill":
            os.kill(envs.pool.workers[1].process.pid, signal.SIGKILL)
            with pytest.raises(vecaccel.WorkerError):
                for _ in range(100):
                    envs.step(zeros(envs))
        else:
            envs.step(zeros(envs))
        envs.close()

    for kind in ("ok", "init", "kill"):  # warm-up: allocator arenas, lazy imports
        cycle(kind)
    gc.collect()
    fds, shm, children = open_fds(), shm_entries(), child_pids()
    for _ in range(3):
        for kind in ("ok", "init", "kill"):
            cycle(kind)
    gc.collect()
    assert wait_until(lambda: child_pids() == children, PROMPT), child_pids() - children
    assert leaked_shm(shm) == set()
    assert len(open_fds()) == len(fds), (sorted(open_fds() - fds), sorted(fds - open_fds()))


INTERRUPTED_STEP_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import vecaccel
    from fault_envs import env_pid, fault_env_fns
    from helpers_envs import process_gone, wait_until

    def main():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C
        backend, context = sys.argv[2], sys.argv[3]
        options = {"device": "cpu"} if backend == "action_server" else {"batch_size": 4}
        envs = vecaccel.make_vec(fault_env_fns(4, hang_seconds=300.0), backend=backend,
                                 num_workers=2, context=context, **options)
        envs.reset(seed=0, options={})
        pids = sorted(set(envs.call(env_pid)))
        actions = np.zeros(4, dtype=np.int64)
        if backend == "action_server":
            import torch
            actions = torch.as_tensor(actions)
        envs.set_attr("inject", "hang")  # every env sleeps 300 s in its next step
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            envs.step(actions)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        envs.close()
        gone = wait_until(lambda: all(process_gone(pid) for pid in pids), 10.0)
        print(json.dumps({"interrupted": interrupted, "gone": gone, "closed": envs.closed}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize("backend, context", [("async", "fork"), ("action_server", "spawn")])
def test_keyboard_interrupt_during_a_step_then_close(backend, context):
    shm_before = shm_entries()
    completed = run_child(INTERRUPTED_STEP_SCRIPT, backend, context)
    result = last_json(completed)
    assert result == {"interrupted": True, "gone": True, "closed": True}, completed.stderr
    assert completed.returncode == 0
    assert "Traceback" not in completed.stderr, completed.stderr
    assert leaked_shm(shm_before) == set()


@pytest.mark.parametrize("then", ["step", "step_wait", "get_attr"])
def test_keyboard_interrupt_in_a_step_then_going_on(then, leak_check):
    """Ctrl-C while ``step`` waits for the workers (caught, as in a notebook): the step in flight
    is never returned by a later ``step``; ``step_wait`` can still take it; nothing hangs."""
    fns = counter_fns(NUM_ENVS, {3: {"sleep_step": 2, "sleep_seconds": 0.5}})
    envs = make("shm", fns)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        envs.reset(seed=0)
        envs.step(zeros(envs))
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            envs.step(zeros(envs))  # env 3 sleeps through its second step
        if then == "step":  # the interrupted step is finished and dropped: this is step 3
            obs, *_ = envs.step(zeros(envs))
            assert as_numpy(obs)[:, 0].tolist() == [3, 3, 3, 3]
        elif then == "step_wait":  # it is still the step in flight
            obs, *_ = envs.step_wait()
            assert as_numpy(obs)[:, 0].tolist() == [2, 2, 2, 2]
        else:
            assert envs.get_attr("steps") == (2, 2, 2, 2)
            obs, *_ = envs.step(zeros(envs))
            assert as_numpy(obs)[:, 0].tolist() == [3, 3, 3, 3]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        close_promptly(envs)


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


@pytest.mark.parametrize("policy", ["raise", "restart"])
@pytest.mark.parametrize("backend", ["shm", "async"])
def test_step_timeout_ends_a_hung_reset(backend, policy, tmp_path, leak_check):
    """``step_timeout`` covers a worker stuck in ``reset`` (or a call) too, not only in a step:
    the hung reset is an error naming its envs, or under the restart policy the worker is
    replaced and the reset done as asked."""
    flag = str(tmp_path / "hang")
    fns = [functools.partial(ResetHangEnv, flag)] * NUM_ENVS
    envs = make(backend, fns, step_timeout=1.0, on_worker_failure=policy)
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
        assert time.monotonic() - started < PROMPT + 1.0
    finally:
        close_promptly(envs)
