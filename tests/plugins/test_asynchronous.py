"""The ``async`` backend: first-ready batches, per-env trajectories equal the serial backend's,
and the ``send``/``recv`` API's argument checks.
"""

from __future__ import annotations

import functools
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from backend_matrix import options_for, partial_batch_options, select
from toy_envs import tagged_counter

import vecaccel
from vecaccel.testing.contract_envs import make_cartpole

torch.set_num_threads(1)

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
        [functools.partial(tagged_counter, tag) for tag in range(4)],
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
    """Env 0 hangs on its second step; the other seven keep filling batches of four meanwhile.
    The hang outlasts the test (``close`` terminates it), so no timing enters the check."""
    fns = [functools.partial(tagged_counter, 0, sleep_on={2: 600.0})] + [
        functools.partial(tagged_counter, tag) for tag in range(1, 8)
    ]
    envs = vecaccel.make_vec(fns, backend="async", batch_size=4, num_workers=4)
    try:
        obs, infos = envs.reset()
        # step until env 0's first step result is back: the next step sends it the hanging one
        for _ in range(100):
            obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
            ids = infos["env_id"].tolist()
            if 0 in ids and obs[ids.index(0), 1] == 1.0:
                break
        else:
            pytest.fail("env 0 never returned its first step")
        seen = set()
        for _ in range(6):
            obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
            seen.update(infos["env_id"].tolist())
            assert envs._in_flight[0]
        assert 0 not in seen
        assert len(seen) >= 4
    finally:
        envs.close(terminate=True)


@pytest.mark.parametrize("context", CONTEXTS)
def test_env_exception_names_the_env(context):
    fns = [
        functools.partial(tagged_counter, tag, fail_on=3 if tag == 2 else -1) for tag in range(4)
    ]
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
            while time.monotonic() - start < 60:
                envs.step(np.zeros(2, dtype=np.int64))
        assert set(info.value.env_indices) == {2, 3}
    finally:
        envs.close()
    assert not [p for p in __import__("multiprocessing").active_children() if p.is_alive()]


def test_batch_size_validation():
    with pytest.raises(ValueError, match="batch_size"):
        vecaccel.make_vec("CartPole-v1", 2, backend="async", batch_size=3)


@pytest.mark.parametrize(
    "backend,options",
    [
        (name, {**options_for(name, num_workers=2), **partial_batch_options(name, 4)})
        for name in select(partial_batches=True)
    ],
)
def test_masked_reset_resets_envs_of_the_batch_in_hand(backend, options):
    """A masked reset needs no full batch of ready envs: while the caller holds the others, it
    returns the batch in hand with the named envs reset."""
    envs = vecaccel.make_vec("CartPole-v1", 4, backend=backend, **options)
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


def tagged_counter_fns(num_envs: int, **kwargs) -> list:
    return [functools.partial(tagged_counter, tag, **kwargs) for tag in range(num_envs)]


# ---------------------------------------------------------------------------------------------
# async: send/recv bookkeeping


