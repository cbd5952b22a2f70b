"""The env functions a training env source holds: they pickle under every start method and say
what they build, and the env source answers what the user's env is."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

import vecaccel
from vecaccel.envs import EnvCall, EnvSource, make_gym_env
from vecaccel.trainers.envs.make import make_env_fn, training_env_source


def _env_id_in_child(fn):
    env = fn()
    try:
        return env.spec.id
    finally:
        env.close()


def test_env_call_pickles_and_shows_its_call():
    fn = EnvCall(make_gym_env, "CartPole-v1", max_episode_steps=7)
    assert repr(fn) == "EnvCall(make_gym_env, 'CartPole-v1', max_episode_steps=7)"
    again = pickle.loads(pickle.dumps(fn))
    env = again()
    assert env.spec.max_episode_steps == 7
    env.close()


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_resolved_id_builds_in_a_fresh_process(context):
    source = EnvSource.resolve("CartPole-v1", 1)
    with multiprocessing.get_context(context).Pool(1) as pool:
        assert pool.apply(_env_id_in_child, (source[0],)) == "CartPole-v1"


def test_module_path_is_answered_by_the_env_source():
    pytest.importorskip("pettingzoo")
    path = "pettingzoo.butterfly.pistonball_v6"
    assert EnvSource.is_module_path(path)
    assert not EnvSource.is_module_path("CartPole-v1")
    assert not EnvSource.is_module_path(lambda: None)
    source = EnvSource.resolve(path, 1, env_kwargs={"n_pistons": 3})
    source.close_unused()
    assert EnvSource.is_module_path(source)
    assert len(source.agents) == 3


def test_module_path_env_steps_under_spawn():
    pytest.importorskip("pettingzoo")
    envs = vecaccel.make_vec(
        "pettingzoo.butterfly.pistonball_v6",
        2,
        backend="shm",
        num_workers=2,
        context="spawn",
        env_kwargs={"n_pistons": 3, "continuous": False},
    )
    try:
        obs, _ = envs.reset(seed=0)
        assert envs.num_envs == 6
    finally:
        envs.close()


def test_training_env_functions_pickle_and_build_the_recorded_env():
    fn = pickle.loads(pickle.dumps(make_env_fn("CartPole-v1")))
    assert repr(fn) == "EnvCall(make_recorded_env, 'CartPole-v1')"
    env = fn()
    assert type(env).__name__ == "RecordEpisodeStatistics"
    env.close()


def test_a_batched_source_says_so_once_resolved():
    assert training_env_source("CartPole-v1", 2, vectorized=True).vectorized
    assert not training_env_source("CartPole-v1", 2).vectorized


def test_an_unknown_id_is_refused_in_the_caller_as_make_vec_refuses_it():
    """The trainers wrap an id in env functions of their own; the id is still checked before a
    worker starts, and the error is the env layer's line, not a worker's traceback."""
    from vecaccel.trainers import PPO

    with pytest.raises(ValueError) as layer:
        vecaccel.make_vec("CartPol-v1", 2)
    with pytest.raises(ValueError) as source:
        training_env_source("CartPol-v1", 2)
    with pytest.raises(ValueError) as trainer:
        PPO("CartPol-v1", backend="shm", num_envs=2, torch_threads=1, tensorboard=False)
    assert str(source.value) == str(trainer.value) == str(layer.value)
    assert "\n" not in str(trainer.value) and "`CartPole`" in str(trainer.value)
    assert multiprocessing.active_children() == []  # no worker was started to find out
