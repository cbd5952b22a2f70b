"""What ``vecaccel bench`` measures: the ``pong`` preset and Gymnasium ids as bench envs, their
env functions picklable by reference, and EnvPool's twin task where one has the same dynamics."""

from __future__ import annotations

import importlib.util
import pickle

import pytest

from vecaccel import bench
from vecaccel.bench.workloads import make_gym_env, resolve_env


def test_an_id_resolves_to_its_own_env_and_its_envpool_twin() -> None:
    target = resolve_env("CartPole-v1")
    assert (target.label, target.make_vec_arg) == ("CartPole-v1", "CartPole-v1")
    assert (target.envpool_id, target.envpool_kwargs) == ("CartPole-v1", {})
    env = pickle.loads(pickle.dumps(target.env_fn))()  # as a spawned peer's worker makes it
    try:
        assert env.spec.id == "CartPole-v1"
    finally:
        env.close()
    assert resolve_env("Acrobot-v1").envpool_id is None  # no twin with the same dynamics


def test_an_unknown_id_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown environment 'NoSuchEnv-v0'.*'pong'"):
        resolve_env("NoSuchEnv-v0")


def test_make_gym_env_passes_registered_ids_to_gymnasium() -> None:
    env = make_gym_env("Pendulum-v1")
    try:
        assert env.spec.id == "Pendulum-v1" and env.observation_space.shape == (3,)
    finally:
        env.close()


def test_pong_env_function_pickles_by_reference() -> None:
    target = bench.resolve_env("PONG")
    assert pickle.loads(pickle.dumps(target.env_fn)) is bench.make_pong_env
    assert target.envpool_kwargs["frame_skip"] == 4
    assert target.envpool_kwargs["repeat_action_probability"] == 0.0


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale-py not installed")
def test_pong_preset_steps() -> None:
    env = bench.make_pong_env()
    try:
        assert env.observation_space.shape == (84, 84)
        assert env.action_space.n == 6
    finally:
        env.close()
    results = bench.run_benchmark(
        "pong", [1], backends=["serial"], peers=["raw"], seconds=0.01, warmup=0.0
    )
    assert [r["status"] for r in results] == ["ok", "ok"]
