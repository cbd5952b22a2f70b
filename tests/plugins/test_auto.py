"""``backend="auto"``: what it builds, records and logs for per-env functions and for vector env
functions (``vectorized=True``), the options that rule backends out, and that ``vecaccel tune``
shares its probe."""

from __future__ import annotations

import functools
import logging

import gymnasium as gym
import numpy as np
import pytest
from toy_vector_envs import costly_sync, native_cartpole

import vecaccel
from vecaccel.backend_choice import choose_backend
from vecaccel.backend_choice import env_step_cost as probe
from vecaccel.backend_choice.env_step_cost import StepCost
from vecaccel.plugins.auto import AutoOptions
from vecaccel.plugins.serial import SerialVecEnv
from vecaccel.tune import autotune
from vecaccel.worker import usable_cpus

RANK = {"serial": 0, "hybrid": 1, "shm": 2}
CHEAP_S, COSTLY_S = 13e-6, 800e-6  # CartPole's step and Pong's, roughly


# ---------------------------------------------------------------------------------------------
# make_vec(backend="auto")


def expected_for(step_s: float, num_envs: int, **kwargs) -> str:
    return choose_backend(step_s, num_envs, usable_cpus(), **kwargs).backend


@pytest.mark.parametrize("step_cost_s", [None, 1e-7, CHEAP_S, COSTLY_S])
def test_auto_over_cartpole_matches_sync_vector_env(step_cost_s, no_leaks):
    """Whatever it builds (the probe's choice, or each branch of the rule through a given step
    cost), the envs step as Gymnasium's SyncVectorEnv does for the same seeds and actions."""
    num_envs = 16
    options = {} if step_cost_s is None else {"step_cost_s": step_cost_s}
    envs = vecaccel.make_vec("CartPole-v1", num_envs, backend="auto", **options)
    reference = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs)
    try:
        record = envs.metadata["backend"]
        if step_cost_s is not None:
            assert record["name"] == expected_for(step_cost_s, num_envs)
        obs, _ = envs.reset(seed=7)
        ref_obs, _ = reference.reset(seed=7)
        np.testing.assert_array_equal(obs, ref_obs)
        space = reference.action_space
        space.seed(3)
        for _ in range(60):  # several episodes end and autoreset
            actions = space.sample()
            got = envs.step(actions)
            want = reference.step(actions)
            for mine, theirs in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(mine, theirs)
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize(
    "isolating", [{"on_worker_failure": "restart"}, {"step_timeout_s": 30.0}, {"step_timeout": 30}]
)
def test_restart_or_a_step_timeout_keeps_every_env_in_a_worker(isolating, monkeypatch, no_leaks):
    def fail(*args, **kwargs):
        raise AssertionError("an env was stepped in the caller")

    monkeypatch.setattr(probe, "probe_step_cost", fail)  # not even the probe runs here
    for extra in ({}, {"step_cost_s": CHEAP_S / 100}):  # cheap enough for the caller otherwise
        with vecaccel.make_vec("CartPole-v1", 8, backend="auto", **isolating, **extra) as envs:
            record = envs.metadata["backend"]
            assert record["name"] == "shm" and envs.inline_envs == 0
            assert "inline_envs" not in record["options"] and record["probed"] is False
            assert envs.num_workers == min(8, usable_cpus())
            envs.reset(seed=0)
            envs.step(envs.action_space.sample())


def test_metadata_and_one_log_line_say_what_was_chosen_and_why(caplog, no_leaks):
    with caplog.at_level(logging.INFO, logger="vecaccel"):
        envs = vecaccel.make_vec("CartPole-v1", 3, backend="auto", copy=False)
    try:
        record = envs.metadata["backend"]
        assert set(record) == {"name", "options", "step_cost_s", "probed", "reason"}
        assert record["probed"] is True and record["step_cost_s"] > 0
        assert record["options"]["copy"] is False  # the options given go to the choice
        assert envs.metadata["autoreset_mode"] == envs.autoreset_mode  # the backend's own
        lines = [r for r in caplog.records if r.name == "vecaccel.plugins.auto"]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO
        message = lines[0].getMessage()
        assert f"chose {record['name']}(" in message and record["reason"] in message
        if record["name"] == "serial":
            assert isinstance(envs, SerialVecEnv)
        else:
            assert envs.num_workers == record["options"]["num_workers"]
            assert envs.inline_envs == record["options"].get("inline_envs", 0)
    finally:
        envs.close()


def test_options_given_are_kept_and_rule_out_backends_that_do_not_take_them(no_leaks):
    # num_workers is a worker option: not serial, even for a step this cheap
    with vecaccel.make_vec(
        "CartPole-v1", 4, backend="auto", num_workers=1, step_cost_s=CHEAP_S / 100
    ) as envs:
        record = envs.metadata["backend"]
        assert record["name"] == "hybrid" and envs.num_workers == 1
        assert record["probed"] is False
    # an inline share given decides hybrid or shm; the rule picks the rest
    with vecaccel.make_vec(
        "CartPole-v1", 4, backend="auto", inline_envs=0, step_cost_s=CHEAP_S
    ) as envs:
        assert envs.metadata["backend"]["name"] == "shm" and envs.inline_envs == 0
        assert envs.metadata["backend"]["probed"] is False


def test_an_explicit_backend_never_probes(monkeypatch, no_leaks):
    def fail(*args, **kwargs):
        raise AssertionError("probed")

    monkeypatch.setattr(probe, "probe_step_cost", fail)
    with vecaccel.make_vec("CartPole-v1", 2, backend="serial") as envs:
        assert "backend" not in envs.metadata
    assert vecaccel.make_vec.__kwdefaults__["backend"] == "shm"  # isolation first


