"""DQN, C51 and Rainbow: smoke tests over backends, their defaults and presets, image
observations stored once, only real transitions stored in every autoreset mode, the settings
their config refuses, CartPole learning (the update: ``test_dqn_update.py``; what the family's
base and loop do: ``off_policy/test_base.py``, ``off_policy/test_loop.py``).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import SMALL_DQN, TINY_DQN, serial_cartpole
from toy_envs import TinyImageEnv

import vecaccel
from vecaccel.trainers.algos.dqn import (
    C51,
    DQN,
    PRESETS,
    DQNConfig,
    Rainbow,
)
from vecaccel.trainers.envs.make import make_env_for_training

torch.set_num_threads(1)

TINY = TINY_DQN


def _backends() -> list[str]:
    available = vecaccel.list_backends()
    return [name for name in ("serial", "shm") if name in available]


def _cartpole(backend: str, num_envs: int = 2) -> gym.vector.VectorEnv:
    options = {"num_workers": 1} if backend == "shm" else {}
    return make_env_for_training("CartPole-v1", num_envs, backend=backend, seed=0, **options)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("algorithm", [DQN, C51, Rainbow], ids=lambda c: c.__name__)
def test_smoke(algorithm, backend, tmp_path) -> None:
    envs = _cartpole(backend)
    try:
        agent = algorithm(env=envs, run_dir=str(tmp_path), **TINY)
        agent.learn(300)
        assert agent.global_step == 300
        assert agent.num_updates > 0
        history = agent.logger.history
        keys = set().union(*(row.keys() for row in history))
        for key in (
            "charts/SPS",
            "stats/transport_share",
            "losses/td_loss",
            "charts/replay_ratio",
            "charts/epsilon",
        ):
            assert key in keys, key
        assert (tmp_path / "metrics.csv").is_file()
        assert (tmp_path / "checkpoint.pt").is_file()
        assert all(
            math.isfinite(row["losses/td_loss"]) for row in history if "losses/td_loss" in row
        )
    finally:
        envs.close()


def test_algorithm_defaults() -> None:
    assert not DQN(env=None).config.categorical
    rainbow = Rainbow(env=None).config
    assert (rainbow.double, rainbow.dueling, rainbow.prioritized, rainbow.categorical) == (
        True,
        True,
        True,
        True,
    )
    assert rainbow.n_step == 3
    # overrides win over class defaults
    assert Rainbow(env=None, n_step=5).config.n_step == 5
    for values in PRESETS.values():
        DQNConfig(**values)  # every preset is a valid config
    atari = C51(env=None, preset="atari-c51").config
    assert atari.batch_size == 2048 and atari.categorical and atari.frame_stack == 4
    with pytest.raises(ValueError, match="unknown preset"):
        DQN(env=None, preset="nope")
    with pytest.raises(
        TypeError, match="unknown DQN setting 'bacth_size'; did you mean 'batch_size'"
    ):
        DQN(env=None, bacth_size=3)


def _tiny_image_env() -> gym.Env:
    env = gym.wrappers.TimeLimit(TinyImageEnv(), 20)
    return gym.wrappers.FrameStackObservation(env, 4)


def test_image_observations_store_each_frame_once() -> None:
    envs = vecaccel.make_vec(
        [_tiny_image_env] * 2, backend="serial", autoreset_mode=vecaccel.AutoresetMode.SAME_STEP
    )
    try:
        agent = DQN(env=envs, **{**TINY, "learning_starts": 40})
        assert type(agent.q_network.body).__name__ == "NatureCNN"
        agent.learn(120)
        assert agent.buffer.frame_stack == 4
        assert agent.buffer.frames.shape[2:] == (36, 36)
        assert agent.num_updates > 0
    finally:
        envs.close()


def _trained_on(mode: vecaccel.AutoresetMode) -> DQN:
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial", autoreset_mode=mode)
    agent = DQN(env=envs, **{**TINY_DQN, "seed": 0, "learning_starts": 16, "buffer_size": 1000})
    agent.learn(400)
    return agent


@pytest.mark.parametrize("mode", list(vecaccel.AutoresetMode), ids=lambda mode: mode.value)
def test_every_autoreset_mode_stores_only_real_transitions(mode) -> None:
    """The replay buffer holds no step that starts from an episode's last observation (a
    NEXT_STEP reset step): every stored CartPole state is inside the bounds that end one."""
    agent = _trained_on(mode)
    try:
        buffer = agent.buffer
        written = np.arange(buffer.T)[:, None] < buffer.filled[None, :]
        states = buffer.frames[written & ~buffer.is_final]
        assert len(states) > 0 and agent.num_updates > 0
        assert (np.abs(states[:, 0]) <= 2.4).all() and (np.abs(states[:, 2]) <= 0.2095).all()
        assert buffer.is_final[written].any(), "episodes ended and their final states were kept"
    finally:
        agent.envs.close()


def test_disabled_autoreset_trains_as_same_step_does() -> None:
    """The collector resets a DISABLED env's ended episodes at once: the same run, bit for bit."""
    same, disabled = (
        _trained_on(vecaccel.AutoresetMode.SAME_STEP),
        _trained_on(vecaccel.AutoresetMode.DISABLED),
    )
    try:
        for a, b in zip(same.q_network.parameters(), disabled.q_network.parameters()):
            assert torch.equal(a, b)
    finally:
        same.envs.close()
        disabled.envs.close()


