"""``on_worker_failure="restart"``: failed envs and dead or stuck workers are rebuilt."""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest

import vecaccel
from tests.async_envs import counter

BACKENDS = {
    "shm": {},
    "hybrid": {"inline_envs": 2},  # env 1 fails inline
    "async": {"batch_size": 4},
    "action_server": {"device": "cpu"},
}


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


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_env_exception_is_restarted_and_reported_as_truncated(backend):
    fns = [functools.partial(counter, tag, fail_on=3 if tag == 1 else -1) for tag in range(4)]
    envs = vecaccel.make_vec(
        fns, backend=backend, num_workers=2, on_worker_failure="restart", **BACKENDS[backend]
    )
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


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_dead_worker_is_restarted(backend):
    envs = vecaccel.make_vec(
        "CartPole-v1",
        4,
        backend=backend,
        num_workers=2,
        on_worker_failure="restart",
        **BACKENDS[backend],
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
        assert restarted == set(victim.env_indices) and restarted  # {2, 3}; {3} under hybrid
        assert envs.failures == 1
        assert envs.pool.workers[1].process.is_alive()
    finally:
        envs.close()


def test_max_restarts_raises():
    fns = [functools.partial(counter, 0, fail_on=1)] * 2
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


@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_stuck_worker_is_killed_after_step_timeout(policy):
    fns = [functools.partial(counter, 0, sleep_on={2: 60.0}), functools.partial(counter, 1)]
    envs = vecaccel.make_vec(
        fns, backend="shm", num_workers=2, on_worker_failure=policy, step_timeout=0.5
    )
    try:
        envs.reset(seed=1)
        envs.step(np.zeros(2, dtype=np.int64))
        start = time.monotonic()
        if policy == "raise":
            with pytest.raises(vecaccel.WorkerError, match="step_timeout"):
                envs.step(np.zeros(2, dtype=np.int64))
        else:
            obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert trunc.tolist() == [True, False]
            assert infos["_worker_restarted"].tolist() == [True, False]
            assert "step_timeout" in infos["restart_reason"][0]
            obs, *_ = envs.step(np.zeros(2, dtype=np.int64))  # keeps going
        assert time.monotonic() - start < 10
    finally:
        envs.close()
