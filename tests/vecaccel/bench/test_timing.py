"""The timing loops of ``vecaccel bench`` and ``vecaccel tune``: what they count is what they
stepped after the warm-up, the clock covers only the timed part, and a plain env is reset
at each episode end."""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np
import pytest

from vecaccel.bench import run_benchmark
from vecaccel.bench.timing import measure, sample_actions, time_raw, time_vector
from vecaccel.bench.workloads import make_gym_env


class _Counting(gym.vector.VectorWrapper):
    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.steps = 0
        self.seen: list = []

    def step(self, actions):
        self.steps += 1
        self.seen.append(np.array(actions))
        return super().step(actions)


def _cartpoles(n: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)


def test_sampled_actions_repeat_with_the_seed() -> None:
    space = gym.spaces.MultiDiscrete([3, 3, 3])
    first = sample_actions(space, 5, seed=4)
    assert [a.tolist() for a in first] == [a.tolist() for a in sample_actions(space, 5, seed=4)]
    assert all(space.contains(a) for a in first)


def test_vector_timing_counts_the_timed_batches_and_cycles_the_actions() -> None:
    envs = _Counting(_cartpoles(2))
    envs.reset(seed=0)
    actions = sample_actions(envs.action_space, 3, seed=0)
    batches, elapsed = time_vector(envs, actions, seconds=0.05, warmup=0.02)
    warm = envs.steps - batches
    assert batches > 0 and warm > 0
    assert elapsed >= 0.05
    for i, seen in enumerate(envs.seen):
        np.testing.assert_array_equal(seen, actions[i % 3])
    envs.close()


def test_a_simulated_policy_latency_bounds_the_batches() -> None:
    envs = _cartpoles(2)
    envs.reset(seed=0)
    actions = sample_actions(envs.action_space, 4, seed=0)
    batches, elapsed = time_vector(envs, actions, seconds=0.1, warmup=0.0, policy_s=0.01)
    assert batches <= elapsed / 0.01 + 1
    envs.close()


def test_raw_timing_resets_a_plain_env_at_each_episode_end() -> None:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    resets = 0
    original = env.reset

    def counting_reset(*args, **kwargs):
        nonlocal resets
        resets += 1
        return original(*args, **kwargs)

    env.reset = counting_reset
    started = time.perf_counter()
    steps, elapsed = time_raw(env, sample_actions(env.action_space, 8, seed=0), 0.05, 0.0)
    assert steps % 16 == 0 and steps > 0
    assert elapsed <= time.perf_counter() - started
    assert resets >= steps // 500  # a random CartPole episode lasts well under 500 steps
    assert resets > 0


def test_measure_reports_env_steps_per_second_and_closes_the_env() -> None:
    built = []

    def build():
        built.append(_Counting(_cartpoles(3)))
        return built[-1]

    rate, setup_s = measure("gym-sync", build, 3, seconds=0.05, warmup=0.0, seed=0)
    assert setup_s >= 0
    # every timed batch is 3 env steps, over at least the 0.05 timed seconds
    assert 0 < rate <= 3 * built[0].steps / 0.05
    assert built[0].env.closed


def test_the_clock_simulates_a_policys_latency_before_each_step():
    """``vecaccel tune --policy-ms`` times on this clock: each timed step waits ``policy_s``
    first, so no more than ``num_envs / policy_s`` env steps fit in a second."""
    build = functools.partial(
        gym.vector.SyncVectorEnv, [functools.partial(make_gym_env, "CartPole-v1")] * 2
    )
    rate, _ = measure("gym-sync", build, 2, seconds=0.05, warmup=0.0, seed=0, policy_s=0.005)
    assert 0 < rate <= 2 / 0.005


@pytest.mark.parametrize(
    "backend,options",
    [
        ("async", {"batch_size": 2, "num_workers": 1}),
        ("action_server", {"alternating": True, "num_workers": 1}),
    ],
    ids=["async-batch_size-2", "action_server-alternating"],
)
def test_bench_measures_backends_that_return_part_of_the_envs(backend, options):
    """``vecaccel bench`` samples actions for the envs a step returns, not ``num_envs`` whatever
    the backend, so a configuration returning fewer envs per step (``-o async.batch_size=2``)
    runs, and its rate counts the batch returned per call, not ``num_envs`` steps."""
    results = run_benchmark(
        "CartPole-v1",
        [4],
        backends=[backend],
        peers=[],
        seconds=0.05,
        warmup=0.0,
        backend_options={backend: options},
    )
    (entry,) = results
    assert entry["status"] == "ok", entry["reason"]
    assert entry["steps_per_s"] > 0
