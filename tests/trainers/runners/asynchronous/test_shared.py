"""What the two processes of an asynchronous run share: the counters, the weights and the two slots
of the double buffer, in shared memory that a forked process writes and this one reads."""

from __future__ import annotations

import multiprocessing

import gymnasium as gym
import numpy as np
import torch

import vecaccel
from vecaccel.trainers.runners.asynchronous.shared import (
    CollectorChannels,
    SharedCounters,
    chunk_slots,
    rollout_slots,
)

CTX = multiprocessing.get_context("fork")


def in_child(target, *args) -> None:
    """Run ``target(*args)`` in a forked process; fail if it fails."""
    process = CTX.Process(target=target, args=args)
    process.start()
    process.join(timeout=30)
    assert process.exitcode == 0, f"the child exited with {process.exitcode}"


def _count(counters: SharedCounters) -> None:
    counters.steps += 96
    counters.version = 7
    counters.sampler_wait += 0.25


def test_the_counters_are_one_structure_both_processes_write_by_name() -> None:
    counters = CTX.RawValue(SharedCounters)
    assert (counters.steps, counters.stop, counters.version) == (0, 0, 0)
    assert counters.sampler_wait == 0.0
    counters.steps = 4
    in_child(_count, counters)
    assert (counters.steps, counters.version, counters.sampler_wait) == (100, 7, 0.25)


def test_the_channels_share_a_copy_of_the_weights_and_two_free_slots() -> None:
    weights = [torch.ones(3, 2), torch.arange(4.0)]
    channels = CollectorChannels(CTX, weights, fixed_lag=False)
    assert all(shared.is_shared() for shared in channels.weights)
    weights[0].add_(1.0)  # the optimiser's own tensors move on; the published copy does not
    assert torch.equal(channels.weights[0], torch.ones(3, 2))
    assert torch.equal(channels.weights[1], torch.arange(4.0))
    assert channels.free_slots.acquire(block=False) and channels.free_slots.acquire(block=False)
    assert not channels.free_slots.acquire(block=False)
    for semaphore in (channels.started_seen, channels.publishes, channels.pulls):
        assert not semaphore.acquire(block=False)


def _fill_chunk(slots: list[dict[str, torch.Tensor]]) -> None:
    slot = slots[1]
    slot["obs"][2, 1] = 255
    slot["actions"][0] = torch.tensor([3, 4, 5])
    slot["rewards"][1, 2] = 0.5
    slot["terminated"][1, 2] = True


def test_a_chunk_slot_holds_whole_vector_steps_in_the_envs_dtypes() -> None:
    space = gym.spaces.Box(0, 255, (4, 4), np.uint8)
    slots = chunk_slots(space, num_envs=3, chunk_steps=5)
    assert len(slots) == 2
    for slot in slots:
        assert slot["obs"].shape == slot["final_obs"].shape == (5, 3, 4, 4)
        assert slot["obs"].dtype == torch.uint8
        assert slot["actions"].dtype == torch.int64 and slot["rewards"].dtype == torch.float64
        assert slot["terminated"].shape == slot["truncated"].shape == (5, 3)
        assert all(tensor.is_shared() for tensor in slot.values())
    in_child(_fill_chunk, slots)  # the collector process writes, this one reads
    assert int(slots[1]["obs"][2, 1].min()) == 255 and slots[1]["actions"][0].tolist() == [3, 4, 5]
    assert slots[1]["rewards"][1, 2] == 0.5 and bool(slots[1]["terminated"][1, 2])
    assert not slots[0]["obs"].any() and not slots[0]["terminated"].any()


def _fill_rollout(slots: list[dict]) -> None:
    slots[0]["extras"]["log_prob"].fill_(-0.5)
    slots[0]["final_index"][0] = torch.tensor([3, 1])


def test_a_rollout_slot_is_shaped_like_the_batch_with_room_for_a_final_obs_per_step() -> None:
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial", autoreset_mode="SameStep")
    try:

        def policy(obs: torch.Tensor):
            actions = torch.zeros(obs.shape[0], dtype=torch.int64)
            return actions, {"log_prob": torch.zeros(obs.shape[0])}

        batch = vecaccel.Sampler(envs, policy, horizon=4, seed=0).collect()
    finally:
        envs.close()
    slots = rollout_slots(batch)
    assert len(slots) == 2
    for slot in slots:
        for key in ("obs", "actions", "rewards", "terminated", "truncated", "valid", "next_obs"):
            assert slot[key].shape == getattr(batch, key).shape, key
            assert slot[key].dtype == getattr(batch, key).dtype, key
            assert slot[key].is_shared() and not slot[key].any(), key
        assert slot["final_obs"].shape == (8, 4) and slot["final_index"].shape == (8, 2)
        assert slot["extras"]["log_prob"].shape == (4, 2)
    in_child(_fill_rollout, slots)
    assert (slots[0]["extras"]["log_prob"] == -0.5).all()
    assert slots[0]["final_index"][0].tolist() == [3, 1]
    assert not slots[1]["extras"]["log_prob"].any()