def test_a_probe_that_fails_is_an_error_naming_the_probe():
    class Broken(gym.Env):
        observation_space = gym.spaces.Discrete(2)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return 0, {}

        def step(self, action):
            raise OSError("simulator went away")

    with pytest.raises(RuntimeError, match="measure its step cost") as info:
        vecaccel.make_vec([Broken, Broken], backend="auto")
    assert isinstance(info.value.__cause__, OSError)


def test_bad_auto_options_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match="step_cost_s"):
        vecaccel.make_vec("CartPole-v1", 2, backend="auto", step_cost_s=-1.0)
    with pytest.raises(TypeError, match="did you mean 'num_workers'"):
        vecaccel.make_vec("CartPole-v1", 2, backend="auto", num_wrokers=2)
    assert AutoOptions(step_cost_s=0.0).given() == {}


# ---------------------------------------------------------------------------------------------
# make_vec(backend="auto", vectorized=True)


def test_auto_keeps_a_cheap_native_vector_env_in_the_caller(no_leaks):
    envs = vecaccel.make_vec(native_cartpole, 256, backend="auto", vectorized=True)
    try:
        record = envs.metadata["backend"]
        assert record["name"] == "serial", record
        assert record["probed"] is True
        assert set(record["vector_step_cost"]) == {"step_s", "slice_step_s", "cores"}
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (256, 4)
        envs.step(np.zeros(256, dtype=np.int64))
    finally:
        envs.close()


def test_auto_spreads_a_costly_vector_env_over_workers(no_leaks):
    # 8 envs of 1.2 ms each: a slice of 4 costs ~4.8 ms, far above the shm threshold
    fn = functools.partial(costly_sync, cpu_s=0.0012)
    envs = vecaccel.make_vec(fn, 8, backend="auto", vectorized=True)
    try:
        record = envs.metadata["backend"]
        cpus = vecaccel.worker.usable_cpus()
        if cpus == 1:
            assert record["name"] == "serial", record
        else:
            # the reason and the measured cost, which a long record's repr would cut off
            why = (record["reason"], record["vector_step_cost"])
            assert record["name"] == "shm", why
            assert record["options"]["num_workers"] == min(8, cpus), why
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (8, 4)
        envs.step(np.zeros(8, dtype=np.int64))
    finally:
        envs.close()


def test_a_given_step_cost_skips_the_vector_probe(no_leaks):
    calls = []

    def counting(n):
        calls.append(n)
        return native_cartpole(n)

    envs = vecaccel.make_vec(
        counting, 64, backend="auto", vectorized=True, step_cost_s=1e-3, num_workers=2
    )
    try:
        record = envs.metadata["backend"]
        assert record["probed"] is False
        assert record["name"] == "shm" and record["options"]["num_workers"] == 2, record
    finally:
        envs.close()
    assert 64 not in calls  # only the size check's one env and the workers' slices were built


def test_a_failing_vector_probe_names_the_probe():
    def breaks_when_big(n):
        if n > 1:
            raise RuntimeError("too big")
        return native_cartpole(n)

    with pytest.raises(RuntimeError, match="measure its step cost.*too big"):
        vecaccel.make_vec(breaks_when_big, 8, backend="auto", vectorized=True)


# ---------------------------------------------------------------------------------------------
# one probe for tune and auto


def test_tune_and_auto_share_the_probe(monkeypatch, no_leaks):
    """Both ask ``vecaccel.backend_choice.env_step_cost.probe_step_cost``: told that a step costs Pong's, each picks
    shm for CartPole, where the real probe would have kept it in the caller."""
    calls: list[str] = []

    def pong_like(env_fn, *args, **kwargs) -> StepCost:
        env = env_fn()
        calls.append(env.spec.id)
        env.close()
        return StepCost(COSTLY_S, 10, 0, 1e-3)

    monkeypatch.setattr(probe, "probe_step_cost", pong_like)
    with vecaccel.make_vec("CartPole-v1", 4, backend="auto") as envs:
        assert envs.metadata["backend"]["step_cost_s"] == COSTLY_S
        assert envs.metadata["backend"]["name"] == "shm"
    trials = autotune("CartPole-v1", [4], backends=["auto"], seconds=0.05)
    (trial,) = trials
    assert trial.auto and trial.error is None and trial.steps_per_s > 0
    assert (trial.backend, trial.options) == ("shm", {"num_workers": min(4, usable_cpus())})
    assert calls == ["CartPole-v1", "CartPole-v1"]


# ---------------------------------------------------------------------------------------------
# the defaults that use it


def test_the_sb3_adapter_and_the_trainers_default_to_auto(no_leaks):
    import inspect

    from vecaccel.adapters.sb3 import VecAccelEnv
    from vecaccel.trainers.config.settings import RunConfig
    from vecaccel.trainers.envs.make import make_env_for_training

    assert RunConfig().backend == "auto"
    venv = VecAccelEnv([lambda: gym.make("CartPole-v1")] * 2)
    try:
        assert venv.vec_env.metadata["backend"]["name"] in RANK
        assert venv.reset().shape == (2, 4)
    finally:
        venv.close()
    assert inspect.signature(make_env_for_training).parameters["backend"].default == "auto"
    with make_env_for_training("CartPole-v1", 2, step_cost_s=COSTLY_S) as envs:
        assert envs.metadata["backend"]["name"] == expected_for(COSTLY_S, 2)
