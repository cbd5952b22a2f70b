"""The run's config on disk: written when a run starts, read back as it was, refused clearly
when it is no run's config."""

from __future__ import annotations

import json

import pytest

from vecaccel.trainers import PPO
from vecaccel.trainers.algos.ppo import PPOConfig
from vecaccel.trainers.services.run_config import (
    CONFIG_NAME,
    config_values,
    read_run_config,
    write_run_config,
)


def test_a_run_writes_its_resolved_config_when_it_starts(tmp_path):
    agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=8, seed=4,
                run_dir=str(tmp_path), torch_threads=1, progress=False, tensorboard=False)  # fmt: skip
    try:
        agent.learn(32)
    finally:
        agent.close()
    saved = read_run_config(tmp_path / CONFIG_NAME)
    assert (saved.algorithm, saved.total_timesteps) == ("ppo", 32)
    assert saved.config["seed"] == 4 and saved.config["num_steps"] == 8
    # every field as the run had it, the tuples JSON wrote as lists among them
    assert PPOConfig(**config_values(saved.config, PPOConfig)) == agent.config
    assert read_run_config(tmp_path).config == saved.config  # the folder names its file


def test_yaml_reads_as_json_does(tmp_path):
    yaml = pytest.importorskip("yaml")
    path = write_run_config(tmp_path, "ppo", PPOConfig(seed=9), 100)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(json.loads(path.read_text())))
    assert read_run_config(tmp_path / "config.yaml") == read_run_config(path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "is not valid JSON"),
        ('{"algorithm": "ppo"}', "is not a run's config"),
        ('{"algorithm": 3, "config": {}}', "'algorithm' must be a name"),
    ],
)
def test_a_file_that_is_no_runs_config_is_refused(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_run_config(path)
    with pytest.raises(ValueError, match="cannot read the config file"):
        read_run_config(tmp_path / "missing.json")
