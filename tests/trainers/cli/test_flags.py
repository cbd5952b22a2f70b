"""``vecaccel train --backend-option KEY=VALUE``: parsed as ``vecaccel bench -o`` values are,
kept in the run's config (and so by ``--resume``), checked before the run starts; the
normalisation flags, kept alike with the statistics."""

from __future__ import annotations

import argparse
import ast

import pytest
import torch
from helpers import run_main
from hypothesis import given
from hypothesis import strategies as st

from vecaccel.trainers import PPO
from vecaccel.trainers.checkpoints.format import load_checkpoint
from vecaccel.trainers.cli.flags import parse_backend_option
from vecaccel.trainers.envs.make import backend_options_of

torch.set_num_threads(1)

pytestmark = pytest.mark.usefixtures("trainers_plugin")

TINY_PPO = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16"]


def train(*argv: str) -> int:
    return run_main(["train", *argv, "--no-progress", "--torch-threads", "1"])


# finite floats: repr(inf) and repr(nan) are no Python literals
finite = st.floats(allow_nan=False, allow_infinity=False)
literals = st.recursive(
    st.none() | st.booleans() | st.integers() | finite | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@given(key=st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True), value=literals)
def test_values_are_python_literals(key, value):
    assert parse_backend_option(f"{key}={value!r}") == (key, value)


@given(text=st.text(max_size=12))
def test_a_value_that_is_no_literal_stays_the_text_given(text):
    try:
        expected = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        expected = text
    assert parse_backend_option(f"address={text}") == ("address", expected)


@pytest.mark.parametrize("text", ["num_workers", "=2", "num workers=2", "2x=1"])
def test_malformed_items_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        parse_backend_option(text)


def test_options_reach_the_backend_and_survive_resume(tmp_path):
    run_dir = tmp_path / "run"
    argv = [*TINY_PPO, "--backend", "shm", "--backend-option", "num_workers=1"]
    argv += ["--backend-option", "context='spawn'", "--run-dir", str(run_dir)]
    assert train("ppo", *argv, "--total-timesteps", "64") == 0
    options = {"num_workers": 1, "context": "spawn"}
    assert load_checkpoint(run_dir / "checkpoint.pt")["config"]["backend_options"] == options
    agent = PPO.load(run_dir / "checkpoint.pt", env="CartPole-v1", tensorboard=False)
    try:
        assert agent.envs.num_workers == 1
    finally:
        agent.close()
    assert train("ppo", "--resume", str(run_dir), "--total-timesteps", "96") == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["global_step"] == 96 and state["config"]["backend_options"] == options


def test_normalisation_flags_reach_the_config_and_resume_goes_on_counting(tmp_path):
    run_dir = tmp_path / "run"
    argv = [*TINY_PPO, "--backend", "serial", "--run-dir", str(run_dir), "--norm-obs"]
    argv += ["--norm-reward", "--clip-obs", "5", "--clip-reward", "2.5", "--norm-gamma", "0.9"]
    assert train("ppo", *argv, "--total-timesteps", "64") == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    config = state["config"]
    assert config["norm_obs"] is config["norm_reward"] is True
    assert (config["clip_obs"], config["clip_reward"], config["norm_gamma"]) == (5.0, 2.5, 0.9)
    assert config["norm_epsilon"] == 1e-8
    assert state["normalization"]["obs"]["count"] == 64.0
    assert train("ppo", "--resume", str(run_dir), "--total-timesteps", "96") == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["normalization"]["obs"]["count"] == state["normalization"]["returns"]["count"]
    assert state["normalization"]["obs"]["count"] == 96.0


def test_a_misspelled_option_exits_2_suggesting_the_name(tmp_path, capsys):
    argv = [*TINY_PPO, "--backend", "shm", "--backend-option", "num_workrs=1"]
    code = train("ppo", *argv, "--total-timesteps", "64", "--run-dir", str(tmp_path / "run"))
    assert code == 2
    err = capsys.readouterr().err
    assert "backend 'shm' has no option 'num_workrs'; did you mean 'num_workers'?" in err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_misspelled_option_is_refused_before_the_async_sampler_starts(tmp_path, capsys):
    argv = [*TINY_PPO, "--backend", "shm", "--backend-option", "step_timout_s=5", "--async"]
    code = train("ppo", *argv, "--total-timesteps", "64", "--run-dir", str(tmp_path / "run"))
    assert code == 2
    assert "did you mean 'step_timeout_s'?" in capsys.readouterr().err


def test_a_malformed_flag_is_a_usage_error(capsys):
    assert train("ppo", *TINY_PPO, "--backend-option", "num_workers", "--total-timesteps", "8") == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_num_workers_given_twice_must_agree(capsys):
    argv = [*TINY_PPO, "--backend", "shm", "--num-workers", "2"]
    assert train("ppo", *argv, "--backend-option", "num_workers=1", "--total-timesteps", "8") == 2
    assert "disagree" in capsys.readouterr().err
    with pytest.raises(ValueError, match="backend_options must be a dict"):
        PPO(None, env_id="CartPole-v1", backend_options=["num_workers=1"])


def test_backend_options_of_adds_the_config_num_workers():
    values = {"backend": "shm", "num_workers": 2, "backend_options": {"context": "spawn"}}
    assert backend_options_of(values) == {"context": "spawn", "num_workers": 2}
    assert backend_options_of({**values, "backend": "serial"}) == {"context": "spawn"}
    assert backend_options_of({**values, "num_workers": 0}) == {"context": "spawn"}
