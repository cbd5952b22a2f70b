"""The DQN family: smoke tests over backends, save/load, replay ratio, resume, the transitions
the loop stores, CartPole learning (the update and schedules: ``test_dqn_update.py``).
"""

from __future__ import annotations

import csv
import io
import math
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import SMALL_DQN, TINY_DQN, serial_cartpole
from toy_envs import ShiftedActions, TinyImageEnv

import vecaccel
from vecaccel.trainers.algos.dqn import (
    C51,
    DQN,
    PRESETS,
    DQNConfig,
    Rainbow,
)
from vecaccel.trainers.checkpoints.format import CheckpointError, load_checkpoint, save_checkpoint
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


@pytest.mark.parametrize(
    ("replay_ratio", "batch_size", "num_envs"), [(4.0, 8, 1), (64.0, 16, 3), (0.5, 32, 4)]
)
def test_replay_ratio_is_enforced(replay_ratio, batch_size, num_envs) -> None:
    envs = _cartpole("serial", num_envs)
    try:
        agent = DQN(
            env=envs,
            **{
                **TINY,
                "replay_ratio": replay_ratio,
                "batch_size": batch_size,
                "log_every_steps": 60,
            },
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
        checkpoint_every=40,
        run_dir=str(run_dir),
    )


#: Rainbow (prioritized replay, a categorical head, dueling: every piece of state the family
#: checkpoints) on every backend; DQN and C51 on one backend each, DQN with either optimizer.
RESUME_CASES = [
    pytest.param(algorithm, backend, overrides, id=f"{algorithm.__name__}-{backend}{name}")
    for algorithm, backend, overrides, name in [
        (DQN, "serial", {}, ""),
        (DQN, "serial", {"optimizer": "rmsprop"}, "-rmsprop"),
        (C51, "shm", {}, ""),
        (Rainbow, "serial", {}, ""),
        (Rainbow, "shm", {}, ""),
    ]
    if backend in _backends()
]


@pytest.mark.parametrize("algorithm, backend, overrides", RESUME_CASES)
def test_resume_is_bit_identical(algorithm, backend, overrides, tmp_path, monkeypatch) -> None:
    total = 300  # about 118 updates: restart points after the 40th and 80th
    config_a = dict(_resume_config(backend, tmp_path / "a"), **overrides)
    uninterrupted = algorithm(env="CartPole-v1", **config_a)
    uninterrupted.learn(total)
    uninterrupted.close()

    crashing = algorithm(env="CartPole-v1", **_resume_config(backend, tmp_path / "b"), **overrides)
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
    config = dict(_resume_config("serial", tmp_path), checkpoint_every=0)
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
    state["off_policy"]["replay"]["token"] = "0-00000000"
    save_checkpoint(path, state)
    with pytest.raises(CheckpointError, match="another checkpoint"):
        Rainbow.load(path, env="CartPole-v1")

    # a checkpoint from before replay files and loop state still loads and trains
    for key in ("replay", "loop"):
        state["off_policy"].pop(key)
    state["config"].pop("checkpoint_replay")
    save_checkpoint(path, state)
    old = Rainbow.load(path, env="CartPole-v1", run_dir=None)
    assert old.buffer is None and old.global_step == 120
    with pytest.raises(ValueError, match="needs total_timesteps"):
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


# -- the training loop writes the transitions the envs produced --------------------------------


