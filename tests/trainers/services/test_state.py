"""The run state of a loop: plain data for a checkpoint, read back equal, whatever a checkpoint of
another release holds besides."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.checkpoints.format import load_checkpoint, save_checkpoint
from vecaccel.trainers.services.state import RunState

STATES = st.builds(
    RunState,
    horizon=st.integers(0, 2**40),
    learn_from=st.integers(0, 2**40),
    updates_at_start=st.integers(0, 2**31),
    beta=st.floats(0.0, 1.0),
    next_log=st.integers(0, 2**40),
    last_target_update=st.integers(0, 2**40),
    saw_episode_info=st.booleans(),
)


@given(STATES)
@settings(max_examples=50, deadline=None, derandomize=True)
def test_a_state_comes_back_equal_from_its_plain_data(state: RunState) -> None:
    values = state.as_dict()
    assert set(values) == {field.name for field in dataclasses.fields(RunState)}
    assert RunState.from_dict(values) == state
    values["horizon"] += 1  # plain data: a copy, not the state's own
    assert values["horizon"] != state.horizon


def test_keys_a_state_does_not_know_are_left_out_and_missing_ones_take_the_defaults() -> None:
    saved = {"horizon": 500, "learn_from": 64, "exact": True, "rng": {"torch": None}}
    assert RunState.from_dict(saved) == RunState(horizon=500, learn_from=64)


def test_a_state_survives_a_weights_only_checkpoint(tmp_path) -> None:
    state = RunState(horizon=1_000, learn_from=100, beta=0.55, next_log=200, saw_episode_info=True)
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"loop": state.as_dict()})
    loaded = load_checkpoint(path)["loop"]
    assert not any(torch.is_tensor(value) for value in loaded.values())
    assert RunState.from_dict(loaded) == state
