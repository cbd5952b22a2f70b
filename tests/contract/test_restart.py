"""``on_worker_failure="restart"``: failed envs and dead workers are rebuilt, and the
SB3 adapter and the Sampler report a restart as a truncation.
"""

from __future__ import annotations

import functools
import os
import signal
import threading

import numpy as np
import pytest
import torch
from backend_matrix import backend_of, options_for, select
from helpers import LONG_PROMPT, NUM_ENVS, as_numpy, close_promptly, make_backend, zeros
from toy_envs import tagged_counter

import vecaccel
from vecaccel.testing.envs import CounterEnv, WideSpacesEnv, counter_fns
from vecaccel.testing.envs import env_pid as worker_pid
from vecaccel.testing.leaks import process_gone, wait_until


class RebuildFailsEnv(CounterEnv):
    """A ``CounterEnv`` whose constructor raises once ``flag`` exists: a rebuild fails."""

    def __init__(self, flag: str) -> None:
        if os.path.exists(flag):
            raise ValueError("cannot rebuild: the flag is set")
        super().__init__()


torch.set_num_threads(1)

BACKENDS = select(restarts_workers=True)


def _options(backend: str) -> dict:
    """Two workers; where the caller steps envs too, it steps envs 0 and 1 (env 1 fails there)."""
    in_caller = {} if backend_of(backend).envs_in_workers else {"inline_envs": 2}
    return options_for(backend, num_workers=2, **in_caller)


def _actions(envs, batch):
    if envs.metadata.get("autoreset_mode") is None:
        raise AssertionError("autoreset_mode missing")
    actions = np.zeros(batch, dtype=np.int64)
    if hasattr(envs, "device"):
        import torch

        return torch.as_tensor(actions)
    return actions


def _as_numpy(x):
    return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_exception_is_restarted_and_reported_as_truncated(backend):
    fns = [
        functools.partial(tagged_counter, tag, fail_on=3 if tag == 1 else -1) for tag in range(4)
    ]
    envs = vecaccel.make_vec(fns, backend=backend, on_worker_failure="restart", **_options(backend))
    try:
        envs.reset(seed=11)
        restarted_seen = False
        for _ in range(6):
            obs, rew, term, trunc, infos = envs.step(_actions(envs, 4))
            ids = infos.get("env_id", np.arange(4))
            ids = list(ids)
            if "worker_restarted" in infos:
                position = ids.index(1)
                assert infos["_worker_restarted"][position]
                assert _as_numpy(trunc)[position] and not _as_numpy(term)[position]
                assert "ValueError: boom" in infos["restart_reason"][position]
                # the rebuilt env starts a new episode: its counter is back to 0
                assert _as_numpy(obs)[position][1] == 0.0
                restarted_seen = True
        assert restarted_seen
        assert envs.failures == 1 and envs.failures_per_env.tolist() == [0, 1, 0, 0]
    finally:
        envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_worker_is_restarted(backend):
    envs = vecaccel.make_vec(
        "CartPole-v1",
        4,
        backend=backend,
        on_worker_failure="restart",
        **_options(backend),
    )
    try:
        envs.reset(seed=0)
        victim = envs.pool.workers[1]
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.join(5)
        restarted = set()
        for _ in range(10):
            obs, rew, term, trunc, infos = envs.step(_actions(envs, 4))
            ids = list(infos.get("env_id", np.arange(4)))
            if "worker_restarted" in infos:
                mask = infos["_worker_restarted"]
                restarted.update(int(ids[k]) for k in np.flatnonzero(mask))
                assert _as_numpy(trunc)[mask].all()
        assert restarted == set(victim.env_indices) and restarted  # {3} if the caller has 0, 1
        assert envs.failures == 1
        assert envs.pool.workers[1].process.is_alive()
    finally:
        envs.close()


def test_max_restarts_raises():
    fns = [functools.partial(tagged_counter, 0, fail_on=1)] * 2
    envs = vecaccel.make_vec(
        fns, backend="shm", num_workers=1, on_worker_failure="restart", max_restarts=3
    )
    try:
        envs.reset()
        with pytest.raises(vecaccel.WorkerError, match="max_restarts=3"):
            for _ in range(10):
                envs.step(np.zeros(2, dtype=np.int64))
    finally:
        envs.close()


def _startup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "vecaccel-startup"]


