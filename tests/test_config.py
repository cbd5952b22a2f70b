"""The shared run config: one vocabulary of settings, and the earlier spellings kept as aliases."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from vecaccel.trainers import A2C, DQN, PPO, A2CConfig, DQNConfig, PPOConfig
from vecaccel.trainers.cli import vecaccel_add_commands
from vecaccel.trainers.config import RunConfig, resolve_aliases

FIXTURES = Path(__file__).parent / "data" / "checkpoints"
SHARED = {field.name for field in dataclasses.fields(RunConfig)}


@pytest.mark.parametrize("config_cls", [PPOConfig, A2CConfig, DQNConfig])
def test_every_config_holds_the_shared_run_settings(config_cls):
    names = {field.name for field in dataclasses.fields(config_cls)}
    assert SHARED <= names
    assert issubclass(config_cls, RunConfig)


@pytest.mark.parametrize("config_cls", [PPOConfig, A2CConfig, DQNConfig])
def test_one_default_device_backend_and_progress(config_cls):
    config = config_cls()
    assert (config.device, config.backend, config.progress) == ("auto", "shm", False)


def test_resolve_aliases_renames_and_the_new_name_wins():
    assert resolve_aliases(DQNConfig, {"checkpoint_period": 4, "log_interval": 9}) == {
        "checkpoint_every": 4,
        "log_every_steps": 9,
    }
    both = {"checkpoint_period": 4, "checkpoint_every": 7}
    assert resolve_aliases(DQNConfig, both) == {"checkpoint_every": 7}


def test_dqn_takes_its_earlier_setting_names():
    config = DQN(env=None, checkpoint_period=5, log_interval=100, device="cpu").config
    assert (config.checkpoint_every, config.log_every_steps) == (5, 100)
    config = DQN(env=None, checkpoint_period=5, checkpoint_every=6, device="cpu").config
    assert config.checkpoint_every == 6


@pytest.mark.parametrize("cls", [PPO, A2C])
def test_on_policy_log_every_counts_updates(cls):
    agent = cls("CartPole-v1", backend="serial", num_envs=2, num_steps=4, log_every=3)
    try:
        assert agent.config.log_every_steps == 3 * 2 * 4
    finally:
        agent.close()
    agent = cls(
        "CartPole-v1", backend="serial", num_envs=2, num_steps=4, log_every=3, log_every_steps=5
    )
    try:
        assert agent.config.log_every_steps == 5  # the current name wins
    finally:
        agent.close()


def test_on_policy_logs_every_log_every_updates():
    agent = A2C("CartPole-v1", backend="serial", num_envs=1, num_steps=4, log_every=3, seed=0)
    try:
        agent.learn(4 * 12)
        steps = [row["step"] for row in agent.logger.history]
        # every third update, and any update in which an episode ended
        assert {12, 24, 36, 48} <= set(steps)
    finally:
        agent.close()


def test_earlier_spellings_in_old_checkpoints_are_read():
    ppo = PPO.load(FIXTURES / "ppo", device="cpu")  # its config says log_every=1
    assert ppo.config.log_every_steps == ppo.batch_size
    dqn = DQN.load(FIXTURES / "dqn", device="cpu")  # log_interval, checkpoint_period
    assert (dqn.config.log_every_steps, dqn.config.checkpoint_every) == (1000, 0)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vecaccel")
    vecaccel_add_commands(parser.add_subparsers())
    return parser.parse_args(["train", *argv])


def test_the_cli_keeps_the_earlier_flags():
    args = _parse("dqn", "--checkpoint-period", "3", "--log-interval", "7")
    assert args.config == {"checkpoint_period": 3, "log_interval": 7}
    config = DQN(env=None, device="cpu", **args.config).config
    assert (config.checkpoint_every, config.log_every_steps) == (3, 7)
    assert _parse("ppo", "--log-every", "2").config == {"log_every": 2}
    assert _parse("ppo", "--checkpoint-every", "9").config == {"checkpoint_every": 9}


def test_the_earlier_names_users_read_on_agents():
    agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=4)
    try:
        assert agent.env is agent.envs
        agent.learn(16)
        assert agent.update_index == agent.num_updates == 2
    finally:
        agent.close()


def test_dqn_train_step_is_its_update():
    agent = DQN(
        "CartPole-v1", backend="serial", batch_size=8, learning_starts=32, device="cpu", seed=0
    )
    try:
        agent.learn(64)
        _, batch = agent.sample_batch(0.5)
        metrics = agent.train_step(batch)
        assert set(metrics) == set(DQN.loss_keys)
    finally:
        agent.close()
