"""The DQN family: smoke tests over backends, CartPole learning, save/load, replay ratio."""

from __future__ import annotations

import csv
import io
import math
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch

import vecaccel
from vecaccel.trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vecaccel.trainers.dqn import C51, DQN, PRESETS, DQNConfig, Rainbow
from vecaccel.trainers.envs import make_env_for_training

torch.set_num_threads(1)

TINY = dict(
    learning_starts=64,
    batch_size=16,
    buffer_size=512,
    replay_ratio=8.0,
    target_update_period=50,
    log_interval=100,
    hidden_sizes=(32, 32),
    progress=False,
    tensorboard=False,
)


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
        for key in ("charts/SPS", "losses/td_loss", "charts/replay_ratio", "charts/epsilon"):
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
    with pytest.raises(TypeError, match="unknown DQN settings"):
        DQN(env=None, bacth_size=3)


class TinyImageEnv(gym.Env):
    """A 36x36 uint8 image whose bright column is where the agent stands; reward for moving right."""

    observation_space = gym.spaces.Box(0, 255, (36, 36), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(0, 36))
        return self._obs(), {}

    def _obs(self):
        obs = np.zeros((36, 36), np.uint8)
        obs[:, self.position] = 255
        return obs

    def step(self, action):
        self.position = min(35, max(0, self.position + (1 if action == 1 else -1)))
        reward = float(action == 1)
        return self._obs(), reward, self.position == 35, False, {}


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


