"""Spaces as plain data in a checkpoint: every space the trainers accept comes back equal,
through ``torch.save`` and ``torch.load(weights_only=True)``; the others are refused."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from vecaccel.trainers.checkpoints.space_serialization import space_from_dict, space_to_dict

SPACES = [
    gym.spaces.Discrete(5, start=-2),
    gym.spaces.Box(-1.0, 2.0, (3, 2), np.float32),
    gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
    gym.spaces.Box(0, 1, (10, 10, 2), np.bool_),
    gym.spaces.Box(np.array([-1.0, -np.inf]), np.array([1.0, np.inf]), dtype=np.float64),
    gym.spaces.MultiBinary([2, 3]),
    gym.spaces.MultiDiscrete([3, 4, 2], start=[1, 0, -1]),
    gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]])),
    gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0.0, 1.0, (2,), np.float32))),
    gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (8, 8, 1), np.uint8),
            "inner": gym.spaces.Dict({"mode": gym.spaces.Discrete(3)}),
        }
    ),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda space: type(space).__name__)
def test_spaces_round_trip_through_a_weights_only_load(space: gym.Space) -> None:
    buffer = io.BytesIO()
    torch.save(space_to_dict(space), buffer)
    buffer.seek(0)
    loaded = space_from_dict(torch.load(buffer, weights_only=True))
    assert loaded == space
    assert type(loaded) is type(space) and loaded.dtype == space.dtype
    sample = space.sample()
    assert loaded.contains(sample)


@pytest.mark.parametrize(
    "space",
    [gym.spaces.Text(5), gym.spaces.Sequence(gym.spaces.Discrete(2))],
    ids=lambda space: type(space).__name__,
)
def test_spaces_the_trainers_cannot_train_on_are_refused(space: gym.Space) -> None:
    with pytest.raises(TypeError):
        space_to_dict(space)
