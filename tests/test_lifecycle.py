"""Creating and closing process backends leaves nothing behind: fds, /dev/shm, children.

(``benchmarks/lifecycle.py`` runs the same check over 1,000 cycles.)
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from helpers_envs import (
    WideSpacesEnv,
    child_pids,
    counter_fns,
    open_fds,
    process_gone,
    shm_entries,
    wait_until,
    worker_pid,
)

import vecaccel

PROMPT = 5.0


def _cycle(process_backend, context, num_envs=2):
    envs = vecaccel.make_vec(
        counter_fns(num_envs), backend=process_backend, num_workers=2, context=context
    )
    envs.reset(seed=0)
    envs.step(np.zeros(num_envs, dtype=np.int64))
    envs.close()


@pytest.mark.parametrize("context, cycles", [("fork", 30), ("spawn", 2)])
def test_create_close_cycles_leave_no_trace(process_backend, context, cycles):
    _cycle(process_backend, context)  # warm-up: allocator arenas, spawn's resource tracker
    gc.collect()
    fds, shm, children = open_fds(), shm_entries(), child_pids()
    for _ in range(cycles):
        _cycle(process_backend, context)
    gc.collect()
    wait_until(lambda: child_pids() == children, PROMPT)
    assert child_pids() == children
    assert shm_entries() - shm == set()
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


@pytest.mark.parametrize("backend", ["serial", "shm", "hybrid"])
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


def test_spawn_script_without_main_guard_fails_instead_of_hanging(tmp_path):
    """Under spawn, a worker re-runs a script that lacks the ``__main__`` guard and dies making
    its own vec env. Pong's spaces made the worker's arguments larger than a pipe buffer, and
    multiprocessing's spawn launch then waited forever to write them to the dead child."""
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text(
        "import vecaccel\n"
        "envs = vecaccel.make_vec('PongNoFrameskip-v4', 2, backend='shm', context='spawn')\n"
        "envs.close()\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "WorkerError" in done.stderr and "exited with code 1" in done.stderr, done.stderr
    assert "bootstrapping phase" in done.stderr  # the child's own explanation reaches the user


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
