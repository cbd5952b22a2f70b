"""The trainers' config checks: every field documented, bad values refused naming the field."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vecaccel.trainers import A2C, PPO
from vecaccel.trainers.a2c import A2CConfig
from vecaccel.trainers.common import config_help
from vecaccel.trainers.ppo import PPOConfig

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
        (A2C, "rms_alpha", 1.5),
    ],
    ids=["ppo-lr-negative", "ppo-lr-nan", "a2c-lr-negative", "clip-coef-negative",
         "max-grad-norm-negative", "target-kl-negative", "bf16-bogus", "rms-alpha-above-1"],
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
        (A2CConfig, "log_every", 0),
        (A2CConfig, "torch_threads", -2),
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


def test_empty_hidden_sizes_name_the_field():
    with pytest.raises(ValueError, match="hidden_sizes"):
        PPO(None, hidden_sizes=(), backend="serial", torch_threads=1)
