"""How the parent waits for its workers' replies, on a real worker pool: a timeout names the
envs still running and keeps the replies already taken; a worker that dies is noticed at once
(an error naming it and its envs, which breaks the pool, or under the restart policy a worker
started again); one that overruns ``step_timeout_s`` is killed with its stack taken first. Env
error reports become one ``WorkerError`` naming every env."""

from __future__ import annotations

import functools
import inspect
import os
import signal

import numpy as np
import pytest
from backend_matrix import DEFAULT_BACKEND, select, spread_start_methods
from gymnasium.vector import AutoresetMode
from helpers import make_backend
from toy_envs import WaitingEnv, tagged_counter

import vecaccel
from vecaccel.errors import RemoteTraceback
from vecaccel.options import WorkerOptions
from vecaccel.testing.envs import CounterEnv
from vecaccel.testing.leaks import process_gone, wait_until
from vecaccel.worker import Command, ErrorReport, Status, WorkerPool
from vecaccel.worker.replies import Replies

SPACES = (CounterEnv().observation_space, CounterEnv().action_space)


def _line_of(function, text: str) -> int:
    """The line number, in its file, of the first line of ``function`` holding ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.fixture
def make_pool(leak_check):
    """Makes worker pools of 4 envs on two fork workers (envs 0, 1 and 2, 3); closes them."""
    pools: list[WorkerPool] = []

    def make(env_fns=(CounterEnv,) * 4, **options) -> WorkerPool:
        options = WorkerOptions(num_workers=2, context="fork", **options)
        pools.append(WorkerPool(list(env_fns), *SPACES, AutoresetMode.NEXT_STEP, options))
        return pools[-1]

    yield make
    for pool in pools:
        pool.close(terminate=True)


def _kill(worker) -> None:
    os.kill(worker.process.pid, signal.SIGKILL)
    assert wait_until(lambda: process_gone(worker.process.pid))


# -- error reports --------------------------------------------------------------------------


def _report(index: int, what: str = "step") -> ErrorReport:
    return ErrorReport(index, "ValueError", f"bad {index}", f"Traceback of env {index}\n", what)


def test_one_report_is_an_error_naming_its_env():
    error = Replies().error_from_reports([_report(3)])
    assert isinstance(error, vecaccel.WorkerError)
    assert str(error) == "env 3 raised ValueError in step: bad 3"
    assert error.env_indices == (3,) and error.original_type == "ValueError"
    assert error.remote_traceback == error.__cause__.traceback == "Traceback of env 3\n"


@pytest.mark.parametrize("count", [2, 3])
def test_several_reports_name_every_env_first_one_first(count):
    reports = [_report(i, "reset") for i in (5, 2, 9)[:count]]
    error = Replies().error_from_reports(reports)
    first, *others = sorted(r.env_index for r in reports)
    assert str(error) == (
        f"env {first} raised ValueError in reset: bad {first} (and {count - 1} more envs failed)"
    )
    assert list(error.env_indices) == [first, *others]
    for i in (first, *others):
        assert f"Traceback of env {i}" in error.remote_traceback
    assert isinstance(error.__cause__, RemoteTraceback)
    names = "envs 5, 9" if count == 3 else "env 5"
    assert f"(env {first}'s traceback; {names} failed too" in str(error.__cause__)


# -- waiting --------------------------------------------------------------------------------


def test_a_timeout_names_the_envs_still_running_and_keeps_the_replies_taken(make_pool):
    pool = make_pool([CounterEnv, CounterEnv, CounterEnv, WaitingEnv], step_timeout_s=30)
    pool.send_all(pool.workers, Command.STEP)
    with pytest.raises(TimeoutError, match=r"step did not finish within 0.2 s") as caught:
        pool.wait(pool.workers, 0.2)
    error = caught.value
    assert "envs still running: [2, 3]" in str(error)
    assert error.results == {0: (Status.OK,)}
    assert error.pending == [pool.workers[1]]
    pool.kill_stuck(error.pending)  # stuck for good: killed, with its stack taken first
    worker = pool.workers[1]
    assert worker.killed_for == (
        "worker 1 (envs [2, 3]) exceeded step_timeout_s=30 s in step and was killed"
    )
    with pytest.raises(vecaccel.WorkerError) as caught:
        pool.wait(error.pending, 5.0)
    assert caught.value.env_indices == (2, 3)
    assert "where it was stuck" in str(caught.value)
    assert f"line {_line_of(WaitingEnv.step, '.wait(')} in step" in caught.value.remote_traceback


def test_a_dead_worker_breaks_the_pool_with_an_error_naming_it(make_pool):
    pool = make_pool()
    victim = pool.workers[1]
    _kill(victim)
    pool.send_all(pool.workers, Command.STEP)
    with pytest.raises(vecaccel.WorkerError) as caught:
        pool.wait(pool.workers, 5.0)
    error = caught.value
    assert str(error) == f"worker 1 (pid {victim.process.pid}, envs [2, 3]) was killed by SIGKILL"
    assert error.env_indices == (2, 3) and error.exitcode == -signal.SIGKILL
    assert pool.broken == f"{error}; this vector env cannot continue: close() it"
    with pytest.raises(vecaccel.WorkerError) as again:
        pool.check_usable()
    assert again.value.env_indices == (2, 3)


def test_under_the_restart_policy_a_dead_worker_is_started_again(make_pool):
    pool = make_pool(on_worker_failure="restart")
    victim = pool.workers[1]
    _kill(victim)
    pool.send_all(pool.workers, Command.STEP)
    results = pool.wait(pool.workers, 30.0)
    assert results[0] == (Status.OK,)
    status, infos = results[1]
    assert status == Status.RESTARTED and sorted(infos) == [2, 3]
    for info in infos.values():
        assert info == {
            "worker_restarted": True,
            "restart_reason": "worker 1 was killed by SIGKILL",
        }
    assert pool.workers[1].process.is_alive() and pool.workers[1] is not victim
    assert pool.failures == 1 and pool.failures_per_env.tolist() == [0, 0, 1, 1]
    assert pool.views.truncations.tolist() == [False, False, True, True]


def test_per_env_replies_and_deaths_are_told_apart(make_pool):
    """Under per-env stepping each byte names an env that finished; a worker that dies is
    reported with whatever it wrote before."""
    pool = make_pool()
    pool.views.step_mask[:] = 1
    pool.send_all(pool.workers, Command.STEP_MASKED)
    finished: list[int] = []
    while len(finished) < 4:
        arrived, dead = pool.wait_bytes(10.0)
        assert dead == [] and arrived
        finished += [worker.start + slot for worker, data in arrived for slot in data]
    assert sorted(finished) == [0, 1, 2, 3]
    assert pool.wait_bytes(0.05) == ([], [])  # nothing more to come: an empty answer in time
    _kill(pool.workers[0])
    arrived, dead = pool.wait_bytes(10.0)
    assert arrived == [] and dead == [pool.workers[0]]


# -- a worker past step_timeout_s -------------------------------------------------------------


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_stuck_worker_is_killed_after_step_timeout(policy):
    fns = [
        functools.partial(tagged_counter, 0, sleep_on={2: 60.0}),
        functools.partial(tagged_counter, 1),
    ]
    envs = vecaccel.make_vec(
        fns, backend="shm", num_workers=2, on_worker_failure=policy, step_timeout=0.5
    )
    try:
        envs.reset(seed=1)
        envs.step(np.zeros(2, dtype=np.int64))
        # env 0 sleeps 60 s: only the timeout can make the next step raise or restart it
        if policy == "raise":
            with pytest.raises(vecaccel.WorkerError, match="step_timeout"):
                envs.step(np.zeros(2, dtype=np.int64))
        else:
            obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert trunc.tolist() == [True, False]
            assert infos["_worker_restarted"].tolist() == [True, False]
            assert "step_timeout" in infos["restart_reason"][0]
            obs, *_ = envs.step(np.zeros(2, dtype=np.int64))  # keeps going
    finally:
        envs.close()


#: (backend, where the worker waits, start method): the default backend stuck in a step under
#: both start methods and in a reset under fork; each other backend holding all its envs in
#: workers stuck in a step under one start method, the start methods taking turns.
STUCK_CASES = [
    (DEFAULT_BACKEND, "step", "fork"),
    (DEFAULT_BACKEND, "step", "spawn"),
    (DEFAULT_BACKEND, "reset", "fork"),
    *(
        (backend, "step", context)
        for backend, context in spread_start_methods(
            [b for b in select(envs_in_workers=True) if b != DEFAULT_BACKEND], ("spawn", "fork")
        )
    ),
]


@pytest.mark.parametrize(
    "backend, wait_in, context", [pytest.param(*case, id="-".join(case)) for case in STUCK_CASES]
)
def test_a_worker_stuck_past_step_timeout_shows_where(backend, wait_in, context, no_leaks):
    fns = [CounterEnv, CounterEnv, CounterEnv, functools.partial(WaitingEnv, wait_in)]
    envs = make_backend(backend, fns, context, step_timeout_s=1)
    try:
        with pytest.raises(vecaccel.WorkerError) as caught:
            envs.reset(seed=0)
            envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()
    error = caught.value
    assert error.env_indices == (2, 3)
    message = str(error)
    assert message.startswith("worker 1 (envs [2, 3]) exceeded step_timeout_s=1")
    line = _line_of(getattr(WaitingEnv, wait_in), ".wait(")
    assert f'toy_envs.py", line {line} in {wait_in}' in message, message
    assert f"in {wait_in}" in error.remote_traceback
