"""The trainers' configs: every field documented, bad values refused naming the field, one
shared run config with one vocabulary, and the earlier spellings kept as aliases."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from vecaccel.cli import ArgumentParser, Commands
from vecaccel.trainers import A2C, DQN, PPO, DQNConfig
from vecaccel.trainers.algos.a2c import A2CConfig
from vecaccel.trainers.algos.ppo import PPOConfig
from vecaccel.trainers.cli.commands import vecaccel_add_commands
from vecaccel.trainers.config.settings import RunConfig, config_help, lr_scale

torch.set_num_threads(1)


# -- config validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algo, field, value",
    [
        (PPO, "learning_rate", -1e-3),
        (PPO, "learning_rate", float("nan")),
        (A2C, "learning_rate", -7e-4),
        (PPO, "clip_coef", -0.1),
        (PPO, "max_grad_norm", -0.5),
        (PPO, "target_kl", -0.01),
        (PPO, "bf16", "bogus"),
        (DQN, "bf16", True),
        (A2C, "rms_alpha", 1.5),
    ],
    ids=["ppo-lr-negative", "ppo-lr-nan", "a2c-lr-negative", "clip-coef-negative",
         "max-grad-norm-negative", "target-kl-negative", "bf16-bogus", "dqn-bf16-bool",
         "rms-alpha-above-1"],
)  # fmt: skip
def test_bad_config_values_are_refused_naming_the_field(algo, field, value):
    """``--activation bogus`` and ``num_envs=0`` are ValueErrors naming the field; these values
    must be refused too, or they would train silently (a negative learning rate ascends the
    loss, NaN makes every parameter NaN, ``bf16='bogus'`` would be quietly 'off', a negative
    clip_coef inverts the clamp)."""
    config = algo.config_cls
    try:
        config(**{field: value})
    except ValueError as exc:
        assert field in str(exc), f"the error should name {field!r}: {exc}"
        return
    pytest.fail(f"{config.__name__}({field}={value!r}) was accepted; expected a ValueError "
                f"naming {field!r}")  # fmt: skip


@pytest.mark.parametrize("config_cls", [PPOConfig, A2CConfig])
def test_every_config_field_is_documented(config_cls):
    docs = config_help(config_cls)
    missing = [f.name for f in dataclasses.fields(config_cls) if not docs.get(f.name)]
    assert not missing


# -- config values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config_cls, field, value",
    [
        (PPOConfig, "ent_coef", -0.01),
        (PPOConfig, "vf_coef", -0.5),
        (PPOConfig, "adam_eps", 0.0),
        (A2CConfig, "rms_eps", -1e-5),
        (A2CConfig, "rms_alpha", 0.0),
        (PPOConfig, "max_grad_norm", 0.0),
        (PPOConfig, "max_grad_norm", float("nan")),
        (PPOConfig, "learning_rate", float("inf")),
        (PPOConfig, "learning_rate", "3e-4"),
        (PPOConfig, "checkpoint_every", -1),
        (A2CConfig, "log_every_steps", -1),
        (A2CConfig, "torch_threads", -2),
        (PPOConfig, "log_std_init", float("nan")),
        (A2CConfig, "log_std_init", float("-inf")),
    ],
)
def test_more_bad_config_values_name_the_field(config_cls, field, value):
    with pytest.raises(ValueError, match=field):
        config_cls(**{field: value})


@pytest.mark.parametrize(
    "config_cls, values",
    [
        (PPOConfig, dict(target_kl=0.0, clip_coef=0.0, ent_coef=0.0, vf_coef=0.0)),
        (PPOConfig, dict(max_grad_norm=float("inf"), checkpoint_every=0, torch_threads=0)),
        (PPOConfig, dict(bf16="auto", target_kl=None)),
        (A2CConfig, dict(rms_alpha=0.5, checkpoint_every=0, bf16="on")),
    ],
)
def test_documented_special_values_stay_valid(config_cls, values):
    config_cls(**values)


def test_env_source_ale_is_another_spelling_of_gymnasium():
    # the name the source had while it served Atari games alone, which command lines may hold
    assert RunConfig(env_source="ale").env_source == "gymnasium"
    assert PPOConfig(env_source="envpool").env_source == "envpool"
    with pytest.raises(ValueError, match="env_source must be one of gymnasium, envpool, got 'gym'"):
        RunConfig(env_source="gym")


def test_lr_scale_modes():
    assert lr_scale(1024, 256, "none") == 1.0
    assert lr_scale(1024, 256, "linear") == 4.0
    assert lr_scale(1024, 256, "sqrt") == 2.0
    with pytest.raises(ValueError, match="mode"):
        lr_scale(1024, 256, "cubic")


def test_empty_hidden_sizes_name_the_field():
    with pytest.raises(ValueError, match="hidden_sizes"):
        PPO(None, hidden_sizes=(), backend="serial", torch_threads=1)


# -- the shared run config ---------------------------------------------------


SHARED = {field.name for field in dataclasses.fields(RunConfig)}


@pytest.mark.parametrize("config_cls", [PPOConfig, A2CConfig, DQNConfig])
def test_every_config_holds_the_shared_run_settings(config_cls):
    names = {field.name for field in dataclasses.fields(config_cls)}
    assert SHARED <= names
    assert issubclass(config_cls, RunConfig)


@pytest.mark.parametrize("config_cls", [PPOConfig, A2CConfig, DQNConfig])
def test_one_default_device_backend_and_progress(config_cls):
    config = config_cls()
    # progress None: a bar where the run is interactive
    assert (config.device, config.backend, config.progress) == ("auto", "auto", None)


@pytest.mark.parametrize("cls", [PPO, A2C, DQN])
@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("log_every", "; did you mean 'log_every_steps'?"),
        ("checkpoint_period", "; did you mean 'checkpoint_every'?"),
        ("log_interval", "; its settings: env_id, num_envs, "),  # SB3's name: none close
    ],
)
def test_a_setting_under_another_name_is_refused_naming_the_one_meant(cls, name, said):
    with pytest.raises(TypeError) as caught:
        cls(None, device="cpu", **{name: 3})
    message = str(caught.value)
    assert message.startswith(f"unknown {cls.__name__} setting {name!r}{said}"), message
    assert "\n" not in message


def _parse(*argv: str) -> argparse.Namespace:
    parser = ArgumentParser(prog="vecaccel")
    vecaccel_add_commands(Commands(parser.add_subparsers()))
    return parser.parse_args(["train", *argv])


def test_the_cli_has_a_flag_per_setting_and_no_other_spelling():
    args = _parse("dqn", "--checkpoint-every", "3", "--log-every-steps", "7")
    assert args.config == {"checkpoint_every": 3, "log_every_steps": 7}
    config = DQN(env=None, device="cpu", **args.config).config
    assert (config.checkpoint_every, config.log_every_steps) == (3, 7)
    for algo, flag in (
        ("dqn", "--log-interval"),
        ("dqn", "--checkpoint-period"),
        ("ppo", "--log-every"),
    ):
        with pytest.raises(SystemExit):
            _parse(algo, flag, "2")


def test_every_algorithm_has_sb3s_env_attribute():
    for agent in (
        PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=4),
        DQN("CartPole-v1", backend="serial", num_envs=2, device="cpu"),
    ):
        try:
            assert agent.env is agent.envs is not None
        finally:
            agent.close()
    assert DQN(env=None, device="cpu").env is None
