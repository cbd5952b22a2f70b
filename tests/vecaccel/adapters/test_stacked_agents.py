"""A PettingZoo parallel env as one Gymnasium env with its agents stacked: observations in
``possible_agents`` order, zeros for agents that are not live, actions handed only to live
agents, the env done once no agent is left."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from pettingzoo_envs import EchoAgentsEnv

from vecaccel.adapters.stacked_agents import StackedAgentsEnv, common_spaces


def test_agents_are_stacked_and_dead_agents_are_zeros() -> None:
    env = StackedAgentsEnv(EchoAgentsEnv(tag=2, num_agents=3, lifetimes=(1, 3, 6), max_steps=6))
    assert env.observation_space.contains(env.reset(seed=0)[0])
    obs, reward, terminated, truncated, info = env.step(np.array([4, 5, 6]))
    # agent 0 dies on this step: active, with its terminal values
    assert obs["active"].tolist() == [1, 1, 1]
    assert obs["terminated"].tolist() == [1, 0, 0]
    assert obs["obs"][:, 2].tolist() == [4, 5, 6]  # each agent's own last action
    assert reward == pytest.approx(3 * 2 + 0.5 * (4 + 5 + 6))
    assert not terminated and not truncated
    obs, _, _, _, _ = env.step(np.array([7, 8, 9]))
    assert obs["active"].tolist() == [0, 1, 1]
    assert obs["obs"][0].tolist() == [0.0] * 5
    assert obs["obs"][1:, 3].tolist() == [2, 2]  # actions received: live agents only
    ended = False
    for _ in range(4):
        obs, _, terminated, truncated, _ = env.step(np.array([1, 1, 1]))
        ended = ended or terminated
        assert not truncated  # a stacked env truncates only when a worker restarts it
    assert ended
    env.close()


def test_agent_infos_are_per_agent() -> None:
    env = StackedAgentsEnv(EchoAgentsEnv(num_agents=2))
    _, info = env.reset(seed=11)
    assert [agent_info["seed"] for agent_info in info["agents"].infos] == [11, 11]
    env.close()


def test_agents_with_different_spaces_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="agent_2: Box") as caught:
        common_spaces(EchoAgentsEnv(num_agents=3, odd_spaces=True), index=4)
    assert "multi-agent env 4" in str(caught.value)
