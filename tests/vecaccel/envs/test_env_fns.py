"""The picklable env functions of an env source: a call of an importable function that shows
itself in its repr and pickles by reference, the PettingZoo env of a module path (parallel, or
AEC where that is all it has), and a function whose first call hands over an env made already,
in this process only."""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import pickle

import gymnasium as gym
import pytest

from vecaccel.envs.env_fns import EnvCall, PrebuiltEnvFn, make_gym_env, make_pettingzoo_env


class _RecordsClose(gym.Wrapper):
    closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


def _made_here() -> gym.Env:
    return _RecordsClose(gym.make("CartPole-v1", max_episode_steps=3))


def test_an_env_call_pickles_by_reference_and_makes_its_env_when_called() -> None:
    fn = EnvCall(make_gym_env, "CartPole-v1", max_episode_steps=4)
    assert repr(fn) == "EnvCall(make_gym_env, 'CartPole-v1', max_episode_steps=4)"
    payload = pickle.dumps(fn)
    assert b"make_gym_env" in payload and b"TimeLimit" not in payload  # no env inside
    env = pickle.loads(payload)()
    try:
        assert env.spec.id == "CartPole-v1" and env.spec.max_episode_steps == 4
    finally:
        env.close()
    assert repr(EnvCall(functools.partial(make_gym_env))).startswith("EnvCall(functools.partial")


def test_a_module_without_parallel_env_gives_its_aec_env(tmp_path, monkeypatch) -> None:
    (tmp_path / "aec_only_env.py").write_text("def env(**kwargs):\n    return ('aec', kwargs)\n")
    (tmp_path / "both_env.py").write_text(
        "def env(**kwargs):\n    return ('aec', kwargs)\n"
        "def parallel_env(**kwargs):\n    return ('parallel', kwargs)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert make_pettingzoo_env("aec_only_env", size=2) == ("aec", {"size": 2})
    assert make_pettingzoo_env("both_env", size=2) == ("parallel", {"size": 2})


@pytest.mark.skipif(importlib.util.find_spec("pettingzoo") is None, reason="no pettingzoo")
def test_a_pettingzoo_module_path_makes_its_parallel_env_with_the_arguments() -> None:
    from pettingzoo import ParallelEnv

    fn = EnvCall(make_pettingzoo_env, "pettingzoo.butterfly.pistonball_v6", n_pistons=3)
    env = pickle.loads(pickle.dumps(fn))()
    try:
        assert isinstance(env, ParallelEnv) and len(env.possible_agents) == 3
    finally:
        env.close()


def test_a_prebuilt_env_is_handed_over_once_and_closed_if_never_taken() -> None:
    made = _made_here()
    fn = PrebuiltEnvFn(_made_here, made)
    assert repr(fn) == repr(_made_here)
    assert fn() is made
    other = fn()
    assert other is not made and other.spec.max_episode_steps == 3
    other.close()
    fn.close_unused()
    assert not made.closed  # taken: the caller's to close
    made.close()

    unused = _made_here()
    PrebuiltEnvFn(_made_here, unused).close_unused()
    assert unused.closed


def test_a_prebuilt_env_pickles_as_its_function() -> None:
    fn = PrebuiltEnvFn(_made_here, _made_here())
    assert pickle.loads(pickle.dumps(fn)) is _made_here
    fn.close_unused()


def _call_in_child(fn: PrebuiltEnvFn, conn) -> None:
    instance = fn.instance  # this process's copy of the env made in the parent
    env = fn()
    conn.send((env is instance, env.spec.max_episode_steps))
    env.close()


def test_a_forked_process_makes_its_own_env_rather_than_the_parent_s() -> None:
    ctx = multiprocessing.get_context("fork")
    fn = PrebuiltEnvFn(_made_here, _made_here())
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_call_in_child, args=(fn, sender))
    child.start()
    try:
        assert receiver.poll(30)
        assert receiver.recv() == (False, 3)
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert fn.instance is not None  # still the parent's to hand over
    fn.close_unused()
