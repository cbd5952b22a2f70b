"""``envs.stats()``: every backend times its steps, splits them into env, policy and transport
time, and names what the run is bound by; the trainers find and log it through wrappers."""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np
import pytest

import vecaccel
from vecaccel.stats import VERDICTS, StepClock
from vecaccel.testing.envs import SleepEnv
from vecaccel.trainers.services.env_timing import env_timing_metrics, verdict_of

BACKENDS = [
    ("serial", {}),
    ("shm", {"num_workers": 2}),
    ("hybrid", {"num_workers": 1}),
    ("async", {"num_workers": 2, "batch_size": 2}),
    ("async", {"num_workers": 2, "min_batch_size": 1, "max_batch_size": 4}),
    ("action_server", {"num_workers": 2, "alternating": True}),
]


@pytest.mark.parametrize(("backend", "options"), BACKENDS)
def test_every_backend_counts_its_steps_and_splits_their_time(backend, options):
    envs = vecaccel.make_vec("CartPole-v1", 4, backend=backend, **options)
    try:
        obs, _ = envs.reset(seed=0)
        assert envs.stats().steps == 0
        for _ in range(7):
            obs, *_ = envs.step(np.zeros(len(obs), dtype=np.int64))
        stats = envs.stats()
    finally:
        envs.close()
    assert stats.steps == 7
    assert min(stats.policy_s, stats.env_s, stats.transport_s) >= 0.0
    assert stats.verdict in VERDICTS
    per = stats.per_step
    assert per.env_s * 7 == pytest.approx(stats.env_s)
    assert stats.last.policy_s <= stats.policy_s


@pytest.mark.parametrize(("backend", "options"), BACKENDS[:2])
def test_the_verdict_names_the_part_that_dominates(backend, options):
    slow_env = [functools.partial(SleepEnv, 0.03)] * 2
    envs = vecaccel.make_vec(slow_env, backend=backend, **options)
    try:
        envs.reset(seed=0)
        for _ in range(5):
            envs.step(np.zeros(2, dtype=np.int64))
        assert envs.stats().verdict == "env-bound"
    finally:
        envs.close()
    envs = vecaccel.make_vec([SleepEnv] * 2, backend=backend, **options)
    try:
        envs.reset(seed=0)
        for _ in range(5):
            time.sleep(0.03)  # the policy
            envs.step(np.zeros(2, dtype=np.int64))
        assert envs.stats().verdict == "policy-bound"
    finally:
        envs.close()


def test_a_step_that_raises_is_not_counted():
    clock = StepClock()
    clock.begin()
    clock.cancel()
    clock.end()
    assert clock.stats().steps == 0


def test_the_trainers_find_the_stats_through_wrappers():
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
    wrapped = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    try:
        wrapped.reset(seed=0)
        wrapped.step(np.zeros(2, dtype=np.int64))
        metrics = env_timing_metrics(wrapped)
    finally:
        wrapped.close()
    assert {"stats/env_share", "stats/policy_share", "stats/transport_share"} <= set(metrics)
    assert verdict_of(metrics) in ("env", "policy", "transport")
    assert env_timing_metrics(object()) == {}
