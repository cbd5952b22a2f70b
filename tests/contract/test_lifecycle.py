"""Creating and closing process backends leaves nothing behind: fds, /dev/shm, children.

(``benchmarks/reliability/lifecycle.py`` runs the same check over 1,000 cycles.) Risky cases (``os.fork()``
in a child) run in a child interpreter with a timeout, so a hang fails the test and does not
stall the suite.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import textwrap
import threading

import numpy as np
import pytest
import torch
from backend_matrix import options_for, select, start_method_cases
from helpers import (
    LONG_PROMPT,
    NUM_ENVS,
    close_promptly,
    last_json,
    make_backend,
    run_child,
    zeros,
)

import vecaccel
from vecaccel.testing.envs import WideSpacesEnv, counter_fns
from vecaccel.testing.envs import env_pid as worker_pid
from vecaccel.testing.leaks import (
    child_pids,
    leaked_shm,
    open_fds,
    process_gone,
    shm_entries,
    wait_until,
)
from vecaccel.worker import process as worker_process

torch.set_num_threads(1)

PROMPT = 5.0


def _cycle(process_backend, context, num_envs=2, num_workers=2):
    envs = vecaccel.make_vec(
        counter_fns(num_envs), backend=process_backend, num_workers=num_workers, context=context
    )
    envs.reset(seed=0)
    envs.step(np.zeros(num_envs, dtype=np.int64))
    envs.close()


# a cycle that leaves anything behind shows at once, so a few cycles do (benchmarks/reliability/
# lifecycle.py runs a thousand); under spawn, one worker, a fresh interpreter each cycle
@pytest.mark.parametrize("context, cycles, workers", [("fork", 10, 2), ("spawn", 1, 1)])
def test_create_close_cycles_leave_no_trace(process_backend, context, cycles, workers):
    # warm-up: allocator arenas, spawn's resource tracker
    _cycle(process_backend, context, num_workers=workers)
    gc.collect()
    fds, shm, children = open_fds(), shm_entries(), child_pids()
    for _ in range(cycles):
        _cycle(process_backend, context, num_workers=workers)
    gc.collect()
    wait_until(lambda: child_pids() == children, PROMPT)
    assert child_pids() == children
    assert leaked_shm(shm) == set()  # entries other jobs on the machine hold are theirs
    assert len(open_fds()) == len(fds), sorted(open_fds() - fds)


def _worker_pids(envs) -> list[int]:
    return sorted(set(envs.call(worker_pid)))


def _abandoned_env(process_backend, context, broken=False):
    faulty = {0: {"fault": "exit", "fault_step": 1}} if broken else None
    envs = vecaccel.make_vec(
        counter_fns(4, faulty), backend=process_backend, num_workers=2, context=context
    )
    envs.reset(seed=0)
    pids = _worker_pids(envs)
    if broken:
        with pytest.raises(vecaccel.WorkerError):
            envs.step(np.zeros(4, dtype=np.int64))
    return pids  # `envs` goes out of scope without close()


@pytest.mark.parametrize("broken", [False, True], ids=["healthy", "broken"])
def test_garbage_collection_closes_workers(process_backend, broken, leak_check):
    pids = _abandoned_env(process_backend, "fork", broken)
    gc.collect()
    assert wait_until(lambda: all(process_gone(pid) for pid in pids), PROMPT)


def test_views_outlive_the_env(process_backend):
    """With ``copy=False`` an observation kept after close() is still readable memory."""
    envs = vecaccel.make_vec(counter_fns(2), backend=process_backend, num_workers=2, copy=False)
    obs, _ = envs.reset(seed=0)
    obs = envs.step(np.zeros(2, dtype=np.int64))[0]
    envs.close()
    del envs
    gc.collect()
    assert obs[:, 0].tolist() == [1, 1]


@pytest.mark.parametrize("context, failing_env", [("fork", 1), ("fork", 3), ("spawn", 3)])
def test_env_construction_error_is_worker_error(process_backend, context, failing_env, leak_check):
    faulty = {failing_env: {"fault_init": True}}
    with pytest.raises(vecaccel.WorkerError) as info:
        vecaccel.make_vec(
            counter_fns(4, faulty), backend=process_backend, num_workers=2, context=context
        )
    assert info.value.env_indices == (failing_env,)
    assert "ValueError" in str(info.value) and "boom in init" in str(info.value)
    assert "boom in init" in info.value.remote_traceback


def test_worker_death_during_construction(process_backend, context, leak_check):
    faulty = {3: {"fault_init": True, "fault": "exit", "exit_code": 5}}
    with pytest.raises(vecaccel.WorkerError) as info:
        vecaccel.make_vec(
            counter_fns(4, faulty), backend=process_backend, num_workers=2, context=context
        )
    assert info.value.env_indices == (2, 3)
    assert info.value.exitcode == 5


@pytest.mark.parametrize("backend", select(lockstep=True, tensors=False))
def test_construction_error_in_first_env(backend, leak_check):
    """The first env is also built in the caller (for the spaces): same error type there."""
    with pytest.raises(vecaccel.WorkerError) as info:
        vecaccel.make_vec(counter_fns(2, {0: {"fault_init": True}}), backend=backend)
    assert info.value.env_indices == (0,)
    assert "ValueError" in str(info.value) and "boom in init" in str(info.value)


def test_context_manager_closes(process_backend, leak_check):
    with vecaccel.make_vec(counter_fns(2), backend=process_backend, num_workers=2) as envs:
        envs.reset(seed=0)
        pids = _worker_pids(envs)
    assert envs.closed
    assert all(process_gone(pid) for pid in pids)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_startup_larger_than_the_socket_buffer(context, leak_check):
    """A worker's env functions and spaces go down its socket after it starts; what the
    socket cannot take at once is written by a thread, which is done when the workers are."""
    envs = vecaccel.make_vec([WideSpacesEnv] * 2, backend="shm", num_workers=2, context=context)
    try:
        obs, _ = envs.reset(seed=0)
        assert (obs == 7).all()
        obs, *_ = envs.step(np.array([1, 0]))
        assert (obs[0] == 1).all() and (obs[1] == 0).all()
        assert not [t for t in threading.enumerate() if t.name == "vecaccel-startup"]
    finally:
        envs.close()


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _startup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "vecaccel-startup"]


def test_worker_dying_mid_startup_raises_and_leaves_no_thread_or_fd(monkeypatch, leak_check):
    """A worker that dies half-way through reading its (large) startup message: the pool
    raises WorkerError at once, and the writer thread and its duplicate socket are gone."""
    warm = vecaccel.make_vec([WideSpacesEnv] * 2, backend="shm", num_workers=2, context="fork")
    warm.close()  # multiprocessing's own lazily made fds exist from here on
    before = _fds()

    def dying(fd):
        os.read(fd, 1000)
        os._exit(3)

    monkeypatch.setattr(worker_process, "read_startup", dying)  # inherited by forked workers
    for _ in range(2):
        with pytest.raises(vecaccel.WorkerError, match="exited with code 3"):
            vecaccel.make_vec(
                [WideSpacesEnv] * 2, backend="shm", num_workers=2, context="fork",
                start_timeout=60,
            )  # fmt: skip
    monkeypatch.undo()
    for thread in _startup_threads():
        thread.join(5.0)
    assert not _startup_threads()
    assert _fds() <= before


FORK_CHILD_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import vecaccel
    from vecaccel.testing.envs import counter_fns, env_pid as worker_pid
    from vecaccel.testing.leaks import process_gone, wait_until

    def main():
        backend, options = sys.argv[2], json.loads(sys.argv[3])
        envs = vecaccel.make_vec(counter_fns(4), backend=backend, **options)
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
    [
        (context, backend)
        for backend, context in start_method_cases(
            select(envs_in_workers=True, tensors=False), ("fork", "spawn", "forkserver")
        )
    ],
)
def test_forked_child_exit_leaves_the_parents_workers_alone(context, backend):
    """A user process that calls ``os.fork()`` after making a vector env: the child's normal
    exit must not end the parent's workers (nor print a traceback); the parent steps on."""
    options = options_for(backend, num_workers=2, context=context)
    completed = run_child(FORK_CHILD_SCRIPT, backend, json.dumps(options))
    result = last_json(completed)
    assert result["status"] == 0
    assert result["alive"] == result["workers"], result
    assert result["step"] == [1, 1, 1, 1], result
    assert "Traceback" not in completed.stderr, completed.stderr


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


