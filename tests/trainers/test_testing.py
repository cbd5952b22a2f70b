"""The kit for algorithm authors, ``check_algorithm``: it finds the algorithm through the registry
and refuses, naming what broke, one that is not registered, not an algorithm, registered under
another class, or that does not repeat its runs (the whole check on a bundled algorithm is its
docstring example; on a third party's, ``package/test_example_algorithm.py``)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from vecaccel import get_plugin_manager, hookimpl
from vecaccel.trainers import A2C
from vecaccel.trainers.config.registry import AlgorithmInfo
from vecaccel.trainers.testing import check_algorithm

SMALL = dict(total_timesteps=32, num_envs=2, num_steps=8, hidden_sizes=(8,))


class Unrepeatable(A2C):
    """A2C whose updates also move the weights by noise no seed governs."""

    algo_name = "a2c-unrepeatable"

    def update(self, batch: Any, progress_remaining: float = 1.0) -> dict[str, float]:
        metrics = super().update(batch, progress_remaining)
        with torch.no_grad():
            next(self.model.parameters()).add_(random.SystemRandom().random())
        return metrics


class UnrepeatablePlugin:
    @hookimpl
    def vecaccel_register_algorithms(self, registry: Any) -> None:
        registry["a2c-unrepeatable"] = AlgorithmInfo(
            "a2c-unrepeatable",
            f"{__name__}:Unrepeatable",
            "vecaccel.trainers.algos.a2c:A2CConfig",
            "an A2C that does not repeat its runs",
        )


def test_a_name_no_plugin_registered_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(AssertionError, match="no algorithm is registered as 'reinforce'.*a2c, ppo"):
        check_algorithm("reinforce")


def test_a_class_that_is_no_algorithm_is_refused() -> None:
    with pytest.raises(AssertionError, match="is not a vecaccel.trainers Algorithm"):
        check_algorithm(dict)


def test_a_class_the_registry_does_not_map_its_name_to_is_refused() -> None:
    class MyA2C(A2C):
        pass

    with pytest.raises(AssertionError, match="algo_name is 'a2c', which the registry does not"):
        check_algorithm(MyA2C)


def test_runs_that_do_not_repeat_are_a_breach(fresh_plugin_manager) -> None:
    get_plugin_manager().register(UnrepeatablePlugin())
    with pytest.raises(AssertionError, match="two synchronous runs with the same seed"):
        check_algorithm("a2c-unrepeatable", **SMALL)
