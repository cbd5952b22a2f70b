"""The DQN family's base: its optimizer and learning-rate scaling, the target network's update,
the ε and β schedules, ε-greedy acting in any ``Discrete(n, start)`` and predict's own generator,
and its checkpoint section: save, load with overrides in force, and an exact resume.
"""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import SMALL_DQN, TINY_DQN, serial_cartpole
from toy_envs import ShiftedActions

import vecaccel
from vecaccel.trainers.algos.dqn import C51, DQN, Rainbow
from vecaccel.trainers.checkpoints.format import CheckpointError

torch.set_num_threads(1)

TINY = TINY_DQN

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
TWO = gym.spaces.Discrete(2)


def test_dqn_predict_is_epsilon_greedy_unless_deterministic() -> None:
    agent = DQN(None, observation_space=CARTPOLE_OBS, action_space=TWO, eval_epsilon=1.0,
                preset=None)  # fmt: skip
    obs = np.zeros((200, 4), np.float32)
    greedy, _ = agent.predict(obs, deterministic=True)
    assert len(set(greedy.tolist())) == 1
    sampled, _ = agent.predict(obs)  # SB3's default: deterministic=False
    assert set(sampled.tolist()) == {0, 1}
    # predict draws from its own generator: exploration's stream is left as it was
    assert agent.rng.bit_generator.state == DQN(None, preset=None).rng.bit_generator.state


def test_polyak_target_update() -> None:
    envs = serial_cartpole(1)
    try:
        agent = DQN(env=envs, **SMALL_DQN, tau=0.25)
        with torch.no_grad():
            for p in agent.q_network.parameters():
                p.add_(1.0)
        before = [p.clone() for p in agent.target_network.parameters()]
        agent.update_target()
        for old, new, online in zip(
            before, agent.target_network.parameters(), agent.q_network.parameters()
        ):
            torch.testing.assert_close(new, 0.75 * old + 0.25 * online)
    finally:
        envs.close()


def test_epsilon_and_beta_schedules_by_hand() -> None:
    agent = DQN(None, start_epsilon=1.0, end_epsilon=0.05, exploration_fraction=0.5,
                priority_beta_start=0.4, prioritized=True, device="cpu")  # fmt: skip
    assert agent.epsilon(0, 1000) == pytest.approx(1.0)
    assert agent.epsilon(250, 1000) == pytest.approx(0.525)
    assert agent.epsilon(500, 1000) == pytest.approx(0.05)
    assert agent.epsilon(900, 1000) == pytest.approx(0.05)
    steps = DQN(None, exploration_steps=100, device="cpu")
    assert steps.epsilon(50, 10_000) == pytest.approx(0.525)

    class Buffer:
        def sample(self, batch_size, beta):
            return beta

    agent.buffer = Buffer()
    for progress, expected in ((0.0, 0.4), (0.5, 0.7), (1.0, 1.0), (1.5, 1.0)):
        beta, sampled_with = agent.sample_batch(progress)
        assert beta == pytest.approx(expected) and sampled_with == pytest.approx(expected)


def test_learning_rate_scaling_is_applied_and_logged() -> None:
    envs = serial_cartpole(1)
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
    envs = serial_cartpole()
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


RESUME_CASES = [
    pytest.param(algorithm, backend, overrides, id=f"{algorithm.__name__}-{backend}{name}")
    for algorithm, backend, overrides, name in [
        (DQN, "serial", {}, ""),
        (DQN, "serial", {"optimizer": "rmsprop"}, "-rmsprop"),
        (C51, "shm", {}, ""),
        (Rainbow, "serial", {}, ""),
        (Rainbow, "shm", {}, ""),
        # the buffer holds normalised observations and scaled rewards, alike after a resume
        (DQN, "serial", {"norm_obs": True, "norm_reward": True}, "-normalized"),
    ]
    if backend in vecaccel.list_backends()
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
    if uninterrupted.normalizer is not None:
        for mine, theirs in zip(
            uninterrupted.normalizer.tensors(), resumed.normalizer.tensors(), strict=True
        ):
            assert torch.equal(mine, theirs)
    # the metrics the crashed run wrote after its checkpoint are dropped on resume
    steps = [int(r["step"]) for r in csv.DictReader(open(tmp_path / "b" / "metrics.csv"))]
    assert steps == sorted(steps) and steps[-1] == total
    # one replay file beside the checkpoint: the older ones are deleted
    assert len(list((tmp_path / "b").glob("checkpoint.replay-*.npz"))) == 1


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
