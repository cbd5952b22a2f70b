"""Reading the trainers' checkpoint: files written earlier still load and act the same, a file of
another layout or another algorithm is refused with the reason, earlier spellings of settings are
read, and loading restores everything a resumed run reads.

The fixtures under ``tests/data/checkpoints/`` hold one tiny CartPole-v1 checkpoint per algorithm,
a fixed batch of observations and the greedy actions the saved agent chose for them, in
``version2/<algo>/`` (written by its ``make.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vecaccel.trainers import A2C, C51, DQN, PPO, PQN, Rainbow
from vecaccel.trainers.checkpoints.format import CheckpointError, load_checkpoint, save_checkpoint
from vecaccel.trainers.checkpoints.reader import read_checkpoint
from vecaccel.trainers.checkpoints.writer import VERSION

torch.set_num_threads(1)

FIXTURES = Path(__file__).parents[2] / "data" / "checkpoints"
ALGORITHMS = ("ppo", "a2c", "dqn", "c51", "rainbow", "pqn")
FOLDERS = [FIXTURES / "version2" / algo for algo in ALGORITHMS]
CLASSES = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "c51": C51, "rainbow": Rainbow, "pqn": PQN}


def _agent_class(algo: str) -> type:
    from vecaccel import trainers

    names = {"ppo": "PPO", "a2c": "A2C", "dqn": "DQN", "pqn": "PQN"}
    return getattr(trainers, names.get(algo, algo.title()))


def _folder_id(folder: Path) -> str:
    return str(folder.relative_to(FIXTURES))


@pytest.mark.parametrize("folder", FOLDERS, ids=_folder_id)
def test_fixture_loads_and_predicts_the_recorded_actions(folder: Path) -> None:
    expected = json.loads((folder / "expected.json").read_text())
    agent = _agent_class(folder.name).load(folder / "checkpoint.pt", device="cpu")
    try:
        obs = np.asarray(expected["observations"], dtype=np.float32)
        actions, state = agent.predict(obs, deterministic=True)
        assert state is None
        np.testing.assert_array_equal(np.asarray(actions), np.asarray(expected["actions"]))
        for name, value in expected["counters"].items():
            assert getattr(agent, name) == value, name
    finally:
        agent.close()


@pytest.mark.parametrize("folder", FOLDERS, ids=_folder_id)
def test_fixture_loads_from_its_run_directory(folder: Path) -> None:
    expected = json.loads((folder / "expected.json").read_text())
    agent = _agent_class(folder.name).load(folder, device="cpu")
    try:
        obs = np.asarray(expected["observations"][0], dtype=np.float32)
        action, _ = agent.predict(obs, deterministic=True)
        assert int(action) == expected["actions"][0]
    finally:
        agent.close()


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


def test_earlier_spellings_in_saved_checkpoints_are_read(tmp_path):
    # the DQN family's bf16 was True/False in files of the current layout: it reads as off/on
    assert DQN.load(FIXTURES / "version2" / "dqn", device="cpu").config.bf16 == "off"
    state = load_checkpoint(FIXTURES / "version2" / "dqn" / "checkpoint.pt")
    state["config"]["bf16"] = True
    state["config"]["async_weight_sync_period"] = 1  # a setting the runner holds now
    state["config"]["env_source"] = "ale"  # the name it had while it served Atari games alone
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    assert read_checkpoint(path)["config"]["bf16"] == "on"
    assert "async_weight_sync_period" not in read_checkpoint(path)["config"]
    assert read_checkpoint(path)["config"]["env_source"] == "gymnasium"
    loaded = DQN.load(path)
    assert loaded.config.bf16 == "on"
    assert loaded.config.env_source == "gymnasium"


@pytest.mark.parametrize("cls", [PPO, DQN], ids=["on-policy", "off-policy"])
def test_statistics_of_another_observation_shape_are_refused_naming_both(cls, tmp_path):
    agent = cls("CartPole-v1", backend="serial", num_envs=2, norm_obs=True, torch_threads=1)
    try:
        path = agent.save(tmp_path / "agent.pt")
    finally:
        agent.close()
    state = load_checkpoint(path)
    for key in ("mean", "var"):  # statistics made for an env of three observations
        state["normalization"]["obs"][key] = torch.zeros(3, dtype=torch.float64)
    save_checkpoint(path, state)
    with pytest.raises(CheckpointError, match=r"shape \(3,\).*shape \(4,\)"):
        cls.load(path)
