"""A2C and PPO: smoke runs on every backend, the update against CleanRL, SB3 and hand
computations, learning, exact resume, save/load/predict.
"""

from __future__ import annotations

import csv
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import pendulum_agent
from toy_envs import (
    BOUNDED_ACTIONS_SEEN,
    BoundedActionEnv,
    BoundedMatrixActionEnv,
    MatrixActionEnv,
    NanRewardEnv,
    ShiftedActions,
    WideBoxEnv,
)

import vecaccel
import vecaccel.trainers.envs.make as training_envs
from vecaccel.trainers import A2C, PPO
from vecaccel.trainers.checkpoints.format import load_checkpoint
from vecaccel.trainers.config.settings import lr_scale

torch.set_num_threads(1)

ALGORITHMS = [PPO, A2C]

TINY = dict(num_envs=2, num_steps=8, num_workers=2, seed=0, torch_threads=1)


def backend_params() -> list:
    params = []
    for name in sorted(vecaccel.list_backends()):
        marks = []
        if name == "async":
            marks = [pytest.mark.skip(reason="steps a subset of envs per call; no [T, B] batch")]
        elif name == "ray":
            marks = [
                pytest.mark.skip(reason="tests/plugins/ray/test_vec_env.py trains on its cluster")
            ]
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def parameters(agent) -> list[torch.Tensor]:
    return [p.detach().clone() for p in agent.model.parameters()]


# -- smoke ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_smoke_every_backend(algo, backend, tmp_path):
    agent = algo("CartPole-v1", backend=backend, run_dir=tmp_path, tensorboard=False, **TINY)
    try:
        before = parameters(agent)
        agent.learn(total_timesteps=48)
    finally:
        agent.close()
    assert agent.global_step == 48
    assert any(not torch.equal(a, b) for a, b in zip(before, parameters(agent)))
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert rows and {"charts/SPS", "losses/value_loss", "losses/policy_loss"} <= rows[0].keys()
    assert (tmp_path / "checkpoint.pt").exists()


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


def test_atari_cnn_smoke():
    pytest.importorskip("ale_py")
    agent = PPO(
        "BreakoutNoFrameskip-v4",
        backend="serial",
        num_envs=2,
        num_steps=4,
        num_minibatches=2,
        update_epochs=1,
        channels_last=True,
        bf16="on",
        seed=0,
    )
    try:
        assert agent.env.single_observation_space.shape == (4, 84, 84)
        assert agent.model.shared and agent.model.encoder.bf16
        agent.learn(total_timesteps=16)
        actions, state = agent.predict(agent.sampler.last_obs[0].numpy(), deterministic=True)
    finally:
        agent.close()
    assert state is None and np.asarray(actions).shape == ()


# -- learning -----------------------------------------------------------------------------------


def best_rolling_return(agent, window: int = 10) -> float:
    returns = [
        r["charts/episodic_return"] for r in agent.logger.history if "charts/episodic_return" in r
    ]
    if len(returns) < window:
        return float("-inf")
    return max(np.mean(returns[i : i + window]) for i in range(len(returns) - window + 1))


@pytest.mark.slow
def test_ppo_learns_cartpole():
    from vecaccel.trainers.algos.ppo import PRESETS

    agent = PPO(backend="serial", seed=1, torch_threads=1, **PRESETS["cartpole"])
    try:
        agent.learn(total_timesteps=40_000)
    finally:
        agent.close()
    assert best_rolling_return(agent) >= 300


@pytest.mark.slow
def test_a2c_learns_cartpole():
    from vecaccel.trainers.algos.a2c import PRESETS

    agent = A2C(backend="serial", seed=1, torch_threads=1, log_every_steps=1, **PRESETS["cartpole"])
    try:
        agent.learn(total_timesteps=60_000)
    finally:
        agent.close()
    assert best_rolling_return(agent) >= 150