def test_rejects_env_without_same_step_autoreset() -> None:
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
    try:
        with pytest.raises(ValueError, match="SAME_STEP"):
            DQN(env=envs)
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("replay_ratio", "batch_size", "num_envs"), [(4.0, 8, 1), (64.0, 16, 3), (0.5, 32, 4)]
)
def test_replay_ratio_is_enforced(replay_ratio, batch_size, num_envs) -> None:
    envs = _cartpole("serial", num_envs)
    try:
        agent = DQN(
            env=envs,
            **{**TINY, "replay_ratio": replay_ratio, "batch_size": batch_size, "log_interval": 60},
        )
        agent.learn(300)
        steps = agent.global_step
        learn_from = max(64, num_envs * (1 + 1 + 1))
        expected = int(replay_ratio * (steps - learn_from) // batch_size)
        assert agent.num_updates == expected
        measured = agent.replay_ratio
        assert replay_ratio - batch_size / (steps - learn_from) <= measured <= replay_ratio
        logged = [
            row["charts/replay_ratio"]
            for row in agent.logger.history
            if "charts/replay_ratio" in row
        ]
        assert logged and logged[-1] == pytest.approx(measured)
    finally:
        envs.close()


def test_learning_rate_scaling_is_applied_and_logged() -> None:
    envs = _cartpole("serial", 1)
    try:
        agent = DQN(
            env=envs,
            **{**TINY, "batch_size": 2048, "buffer_size": 4096},
            base_batch_size=32,
            learning_rate=1e-4,
            lr_scaling="sqrt",
        )
        assert agent.optimizer.param_groups[0]["lr"] == pytest.approx(8e-4)
        agent.learn(10)
        first = agent.logger.history[0]
        assert first["charts/learning_rate"] == pytest.approx(8e-4)
        assert first["charts/lr_scale"] == pytest.approx(8.0)
    finally:
        envs.close()


def test_save_load_predict(tmp_path) -> None:
    envs = _cartpole("serial")
    try:
        agent = Rainbow(env=envs, **TINY)
        agent.learn(200)
        path = agent.save(tmp_path / "rainbow.pt")
        loaded = Rainbow.load(path)
        obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
        np.testing.assert_array_equal(agent.predict(obs)[0], loaded.predict(obs)[0])
        single, state = loaded.predict(obs[0])
        assert state is None and np.ndim(single) == 0 and single == agent.predict(obs)[0][0]
        assert loaded.global_step == 200 and loaded.num_updates == agent.num_updates
        for a, b in zip(agent.q_network.parameters(), loaded.q_network.parameters()):
            torch.testing.assert_close(a, b)

        # a loaded agent given an env goes on training
        resumed = Rainbow.load(path, env=envs)
        resumed.learn(200, reset_num_timesteps=False)
        assert resumed.global_step == 400 and resumed.num_updates > agent.num_updates

        corrupt = tmp_path / "corrupt.pt"
        corrupt.write_bytes(path.read_bytes()[:-100])
        with pytest.raises(CheckpointError):
            Rainbow.load(corrupt)
    finally:
        envs.close()


class Crash(Exception):
    """Stands for the process dying in the middle of an update."""


def _resume_config(backend: str, run_dir) -> dict:
    return dict(
        TINY,
        backend=backend,
        num_envs=2,
        seed=3,
        torch_threads=1,
        checkpoint_period=40,
        run_dir=str(run_dir),
    )


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("algorithm", [DQN, C51, Rainbow], ids=lambda c: c.__name__)
def test_resume_is_bit_identical(algorithm, backend, tmp_path, monkeypatch) -> None:
    total = 300  # about 118 updates: restart points after the 40th and 80th
    uninterrupted = algorithm(env="CartPole-v1", **_resume_config(backend, tmp_path / "a"))
    uninterrupted.learn(total)
    uninterrupted.close()

    crashing = algorithm(env="CartPole-v1", **_resume_config(backend, tmp_path / "b"))
    train_step = DQN.update

    def train_step_then_crash(self, batch):
        if self.num_updates == 100:  # the 101st update dies after the checkpoint of the 80th
            raise Crash
        return train_step(self, batch)

    monkeypatch.setattr(DQN, "update", train_step_then_crash)
    with pytest.raises(Crash):
        crashing.learn(total)
    crashing.close()
    monkeypatch.undo()

    resumed = algorithm.load(tmp_path / "b", env="CartPole-v1")  # the run directory
    assert resumed.num_updates == 80 and 0 < resumed.global_step < total
    resumed.learn()
    resumed.close()

    assert resumed.global_step == uninterrupted.global_step == total
    assert resumed.num_updates == uninterrupted.num_updates
    for network in ("q_network", "target_network"):
        for a, b in zip(
            getattr(uninterrupted, network).parameters(),
            getattr(resumed, network).parameters(),
            strict=True,
        ):
            assert torch.equal(a, b), network
    states = (
        uninterrupted.optimizer.state_dict()["state"],
        resumed.optimizer.state_dict()["state"],
    )
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        for name in states[0][key]:
            assert torch.equal(states[0][key][name], states[1][key][name]), name
    for name, array in uninterrupted.buffer.arrays.items():
        np.testing.assert_array_equal(array, resumed.buffer.arrays[name], err_msg=name)
    # the metrics the crashed run wrote after its checkpoint are dropped on resume
    steps = [int(r["step"]) for r in csv.DictReader(open(tmp_path / "b" / "metrics.csv"))]
    assert steps == sorted(steps) and steps[-1] == total
    # one replay file beside the checkpoint: the older ones are deleted
    assert len(list((tmp_path / "b").glob("checkpoint.replay-*.npz"))) == 1


def test_replay_file_is_validated(tmp_path) -> None:
    config = dict(_resume_config("serial", tmp_path), checkpoint_period=0)
    agent = Rainbow(env="CartPole-v1", **config)
    agent.learn(120)
    agent.close()
    path = tmp_path / "checkpoint.pt"
    (replay,) = tmp_path.glob("checkpoint.replay-*.npz")
    good = replay.read_bytes()

    # predicting needs no replay file; training does, and says how to do without
    replay.unlink()
    assert Rainbow.load(path).num_updates == agent.num_updates
    with pytest.raises(CheckpointError, match="missing.*load_replay=False"):
        Rainbow.load(path, env="CartPole-v1")
    empty = Rainbow.load(path, env="CartPole-v1", load_replay=False, run_dir=None)
    empty.learn(60, reset_num_timesteps=False)  # refills the buffer, as before replay files
    assert empty.global_step == 180
    empty.close()

    corrupt = bytearray(good)
    with zipfile.ZipFile(io.BytesIO(good)) as archive:  # a byte inside the stored frames
        frames = archive.getinfo("frames.npy")
    corrupt[frames.header_offset + frames.file_size // 2 + 100] ^= 0xFF
    for damaged in (bytes(corrupt), good[: len(good) // 2]):
        replay.write_bytes(damaged)
        with pytest.raises(CheckpointError, match="truncated or corrupt"):
            Rainbow.load(path, env="CartPole-v1")

    # a replay file left by another checkpoint is refused, not silently used
    replay.write_bytes(good)
    state = load_checkpoint(path)
    state["replay"]["token"] = "0-00000000"
    save_checkpoint(path, state)
    with pytest.raises(CheckpointError, match="another checkpoint"):
        Rainbow.load(path, env="CartPole-v1")

    # a checkpoint from before replay files and loop state still loads and trains
    for key in ("replay", "loop"):
        state.pop(key)
    state["config"].pop("checkpoint_replay")
    save_checkpoint(path, state)
    old = Rainbow.load(path, env="CartPole-v1", run_dir=None)
    assert old.buffer is None and old.global_step == 120
    with pytest.raises(ValueError, match="needs total_steps"):
        old.learn()
    old.learn(60, reset_num_timesteps=False)
    assert old.global_step == 180
    old.close()


def test_second_learn_call_keeps_the_buffer_consistent() -> None:
    envs = _cartpole("serial")
    try:
        agent = DQN(env=envs, n_step=3, **TINY)
        agent.learn(150)
        agent.learn(150)  # resets the envs mid-episode: the buffer closes those episodes
        assert agent.global_step == 150
        batch = agent.buffer.sample(256)
        assert np.all(np.isfinite(batch.reward)) and np.all(batch.discount <= 1.0)
    finally:
        envs.close()


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
        log_interval=100,
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
