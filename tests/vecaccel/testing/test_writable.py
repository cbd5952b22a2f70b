"""Read-only arrays in what a backend returns: observations, rewards, flags and
``infos["final_obs"]``, nested in dicts, tuples and object arrays, each named by its path; a
``reset`` result (``None`` in the middle) and writable arrays give none."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.testing.writable import read_only_arrays


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def test_what_a_sync_vector_env_returns_is_writable() -> None:
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=2)] * 2,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    try:
        obs, infos = envs.reset(seed=0)
        assert read_only_arrays((obs, None, None, None, infos)) == []
        for _ in range(2):  # the second step ends the episodes: final_obs in the infos
            result = envs.step(np.zeros(2, dtype=np.int64))
        assert "final_obs" in result[4]
        assert read_only_arrays(result) == []
    finally:
        envs.close()


def test_each_read_only_part_is_named_by_its_path() -> None:
    obs = {"image": _read_only(np.zeros((2, 3))), "pair": (np.zeros(2), _read_only(np.zeros(2)))}
    final = np.empty(2, dtype=object)
    final[:] = [{"image": np.zeros(3), "pair": (_read_only(np.zeros(1)), np.zeros(1))}, None]
    result = (
        obs,
        _read_only(np.zeros(2)),
        np.zeros(2, bool),
        _read_only(np.zeros(2, bool)),
        {"final_obs": final, "other": _read_only(np.zeros(2))},  # other infos are not checked
    )
    assert read_only_arrays(result) == [
        "observations['image']",
        "observations['pair'][1]",
        "rewards",
        "truncated",
        "infos['final_obs'][0]['pair'][0]",
    ]


@settings(max_examples=50, deadline=None)
@given(flags=st.lists(st.booleans(), min_size=4, max_size=4))
def test_exactly_the_read_only_arrays_are_named(flags) -> None:
    labels = ["observations", "rewards", "terminated", "truncated"]
    parts = [np.zeros(2) for _ in labels]
    for part, read_only in zip(parts, flags):
        part.flags.writeable = not read_only
    named = read_only_arrays((*parts, {}))
    assert named == [label for label, read_only in zip(labels, flags) if read_only]