# -- resume -------------------------------------------------------------------------------------


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("backend", [b for b in ("serial", "shm") if b in vecaccel.list_backends()])
@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_resume_is_bit_identical(algo, backend, tmp_path, monkeypatch):
    config = dict(
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


# -- save, load, predict --------------------------------------------------------------------------


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


# -- learning-rate scaling ---------------------------------------------------------------------


def test_lr_scale_modes():
    assert lr_scale(1024, 256, "none") == 1.0
    assert lr_scale(1024, 256, "linear") == 4.0
    assert lr_scale(1024, 256, "sqrt") == 2.0
    with pytest.raises(ValueError, match="mode"):
        lr_scale(1024, 256, "cubic")


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
def test_nan_loss_stops_before_the_step_and_writes_no_checkpoint(algo, tmp_path):
    """A NaN reward in the third rollout: the error names the update and the step, the
    parameters are those of the last good step (finite), and no checkpoint is written after it."""
    envs = vecaccel.make_vec([NanRewardEnv] * 2, backend="serial", autoreset_mode="SameStep")
    agent = algo(envs, run_dir=tmp_path, tensorboard=False, num_envs=2, num_steps=8,
                 torch_threads=1, seed=0, checkpoint_every=1)  # fmt: skip
    before: list[torch.Tensor] = []

    def keep_parameters(agent, metrics):
        before[:] = [p.detach().clone() for p in agent.model.parameters()]

    try:
        with pytest.raises(FloatingPointError, match=r"update 2 \(global step 48\).*nan"):
            agent.learn(64, callback=keep_parameters)
        if algo is A2C:  # one step per update: the parameters of the end of update 1
            for p, q in zip(agent.model.parameters(), before, strict=True):
                torch.testing.assert_close(p, q, rtol=0, atol=0)
        assert all(bool(torch.isfinite(p).all()) for p in agent.model.parameters())
        checkpoint = tmp_path / "checkpoint.pt"
        assert load_checkpoint(checkpoint)["num_updates"] == 2, "update 1's, not after the error"
    finally:
        envs.close()


@pytest.mark.parametrize("algorithm", ["PPO", "A2C"])
def test_on_policy_discrete_action_space_with_offset_start(algorithm) -> None:
    """PPO and A2C act in ``start..start+n-1``, in learn() and in predict(), so an env whose
    actions are 1..n steps (their losses index the categorical head with 0..n-1)."""
    from vecaccel.trainers.algos.a2c import A2C
    from vecaccel.trainers.algos.ppo import PPO

    cls = {"PPO": PPO, "A2C": A2C}[algorithm]
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


# -- learning-rate annealing and A2C's single RMSprop step ---------------------------------------


@pytest.mark.parametrize("algo", [PPO, A2C], ids=["ppo", "a2c"])
def test_lr_anneals_linearly_per_update_as_cleanrl_and_a2c_steps_once(algo):
    """CleanRL: lr_i = lr * (1 - i / num_iterations), i = 0..N-1, set before the rollout."""
    seen = []
    agent = algo("CartPole-v1", backend="serial", num_envs=2, num_steps=4, torch_threads=1,
                 seed=0, learning_rate=1e-3, anneal_lr=True,
                 **({"update_epochs": 1, "num_minibatches": 1} if algo is PPO else {}))  # fmt: skip
    try:
        agent.learn(
            40,  # 5 updates of 8
            callback=lambda a, m: seen.append(
                (m["charts/learning_rate"], a.optimizer.param_groups[0]["lr"], a.optimizer.steps)
            ),
        )
    finally:
        agent.close()
    expected = [1e-3 * (1 - i / 5) for i in range(5)]
    assert [s[0] for s in seen] == pytest.approx(expected)
    assert [s[1] for s in seen] == pytest.approx(expected)
    assert [s[2] for s in seen] == [1, 2, 3, 4, 5], "one optimizer step per rollout"
    if algo is A2C:
        group = agent.optimizer.param_groups[0]
        assert (group["alpha"], group["eps"]) == (0.99, 1e-5)  # SB3's A2C RMSprop


def test_box_batch_keeps_unclipped_actions_with_their_gaussian_log_prob():
    """The stored action is the raw sample (outside [-0.5, 0.5] here) and the stored log-prob
    is log N(a; mu, sigma) of that raw sample, by hand from the network's mean and log_std."""
    envs = vecaccel.make_vec([WideBoxEnv] * 2, backend="serial", autoreset_mode="SameStep")
    agent = PPO(envs, num_envs=2, num_steps=8, torch_threads=1, seed=0)
    try:
        with torch.no_grad():
            agent.model.log_std.fill_(0.5)
        batch = agent.sampler.collect()
        actions = batch.actions.reshape(-1, 2)
        assert (actions.abs() > 0.5).any(), "the test needs samples outside the bounds"
        with torch.no_grad():
            mean = agent.model.actor_head(agent.model._features(batch.obs.reshape(-1, 3))[0])
        var = math.exp(0.5) ** 2
        by_hand = (-((actions - mean) ** 2) / (2 * var) - 0.5 - 0.5 * math.log(2 * math.pi)).sum(-1)
        torch.testing.assert_close(batch.extras["log_prob"].reshape(-1), by_hand, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    finally:
        envs.close()


def test_multi_axis_box_actions_have_the_space_shape():
    """SB3 reshapes the Gaussian's flat sample to ``action_space.shape``; vecaccel's
    ActorCritic returns ``[N, prod(shape)]`` and never reshapes, so the sampler's clip to
    ``low``/``high`` (shape (2, 2)) and ``predict`` fail to broadcast."""
    envs = vecaccel.make_vec([MatrixActionEnv] * 2, backend="serial", autoreset_mode="SameStep")
    try:
        agent = PPO(envs, num_envs=2, num_steps=4, update_epochs=1, torch_threads=1, seed=0)
        try:
            action, _ = agent.predict(np.zeros(3, np.float32), deterministic=True)
        except ValueError as exc:
            pytest.fail(f"predict on a Box(2, 2) action space should give a (2, 2) action, "
                        f"raised ValueError: {exc}")  # fmt: skip
        assert np.shape(action) == (2, 2), f"expected a (2, 2) action, got {np.shape(action)}"
        try:
            agent.learn(8)
        except ValueError as exc:
            pytest.fail(f"PPO on a Box(2, 2) action space should train, raised: {exc}")
    finally:
        envs.close()


# -- unsupported action spaces must not leak the env ---------------------------------------------


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


# -- continuous actions -----------------------------------------------------------------------


def test_predict_clips_box_actions_to_the_action_space():
    """SB3's ``predict`` clips Box actions to the action space; vecaccel's returns the raw
    Gaussian mean (here 10 for Pendulum's [-2, 2]) and raw samples."""
    agent = pendulum_agent(mean=10.0, log_std=2.0)
    obs = np.zeros((64, 3), dtype=np.float32)
    for deterministic in (True, False):
        actions, _ = agent.predict(obs, deterministic=deterministic)
        assert actions.shape == (64, 1)
        assert np.all(actions >= -2.0) and np.all(actions <= 2.0), (deterministic, actions.max())


def test_sampled_box_actions_reach_the_env_clipped_to_its_bounds():
    """CleanRL (``ClipAction``) and SB3 (``np.clip`` before ``env.step``) hand the env actions
    within its Box, while the buffer keeps the unclipped sample for the log-probability.
    vecaccel does the same: with std e^1 most raw Gaussian samples are outside [-1, 1], and an
    env that does not clip (or charges a control cost on the action) must not see them."""
    BOUNDED_ACTIONS_SEEN.clear()
    envs = vecaccel.make_vec([BoundedActionEnv] * 2, backend="serial", autoreset_mode="SameStep")
    agent = PPO(envs, backend="serial", num_envs=2, num_steps=8, update_epochs=1,
                torch_threads=1, seed=0)  # fmt: skip
    with torch.no_grad():
        agent.model.log_std.fill_(1.0)
    try:
        agent.learn(16)
    finally:
        envs.close()
    seen = np.concatenate(BOUNDED_ACTIONS_SEEN)
    assert len(seen) == 16
    assert np.all(seen >= -1.0) and np.all(seen <= 1.0), seen.max()
