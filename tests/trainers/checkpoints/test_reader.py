"""Checkpoints written earlier still load and act the same.

The fixtures under ``tests/data/checkpoints/`` hold one tiny CartPole-v1 checkpoint per algorithm,
a fixed batch of observations and the greedy actions the saved agent chose for them, in
``version2/<algo>/`` (written by its ``make.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parents[2] / "data" / "checkpoints"
ALGORITHMS = ("ppo", "a2c", "dqn", "c51", "rainbow")
FOLDERS = [FIXTURES / "version2" / algo for algo in ALGORITHMS]


def _agent_class(algo: str) -> type:
    from vecaccel import trainers

    return getattr(trainers, {"ppo": "PPO", "a2c": "A2C", "dqn": "DQN"}.get(algo, algo.title()))


def _folder_id(folder: Path) -> str:
    return str(folder.relative_to(FIXTURES))


@pytest.mark.parametrize("folder", FOLDERS, ids=_folder_id)
def test_fixture_loads_and_predicts_the_recorded_actions(folder: Path) -> None:
    expected = json.loads((folder / "expected.json").read_text())
    agent = _agent_class(folder.name).load(folder / "checkpoint.pt", device="cpu")
    try:
        obs = np.asarray(expected["observations"], dtype=np.float32)
        actions, state = agent.predict(obs, deterministic=True)
        assert state is None
        np.testing.assert_array_equal(np.asarray(actions), np.asarray(expected["actions"]))
        for name, value in expected["counters"].items():
            assert getattr(agent, name) == value, name
    finally:
        agent.close()


@pytest.mark.parametrize("folder", FOLDERS, ids=_folder_id)
def test_fixture_loads_from_its_run_directory(folder: Path) -> None:
    expected = json.loads((folder / "expected.json").read_text())
    agent = _agent_class(folder.name).load(folder, device="cpu")
    try:
        obs = np.asarray(expected["observations"][0], dtype=np.float32)
        action, _ = agent.predict(obs, deterministic=True)
        assert int(action) == expected["actions"][0]
    finally:
        agent.close()
