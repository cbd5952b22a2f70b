"""Presets: which one a run on an env id starts from, that explicit settings beat it, that
``preset=None`` / ``--preset none`` give the plain defaults, and that the name is recorded."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from helpers import run_main, serial_cartpole

pytest.importorskip("torch")

from vecaccel.trainers import A2C, C51, DQN, PPO, DQNConfig, Rainbow
from vecaccel.trainers.checkpoints.format import load_checkpoint
from vecaccel.trainers.config.presets import (
    ATARI,
    ENV_PRESETS,
    preset_for_env,
    resolve_preset,
    suited_env_ids,
)

CLASSES = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "c51": C51, "rainbow": Rainbow}
QUIET = ["--backend", "serial", "--no-progress", "--no-tensorboard"]


# -- the table --------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", sorted(CLASSES))
def test_every_preset_of_the_table_exists_and_names_the_envs_it_suits(algo: str) -> None:
    named = CLASSES[algo].presets
    assert ENV_PRESETS[algo], algo
    for preset, env_ids in ENV_PRESETS[algo].items():
        assert preset in named, (algo, preset)
        assert env_ids and suited_env_ids(algo, preset) == env_ids


@pytest.mark.parametrize(
    ("algo", "cartpole", "atari"),
    [
        ("ppo", "cartpole", "atari"),
        ("a2c", "cartpole", "atari"),
        ("dqn", "cartpole", "atari-dqn"),
        ("c51", "cartpole-c51", "atari-c51"),
        ("rainbow", "cartpole-rainbow", "atari-rainbow"),
    ],
)
def test_the_preset_made_for_an_env_id(algo: str, cartpole: str, atari: str) -> None:
    assert preset_for_env(algo, "CartPole-v1") == cartpole
    assert preset_for_env(algo, "ALE/Pong-v5") == atari
    assert ATARI in suited_env_ids(algo, atari)
    assert preset_for_env(algo, "Acrobot-v1") is None
    assert preset_for_env(algo, "NoSuchEnv-v0") is None


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_the_mujoco_tasks_start_from_one_normalising_preset(algo: str) -> None:
    """Every locomotion task gets the ``mujoco`` preset: many envs, observations and rewards
    normalised, and the batch and learning rate its rule states."""
    tasks = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
    assert {preset_for_env(algo, task) for task in tasks} == {"mujoco"}
    assert preset_for_env(algo, "Pendulum-v1") is None
    cfg = CLASSES[algo](env=None, env_id="Hopper-v5", device="cpu").config
    assert cfg.preset == "mujoco" and cfg.norm_obs and cfg.norm_reward
    assert cfg.num_envs >= 32 and cfg.network == "mlp" and cfg.lr_scaling == "sqrt"
    if algo == "ppo":  # CleanRL's batch of 2,048 and its minibatch of 64, at its own rate
        assert cfg.num_envs * cfg.num_steps == cfg.base_batch_size == 2048
        assert cfg.num_envs * cfg.num_steps // cfg.num_minibatches == 64
        assert cfg.learning_rate == 3e-4


def test_a_no_frameskip_id_gets_the_atari_preset() -> None:
    pytest.importorskip("ale_py")
    assert preset_for_env("ppo", "PongNoFrameskip-v4") == "atari"
    assert preset_for_env("dqn", "BreakoutNoFrameskip-v4") == "atari-dqn"


def test_resolving_a_preset_name() -> None:
    named = PPO.presets
    assert resolve_preset("ppo", named, "auto", "CartPole-v1") == "cartpole"
    assert resolve_preset("ppo", named, "auto", None) is None
    assert resolve_preset("ppo", named, "atari-large", "CartPole-v1") == "atari-large"
    for off in (None, "none"):
        assert resolve_preset("ppo", named, off, "CartPole-v1") is None
    with pytest.raises(ValueError, match=r"unknown preset 'cartpol' for ppo.*'cartpole'.*'none'"):
        resolve_preset("ppo", named, "cartpol", "CartPole-v1")


# -- the Python API ---------------------------------------------------------------------------


def test_an_env_id_starts_from_its_preset_and_explicit_arguments_win() -> None:
    agent = PPO(env=None, env_id="CartPole-v1", num_envs=2, device="cpu")
    cfg = agent.config
    assert cfg.preset == "cartpole"
    assert cfg.num_envs == 2  # given
    assert (cfg.update_epochs, cfg.gamma, cfg.anneal_clip) == (20, 0.98, True)  # the preset's

    agent = PPO("CartPole-v1", backend="serial", num_envs=2, update_epochs=3, device="cpu")
    try:
        assert agent.config.preset == "cartpole" and agent.config.update_epochs == 3
        assert agent.envs.num_envs == 2
    finally:
        agent.close()


def test_the_preset_taken_by_itself_is_logged_once(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="vecaccel.trainers.config.presets"):
        PPO(env=None, env_id="CartPole-v1", device="cpu")
        PPO(env=None, env_id="CartPole-v1", preset="cartpole", device="cpu")  # named: not logged
    [record] = caplog.records
    assert "ppo on CartPole-v1 starts from the preset 'cartpole'" in record.getMessage()
    assert "preset=None" in record.getMessage()


@pytest.mark.parametrize("off", [None, "none"])
def test_no_preset_gives_the_plain_defaults(off) -> None:
    plain = dataclasses.asdict(PPO.config_cls(env_id="CartPole-v1"))
    agent = PPO(env=None, env_id="CartPole-v1", preset=off, device="cpu")
    assert dataclasses.asdict(agent.config) == {**plain, "device": "cpu"}
    assert agent.config.preset is None


def test_a_named_preset_beats_the_one_made_for_the_env() -> None:
    agent = A2C(env=None, env_id="CartPole-v1", preset="atari", device="cpu", network="mlp")
    assert agent.config.preset == "atari"
    assert agent.config.env_id == "CartPole-v1"  # the env given beats the preset's
    assert agent.config.num_envs == A2C.presets["atari"]["num_envs"]
    with pytest.raises(ValueError, match="unknown preset 'nope' for a2c"):
        A2C(env=None, env_id="CartPole-v1", preset="nope")


def test_a_ready_vector_env_gets_no_preset() -> None:
    envs = serial_cartpole(2)
    try:
        agent = PPO(envs, device="cpu")
        assert agent.config.preset is None and agent.config.update_epochs == 4
        agent = PPO(envs, preset="cartpole", device="cpu")
        assert agent.config.preset == "cartpole" and agent.config.update_epochs == 20
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("cls", "preset"), [(DQN, "cartpole"), (C51, "cartpole-c51"), (Rainbow, "cartpole-rainbow")]
)
def test_the_dqn_family_starts_from_the_preset_of_its_env(cls: type, preset: str) -> None:
    cfg = cls(env=None, env_id="CartPole-v1", batch_size=64).config
    assert cfg.preset == preset and cfg.batch_size == 64
    assert cfg.replay_ratio == cls.presets[preset]["replay_ratio"]
    assert cls(env=None).config.preset is None  # no env id named: the plain defaults
    plain = cls(env=None, env_id="CartPole-v1", preset=None).config
    assert dataclasses.replace(plain, env_id=cls(env=None).config.env_id) == cls(env=None).config
    assert plain.preset is None and plain.replay_ratio == DQNConfig().replay_ratio


def test_an_old_spelling_given_beats_the_presets_setting() -> None:
    cfg = DQN(env=None, env_id="ALE/Pong-v5", log_every_steps=500).config
    assert cfg.preset == "atari-dqn" and cfg.log_every_steps == 500
    assert DQN(env=None, env_id="ALE/Pong-v5").config.log_every_steps == 10_000


def test_a_full_dqn_config_is_explicit() -> None:
    config = DQNConfig(env_id="CartPole-v1", batch_size=48)
    assert DQN(env=None, config=config).config == config
    assert DQN(env=None, config=config, preset="cartpole").config.preset == "cartpole"


# -- checkpoints ------------------------------------------------------------------------------


def test_a_checkpoint_records_the_preset_and_a_loaded_run_keeps_its_settings(tmp_path) -> None:
    agent = PPO(env=None, env_id="CartPole-v1", num_envs=2, num_steps=16, device="cpu")
    path = agent.save(tmp_path / "checkpoint.pt")
    assert load_checkpoint(path)["config"]["preset"] == "cartpole"
    loaded = PPO.load(path)
    assert loaded.config == agent.config


# -- the command line -------------------------------------------------------------------------


def test_train_without_preset_takes_the_envs_and_says_so(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16"]
    assert run_main([*argv, "--total-timesteps", "64", "--run-dir", str(run_dir), *QUIET]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("preset:")]
    assert lines == [
        "preset: cartpole, made for CartPole-v1 (flags given override it; --preset none for "
        "the plain defaults)"
    ]
    config = load_checkpoint(run_dir / "checkpoint.pt")["config"]
    assert config["preset"] == "cartpole"
    assert (config["num_envs"], config["num_steps"]) == (2, 16)  # the flags beat the preset
    assert config["update_epochs"] == 20  # the preset's


def test_train_preset_none_gives_the_plain_defaults(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16"]
    code = run_main(
        [*argv, "--preset", "none", "--total-timesteps", "32", "--run-dir", str(run_dir)]
    )
    assert code == 0
    assert "preset:" not in capsys.readouterr().err
    config = load_checkpoint(run_dir / "checkpoint.pt")["config"]
    assert config["preset"] is None and config["update_epochs"] == 4 and config["gamma"] == 0.99


def test_train_dqn_takes_the_preset_of_its_family(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "c51", "--env", "CartPole-v1", "--total-timesteps", "32", *QUIET]
    assert run_main([*argv, "--run-dir", str(run_dir)]) == 0
    assert "preset: cartpole-c51, made for CartPole-v1" in capsys.readouterr().err
    config = load_checkpoint(run_dir / "checkpoint.pt")["config"]
    assert config["preset"] == "cartpole-c51" and config["v_max"] == 100.0


def test_an_explicit_preset_is_not_announced(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "a2c", "--preset", "cartpole", "--env", "CartPole-v1", "--num-envs", "2"]
    assert run_main([*argv, "--total-timesteps", "20", "--run-dir", str(run_dir), *QUIET]) == 0
    assert "preset:" not in capsys.readouterr().err
    assert load_checkpoint(run_dir / "checkpoint.pt")["config"]["preset"] == "cartpole"


def test_a_resumed_run_keeps_its_settings_and_refuses_preset(tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "16"]
    assert run_main([*argv, "--total-timesteps", "32", "--run-dir", str(run_dir), *QUIET]) == 0
    before = load_checkpoint(run_dir / "checkpoint.pt")["config"]
    capsys.readouterr()
    resume = ["train", "ppo", "--resume", str(run_dir), *QUIET]
    assert run_main([*resume, "--preset", "none", "--total-timesteps", "64"]) == 2
    assert "error: --preset applies to a new run" in capsys.readouterr().err
    assert run_main([*resume, "--total-timesteps", "64"]) == 0
    assert "preset:" not in capsys.readouterr().err
    after = load_checkpoint(run_dir / "checkpoint.pt")
    assert after["global_step"] == 64
    assert after["config"] == before
