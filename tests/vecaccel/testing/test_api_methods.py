"""The methods ``check_backend`` calls on a backend's vector env: each one that is missing, or
that ``vecaccel.VecEnv`` only holds as a placeholder down the chain of what it calls, named with
its fix; a backend implementing the ``*_indices`` methods lacks none."""

from __future__ import annotations

import gymnasium as gym
import pytest

from vecaccel.plugins.serial import SerialVecEnv
from vecaccel.testing.api_methods import REQUIRED_METHODS, missing_methods
from vecaccel.vec_env import VecEnv


class WithoutIndices(SerialVecEnv):
    """``serial`` with ``vecaccel.VecEnv``'s placeholders for ``call_indices`` and
    ``set_attr_indices``: ``call``, ``get_attr`` and ``set_attr`` end at them."""

    call_indices = VecEnv.call_indices
    set_attr_indices = VecEnv.set_attr_indices


class OwnCallOnly(WithoutIndices):
    """Overrides ``call`` itself: ``get_attr`` goes through it; ``set_attr`` still ends at the
    placeholder."""

    def call(self, name, *args, **kwargs):
        return tuple(getattr(env.unwrapped, name) for env in self.envs)


def _cartpoles(cls, n: int = 2):
    return cls([lambda: gym.make("CartPole-v1")] * n)


def test_a_backend_implementing_the_indices_methods_lacks_nothing() -> None:
    envs = _cartpoles(SerialVecEnv)
    try:
        assert missing_methods(envs) == []
    finally:
        envs.close()


@pytest.mark.parametrize(
    "cls, missing",
    [(WithoutIndices, ["call", "get_attr", "set_attr"]), (OwnCallOnly, ["set_attr"])],
)
def test_placeholders_are_followed_down_what_each_method_calls(cls, missing) -> None:
    envs = _cartpoles(cls)
    try:
        found = missing_methods(envs)
    finally:
        envs.close()
    assert [method for method, _ in found] == missing
    assert all(fix == REQUIRED_METHODS[method] for method, fix in found)


def test_a_gymnasium_vector_env_lacks_the_async_pair_and_an_object_everything() -> None:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    try:
        assert [method for method, _ in missing_methods(envs)] == ["step_async", "step_wait"]
    finally:
        envs.close()
    everything = missing_methods(object())
    assert [method for method, _ in everything] == list(REQUIRED_METHODS)
    for method, fix in everything:
        assert fix and ("vecaccel.VecEnv" in fix or fix.startswith("implement")), (method, fix)


def test_an_attribute_that_is_not_callable_is_missing() -> None:
    class NotCallable:
        step_async = None

    assert "step_async" in [method for method, _ in missing_methods(NotCallable())]
