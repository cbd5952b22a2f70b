"""The env registration plugin: MinAtar's ids registered as MinAtar registers them, without
importing MinAtar, an id already there left as it is, and ALE's ids once the hook runs in a fresh
interpreter (where they work in the caller and in workers: ``contract/test_env_registration.py``)."""

from __future__ import annotations

import importlib.util
import textwrap
import warnings
from collections.abc import Iterator

import gymnasium as gym
import pytest
from helpers import last_json, run_child

from vecaccel.plugins.envs import MINATAR_GAMES, register_minatar

MINATAR_IDS = [f"MinAtar/{game}-{version}" for game in MINATAR_GAMES for version in ("v0", "v1")]


@pytest.fixture
def no_minatar_ids() -> Iterator[None]:
    """The Gymnasium registry without MinAtar's ids for the test, as it was afterwards."""
    saved = {env_id: gym.registry.pop(env_id) for env_id in MINATAR_IDS if env_id in gym.registry}
    try:
        yield
    finally:
        for env_id in MINATAR_IDS:
            gym.registry.pop(env_id, None)
        gym.registry.update(saved)


def test_minatar_ids_are_registered_lazily_with_the_games_action_sets(no_minatar_ids) -> None:
    register_minatar()
    for game, module in MINATAR_GAMES.items():
        for version, minimal in (("v0", False), ("v1", True)):
            spec = gym.spec(f"MinAtar/{game}-{version}")
            # a path, not the class: MinAtar (and the plotting it imports) loads at make time
            assert spec.entry_point == "minatar.gym:BaseEnv"
            assert spec.kwargs == {"game": module, "use_minimal_action_set": minimal}


def test_an_id_registered_already_is_left_as_it_is(no_minatar_ids) -> None:
    gym.register(id="MinAtar/Breakout-v1", entry_point="my_minatar:Breakout", kwargs={"x": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overriding environment" either, called twice
        register_minatar()
        register_minatar()
    assert gym.spec("MinAtar/Breakout-v1").entry_point == "my_minatar:Breakout"
    assert gym.spec("MinAtar/Breakout-v0").entry_point == "minatar.gym:BaseEnv"


@pytest.mark.skipif(importlib.util.find_spec("minatar") is None, reason="MinAtar not installed")
def test_the_hook_registers_minatar_and_ale_ids_in_a_fresh_interpreter() -> None:
    script = textwrap.dedent(
        """
        import json, sys
        import gymnasium as gym
        from vecaccel.plugins.envs import vecaccel_register_envs

        def known(prefix):
            return sum(env_id.startswith(prefix) for env_id in gym.registry)

        before = {"minatar": known("MinAtar/"), "ale": known("ALE/")}
        vecaccel_register_envs()
        print(json.dumps({
            "before": before,
            "after": {"minatar": known("MinAtar/"), "ale": known("ALE/")},
            "imported": [name for name in ("minatar", "matplotlib") if name in sys.modules],
        }))
        """
    )
    result = last_json(run_child(script))
    assert result["before"] == {"minatar": 0, "ale": 0}
    assert result["after"]["minatar"] == len(MINATAR_IDS)
    has_ale = importlib.util.find_spec("ale_py") is not None
    assert (result["after"]["ale"] > 0) is has_ale
    assert result["imported"] == []
