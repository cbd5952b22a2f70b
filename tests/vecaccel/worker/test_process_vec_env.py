"""``ProcessVecEnv``, the base of the backends on a worker pool, under a subclass that adds
nothing but the two hooks it documents: control calls bring the envs to a quiet state first and
reach the envs they name; a space the backend refuses stops it before any worker starts; the
failures recovered from are the pool's; ``close`` stops the workers at once when a command is in
flight or the pool is broken."""

from __future__ import annotations

import os
import signal

import pytest

import vecaccel
from vecaccel.options import WorkerOptions
from vecaccel.testing.envs import CounterEnv
from vecaccel.testing.leaks import child_pids, process_gone, wait_until
from vecaccel.worker import ProcessVecEnv


class ControlOnly(ProcessVecEnv):
    """A backend on a worker pool with the base's control calls and no steps of its own."""

    def __init__(self, env_fns, *, busy: bool = False, **kwargs) -> None:
        self.prepared = 0
        self.busy = busy
        super().__init__(env_fns, **kwargs)

    def _prepare_control(self) -> None:
        self.prepared += 1

    def _busy(self) -> bool:
        return self.busy


class RefusesCounters(ControlOnly):
    def _check_spaces(self) -> None:
        raise TypeError(f"this backend cannot serve {self.single_observation_space}")


def _options(**options) -> WorkerOptions:
    return WorkerOptions(num_workers=2, context="fork", **options)


def _kill_worker(envs: ControlOnly, index: int) -> None:
    pid = envs.pool.workers[index].process.pid
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: process_gone(pid))


@pytest.fixture
def make_env(leak_check):
    made: list[ControlOnly] = []

    def make(cls=ControlOnly, num_envs: int = 4, **kwargs) -> ControlOnly:
        made.append(cls([CounterEnv] * num_envs, **kwargs))
        return made[-1]

    yield make
    for envs in made:
        envs.close()


def test_control_calls_reach_the_envs_named_once_the_envs_are_quiet(make_env):
    envs = make_env(options=_options(copy=False), autoreset_mode="SameStep")
    assert envs.num_workers == envs.pool.num_workers == 2
    assert envs.copy is False and envs.autoreset_mode.value == "SameStep"
    envs.set_attr_indices("tag", "x", [-1, 0])  # one value for every env named
    assert envs.prepared == 1
    assert envs.call_indices("tag", [3, 0]) == ("x", "x")
    envs.set_attr("tag", ["a", "b", "c", "d"])
    assert envs.get_attr("tag") == ("a", "b", "c", "d")
    assert envs.call_indices(lambda env: env.unwrapped.steps, 2) == (0,)
    assert envs.prepared == 5
    with pytest.raises(ValueError, match="length 2"):
        envs.set_attr_indices("tag", ["a"], [0, 1])
    with pytest.raises(IndexError, match="env index 4 out of range"):
        envs.call_indices("tag", [4])


def test_default_options_run_a_worker_per_env_up_to_the_cpus(make_env):
    from vecaccel.worker import usable_cpus

    envs = make_env(num_envs=2)
    assert envs.options == WorkerOptions()
    assert envs.num_workers == min(2, usable_cpus())
    assert envs.copy is True


def test_a_refused_space_stops_the_backend_before_any_worker_starts(leak_check):
    before = child_pids()
    with pytest.raises(TypeError, match="cannot serve Box"):
        RefusesCounters([CounterEnv] * 2, options=_options())
    assert child_pids() == before


def test_failures_recovered_from_are_the_pools(make_env):
    envs = make_env(options=_options(on_worker_failure="restart"))
    assert envs.failures == 0 and envs.failures_per_env.tolist() == [0, 0, 0, 0]
    _kill_worker(envs, 1)
    with pytest.raises(vecaccel.WorkerError, match=r"envs \[2, 3\] did not run"):
        envs.get_attr("steps")
    assert envs.failures == 1 and envs.failures_per_env.tolist() == [0, 0, 1, 1]
    assert envs.get_attr("steps") == (0, 0, 0, 0)  # the restarted worker serves calls


def test_a_broken_pool_refuses_control_calls_before_preparing_them(make_env):
    envs = make_env(options=_options())
    _kill_worker(envs, 0)
    with pytest.raises(vecaccel.WorkerError, match="was killed by SIGKILL"):
        envs.get_attr("steps")
    prepared = envs.prepared
    for call in (lambda: envs.call_indices("steps", [3]), lambda: envs.set_attr("tag", 1)):
        with pytest.raises(vecaccel.WorkerError, match="cannot continue") as caught:
            call()
        assert caught.value.env_indices == (0, 1)
    assert envs.prepared == prepared


@pytest.mark.parametrize(
    "setup, terminate",
    [("idle", False), ("busy", True), ("broken", True), ("asked", True)],
)
def test_close_stops_the_workers_at_once_when_waiting_for_them_cannot_help(
    make_env, monkeypatch, setup, terminate
):
    envs = make_env(options=_options(), busy=setup == "busy")
    if setup == "broken":
        _kill_worker(envs, 0)
        with pytest.raises(vecaccel.WorkerError):
            envs.get_attr("steps")
    pool = envs.pool
    asked: list[bool] = []
    close = pool.close
    monkeypatch.setattr(
        pool, "close", lambda terminate: (asked.append(terminate), close(terminate))
    )
    pids = [w.process.pid for w in pool.workers]
    envs.close(terminate=setup == "asked")
    envs.close()  # once closed, closing again does nothing
    assert asked == [terminate]
    assert all(process_gone(pid) for pid in pids)
    with pytest.raises(Exception, match="closed"):
        envs.get_attr("steps")