class _Recorder:
    """Wraps a vector env's reset/step and keeps, per env, the transitions it produced."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs
        self.transitions: list[list[dict]] = [[] for _ in range(self.num_envs)]
        self.obs = None
        self._step, self._reset = envs.step, envs.reset
        envs.step, envs.reset = self.step, self.reset

    def reset(self, **kwargs):
        out = self._reset(**kwargs)
        self.obs = np.array(out[0], copy=True)
        return out

    def step(self, actions):
        out = self._step(actions)
        next_obs, reward, terminated, truncated, infos = out
        for b in range(self.num_envs):
            done = bool(terminated[b] or truncated[b])
            final = infos["final_obs"][b] if done else next_obs[b]
            self.transitions[b].append(
                dict(
                    obs=self.obs[b].copy(),
                    action=int(actions[b]),
                    reward=float(reward[b]),
                    terminated=bool(terminated[b]),
                    truncated=bool(truncated[b]),
                    next_obs=np.array(final, copy=True),
                )
            )
        self.obs = np.array(next_obs, copy=True)
        return out


def _reference_target(episode: list[dict], i: int, n: int, gamma: float):
    ret = 0.0
    for k in range(n):
        t = episode[i + k]
        ret += gamma**k * t["reward"]
        if t["terminated"]:
            return ret, 0.0, t["next_obs"]
        if t["truncated"]:
            return ret, gamma ** (k + 1), t["next_obs"]
    return ret, gamma**n, episode[i + n - 1]["next_obs"]


@pytest.mark.parametrize("prioritized", [False, True])
def test_loop_stores_the_env_transitions_with_n_step_targets(prioritized) -> None:
    """DQN.learn on CartPole cut by a 7-step TimeLimit (truncations) with a wrapping buffer:
    every sampleable transition has the n-step return, discount and bootstrap observation of
    the trajectory the envs really produced (truncation bootstraps from final_obs)."""
    envs = vecaccel.make_vec(
        [lambda: gym.make("CartPole-v1", max_episode_steps=7)] * 2,
        backend="serial",
        autoreset_mode=vecaccel.AutoresetMode.SAME_STEP,
    )
    recorder = _Recorder(envs)
    gamma, n = 0.5, 3
    try:
        agent = DQN(
            env=envs,
            **{**SMALL_DQN, "buffer_size": 40},
            n_step=n,
            gamma=gamma,
            prioritized=prioritized,
        )
        agent.learn(120)  # 60 vector steps into 20 slots per env: the ring wraps
    finally:
        envs.close()
    buffer = agent.buffer
    assert np.any(buffer.truncated)
    valid = np.flatnonzero(buffer._valid_mask().reshape(-1))
    assert len(valid) > 20
    batch = buffer.get(valid)
    where = {}
    for b, episode in enumerate(recorder.transitions):
        for i, t in enumerate(episode):
            where[t["obs"].tobytes()] = (b, i)
    for row in range(len(valid)):
        b, i = where[batch.obs[row].tobytes()]
        episode = recorder.transitions[b]
        ret, discount, next_obs = _reference_target(episode, i, n, gamma)
        assert batch.action[row] == episode[i]["action"]
        assert batch.reward[row] == pytest.approx(ret, abs=1e-5)
        assert batch.discount[row] == pytest.approx(discount, abs=1e-7)
        if discount > 0:
            np.testing.assert_array_equal(batch.next_obs[row], next_obs)


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


def test_load_overrides_reach_the_optimizer(tmp_path) -> None:
    """``DQN.load(path, learning_rate=..., adam_eps=...)`` puts the overrides in force in the
    optimizer's param groups, not only in the config, while the saved Adam moments are restored
    (``optimizer.load_state_dict`` alone would bring back the saved rate and eps)."""
    envs = serial_cartpole(1)
    try:
        agent = DQN(env=envs, **{**SMALL_DQN, "learning_starts": 32}, learning_rate=1e-3)
        agent.learn(60)
        path = agent.save(tmp_path / "agent.pt")
    finally:
        envs.close()
    loaded = DQN.load(path, learning_rate=5e-2, adam_eps=1e-2)
    assert loaded.learning_rate == pytest.approx(5e-2)
    group = loaded.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(loaded.learning_rate)
    assert group["eps"] == pytest.approx(1e-2)
    # the Adam moments are still restored
    saved = agent.optimizer.state_dict()["state"]
    for key, value in loaded.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(value["exp_avg"], saved[key]["exp_avg"])


def test_rmsprop_is_nature_dqn_s_centred_rmsprop(tmp_path) -> None:
    """``optimizer="rmsprop"`` trains with centred RMSprop at the scaled rate; a checkpoint
    loads with its ``rms_*`` overrides in force and its averages restored, and refuses to
    continue under the other optimizer, whose state it does not hold."""
    envs = serial_cartpole(1)
    try:
        agent = DQN(
            env=envs,
            **{
                **SMALL_DQN,
                "learning_starts": 32,
                "batch_size": 128,
                "base_batch_size": 32,
                "lr_scaling": "sqrt",
                "learning_rate": 2.5e-4,
            },
            optimizer="rmsprop",
        )
        assert isinstance(agent.optimizer, torch.optim.RMSprop)
        group = agent.optimizer.param_groups[0]
        assert group["centered"] and group["alpha"] == 0.95 and group["eps"] == 0.01
        assert group["lr"] == pytest.approx(5e-4)
        agent.learn(200)
        assert agent.num_updates > 0
        path = agent.save(tmp_path / "agent.pt")
    finally:
        envs.close()
    loaded = DQN.load(path, rms_alpha=0.9, rms_eps=1e-3)
    group = loaded.optimizer.param_groups[0]
    assert isinstance(loaded.optimizer, torch.optim.RMSprop) and group["centered"]
    assert (group["alpha"], group["eps"]) == (0.9, 1e-3)
    saved = agent.optimizer.state_dict()["state"]
    for key, value in loaded.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(value["square_avg"], saved[key]["square_avg"])
        torch.testing.assert_close(value["grad_avg"], saved[key]["grad_avg"])
    with pytest.raises(ValueError, match="holds the state of 'rmsprop'"):
        DQN.load(path, optimizer="adam")


def test_discrete_action_space_with_offset_start() -> None:
    """DQN accepts any Discrete action space, but acts with 0..n-1 and ignores ``start``: an env
    whose actions are 1..n fails on the first step of learn(). It should either act in
    ``start..start+n-1`` or refuse the env when it is built."""
    envs = vecaccel.make_vec(
        [lambda: ShiftedActions(gym.make("CartPole-v1"))],
        backend="serial",
        autoreset_mode=vecaccel.AutoresetMode.SAME_STEP,
    )
    try:
        try:
            agent = DQN(env=envs, **{**SMALL_DQN, "learning_starts": 32})
        except (TypeError, ValueError):
            return  # refused up front: acceptable
        agent.learn(64)
        actions, _ = agent.predict(np.zeros((8, 4), np.float32))
        assert set(actions.tolist()) <= {1, 2}
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
