"""The ``async`` backend: first-ready batches, per-env trajectories equal the serial backend's."""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np
import pytest

import vecaccel
from tests.async_envs import counter

CONTEXTS = ["fork", "spawn"]


def _collect_async(envs, actions_by_env, steps):
    obs, infos = envs.reset(seed=7)
    ids = infos["env_id"]
    trajectories: dict[int, list] = {int(i): [obs[k]] for k, i in enumerate(ids)}
    # rewards aligned with observations: a reset observation comes with reward 0
    rewards: dict[int, list] = {int(i): [0.0] for i in ids}
    used = np.zeros(len(actions_by_env), dtype=int)
    for _ in range(steps):
        actions = actions_by_env[ids, used[ids]]
        used[ids] += 1
        obs, rew, term, trunc, infos = envs.step(actions)
        ids = infos["env_id"]
        for k, i in enumerate(ids.tolist()):
            trajectories.setdefault(i, []).append(obs[k])
            rewards.setdefault(i, []).append(rew[k])
    return trajectories, rewards


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_each_env_trajectory_equals_serial(mode):
    n = 6
    rng = np.random.default_rng(0)
    actions_by_env = rng.integers(0, 2, (n, 400))
    envs = vecaccel.make_vec(
        "CartPole-v1", n, backend="async", batch_size=4, num_workers=2, autoreset_mode=mode
    )
    try:
        trajectories, rewards = _collect_async(envs, actions_by_env, 150)
    finally:
        envs.close()
    reference = vecaccel.make_vec("CartPole-v1", n, backend="serial", autoreset_mode=mode)
    obs, _ = reference.reset(seed=7)
    expected = {i: [obs[i]] for i in range(n)}
    expected_rewards: dict[int, list] = {i: [0.0] for i in range(n)}
    steps = min(len(t) for t in trajectories.values())
    for s in range(steps - 1):
        obs, rew, *_ = reference.step(actions_by_env[:, s])
        for i in range(n):
            expected[i].append(obs[i])
            expected_rewards[i].append(rew[i])
    reference.close()
    for i in range(n):
        np.testing.assert_array_equal(np.array(trajectories[i][:steps]), np.array(expected[i]))
        np.testing.assert_array_equal(np.array(rewards[i][:steps]), np.array(expected_rewards[i]))


def test_send_recv_api_and_errors():
    envs = vecaccel.make_vec(
        [functools.partial(counter, tag) for tag in range(4)],
        backend="async",
        batch_size=2,
        num_workers=2,
    )
    try:
        obs, infos = envs.reset()
        assert obs.shape == (2, 2) and infos["env_id"].tolist() == [0, 1]
        # the other two are ready too: send to the first two, recv gives 2 and 3 first
        envs.send(np.array([1, 2]), infos["env_id"])
        obs, rew, term, trunc, infos = envs.recv()
        assert sorted(infos["env_id"].tolist()) == [2, 3]
        assert obs[:, 1].tolist() == [0.0, 0.0]  # reset observations
        with pytest.raises(ValueError, match="still stepping"):
            envs.send(np.array([0]), [0])
        with pytest.raises(ValueError, match=r"env 3 .*outside Discrete\(3\)"):
            envs.send(np.array([0, 5]), [2, 3])
        envs.send(np.array([0, 2]), [2, 3])  # still usable after a bad action
        obs, rew, term, trunc, infos = envs.recv_ids([0, 1])
        assert infos["env_id"].tolist() == [0, 1]
        assert rew.tolist() == [1.0, 2.0]  # reward echoes the action that was sent
        assert obs[:, 1].tolist() == [1.0, 1.0]
    finally:
        envs.close()


def test_slow_env_does_not_stall_the_batch():
    fns = [functools.partial(counter, 0, sleep_on={2: 3.0})] + [
        functools.partial(counter, tag) for tag in range(1, 8)
    ]
    envs = vecaccel.make_vec(fns, backend="async", batch_size=4, num_workers=4)
    try:
        obs, infos = envs.reset()
        start = time.monotonic()
        seen = set()
        for _ in range(6):
            obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
            seen.update(infos["env_id"].tolist())
        elapsed = time.monotonic() - start
        # env 0 sleeps 3 s on its second step; the batches kept coming meanwhile
        assert envs._in_flight[0] or 0 not in seen or elapsed >= 3.0
        assert elapsed < 3.0 or not envs._in_flight[0]
        assert len(seen - {0}) >= 3
    finally:
        envs.close(terminate=True)


