"""Team returns of multi-agent vector envs: an env's episode ends once every one of its rows
has ended or left, and its return is the sum over all of its rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vecaccel.trainers.services.team_returns import TeamReturns, team_returns_for


def test_an_env_ends_when_its_last_live_row_ends() -> None:
    team = TeamReturns([0, 0, 1])
    live = np.ones(3, bool)
    assert team.record(np.array([1.0, 1.0, 5.0]), np.zeros(3, bool), live) == []
    # env 1's only row ends; env 0's first row ends while the second stays live
    assert team.record(np.array([0.0, 0.0, 1.0]), np.array([True, False, True]), live) == [6.0]
    inactive_first = np.array([False, True, True])
    assert team.record(
        np.array([0.0, 4.0, 0.0]), np.array([False, True, False]), inactive_first
    ) == [6.0]
    assert team.record(np.zeros(3), np.array([False, False, True]), live) == [0.0]


def test_a_batch_is_recorded_step_by_step() -> None:
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    done = torch.tensor([[False, False], [True, True], [True, True]])
    batch = SimpleNamespace(
        rewards=rewards,
        terminated=done,
        truncated=torch.zeros_like(done),
        active=torch.ones_like(done),
    )
    assert TeamReturns([0, 0]).record_batch(batch) == [10.0, 11.0]


def test_only_multiagent_envs_get_team_returns() -> None:
    assert team_returns_for(SimpleNamespace()) is None
    team = team_returns_for(SimpleNamespace(row_env=[0, 0, 1, 1, 1]))
    assert team is not None and team.rows_per_env.tolist() == [2, 3]
    with pytest.raises(ValueError, match="non-negative"):
        TeamReturns([0, -1])
