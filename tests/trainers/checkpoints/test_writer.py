"""The versioned checkpoint layout: one header for every algorithm, one section per family,
every observation space the trainers accept, and the earlier layouts read into the current one.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from vecaccel.trainers import A2C, C51, DQN, PPO, Rainbow
from vecaccel.trainers.checkpoints.format import CheckpointError, load_checkpoint, save_checkpoint
from vecaccel.trainers.checkpoints.reader import read_checkpoint
from vecaccel.trainers.checkpoints.space_serialization import space_from_dict, space_to_dict
from vecaccel.trainers.checkpoints.writer import FORMAT, VERSION

torch.set_num_threads(1)

FIXTURES = Path(__file__).parents[2] / "data" / "checkpoints"
CLASSES = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "c51": C51, "rainbow": Rainbow}
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


@pytest.mark.parametrize(
    "space",
    [
        *OBSERVATION_SPACES.values(),
        gym.spaces.Discrete(4, start=2),
        gym.spaces.Box(-2.0, 2.0, (2,), np.float64),
        gym.spaces.MultiBinary([2, 3]),
        gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
        gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.MultiBinary(3))),
        gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(0, 1, (2,))}),
    ],
    ids=repr,
)
def test_spaces_survive_a_weights_only_round_trip(space, tmp_path):
    path = save_checkpoint(tmp_path / "space.pt", {"space": space_to_dict(space)})
    restored = space_from_dict(load_checkpoint(path)["space"])
    assert restored == space and restored.dtype == space.dtype


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


def test_a_newer_version_is_refused_with_the_reason(tmp_path):
    state = read_checkpoint(FIXTURES / "version2" / "ppo" / "checkpoint.pt")
    state["version"] = VERSION + 1
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    with pytest.raises(CheckpointError, match="newer.*upgrade vecaccel"):
        PPO.load(path)


def test_a_dict_no_trainer_wrote_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"weights": torch.zeros(2)})
    with pytest.raises(CheckpointError, match="not a vecaccel trainer checkpoint"):
        DQN.load(path)


def test_dqn_loads_its_family_and_refuses_the_other(tmp_path):
    c51 = DQN.load(FIXTURES / "version2" / "c51")
    assert c51.config.categorical
    with pytest.raises(CheckpointError, match="'c51' checkpoint, not 'rainbow'"):
        Rainbow.load(FIXTURES / "version2" / "c51")
    with pytest.raises(CheckpointError, match="'ppo' checkpoint, not 'dqn'"):
        DQN.load(FIXTURES / "version2" / "ppo")


def _parameters(agent) -> list[torch.Tensor]:
    network = agent.model if agent.checkpoint_key == "on_policy" else agent.q_network
    return [p.detach().clone() for p in network.parameters()]


def _same(a, b) -> bool:
    """Whether two nests of dicts, sequences, tensors and numbers are equal."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("algo", sorted(CLASSES))
def test_a_saved_file_loads_everything_a_run_reads(algo):
    """Loading keeps what a resumed run reads: the counters, the learning-rate schedule or the
    exploration generator and loop counters, and the global RNG states."""
    from vecaccel.trainers.services.seeding import get_rng_state

    cls = CLASSES[algo]
    path = FIXTURES / f"version{VERSION}" / algo / "checkpoint.pt"
    raw = load_checkpoint(path)
    section = raw[cls.checkpoint_key]
    agent = cls.load(path)
    assert _same(get_rng_state(), raw["rng"])
    assert (agent.global_step, agent.num_updates) == (raw["global_step"], raw["num_updates"])
    if cls.checkpoint_key == "on_policy":
        assert agent.target_steps == raw["target_steps"]
        assert agent.schedule_start_update == section["schedule_start_update"]
        assert agent.schedule_updates == section["schedule_updates"]
    else:
        assert agent.target_steps == section["loop"]["horizon"]
        assert agent.loop_state == section["loop"]
        assert agent.rng.bit_generator.state == section["exploration_rng"]
    network = agent.model if cls.checkpoint_key == "on_policy" else agent.q_network
    for name, tensor in section.get("model", section.get("q_network", {})).items():
        assert torch.equal(network.state_dict()[name], tensor)


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
