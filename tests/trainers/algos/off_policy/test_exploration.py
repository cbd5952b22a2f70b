"""ε-greedy acting and the env stepper of the DQN family: actions in the env's numbering, and
the same stored transitions whatever the env's autoreset mode, on real CartPole envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from vecaccel.trainers.algos.off_policy.exploration import EnvStepper, EpsilonGreedy, expected_q


def _network() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def test_greedy_actions_are_the_networks_argmax_in_the_envs_numbering() -> None:
    network = _network()
    obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    policy = EpsilonGreedy(network, num_actions=2, action_start=-1)
    actions = policy(obs, epsilon=0.0, rng=np.random.default_rng(0))
    expected = network(torch.from_numpy(obs)).argmax(dim=1).numpy() - 1
    np.testing.assert_array_equal(actions, expected)


def test_random_actions_cover_the_action_space_at_epsilon_one() -> None:
    policy = EpsilonGreedy(_network(), num_actions=2, action_start=3)
    actions = policy(np.zeros((2000, 4), np.float32), epsilon=1.0, rng=np.random.default_rng(0))
    assert set(actions.tolist()) == {3, 4}
    assert 0.45 < np.mean(actions == 3) < 0.55


def test_a_categorical_head_acts_on_its_expected_values() -> None:
    support = torch.tensor([0.0, 10.0])
    logits = torch.tensor([[[5.0, 0.0], [0.0, 5.0]]])  # action 1 puts its mass on 10
    assert expected_q(logits, support).argmax(dim=1).item() == 1
    assert torch.equal(expected_q(logits[0], None), logits[0])


def _stored(mode: AutoresetMode, steps: int) -> list[list[tuple]]:
    """The transitions a replay buffer would store, per env."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1", max_episode_steps=12)] * 2, autoreset_mode=mode
    )
    stepper = EnvStepper(envs, EpsilonGreedy(_network(), num_actions=2))
    stepper.reset(seed=5)
    per_env: list[list[tuple]] = [[], []]
    returns = []
    rng = np.random.default_rng(0)
    for _ in range(steps):
        transition, finished = stepper.step(epsilon=0.0, rng=rng)
        returns += finished
        done = transition.terminated | transition.truncated
        for i in range(2):
            if transition.active is not None and not transition.active[i]:
                continue
            final = transition.final_obs[i].tolist() if done[i] else None
            row = (transition.obs[i].tolist(), int(transition.actions[i]), bool(done[i]), final)
            per_env[i].append(row)
    stepper.close()
    assert returns and all(0 < ret <= 12 for ret, _ in returns)
    return per_env


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED])
def test_every_autoreset_mode_stores_the_same_transitions(mode: AutoresetMode) -> None:
    same_step = _stored(AutoresetMode.SAME_STEP, 40)
    other = _stored(mode, 50)
    for mine, reference in zip(other, same_step, strict=True):
        n = min(len(mine), len(reference))
        assert n >= 35
        assert mine[:n] == reference[:n]
