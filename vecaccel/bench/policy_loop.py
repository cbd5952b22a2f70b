"""Rollout speed with a torch policy in the loop: env steps per second of ``act, step, repeat``.

The same loop serves every backend, so that a policy on a GPU can be timed on ``shm`` (NumPy
arrays copied to the device and the actions back, each step) beside ``action_server`` (tensors
in and out on the device, with or without alternating halves). torch is imported when a rate is
measured, not with this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

__all__ = ["policy_steps_per_second"]


def _actions_of(output: Any) -> Any:
    """A policy returns actions, or ``(actions, extras)`` as the sampler's policies do."""
    return output[0] if isinstance(output, tuple) else output


def policy_steps_per_second(
    envs: gym.vector.VectorEnv,
    policy: Callable[[Any], Any],
    seconds: float,
    *,
    device: str = "cpu",
    warmup_steps: int = 10,
    seed: int = 0,
) -> float:
    """Env steps per second of a loop that acts with ``policy`` on ``envs`` and steps them.

    Observations that come back as NumPy arrays go to ``device`` before the policy sees them,
    and its actions come back as NumPy arrays; tensors (``action_server``) pass as they are. A
    step counts the envs it returned (half of them with alternating halves). The envs are reset
    first and stepped ``warmup_steps`` times before the clock starts; on a CUDA device the
    clock starts and stops with the device idle.

    Args:
        envs: a ready vector env (it is reset; the caller closes it).
        policy: maps a batch of observations (a tensor on ``device``) to actions, or to
            ``(actions, extras)``; it runs under ``torch.inference_mode``.
        seconds: how long the timed loop runs.
        device: where the policy runs (for backends that return NumPy arrays).
        warmup_steps: untimed steps first.
        seed: the reset seed.

    Returns:
        Env steps per second over the timed loop.

    Example:
        >>> import torch, vecaccel
        >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
        >>> def policy(obs):
        ...     return torch.zeros(obs.shape[0], dtype=torch.int64)
        >>> policy_steps_per_second(envs, policy, 0.05) > 0
        True
        >>> envs.close()
    """
    import torch

    target = torch.device(device)
    sync = torch.cuda.synchronize if target.type == "cuda" else (lambda: None)
    obs, _ = envs.reset(seed=seed)
    as_tensors = isinstance(obs, torch.Tensor)

    def step() -> int:
        nonlocal obs
        batch = obs if as_tensors else torch.as_tensor(obs).to(target)
        actions = _actions_of(policy(batch))
        obs, *_ = envs.step(actions if as_tensors else actions.cpu().numpy())
        return int(obs.shape[0])

    with torch.inference_mode():
        for _ in range(warmup_steps):
            step()
        sync()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            steps += step()
        sync()
        return steps / (time.perf_counter() - start)
