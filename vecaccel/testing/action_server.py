"""Checks of the ``action_server`` backend on a torch device.

:func:`check_action_server` asserts what the backend promises on any device: observations,
rewards and flags come back as tensors on that device, a CUDA device gets them through pinned
host memory, the two alternating halves take turns, and each half's trajectory equals the one
the ``serial`` backend gives for the same actions. A failed property is an ``AssertionError``
that says which one broke.

torch is imported when a check runs, not with this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["check_action_server"]


def _serial_trajectory(
    env_fns: Sequence[Callable[[], gym.Env]], actions: list[np.ndarray], seed: int
) -> np.ndarray:
    """Observations ``[num_envs, steps + 1, ...]`` of the serial backend under ``actions``."""
    import vecaccel

    serial = vecaccel.make_vec(list(env_fns), backend="serial")
    try:
        obs, _ = serial.reset(seed=seed)
        frames = [obs]
        for step_actions in actions:
            frames.append(serial.step(step_actions)[0])
    finally:
        serial.close()
    return np.stack(frames, 1)


def check_action_server(
    env_fns: Sequence[Callable[[], gym.Env]],
    device: str = "cpu",
    *,
    steps: int = 30,
    seed: int = 1,
    **options: Any,
) -> dict[str, Any]:
    """Assert the ``action_server`` backend's promises on ``device``, with alternating halves.

    The envs are stepped with seeded random actions from their action space, once on the
    ``serial`` backend and once on ``action_server`` with ``alternating=True``, each half
    getting, at its ``k``-th step, the actions the serial run took at step ``k``.

    Args:
        env_fns: an even number (at least 2) of env functions, each building a deterministic
            env with a fixed-size observation (an array).
        device: the torch device the backend serves (``"cuda"``, ``"cuda:1"``, ``"cpu"``).
        steps: steps each half takes.
        seed: the reset seed of both runs, and the seed of the actions.
        **options: more ``action_server`` options (``num_workers``, ...).

    Returns:
        What was checked: ``device``, ``num_envs``, ``steps``, ``pinned_staging`` (``True``
        on a CUDA device, ``None`` elsewhere, where nothing is pinned) and
        ``halves_exact=True``.

    Raises:
        AssertionError: a tensor on another device, staging not pinned on a CUDA device,
            halves served out of turn, or a half's observations differing from the serial run.
        ValueError: an odd number of envs, or fewer than 2.

    Example:
        >>> import gymnasium as gym, torch
        >>> torch.set_num_threads(1)
        >>> report = check_action_server(
        ...     [lambda: gym.make("CartPole-v1")] * 4, "cpu", steps=5, num_workers=1
        ... )
        >>> report["halves_exact"], report["pinned_staging"]
        (True, None)
    """
    import torch

    import vecaccel

    num_envs = len(env_fns)
    if num_envs < 2 or num_envs % 2:
        raise ValueError(f"check_action_server needs an even number of envs >= 2, got {num_envs}")
    target = torch.device(device)
    probe = vecaccel.make_vec(list(env_fns[:1]), backend="serial")
    try:
        space = probe.single_action_space
    finally:
        probe.close()
    space.seed(seed)
    actions = [np.stack([space.sample() for _ in range(num_envs)]) for _ in range(steps)]
    expected = _serial_trajectory(env_fns, actions, seed)

    envs: Any = vecaccel.make_vec(
        list(env_fns), backend="action_server", device=device, alternating=True, **options
    )
    try:
        halves = [np.arange(0, num_envs, 2), np.arange(1, num_envs, 2)]
        obs, infos = envs.reset(seed=seed)
        assert obs.device.type == target.type, f"reset's observations are on {obs.device}"
        pinned = None
        if target.type == "cuda":
            assert envs.pinned_staging, "observations are not staged through pinned memory"
            pinned = True
        seen: list[list[np.ndarray]] = [[obs.cpu().numpy()], []]
        taken, half = [0, 0], 0
        for _ in range(2 * steps - 1):
            ids = halves[half]
            step_actions = torch.as_tensor(actions[taken[half]][ids], device=target)
            obs, rewards, terminations, truncations, infos = envs.step(step_actions)
            taken[half] += 1
            half = 1 - half
            returned = infos["env_id"].tolist()
            assert returned == halves[half].tolist(), (
                f"step returned envs {returned}, expected the other half {halves[half].tolist()}"
            )
            for name, tensor in (
                ("observations", obs),
                ("rewards", rewards),
                ("terminations", terminations),
                ("truncations", truncations),
            ):
                assert tensor.device.type == target.type, f"{name} are on {tensor.device}"
            seen[half].append(obs.cpu().numpy())
        for half, ids in enumerate(halves):
            got = np.stack(seen[half], 0)
            want = expected[ids].swapaxes(0, 1)[: len(got)]
            for step, (got_step, want_step) in enumerate(zip(got, want)):
                assert np.array_equal(got_step, want_step), (
                    f"half {half} (envs {ids.tolist()}): observations of its step {step} differ "
                    "from the serial backend's under the same actions"
                )
    finally:
        envs.close()
    return {
        "device": str(target),
        "num_envs": num_envs,
        "steps": steps,
        "pinned_staging": pinned,
        "halves_exact": True,
    }