@pytest.mark.parametrize(
    "backend, context", start_method_cases(select(envs_in_workers=True), ("fork", "forkserver"))
)
def test_env_constructor_error_in_a_worker_names_the_env(backend, context, leak_check):
    with pytest.raises(vecaccel.WorkerError) as info:
        make_backend(backend, counter_fns(NUM_ENVS, {2: {"fault_init": True}}), context=context)
    assert info.value.env_indices == (2,)
    assert "boom in init" in str(info.value) and "boom in init" in info.value.remote_traceback


@pytest.mark.parametrize(
    "backend, context", start_method_cases(select(envs_in_workers=True), ("fork", "spawn"))
)
def test_close_with_a_step_in_flight(backend, context, leak_check):
    """``step_async`` (or ``send``) and then ``close()`` without waiting, while an env sleeps
    30 s in that step: close returns at once and leaves nothing behind."""
    envs = make_backend(
        backend, counter_fns(NUM_ENVS, {3: {"sleep_step": 1, "sleep_seconds": 30.0}})
    )
    envs.reset(seed=0)
    envs.step_async(zeros(envs))
    pids = [w.process.pid for w in envs.pool.workers]
    close_promptly(envs)
    assert all(process_gone(pid) for pid in pids)


def test_async_partial_batches_then_close(leak_check):
    envs = make_backend("async", counter_fns(NUM_ENVS), batch_size=2)
    envs.reset(seed=0)
    envs.step(np.zeros(2, dtype=np.int64))
    envs.send(np.zeros(2, dtype=np.int64), envs._last_ids)  # two envs stepping, none received
    close_promptly(envs)