#: Rainbow (prioritized replay, a categorical head, dueling: every piece of state the family
#: checkpoints) on every backend; DQN and C51 on one backend each, DQN with either optimizer.


@pytest.mark.slow
def test_dqn_learns_cartpole() -> None:
    agent = DQN(env="CartPole-v1", preset="cartpole", seed=1, progress=False, tensorboard=False)
    try:
        agent.learn(15_000)
    finally:
        agent.close()
    returns = [episode_return for _, episode_return, _ in agent.episode_log]
    # random play scores about 22
    assert np.mean(returns[-10:]) >= 150, returns[-20:]


def test_atari_preset_smoke() -> None:
    pytest.importorskip("ale_py")
    agent = Rainbow(
        env="ALE/Pong-v5",
        preset="atari-rainbow",
        num_envs=2,
        backend="serial",
        buffer_size=2_000,
        learning_starts=200,
        batch_size=32,
        log_every_steps=100,
        progress=False,
        tensorboard=False,
    )
    try:
        agent.learn(300)
    finally:
        agent.close()
    # real FrameStackObservation stacks rebuilt from one stored 84x84 frame per step
    assert agent.buffer.frame_stack == 4
    assert agent.buffer.frames.shape[1:] == (2, 84, 84)
    assert agent.num_updates > 0


@pytest.mark.parametrize(
    "setting",
    [
        dict(gamma=1.5),
        dict(gamma=-0.1),
        dict(tau=0.0),
        dict(tau=-0.5),
        dict(priority_alpha=-1.0),
        dict(priority_beta_start=-0.5),
        dict(priority_eps=-1.0),
        dict(optimizer="sgd"),
        dict(rms_alpha=1.0),
        dict(rms_eps=0.0),
        dict(adam_eps=-1e-8),
    ],
    ids=lambda s: "{}={}".format(*next(iter(s.items()))),
)
def test_config_rejects_settings_that_cannot_train(setting) -> None:
    """gamma outside [0, 1] makes the targets diverge, tau <= 0 never moves (or pushes away)
    the target network, a negative alpha prefers the best-fitted transitions, a negative beta
    up-weights the over-sampled ones, and a negative eps crashes the sum tree mid-run.
    DQNConfig validates batch sizes, the loss and the C51 support already; these should fail
    the same way, at construction."""
    with pytest.raises(ValueError):
        DQNConfig(**setting)


def test_negative_priority_eps_crashes_mid_training() -> None:
    """The user-visible consequence of accepting priority_eps < 0: construction and the first
    steps succeed, then an update raises from inside the sum tree."""
    envs = serial_cartpole(1)
    try:
        try:
            agent = DQN(
                env=envs,
                **{**SMALL_DQN, "learning_starts": 32},
                prioritized=True,
                priority_eps=-10.0,
            )
        except ValueError:
            return  # rejected up front: correct
        agent.learn(80)  # fails inside update_priorities / SumTree.update
    finally:
        envs.close()


def test_a_run_dir_given_as_a_path_checkpoints_and_loads(tmp_path):
    """``run_dir=Path(...)`` (as PPO takes it) is saved so that the weights-only load reads it
    back (a ``PosixPath`` in the saved config would be refused as a corrupt checkpoint)."""
    agent = DQN(
        env="CartPole-v1", num_envs=1, backend="serial", learning_starts=8, batch_size=8,
        buffer_size=64, run_dir=tmp_path / "run", progress=False, tensorboard=False,
    )  # fmt: skip
    try:
        agent.learn(16)
    finally:
        agent.close()
    loaded = DQN.load(tmp_path / "run" / "checkpoint.pt")
    assert loaded.global_step == 16
    assert loaded.config.run_dir == str(tmp_path / "run")
