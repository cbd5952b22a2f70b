"""Writing the versioned checkpoint layout: one header for every algorithm, one section per
family, every observation space the trainers accept, and nothing a run reads lost when a loaded
agent is saved again.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from vecaccel.trainers import A2C, C51, DQN, PPO, PQN, Rainbow
from vecaccel.trainers.checkpoints.format import load_checkpoint
from vecaccel.trainers.checkpoints.writer import FORMAT, VERSION

torch.set_num_threads(1)

FIXTURES = Path(__file__).parents[2] / "data" / "checkpoints"
CLASSES = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "c51": C51, "rainbow": Rainbow, "pqn": PQN}
HEADER = {
    "format",
    "version",
    "algorithm",
    "config",
    "observation_space",
    "action_space",
    "global_step",
    "num_updates",
    "target_steps",
    "elapsed",
    "best_eval_reward",
    "rng",
    "async",
    "async_options",
}

OBSERVATION_SPACES = {
    "box-float": gym.spaces.Box(-1.0, 1.0, (5,), np.float32),
    "box-uint8": gym.spaces.Box(0, 255, (2, 3), np.uint8),
    "box-bool": gym.spaces.Box(0, 1, (10, 10, 2), np.bool_),
    "multibinary": gym.spaces.MultiBinary(6),
    "multidiscrete": gym.spaces.MultiDiscrete([3, 4, 2], start=[1, 0, -1]),
}


def _agent(cls, observation_space):
    return cls(
        None,
        observation_space=observation_space,
        action_space=gym.spaces.Discrete(3),
        preset=None,
        seed=4,
        device="cpu",
        hidden_sizes=(8,),
        network="mlp",
    )


@pytest.mark.parametrize("name", sorted(OBSERVATION_SPACES))
@pytest.mark.parametrize("cls", [PPO, DQN], ids=["on-policy", "off-policy"])
def test_every_observation_space_saves_and_loads(cls, name, tmp_path):
    space = OBSERVATION_SPACES[name]
    agent = _agent(cls, space)
    path = agent.save(tmp_path / "agent.pt")
    loaded = cls.load(path)
    assert loaded.observation_space == space
    obs = np.stack([space.sample() for _ in range(8)])
    expected, _ = agent.predict(obs, deterministic=True)
    actions, _ = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(actions, expected)


@pytest.mark.parametrize("cls", [A2C, C51], ids=["on-policy", "off-policy"])
def test_a_checkpoint_is_one_header_and_its_family_section(cls, tmp_path):
    agent = _agent(cls, OBSERVATION_SPACES["box-float"])
    state = load_checkpoint(agent.save(tmp_path / "agent.pt"))
    assert state["format"] == FORMAT and state["version"] == VERSION
    assert state["algorithm"] == cls.algo_name
    assert set(state) == HEADER | {cls.checkpoint_key}
    other = {"on_policy": "off_policy", "off_policy": "on_policy"}[cls.checkpoint_key]
    assert other not in state


@pytest.mark.parametrize("cls", [PPO, DQN], ids=["on-policy", "off-policy"])
def test_a_normalising_agents_header_holds_its_statistics(cls, tmp_path):
    agent = _agent(cls, OBSERVATION_SPACES["box-float"])
    plain = load_checkpoint(agent.save(tmp_path / "plain.pt"))
    assert "normalization" not in plain  # normalisation off: the header of before
    normalizing = cls(
        None,
        observation_space=OBSERVATION_SPACES["box-float"],
        action_space=gym.spaces.Discrete(3),
        preset=None,
        norm_obs=True,
        norm_reward=True,
    )
    normalizing.normalizer.observe_obs(np.arange(10.0, dtype=np.float32).reshape(2, 5))
    normalizing.normalizer.scale_rewards(np.array([1.0, 3.0]), np.zeros(2, bool))
    state = load_checkpoint(normalizing.save(tmp_path / "normalized.pt"))
    saved = state["normalization"]
    assert set(state) == HEADER | {"normalization", cls.checkpoint_key}
    assert saved["obs"]["mean"].tolist() == [2.5, 3.5, 4.5, 5.5, 6.5]
    assert saved["obs"]["count"] == 2.0 and saved["returns"]["count"] == 2.0
    assert saved["returns"]["var"].item() == 1.0  # of the returns 1 and 3


def _parameters(agent) -> list[torch.Tensor]:
    network = agent.model if agent.checkpoint_key == "on_policy" else agent.q_network
    return [p.detach().clone() for p in network.parameters()]


@pytest.mark.parametrize("algo", sorted(CLASSES))
def test_a_saved_file_trains_on_as_its_saved_again_copy_does(algo, tmp_path):
    """Saving a loaded agent again loses nothing a run reads: training on from the file and
    from its copy gives the same parameters, bit for bit."""
    cls = CLASSES[algo]
    old = FIXTURES / f"version{VERSION}" / algo / "checkpoint.pt"
    copy = cls.load(old).save(tmp_path / "checkpoint.pt")
    trained = []
    for path in (old, copy):
        agent = cls.load(path, env="CartPole-v1", backend="serial", torch_threads=1)
        try:
            agent.learn(64, reset_num_timesteps=False)
            trained.append((agent.global_step, agent.num_updates, _parameters(agent)))
        finally:
            agent.close()
    (step, updates, first), (step_copy, updates_copy, second) = trained
    assert (step, updates) == (step_copy, updates_copy) and updates > 0
    for a, b in zip(first, second):
        assert torch.equal(a, b)