def _abandon(backend, context, in_flight):
    envs = make_backend(backend, counter_fns(NUM_ENVS), context=context)
    envs.reset(seed=0)
    pids = [w.process.pid for w in envs.pool.workers]
    if in_flight:
        envs.step_async(zeros(envs))
    return pids  # no close()


@pytest.mark.parametrize("in_flight", [True, False])
@pytest.mark.parametrize(
    "backend, context",
    start_method_cases(select(envs_in_workers=True), ("fork", "spawn", "forkserver")),
)
def test_garbage_collection_without_close_cleans_up(backend, context, in_flight, leak_check):
    pids = _abandon(backend, context, in_flight)
    gc.collect()
    assert wait_until(lambda: all(process_gone(pid) for pid in pids), LONG_PROMPT)


@pytest.mark.parametrize("backend", select(partial_batches=True, envs_in_workers=True))
def test_create_close_cycles_with_failures_leave_no_trace(backend):
    def cycle(kind: str) -> None:
        if kind == "init":
            with pytest.raises(vecaccel.WorkerError):
                make_backend(backend, counter_fns(NUM_ENVS, {3: {"fault_init": True}}))
            return
        envs = make_backend(backend, counter_fns(NUM_ENVS))
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
    assert wait_until(lambda: child_pids() == children, LONG_PROMPT), child_pids() - children
    assert leaked_shm(shm) == set()
    assert len(open_fds()) == len(fds), (sorted(open_fds() - fds), sorted(fds - open_fds()))
