"""``max_concurrency``: at most N envs step or reset at one time on every process backend,
whatever the number of workers, and a worker killed while it holds a permit gives it back."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import vecaccel
from vecaccel.testing.envs import IntervalEnv, fault_env_fns, most_inside_at_once

NUM_ENVS, NUM_WORKERS = 6, 3


def _intervals(backend: str, context: str, steps: int, **options) -> list[tuple[float, float]]:
    fns = [functools.partial(IntervalEnv, 0.004)] * NUM_ENVS
    envs = vecaccel.make_vec(
        fns, backend=backend, num_workers=NUM_WORKERS, context=context, **options
    )
    intervals: list[tuple[float, float]] = []

    def take(infos) -> None:
        mask = infos["_entered"]
        intervals.extend(zip(infos["entered"][mask].tolist(), infos["left"][mask].tolist()))

    try:
        obs, infos = envs.reset(seed=0)
        take(infos)
        for _ in range(steps):
            obs, _, _, _, infos = envs.step(np.zeros(len(obs), dtype=np.int64))
            take(infos)
    finally:
        envs.close()
    return intervals


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize(
    ("backend", "context", "extra"),
    [
        ("shm", "fork", {}),
        ("shm", "spawn", {}),
        ("hybrid", "forkserver", {"inline_envs": 2}),
        ("async", "fork", {"batch_size": 3}),
    ],
)
def test_at_most_max_concurrency_envs_are_inside_step_or_reset(backend, context, extra, limit):
    intervals = _intervals(backend, context, 8, max_concurrency=limit, **extra)
    assert len(intervals) >= NUM_ENVS * 2
    assert most_inside_at_once(intervals) <= limit


def test_without_a_cap_the_workers_overlap():
    # the probe above can see an overlap: with no cap, workers sleeping in step do overlap
    assert most_inside_at_once(_intervals("shm", "fork", 8)) > 1


def test_the_action_server_keeps_the_cap():
    pytest.importorskip("torch")
    intervals = _intervals("action_server", "fork", 6, max_concurrency=1, device="cpu")
    assert most_inside_at_once(intervals) == 1


def test_a_worker_killed_while_holding_a_permit_gives_it_back():
    # two permits for three workers: the others never wait for the hung worker's permit, so
    # only it is overdue (step_timeout_s counts a wait for a permit too)
    envs = vecaccel.make_vec(
        fault_env_fns(6, hang_seconds=60.0),
        backend="shm",
        num_workers=3,
        max_concurrency=2,
        step_timeout_s=1.0,
        on_worker_failure="restart",
    )
    try:
        envs.reset(seed=0)
        envs.set_attr_indices("inject", "hang", [0])  # killed in its step, holding the permit
        _, _, _, trunc, infos = envs.step(np.zeros(6, dtype=np.int64))
        assert trunc[0] and infos["worker_restarted"][0]
        assert not trunc[2:].any()  # the other workers were not killed
        # nothing steps now: both permits are free, the one the killed worker held too
        assert envs.pool.gate.semaphore.get_value() == 2
        for _ in range(3):
            envs.step(np.zeros(6, dtype=np.int64))
        assert envs.pool.gate.semaphore.get_value() == 2
    finally:
        envs.close()


def test_max_concurrency_over_vectorized_slices_is_refused_before_any_worker():
    with pytest.raises(ValueError, match="max_concurrency"):
        vecaccel.make_vec(
            "CartPole-v1", 4, backend="shm", vectorized=True, max_concurrency=1, num_workers=2
        )


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_capped_backend_keeps_the_contract_and_leaves_nothing_behind(context):
    from vecaccel.testing import check_backend

    check_backend("shm", num_workers=2, max_concurrency=1, context=context)
