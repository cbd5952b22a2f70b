"""The env source: what a user passes as ``env`` resolved once into the envs to build (an id
makes no env, a function is looked at once and its env handed over, a vector env function is
checked and named by every env, PettingZoo envs and module paths become multi-agent sources),
what a backend reads from it, and what it refuses, saying what to pass instead."""

from __future__ import annotations

import functools
import importlib.util
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from toy_vector_envs import native_cartpole

from vecaccel.envs import EnvCall, EnvSource, make_gym_env
from vecaccel.envs.source import checked_num_envs
from vecaccel.envs.vectorized_slices import SliceEnvFn

PETTINGZOO = importlib.util.find_spec("pettingzoo") is not None
needs_pettingzoo = pytest.mark.skipif(not PETTINGZOO, reason="pettingzoo is not installed")


def _per_env() -> gym.Env:
    return gym.make("CartPole-v1")


def _vector(n: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")


# ---------------------------------------------------------------------------------------------
# what a user passes


def test_an_id_resolves_to_picklable_calls_and_makes_no_env() -> None:
    source = EnvSource.resolve("CartPole-v1", 3, env_kwargs={"max_episode_steps": 7})
    assert (source.num_envs, source.env_id, source.vectorized, source.multiagent) == (
        3,
        "CartPole-v1",
        False,
        False,
    )
    assert source.observation_space is None  # nothing was made to look at
    assert all(isinstance(fn, EnvCall) and fn.fn is make_gym_env for fn in source)
    env = pickle.loads(pickle.dumps(source[2]))()
    try:
        assert env.spec.id == "CartPole-v1" and env.spec.max_episode_steps == 7
    finally:
        env.close()
    assert EnvSource.id_of(source) == EnvSource.id_of("CartPole-v1") == "CartPole-v1"
    assert EnvSource.id_of([_per_env]) is None


def test_a_gymnasium_env_function_is_called_as_often_as_before() -> None:
    """Where PettingZoo is installed a function is called once to see what it makes; that env
    then serves as env 0, so the envs of a source cost as many calls as envs."""
    calls = []

    def make():
        calls.append(1)
        return gym.make("CartPole-v1")

    source = EnvSource.resolve(make, 2)
    envs = [fn() for fn in source]
    try:
        assert len(calls) == 2 and envs[0] is not envs[1]
        if PETTINGZOO:  # looked at: its spaces are known
            assert source.observation_space == envs[0].observation_space
            assert source.action_space == gym.spaces.Discrete(2)
    finally:
        for env in envs:
            env.close()
    source.close_unused()  # the env looked at was taken: nothing left to close


def test_a_list_or_a_generator_of_functions_gives_one_env_each() -> None:
    fns = [_per_env, functools.partial(gym.make, "CartPole-v1", max_episode_steps=5)]
    assert EnvSource.resolve(fns).num_envs == 2
    assert EnvSource.resolve((fn for fn in fns), 2).env_fns[1] is fns[1]
    with pytest.raises(ValueError, match="num_envs=3 but 2 env functions were given"):
        EnvSource.resolve(fns, 3)


def test_a_source_passes_through_and_slices_into_sources() -> None:
    source = EnvSource.resolve("CartPole-v1", 4)
    assert EnvSource.resolve(source) is source and EnvSource.resolve(source, 4) is source
    assert EnvSource.of(source) is source
    part = source[1:3]
    assert isinstance(part, EnvSource) and part.num_envs == 2 and part.env_id == "CartPole-v1"
    assert list(part) == list(source.env_fns[1:3])
    with pytest.raises(ValueError, match="num_envs=2 but 4"):
        EnvSource.resolve(source, 2)
    with pytest.raises(ValueError, match="env_kwargs only apply"):
        EnvSource.resolve(source, env_kwargs={"max_episode_steps": 5})


def test_a_vector_env_function_is_checked_once_and_named_by_every_env() -> None:
    built = []

    def vector(n: int) -> gym.vector.VectorEnv:
        built.append(n)
        return native_cartpole(n)

    source = EnvSource.resolve(vector, 4, vectorized=True)
    assert built == [1]  # one env, to check the autoreset mode before any worker starts
    assert source.vectorized and source.env_id is None and source.num_envs == 4
    assert all(isinstance(fn, SliceEnvFn) for fn in source)
    assert source.vector_env_fn() is source[0].vector_fn
    # a backend handed the plain list reads the same facts
    assert EnvSource.of(list(source)).vectorized and not EnvSource.of([_per_env]).vectorized
    # a block of them (a Ray shard's) resolves to a vectorized source again
    assert EnvSource.resolve(list(source[2:])).vectorized
    other = EnvSource.resolve(native_cartpole, 2, vectorized=True)
    with pytest.raises(TypeError, match="env 1 is not a sub-env of the same vector env"):
        EnvSource.resolve([source[0], other[0]])


def test_num_envs_is_required_with_vectorized():
    with pytest.raises(ValueError, match="num_envs is required with vectorized=True"):
        EnvSource.resolve(native_cartpole, vectorized=True)


# ---------------------------------------------------------------------------------------------
# PettingZoo envs


@needs_pettingzoo
def test_a_pettingzoo_function_makes_a_multiagent_source_of_its_agents() -> None:
    from pettingzoo_envs import EchoAgentsEnv

    fn = functools.partial(EchoAgentsEnv, num_agents=3)
    source = EnvSource.resolve(fn, 2)
    try:
        assert source.multiagent and source.num_envs == 2 and source.env_id is None
        assert source.agents == ("agent_0", "agent_1", "agent_2")
        assert source.observation_space is not None and source.action_space is not None
    finally:
        source.close_unused()


@needs_pettingzoo
def test_module_paths_of_pettingzoo_envs_and_nothing_else() -> None:
    path = "pettingzoo.butterfly.pistonball_v6"
    assert EnvSource.is_module_path(path)
    for not_a_module in ("CartPole-v1", "ALE/Pong-v5", "numpy.linalg", "no_such.module", 3):
        assert not EnvSource.is_module_path(not_a_module)
    source = EnvSource.resolve(path, 2, env_kwargs={"n_pistons": 3})
    try:
        assert source.multiagent and source.env_id == path and len(source.agents) == 3
        assert EnvSource.is_module_path(source)
    finally:
        source.close_unused()
    with pytest.raises(ValueError, match="num_envs is required when env is a module path"):
        EnvSource.resolve(path)


@needs_pettingzoo
def test_an_id_imports_no_pettingzoo_and_a_function_importing_it_is_still_looked_at():
    """A fresh interpreter: ``make_vec`` on a Gymnasium id leaves PettingZoo unimported, and a
    function that imports PettingZoo itself is still found to make PettingZoo envs."""
    code = (
        "import sys, vecaccel\n"
        "envs = vecaccel.make_vec('CartPole-v1', 2, backend='serial')\n"
        "envs.close()\n"
        "assert 'pettingzoo' not in sys.modules, 'pettingzoo was imported'\n"
        "def make():\n"
        "    from pettingzoo.butterfly import cooperative_pong_v6\n"
        "    return cooperative_pong_v6.parallel_env()\n"
        "envs = vecaccel.make_vec(make, 2, backend='serial')\n"
        "assert envs.num_envs == 4 and envs.agents_per_env == 2, envs.num_envs\n"
        "envs.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------------------------------------
# what it refuses, saying what to pass instead


def test_an_empty_env_list_is_a_clear_error():
    with pytest.raises(ValueError, match="a vector env needs at least one env function"):
        EnvSource.resolve([])


def test_an_env_instance_says_what_to_pass():
    """Passing ``gym.make(...)`` (an instance) instead of an id or a function is an error that
    says what to pass, not "TypeError: 'TimeLimit' object is not iterable"."""
    env = gym.make("CartPole-v1")
    try:
        with pytest.raises(TypeError, match="zero-argument callable.*an env instance") as info:
            EnvSource.resolve(env, 2)
    finally:
        env.close()
    assert "not iterable" not in str(info.value)


@pytest.mark.parametrize(
    "env, expected",
    [(gym.spec("CartPole-v1"), "pass its id 'CartPole-v1'"), (3, "takes an env id")],
    ids=["env-spec", "not-iterable"],
)
def test_neither_an_id_nor_functions_says_what_to_pass(env, expected):
    with pytest.raises(TypeError, match=expected):
        EnvSource.resolve(env, 2)


@pytest.mark.parametrize(
    "env, num_envs, error, message",
    [
        ("CartPole-v1", None, ValueError, "num_envs is required when env is an environment id"),
        (_per_env, None, ValueError, "num_envs is required when env is a single env function"),
        ([_per_env, "CartPole-v1"], None, TypeError, "env function 1 is not callable"),
        ("NoSuchEnv-v0", 2, ValueError, "unknown environment id 'NoSuchEnv-v0'"),
    ],
    ids=["id", "function", "not-callable", "unknown-id"],
)
def test_an_incomplete_or_unknown_env_is_refused(env, num_envs, error, message):
    with pytest.raises(error, match=message):
        EnvSource.resolve(env, num_envs)


def test_check_id_refuses_an_unknown_id_with_resolves_one_line():
    """What a caller that wraps the id in env functions of its own checks first: the message
    ``resolve`` gives for the id itself."""
    EnvSource.check_id("CartPole-v1")
    with pytest.raises(ValueError) as resolved:
        EnvSource.resolve("CartPol-v1", 2)
    with pytest.raises(ValueError) as checked:
        EnvSource.check_id("CartPol-v1")
    assert str(checked.value) == str(resolved.value)
    assert str(checked.value).startswith("unknown environment id 'CartPol-v1': ")
    assert "\n" not in str(checked.value) and "`CartPole`" in str(checked.value)


def test_env_kwargs_of_a_gymnasium_env_function_are_refused():
    """They apply to an id or a PettingZoo env function only (where PettingZoo is installed,
    the function is called with them once to see which it is)."""
    fn = functools.partial(gym.make, "CartPole-v1")
    with pytest.raises(ValueError, match="env_kwargs only applies when env is an environment id"):
        EnvSource.resolve(fn, 2, env_kwargs={"max_episode_steps": 5})


def test_a_per_env_function_with_vectorized_is_refused_naming_fn_of_n():
    with pytest.raises(TypeError, match=r"vector env function fn\(n\) -> gymnasium.vector") as info:
        EnvSource.resolve(_per_env, 4, vectorized=True)
    assert "_per_env takes no argument" in str(info.value)
    assert "without vectorized=True" in str(info.value)


@pytest.mark.parametrize("as_list", [False, True])
def test_a_vector_env_function_without_vectorized_is_refused_naming_the_flag(as_list):
    env = [_per_env, _vector] if as_list else _vector
    with pytest.raises(TypeError, match=r"_vector.* needs 1 argument.*pass vectorized=True"):
        EnvSource.resolve(env, None if as_list else 4)


@pytest.mark.parametrize("num_envs", [True, 2.0, "2"])
def test_a_num_envs_that_is_not_an_integer_is_refused(num_envs):
    with pytest.raises(TypeError, match="num_envs must be an integer"):
        EnvSource.resolve("CartPole-v1", num_envs)


def test_num_envs_may_be_any_positive_integer_type():
    """A count read from an array or a config (``np.int64``) is an integer too."""
    assert checked_num_envs(np.int64(2)) == 2 and type(checked_num_envs(np.int64(2))) is int
    assert EnvSource.resolve("CartPole-v1", np.int32(3)).num_envs == 3
    for bad in (0, -1, np.int64(0)):
        with pytest.raises(ValueError, match="num_envs must be a positive integer"):
            checked_num_envs(bad)
