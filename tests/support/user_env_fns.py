"""Env functions written as a user writes them: each makes its env by id inside the function,
with no registration line of its own (importable by spawned workers and Ray actors: the tests
folder is on their path)."""

from __future__ import annotations

import gymnasium as gym


def make_pong() -> gym.Env:
    """ALE Pong by its id: Gymnasium 1.x knows ``ALE/`` only once ale-py's registration ran."""
    return gym.make("ALE/Pong-v5")


def make_from_an_unknown_namespace() -> gym.Env:
    """An id whose namespace no installed package registers."""
    return gym.make("NoSuchPackage/Game-v0")


def report_whether_ale_is_known(spec: dict) -> None:
    """A sampler loop that only reports whether ``ALE/Pong-v5`` is a known id in its process."""
    spec["result"].put("ALE/Pong-v5" in gym.registry)
