"""``vecaccel.adapters.env_calls``: the SB3 adapter's calls into the workers, which a worker
runs without importing Stable-Baselines3 or torch."""

from __future__ import annotations

import sys

import gymnasium as gym
import pytest

from vecaccel.adapters.env_calls import (
    MissingAttribute,
    RegisteringEnvFn,
    get_wrapper_attr,
    has_wrapper_attr,
    render,
)

HEAVY = ("stable_baselines3", "torch")


class ModulesEnv(gym.Wrapper):
    """CartPole that reports which of ``HEAVY`` its process has imported."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1", render_mode="rgb_array"))
        self.tag = "cartpole"

    def heavy_modules(self) -> list[str]:
        return [name for name in HEAVY if name in sys.modules]


def test_the_calls_find_attributes_through_the_wrappers_and_render() -> None:
    env = gym.wrappers.RecordEpisodeStatistics(ModulesEnv())
    env.reset(seed=0)
    assert get_wrapper_attr(env, "tag") == "cartpole"
    missing = get_wrapper_attr(env, "no_such_attribute")
    assert isinstance(missing, MissingAttribute) and "no_such_attribute" in missing.message
    assert has_wrapper_attr(env, "tag") and not has_wrapper_attr(env, "no_such_attribute")
    assert render(env).shape == (400, 600, 3)
    env.close()


def test_registering_env_fn_builds_the_env_after_the_plugins_registered_theirs() -> None:
    env = RegisteringEnvFn(ModulesEnv)()
    assert isinstance(env, ModulesEnv)
    env.close()


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_a_fresh_worker_answers_the_adapter_without_importing_sb3_or_torch(context) -> None:
    # imported here: a spawned worker imports this module to unpickle ModulesEnv
    pytest.importorskip("stable_baselines3")
    from vecaccel.adapters.sb3 import VecAccelEnv

    venv = VecAccelEnv([ModulesEnv] * 2, backend="shm", num_workers=1, context=context)
    try:
        venv.reset()
        assert venv.get_attr("tag") == ["cartpole", "cartpole"]
        assert venv.has_attr("tag") and not venv.has_attr("no_such_attribute")
        with pytest.raises(AttributeError, match="no_such_attribute"):
            venv.get_attr("no_such_attribute")
        assert [image.shape for image in venv.get_images()] == [(400, 600, 3)] * 2
        assert venv.env_method("heavy_modules") == [[], []]
    finally:
        venv.close()
