"""The ``async`` batch former: a floor, a ceiling and a deadline, checked in the caller, kept on
every step, and leaving each env's trajectory equal to the serial backend's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vecaccel
from vecaccel.sampler import Sampler
from vecaccel.testing.batch_former import check_batch_former, declares_batch_former
from vecaccel.testing.leaks import child_pids

N = 6


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"min_batch_size": 5, "max_batch_size": 3}, "min_batch_size"),
        ({"max_batch_size": N + 1}, "max_batch_size"),
        ({"min_batch_size": N + 1}, "min_batch_size"),
        ({"batch_size": N + 1}, "batch_size"),
        ({"batch_wait_s": -0.1}, "batch_wait_s"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"batch_size": 2, "max_batch_size": 3}, "batch_size"),
        ({"batch_wait_s": 0.01}, "batch_wait_s=0.01 waits for envs beyond a floor"),
        ({"batch_size": 2, "batch_wait_s": 0.01}, "give min_batch_size or max_batch_size"),
    ],
)
def test_bad_bounds_are_refused_by_make_vec_before_any_worker(options, named):
    before = child_pids()
    with pytest.raises(ValueError, match=named):
        vecaccel.make_vec("CartPole-v1", N, backend="async", num_workers=2, **options)
    assert child_pids() == before


@pytest.mark.parametrize("backend", ["shm", "hybrid", "action_server"])
def test_max_concurrency_below_one_is_refused_on_every_process_backend(backend):
    before = child_pids()
    with pytest.raises(ValueError, match="max_concurrency"):
        vecaccel.make_vec("CartPole-v1", 4, backend=backend, max_concurrency=0)
    assert child_pids() == before


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_the_kit_checks_the_batch_former(context):
    assert declares_batch_former("async")
    check_batch_former("async", num_workers=2, context=context)


def test_recv_arguments_override_the_options_and_are_checked():
    envs = vecaccel.make_vec("CartPole-v1", N, backend="async", num_workers=2, batch_size=N)
    try:
        obs, infos = envs.reset(seed=0)
        envs.send(np.zeros(N, dtype=np.int64), infos["env_id"])
        with pytest.raises(ValueError, match="min_batch_size=4 is above max_batch_size=2"):
            envs.recv(min_batch_size=4, max_batch_size=2)
        with pytest.raises(ValueError, match="batch_wait_s"):
            envs.recv(batch_wait_s=-1.0)
        obs, *_, infos = envs.recv(min_batch_size=2, max_batch_size=2)
        assert len(infos["env_id"]) == 2 and obs.shape == (2, 4)
        # the spaces follow the batch the next step acts for
        assert envs.action_space.shape == (2,)
        # 4 ready, none stepping: a floor of 5 can never be met
        with pytest.raises(RuntimeError, match="needs 5 envs"):
            envs.recv(min_batch_size=5)
    finally:
        envs.close()


def test_a_varying_batch_is_refused_by_the_sampler():
    envs = vecaccel.make_vec(
        "CartPole-v1", 4, backend="async", num_workers=2, min_batch_size=2, max_batch_size=4
    )
    try:
        assert not envs.capabilities.fixed_batch
        with pytest.raises(ValueError, match="fixed batch"):
            Sampler(envs, policy=lambda obs: None, horizon=4)
    finally:
        envs.close()


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    bounds=st.tuples(st.integers(1, N), st.integers(1, N)).map(sorted),
    wait_s=st.sampled_from([0.0, 0.0005, 0.003]),
    seed=st.integers(0, 2**16),
)
def test_each_env_trajectory_equals_serial_whatever_the_batch_sizes(bounds, wait_s, seed):
    low, high = bounds
    actions_by_env = np.random.default_rng(seed).integers(0, 2, (N, 200))
    envs = vecaccel.make_vec(
        "CartPole-v1",
        N,
        backend="async",
        num_workers=2,
        min_batch_size=low,
        max_batch_size=high,
        batch_wait_s=wait_s,
    )
    trajectories: dict[int, list] = {}
    try:
        obs, infos = envs.reset(seed=seed)
        used = np.zeros(N, dtype=np.int64)
        for k, i in enumerate(infos["env_id"].tolist()):
            trajectories[i] = [obs[k]]
        for _ in range(40):
            ids = infos["env_id"]
            actions = actions_by_env[ids, used[ids]]
            used[ids] += 1
            obs, _, _, _, infos = envs.step(actions)
            assert low <= len(infos["env_id"]) <= high
            for k, i in enumerate(infos["env_id"].tolist()):
                trajectories.setdefault(i, []).append(obs[k])
    finally:
        envs.close()
    reference = vecaccel.make_vec("CartPole-v1", N, backend="serial")
    obs, _ = reference.reset(seed=seed)
    expected = {i: [obs[i]] for i in range(N)}
    for s in range(int(used.max())):
        obs, *_ = reference.step(actions_by_env[:, s])
        for i in range(N):
            expected[i].append(obs[i])
    reference.close()
    for i, got in trajectories.items():
        np.testing.assert_array_equal(np.array(got), np.array(expected[i][: len(got)]))
