"""What A2C and PPO share, their family's base: the envs it attaches (any autoreset mode, the
action server's alternating halves) and closes when it refuses a space, the learning rate scaled
with the batch, acting in any ``Discrete(n, start)`` and in a ``Box`` of any shape (clipped to
its bounds), and its checkpoint section: save, load, predict, and a resume bit-identical to a run
never interrupted.
"""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import pendulum_agent
from toy_envs import BoundedMatrixActionEnv, ShiftedActions

import vecaccel
import vecaccel.trainers.envs.make as training_envs
from vecaccel.trainers import A2C, PPO

torch.set_num_threads(1)

ALGORITHMS = [PPO, A2C]

TINY = dict(num_envs=2, num_steps=8, num_workers=2, seed=0, torch_threads=1)


def parameters(agent) -> list[torch.Tensor]:
    return [p.detach().clone() for p in agent.model.parameters()]


def test_lr_scaling_is_applied_and_logged():
    agent = PPO(
        "CartPole-v1",
        backend="serial",
        num_envs=4,
        num_steps=16,
        learning_rate=1e-4,
        lr_scaling="linear",
        base_batch_size=16,
        anneal_lr=False,
    )
    try:
        assert agent.optimizer.param_groups[0]["lr"] == pytest.approx(4e-4)
        agent.learn(64)
    finally:
        agent.close()
    row = agent.logger.history[-1]
    assert row["charts/lr_scale"] == 4.0
    assert row["charts/learning_rate"] == pytest.approx(4e-4)


@pytest.mark.skipif("action_server" not in vecaccel.list_backends(), reason="no action_server")
def test_ppo_on_alternating_action_server():
    agent = PPO("CartPole-v1", backend="action_server", alternating=True, **TINY)
    try:
        agent.learn(total_timesteps=32)
    finally:
        agent.close()
    assert agent.global_step == 32


@pytest.mark.parametrize("mode", ["NextStep", "Disabled"])
def test_other_autoreset_modes_train(mode):
    agent = PPO("CartPole-v1", backend="serial", autoreset_mode=mode, **{**TINY, "num_steps": 64})
    try:
        agent.learn(total_timesteps=256)
    finally:
        agent.close()
    assert agent.global_step == 256


def test_refused_action_space_closes_the_env_it_built(monkeypatch):
    """A MultiDiscrete action space is refused (TypeError) after the trainer has built its
    envs (worker processes for shm); the observation-space refusal closes them, this one
    does not."""
    closed: list[bool] = []
    make = training_envs.make_env_for_training

    def make_and_spy(*args, **kwargs):
        env = make(*args, **kwargs)
        env.single_action_space = gym.spaces.MultiDiscrete([2, 3])
        close = env.close

        def spy_close(*a, **k):
            closed.append(True)
            return close(*a, **k)

        env.close = spy_close
        return env

    monkeypatch.setattr(training_envs, "make_env_for_training", make_and_spy)
    with pytest.raises(TypeError, match="MultiDiscrete"):
        PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=4, torch_threads=1)
    assert closed, "the trainer raised for its action space but left the envs it built open"


def test_predict_clips_box_actions_to_the_action_space():
    """SB3's ``predict`` clips Box actions to the action space; vecaccel's returns the raw
    Gaussian mean (here 10 for Pendulum's [-2, 2]) and raw samples."""
    agent = pendulum_agent(mean=10.0, log_std=2.0)
    obs = np.zeros((64, 3), dtype=np.float32)
    for deterministic in (True, False):
        actions, _ = agent.predict(obs, deterministic=deterministic)
        assert actions.shape == (64, 1)
        assert np.all(actions >= -2.0) and np.all(actions <= 2.0), (deterministic, actions.max())


