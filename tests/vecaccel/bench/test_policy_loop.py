"""Rollout speed with a policy in the loop: observations reach the policy as tensors and its
actions reach the envs as arrays (tensors pass through where the envs return them), a policy
may return ``(actions, extras)``, the warm-up steps are untimed, and the rate counts the envs
each step returned."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from vecaccel.bench.policy_loop import policy_steps_per_second


class _Recording(gym.vector.VectorWrapper):
    """Keeps the types of the actions it was stepped with."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.action_types: list[type] = []

    def step(self, actions):
        self.action_types.append(type(actions))
        return super().step(actions)


class _TensorsInAndOut(gym.vector.VectorWrapper):
    """Returns observations as tensors and takes actions as tensors, as ``action_server`` does;
    with ``half`` it returns half the envs each step, as alternating halves do."""

    def __init__(self, env: gym.vector.VectorEnv, half: bool = False) -> None:
        super().__init__(env)
        self.half = half
        self.action_types: list[type] = []

    def _part(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs[: len(obs) // 2] if self.half else obs)

    def reset(self, **kwargs):
        obs, infos = super().reset(**kwargs)
        return self._part(obs), infos

    def step(self, actions):
        self.action_types.append(type(actions))
        full = np.zeros(self.num_envs, dtype=np.int64)
        full[: len(actions)] = actions.numpy()
        obs, *rest = super().step(full)
        return (self._part(obs), *rest)


def _cartpoles(n: int) -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)


def test_numpy_envs_get_arrays_and_the_policy_gets_tensors() -> None:
    seen: list[torch.Tensor] = []

    def policy(obs: torch.Tensor):
        seen.append(obs)
        return torch.zeros(obs.shape[0], dtype=torch.int64), {"value": torch.zeros(1)}

    envs = _Recording(_cartpoles(4))
    try:
        started = time.perf_counter()
        rate = policy_steps_per_second(envs, policy, 0.05, warmup_steps=3)
        elapsed = time.perf_counter() - started
    finally:
        envs.close()
    assert all(isinstance(obs, torch.Tensor) and obs.shape == (4, 4) for obs in seen)
    assert all(torch.is_inference(obs) for obs in seen)  # the policy runs in inference mode
    assert set(envs.action_types) == {np.ndarray}
    timed = len(envs.action_types) - 3  # the warm-up steps are not counted
    assert timed >= 1
    assert 4 * timed / elapsed <= rate <= 4 * timed / 0.05


def test_tensor_envs_pass_tensors_and_the_rate_counts_the_envs_returned() -> None:
    def policy(obs: torch.Tensor) -> torch.Tensor:
        return torch.ones(obs.shape[0], dtype=torch.int64)

    envs = _TensorsInAndOut(_cartpoles(4), half=True)
    try:
        rate = policy_steps_per_second(envs, policy, 0.05, warmup_steps=0)
    finally:
        envs.close()
    assert set(envs.action_types) == {torch.Tensor}
    assert 0 < rate <= 2 * len(envs.action_types) / 0.05  # two envs a step, not four


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_policy_runs_on_the_device_asked_for() -> None:
    devices: set[torch.device] = set()

    def policy(obs: torch.Tensor) -> torch.Tensor:
        devices.add(obs.device)
        return torch.zeros(obs.shape[0], dtype=torch.int64, device=obs.device)

    envs = _Recording(_cartpoles(2))
    try:
        assert policy_steps_per_second(envs, policy, 0.05, device="cuda") > 0
    finally:
        envs.close()
    assert {device.type for device in devices} == {"cuda"}
    assert set(envs.action_types) == {np.ndarray}