@pytest.mark.parametrize("context", CONTEXTS)
def test_env_exception_names_the_env(context):
    fns = [functools.partial(counter, tag, fail_on=3 if tag == 2 else -1) for tag in range(4)]
    envs = vecaccel.make_vec(fns, backend="async", batch_size=4, num_workers=2, context=context)
    try:
        envs.reset()
        with pytest.raises(vecaccel.WorkerError, match="env 2 raised ValueError") as info:
            for _ in range(5):
                envs.step(np.zeros(4, dtype=np.int64))
        assert info.value.env_indices == (2,)
        assert "boom at step 3" in info.value.remote_traceback
    finally:
        envs.close()
        envs.close()


def test_dead_worker_is_reported():
    import os
    import signal

    envs = vecaccel.make_vec("CartPole-v1", 4, backend="async", batch_size=2, num_workers=2)
    try:
        envs.reset(seed=0)
        victim = envs.pool.workers[1]
        os.kill(victim.process.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(vecaccel.WorkerError, match="SIGKILL") as info:
            # the other worker keeps serving batches until the kernel has reaped the victim
            while time.monotonic() - start < 10:
                envs.step(np.zeros(2, dtype=np.int64))
        assert time.monotonic() - start < 5
        assert set(info.value.env_indices) == {2, 3}
    finally:
        envs.close()
    assert not [p for p in __import__("multiprocessing").active_children() if p.is_alive()]


def test_batch_size_validation():
    with pytest.raises(ValueError, match="batch_size"):
        vecaccel.make_vec("CartPole-v1", 2, backend="async", batch_size=3)


@pytest.mark.parametrize(
    "backend,options",
    [("async", {"batch_size": 2}), ("action_server", {"device": "cpu", "alternating": True})],
)
def test_masked_reset_resets_envs_of_the_batch_in_hand(backend, options):
    """A masked reset used to need a full batch of ready envs and raised RuntimeError while the
    caller held the others; it now returns the batch in hand with the named envs reset."""
    envs = vecaccel.make_vec("CartPole-v1", 4, backend=backend, num_workers=2, **options)
    try:
        envs.reset(seed=0)
        obs, _, _, _, infos = envs.step(np.zeros(2, dtype=np.int64))
        held = np.asarray(infos["env_id"])
        before = np.asarray(obs).copy()
        mask = np.zeros(4, dtype=bool)
        mask[held[1]] = True
        obs, infos = envs.reset(seed=100, options={"reset_mask": mask})
        obs = np.asarray(obs)
        np.testing.assert_array_equal(np.asarray(infos["env_id"]), held)
        twin = gym.make("CartPole-v1")
        expected, _ = twin.reset(seed=100 + int(held[1]))
        np.testing.assert_array_equal(obs[1], expected)
        np.testing.assert_array_equal(obs[0], before[0])  # not in the mask: as it was
        other = np.zeros(4, dtype=bool)
        other[np.setdiff1d(np.arange(4), held)[0]] = True
        with pytest.raises(ValueError, match="not in the batch last returned"):
            envs.reset(options={"reset_mask": other})
        expected_next, *_ = twin.step(0)
        # stepping goes on from the batch in hand; which envs are ready first is up to the
        # scheduler (a busy machine can keep one worker's envs ahead for a few batches)
        for _ in range(50):
            obs, *_, infos = envs.step(np.zeros(2, dtype=np.int64))
            ids = np.asarray(infos["env_id"]).tolist()
            if int(held[1]) in ids:  # its first step after the reset
                np.testing.assert_array_equal(
                    np.asarray(obs)[ids.index(int(held[1]))], expected_next
                )
                break
        else:
            raise AssertionError(f"env {held[1]} never came back")
    finally:
        envs.close()