@pytest.mark.parametrize("cls", ALGORITHMS, ids=lambda c: c.__name__)
def test_on_policy_discrete_action_space_with_offset_start(cls) -> None:
    """PPO and A2C act in ``start..start+n-1``, in learn() and in predict(), so an env whose
    actions are 1..n steps (their losses index the categorical head with 0..n-1)."""
    envs = vecaccel.make_vec(
        [lambda: ShiftedActions(gym.make("CartPole-v1"))] * 2,
        backend="serial",
        autoreset_mode=vecaccel.AutoresetMode.SAME_STEP,
    )
    try:
        agent = cls(envs, num_envs=2, num_steps=16, seed=0, torch_threads=1, tensorboard=False)
        sent: list[int] = []
        step = envs.step
        envs.step = lambda actions: (sent.extend(np.asarray(actions).tolist()), step(actions))[1]
        agent.learn(64)
        assert sent and set(sent) <= {1, 2}
        for deterministic in (False, True):
            actions, _ = agent.predict(np.zeros((8, 4), np.float32), deterministic=deterministic)
            assert set(actions.tolist()) <= {1, 2}
    finally:
        envs.close()


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_multi_axis_box_actions_batch_clip_save_load_predict(algo, tmp_path):
    """Box(2, 2) actions: [T, B, 2, 2] in the batch, clipped per element to low/high (which
    differ by element) before the env, and predict, save and load keep the shape."""
    envs = vecaccel.make_vec(
        [BoundedMatrixActionEnv] * 3, backend="serial", autoreset_mode="SameStep"
    )
    try:
        agent = algo(envs, num_envs=3, num_steps=4, torch_threads=1, seed=0)
        with torch.no_grad():
            agent.model.log_std.fill_(1.5)  # samples outside the bounds, for the clip
        batch = agent.sampler.collect()
        assert batch.actions.shape == (4, 3, 2, 2)
        assert batch.extras["log_prob"].shape == (4, 3)
        log_prob, _, _ = agent.model.evaluate(
            batch.obs.reshape(-1, 3), batch.actions.reshape(-1, 2, 2)
        )
        flat_log_prob, _, _ = agent.model.evaluate(
            batch.obs.reshape(-1, 3), batch.actions.reshape(-1, 4)
        )
        torch.testing.assert_close(log_prob, batch.extras["log_prob"].reshape(-1))
        torch.testing.assert_close(flat_log_prob, log_prob)
        agent.learn(24)
        one, _ = agent.predict(np.zeros(3, np.float32), deterministic=True)
        several, _ = agent.predict(np.zeros((5, 3), np.float32))
        assert one.shape == (2, 2) and several.shape == (5, 2, 2)
        space = BoundedMatrixActionEnv.action_space
        assert ((several >= space.low) & (several <= space.high)).all()
        loaded = algo.load(agent.save(tmp_path / "agent.pt"))
        np.testing.assert_array_equal(
            loaded.predict(np.zeros(3, np.float32), deterministic=True)[0], one
        )
    finally:
        envs.close()


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_save_load_predict(algo, tmp_path):
    agent = algo("CartPole-v1", backend="serial", num_envs=2, num_steps=8, seed=0)
    agent.learn(32)
    agent.save(tmp_path / "agent.pt")
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    expected, _ = agent.predict(obs, deterministic=True)
    agent.close()

    loaded = algo.load(tmp_path / "agent.pt")
    actions, state = loaded.predict(obs, deterministic=True)
    assert state is None and actions.shape == (5,)
    np.testing.assert_array_equal(actions, expected)
    single, _ = loaded.predict(obs[0], deterministic=True)
    assert np.asarray(single).shape == () and single == expected[0]
    assert loaded.config == agent.config


class Interrupt(Exception):
    pass


NORMALIZED = {"norm_obs": True, "norm_reward": True}
RESUME_CASES = [
    *(
        pytest.param(algo, backend, {}, id=f"{algo.__name__}-{backend}")
        for backend in ("serial", "shm")
        if backend in vecaccel.list_backends()
        for algo in ALGORITHMS
    ),
    # the normalisation statistics go on exactly too
    pytest.param(PPO, "serial", NORMALIZED, id="PPO-serial-normalized"),
]


@pytest.mark.parametrize("algo, backend, normalization", RESUME_CASES)
def test_resume_is_bit_identical(algo, backend, normalization, tmp_path, monkeypatch):
    config = dict(
        **normalization,
        backend=backend,
        num_envs=3,
        num_steps=16,
        num_workers=2,
        seed=5,
        checkpoint_every=2,
        tensorboard=False,
        torch_threads=1,
    )
    total = 6 * 3 * 16  # six updates, checkpoints after the 2nd and 4th

    uninterrupted = algo("CartPole-v1", run_dir=tmp_path / "a", **config)
    uninterrupted.learn(total)
    uninterrupted.close()

    crashing = algo("CartPole-v1", run_dir=tmp_path / "b", **config)
    update = type(crashing).update

    def update_then_crash(self, batch, progress_remaining):
        if self.num_updates == 4:  # the fifth update dies after the checkpoint of the fourth
            raise Interrupt
        return update(self, batch, progress_remaining)

    monkeypatch.setattr(type(crashing), "update", update_then_crash)
    with pytest.raises(Interrupt):
        crashing.learn(total)
    crashing.close()
    monkeypatch.undo()

    resumed = algo.load(tmp_path / "b", run_dir=tmp_path / "b", tensorboard=False)
    assert resumed.global_step == 4 * 3 * 16 and resumed.num_updates == 4
    resumed.learn()
    resumed.close()

    assert resumed.global_step == uninterrupted.global_step == total
    for a, b in zip(parameters(uninterrupted), parameters(resumed), strict=True):
        assert torch.equal(a, b)
    _assert_same_state(uninterrupted.optimizer.state_dict(), resumed.optimizer.state_dict())
    if normalization:
        _assert_same_state(uninterrupted.normalizer.state_dict(), resumed.normalizer.state_dict())
        assert resumed.normalizer.obs.count == resumed.normalizer.returns.count == total
    # the metrics a crashed run wrote after its checkpoint are dropped on resume
    steps = [int(r["step"]) for r in csv.DictReader(open(tmp_path / "b" / "metrics.csv"))]
    assert steps == sorted(steps) and steps[-1] == total


def _assert_same_state(a, b, path: str = "optimizer") -> None:
    """Two optimizer state dicts hold the same step counts, settings and tensors, exactly."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a:
            _assert_same_state(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