@pytest.mark.parametrize("context", ["fork"])  # spawn's large startup: test_lifecycle.py
def test_restarted_worker_gets_a_large_startup_and_steps(context, leak_check):
    """respawn() sends the startup message again (through the writer thread for large spaces)
    and joins it; the restarted env reports worker_restarted and steps afterwards."""
    envs = vecaccel.make_vec(
        [WideSpacesEnv] * 2, backend="shm", num_workers=2, context=context,
        on_worker_failure="restart",
    )  # fmt: skip
    try:
        envs.reset(seed=0)
        for _ in range(2):
            os.kill(envs.pool.workers[0].process.pid, 9)
            obs, _, _, truncated, infos = envs.step(np.array([1, 0]))
            assert truncated.tolist() == [True, False]
            assert infos["worker_restarted"][0]
            assert (obs[1] == 0).all()
        envs.step(np.array([1, 0]))  # the NEXT_STEP reset of the restarted env
        obs, *_ = envs.step(np.array([1, 0]))
        assert (obs[0] == 1).all() and (obs[1] == 0).all()
        assert not _startup_threads()
    finally:
        envs.close()


@pytest.mark.parametrize("operation", ["reset", "get_attr"])
@pytest.mark.parametrize("backend", select(restarts_workers=True, envs_in_workers=True))
def test_restart_policy_recovers_a_worker_that_died_while_idle(backend, operation, leak_check):
    """Under ``on_worker_failure="restart"`` a worker killed between calls is started again
    whatever the next call is, not only when it is a ``step``: a ``reset`` (what a user does
    after a failure) or a ``get_attr`` must not leave the vector env broken for good."""
    envs = make_backend(backend, counter_fns(NUM_ENVS), on_worker_failure="restart")
    try:
        envs.reset(seed=0)
        pid = envs.call(worker_pid)[3]
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: process_gone(pid), LONG_PROMPT)
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


@pytest.mark.parametrize("backend", select(restarts_workers=True, envs_in_workers=True))
def test_failed_restart_leaves_a_clear_error(backend, tmp_path, leak_check):
    """A dead worker whose env function raises when it is rebuilt: that error is raised, and
    every later call says the env cannot continue (a ``WorkerError`` naming the envs), not
    "step_async() called twice" or "envs [2, 3] are still stepping"."""
    flag = str(tmp_path / "flag")
    env_fns = [functools.partial(RebuildFailsEnv, flag)] * NUM_ENVS
    envs = make_backend(backend, env_fns, on_worker_failure="restart")
    try:
        envs.reset(seed=0)
        pid = envs.call(worker_pid)[3]
        open(flag, "w").close()
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: process_gone(pid), LONG_PROMPT)
        with pytest.raises(vecaccel.WorkerError, match="cannot rebuild"):
            envs.step(zeros(envs))
        for _ in range(2):
            with pytest.raises(vecaccel.WorkerError) as info:
                envs.step(zeros(envs))
            assert {2, 3} & set(info.value.env_indices), str(info.value)
    finally:
        close_promptly(envs)


def _failing_fns():
    return [
        functools.partial(tagged_counter, tag, fail_on=3 if tag == 1 else -1) for tag in range(4)
    ]


def test_sb3_adapter_reports_a_restart_as_a_truncation():
    from vecaccel.adapters.sb3 import VecAccelEnv

    venv = VecAccelEnv(_failing_fns(), backend="shm", num_workers=2, on_worker_failure="restart")
    try:
        venv.reset()
        for _ in range(3):
            obs, rewards, dones, infos = venv.step(np.zeros(4, dtype=np.int64))
        assert dones.tolist() == [False, True, False, False]
        info = infos[1]
        assert info["worker_restarted"] and "ValueError: boom" in info["restart_reason"]
        assert info["TimeLimit.truncated"] is True  # bootstrapped, not a terminal state
        assert "terminal_observation" in info
        assert obs[1][1] == 0.0  # the rebuilt env starts a new episode
        obs, rewards, dones, infos = venv.step(np.zeros(4, dtype=np.int64))
        assert not dones.any()  # and keeps stepping
    finally:
        venv.close()


def test_sampler_bootstraps_a_restart_and_does_not_count_it_as_an_episode():
    envs = vecaccel.make_vec(
        _failing_fns(),
        backend="shm",
        num_workers=2,
        on_worker_failure="restart",
        autoreset_mode="SameStep",
    )

    def policy(obs):
        return torch.zeros(obs.shape[0], dtype=torch.int64), {}

    try:
        sampler = vecaccel.Sampler(envs, policy, horizon=5)
        batch = sampler.collect()
        assert batch.truncated[2].tolist() == [False, True, False, False]
        assert not batch.terminated.any()
        # the truncated step bootstraps from a final observation
        assert tuple(map(int, batch.final_index[0])) == (2, 1)
        # CounterEnv episodes are 50 steps: nothing finished in 5 steps, the restart included
        assert sampler.pop_episodes().returns == []
    finally:
        envs.close()
