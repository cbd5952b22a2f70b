"""The ``action_server`` backend on CPU: torch tensors in and out, alternating halves exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vecaccel


def _serial_trajectories(n, actions, steps, seed):
    envs = vecaccel.make_vec("CartPole-v1", n, backend="serial")
    obs, _ = envs.reset(seed=seed)
    out = [obs]
    rewards = []
    for t in range(steps):
        obs, rew, term, trunc, _ = envs.step(actions[:, t])
        out.append(obs)
        rewards.append(rew)
    envs.close()
    return np.stack(out, 1), np.stack(rewards, 1)  # [n, T+1, ...], [n, T]


def test_without_alternation_matches_serial():
    n, steps = 4, 60
    actions = np.random.default_rng(1).integers(0, 2, (n, steps))
    expected_obs, expected_rew = _serial_trajectories(n, actions, steps, seed=3)
    envs = vecaccel.make_vec("CartPole-v1", n, backend="action_server", device="cpu", num_workers=2)
    try:
        obs, infos = envs.reset(seed=3)
        assert isinstance(obs, torch.Tensor) and obs.device.type == "cpu"
        assert infos["env_id"].tolist() == [0, 1, 2, 3]
        np.testing.assert_array_equal(obs.numpy(), expected_obs[:, 0])
        for t in range(steps):
            obs, rew, term, trunc, infos = envs.step(torch.as_tensor(actions[:, t]))
            assert rew.dtype == torch.float64 and term.dtype == torch.bool
            np.testing.assert_array_equal(obs.numpy(), expected_obs[:, t + 1])
            np.testing.assert_array_equal(rew.numpy(), expected_rew[:, t])
    finally:
        envs.close()


def test_alternating_halves_are_each_exact():
    n, steps = 6, 40
    actions = np.random.default_rng(2).integers(0, 2, (n, steps))
    expected_obs, expected_rew = _serial_trajectories(n, actions, steps, seed=5)
    envs = vecaccel.make_vec(
        "CartPole-v1", n, backend="action_server", device="cpu", alternating=True, num_workers=2
    )
    try:
        halves = {0: [0, 2, 4], 1: [1, 3, 5]}
        rewards: dict[int, list] = {0: [], 1: []}
        obs, infos = envs.reset(seed=5)
        seen = {0: [obs.numpy()], 1: []}
        used = {0: 0, 1: 0}
        group = 0
        for _ in range(2 * steps - 1):
            ids = halves[group]
            obs, rew, term, trunc, infos = envs.step(torch.as_tensor(actions[ids, used[group]]))
            used[group] += 1
            group = 1 - group
            assert infos["env_id"].tolist() == halves[group]
            seen[group].append(obs.numpy())
            if used[group] > 0:
                rewards[group].append(rew.numpy())
        # half B's first observation is its reset observation (served on the first step)
        for g, ids in halves.items():
            got = np.stack(seen[g], 0)  # [T, half, 4]
            want = expected_obs[ids].transpose(1, 0, 2)[: len(got)]
            np.testing.assert_array_equal(got, want)
            got_rew = np.stack(rewards[g], 0)
            want_rew = expected_rew[ids].T[: len(got_rew)]
            np.testing.assert_array_equal(got_rew, want_rew)
    finally:
        envs.close()


def test_bad_actions_and_options():
    with pytest.raises(ValueError, match="even number"):
        vecaccel.make_vec("CartPole-v1", 3, backend="action_server", alternating=True)
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="action_server", num_workers=1)
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="env 1 is 7"):
            envs.step(torch.tensor([0, 7]))
        obs, *_ = envs.step(torch.tensor([0, 1]))  # usable afterwards
        assert obs.shape == (2, 4)
    finally:
        envs.close()


def test_warns_when_torch_threads_would_starve_the_workers():
    """On the CPU the policy's spinning OpenMP threads share the cores with the env workers
    (the SB3 adapter warns the same way): more threads than the workers leave is a warning."""
    from vecaccel.worker import usable_cpus

    previous = torch.get_num_threads()
    torch.set_num_threads(usable_cpus() + 1)
    try:
        with pytest.warns(RuntimeWarning, match=r"torch.set_num_threads"):
            envs = vecaccel.make_vec(
                "CartPole-v1", 2, backend="action_server", device="cpu", num_workers=1
            )
        envs.close()
    finally:
        torch.set_num_threads(previous)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one thread, one worker: nothing to say
        vecaccel.make_vec(
            "CartPole-v1", 2, backend="action_server", device="cpu", num_workers=1
        ).close()