def test_async_send_refuses_envs_whose_result_was_not_received():
    """After ``reset`` returns envs 0 and 1, envs 2 and 3 are ready but not received yet: their
    reset observations are still to come. Sending them actions now is refused: accepting it
    would lose the reset observation and return the same step result twice."""
    envs = vecaccel.make_vec(tagged_counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        _, infos = envs.reset()
        assert infos["env_id"].tolist() == [0, 1]
        with pytest.raises(ValueError):
            envs.send(np.array([1, 1]), [2, 3])
        # whatever send did, every env's first result must be its reset observation
        obs, rew, *_ = envs.recv()
        assert obs[:, 1].tolist() == [0.0, 0.0] and rew.tolist() == [0.0, 0.0]
    finally:
        envs.close()


def test_async_recv_refuses_when_stepping_envs_cannot_fill_a_batch():
    """One env stepping and none ready can never make a batch of two: ``recv`` must say so
    (as it does when nothing steps) instead of blocking forever."""
    envs = vecaccel.make_vec(tagged_counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        envs.reset()
        envs.send(np.array([1]), [0])
        assert sorted(envs.recv()[4]["env_id"].tolist()) == [2, 3]  # the ready ones
        with pytest.raises(RuntimeError):
            envs.recv(timeout=2.0)  # without the timeout this call never returns
    finally:
        envs.close()


def test_async_recv_ids_refuses_a_negative_id_instead_of_waiting_for_it():
    """``recv_ids([-1])`` while env 3 steps is refused: reading it as ``_in_flight[-1]`` (env 3)
    would wait for an env ``-1`` that never arrives (forever without a timeout)."""
    envs = vecaccel.make_vec(tagged_counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        envs.reset()
        envs.step(np.zeros(2, dtype=np.int64))  # sends 0, 1; returns 2, 3 (ready)
        envs.send(np.zeros(2, dtype=np.int64), [2, 3])  # every env is stepping now
        with pytest.raises(ValueError):
            envs.recv_ids([-1], timeout=2.0)
    finally:
        envs.close()


def test_async_recv_ids_refuses_duplicates_and_out_of_range_ids_like_send():
    envs = vecaccel.make_vec(tagged_counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        envs.reset()
        with pytest.raises(ValueError):
            envs.recv_ids([2, 2], timeout=2.0)  # returned env 2 twice
        with pytest.raises(ValueError):
            envs.recv_ids([9], timeout=2.0)  # a bare numpy IndexError
    finally:
        envs.close()


def test_async_send_and_recv_argument_errors():
    envs = vecaccel.make_vec(tagged_counter_fns(4), backend="async", batch_size=4, num_workers=2)
    try:
        with pytest.raises(RuntimeError, match="reset"):
            envs.step(np.zeros(4, dtype=np.int64))
        _, infos = envs.reset()
        assert infos["env_id"].tolist() == [0, 1, 2, 3]
        with pytest.raises(RuntimeError, match="send\\(\\) actions first"):
            envs.recv()  # nothing stepping, nothing ready
        for ids, match in (([-1], "lie in"), ([4], "lie in"), ([1, 1], "duplicates")):
            with pytest.raises(ValueError, match=match):
                envs.send(np.zeros(len(ids), dtype=np.int64), ids)
        with pytest.raises(ValueError, match="shape"):
            envs.send(np.zeros(3, dtype=np.int64), [0, 1])
        envs.send(np.zeros(0, dtype=np.int64), [])  # nothing to do
        assert not envs._in_flight.any()
        obs, rew, _, _, infos = envs.step(np.array([0, 1, 2, 0]))  # still usable
        assert sorted(infos["env_id"].tolist()) == [0, 1, 2, 3] and obs.shape == (4, 2)
        assert obs[:, 1].tolist() == [1.0] * 4
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["SameStep", "NextStep"])
def test_async_flags_and_infos_per_env_equal_serial(mode):
    """Partial batches carry each env's own flags and infos (``final_obs``/``final_info`` in
    SAME_STEP, ``_key`` masks over the batch), exactly as the serial backend gives them."""
    n = 4
    fns = [functools.partial(make_cartpole, 5, True)] * n

    def per_env(infos, position):
        out = {}
        for key, value in infos.items():
            if key.startswith("_") or key == "env_id":
                continue
            if not infos[f"_{key}"][position]:
                continue
            if isinstance(value, dict):
                out[key] = {k: v[position] for k, v in value.items() if not k.startswith("_")}
            else:
                out[key] = value[position]
        return out

    envs = vecaccel.make_vec(fns, backend="async", batch_size=2, num_workers=2, autoreset_mode=mode)
    got: dict[int, list] = {i: [] for i in range(n)}
    try:
        _, infos = envs.reset(seed=3)
        first = set(infos["env_id"].tolist())
        # until every env has 8 steps: which envs come back first is up to the scheduler
        for _ in range(1000):
            if min(len(v) for v in got.values()) >= 8:
                break
            obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
            for position, i in enumerate(infos["env_id"].tolist()):
                if i not in first:
                    first.add(i)  # its reset observation: the serial reference starts after it
                    continue
                got[i].append((obs[position], rew[position], term[position], trunc[position],
                               per_env(infos, position)))  # fmt: skip
    finally:
        envs.close()
    reference = vecaccel.make_vec(fns, backend="serial", autoreset_mode=mode)
    try:
        reference.reset(seed=3)
        steps = min(len(v) for v in got.values())
        assert steps >= 8  # episodes of 5 steps: at least one autoreset per env
        for s in range(steps):
            obs, rew, term, trunc, infos = reference.step(np.zeros(n, dtype=np.int64))
            for i in range(n):
                g_obs, g_rew, g_term, g_trunc, g_info = got[i][s]
                np.testing.assert_array_equal(g_obs, obs[i])
                assert (g_rew, g_term, g_trunc) == (rew[i], term[i], trunc[i]), (i, s)
                e_info = per_env(infos, i)
                assert g_info.keys() == e_info.keys(), (i, s)
                for key in e_info:
                    if isinstance(e_info[key], dict):
                        assert g_info[key].keys() == e_info[key].keys()
                        for k in e_info[key]:
                            np.testing.assert_array_equal(g_info[key][k], e_info[key][k])
                    else:
                        np.testing.assert_array_equal(g_info[key], e_info[key])
    finally:
        reference.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_async_reset_while_envs_step_reseeds_every_env(context):
    envs = vecaccel.make_vec(
        "CartPole-v1", 4, backend="async", batch_size=2, num_workers=2, context=context
    )
    twins = [gym.make("CartPole-v1") for _ in range(4)]
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))  # 0 and 1 step; 2 and 3 come back
        envs.send(np.ones(2, dtype=np.int64), [2, 3])  # now every env is stepping
        obs, infos = envs.reset(seed=10)
        expected = np.stack([twin.reset(seed=10 + i)[0] for i, twin in enumerate(twins)])
        assert infos["env_id"].tolist() == [0, 1]
        np.testing.assert_array_equal(obs, expected[[0, 1]])
        # the other two come back with their reset observation, never a stale step result
        obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert infos["env_id"].tolist() == [2, 3]
        np.testing.assert_array_equal(obs, expected[[2, 3]])
        assert rew.tolist() == [0.0, 0.0] and not term.any() and not trunc.any()
        obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
        after_one_step = np.stack([twin.step(0)[0] for twin in twins])
        ids = infos["env_id"]
        np.testing.assert_array_equal(obs, after_one_step[ids])
        assert rew.tolist() == [1.0, 1.0]
    finally:
        envs.close()
        for twin in twins:
            twin.close()


def test_async_close_with_envs_in_flight_leaves_nothing(leak_check):
    envs = vecaccel.make_vec(
        tagged_counter_fns(4, sleep_on={1: 1.0}), backend="async", batch_size=2, num_workers=2
    )
    envs.reset()
    envs.send(np.zeros(2, dtype=np.int64), [0, 1])
    envs.close()
    assert envs.closed
    with pytest.raises(vecaccel.ClosedEnvError):
        envs.recv()
    envs.close()  # idempotent
