"""A2C and PPO: smoke runs on every backend, the update against CleanRL, SB3 and hand
computations, learning, exact resume, save/load/predict.
"""

from __future__ import annotations

import copy
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
import vecaccel.trainers.algos.base as algorithm
from vecaccel.sampler import SampleBatch
from vecaccel.trainers import A2C, PPO
from vecaccel.trainers.advantages import compute_gae
from vecaccel.trainers.checkpoint import load_checkpoint
from vecaccel.trainers.config import lr_scale
from vecaccel.trainers.optim import FlatAdam

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
            marks = [pytest.mark.skip(reason="tests/test_ray_backend.py trains on its cluster")]
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
        agent.learn(total_steps=48)
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
        agent.learn(total_steps=32)
    finally:
        agent.close()
    assert agent.global_step == 32


@pytest.mark.parametrize("mode", ["NextStep", "Disabled"])
def test_other_autoreset_modes_train(mode):
    agent = PPO("CartPole-v1", backend="serial", autoreset_mode=mode, **{**TINY, "num_steps": 64})
    try:
        agent.learn(total_steps=256)
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
        agent.learn(total_steps=16)
        actions, state = agent.predict(agent.sampler.last_obs[0].numpy(), deterministic=True)
    finally:
        agent.close()
    assert state is None and np.asarray(actions).shape == ()


# -- the same algorithm as SB3 -------------------------------------------------------------------


def short_cartpole() -> gym.Env:
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=12))


def sb3_parameter_pairs(model, policy):
    """``(SB3 parameter, the same parameter of vecaccel's ActorCritic)`` for the MLP policy."""
    twins = (policy.mlp_extractor.policy_net, policy.mlp_extractor.value_net)
    for twin, net in enumerate(twins):  # the TwinMLP's copy 0 is the actor, 1 the critic
        for layer, index in enumerate((0, 2)):  # Linear, Tanh, Linear, Tanh
            weight, bias = model.encoder.weights[layer][twin], model.encoder.biases[layer][twin]
            yield net[index].weight, weight.T
            yield net[index].bias, bias[0]
    for theirs_layer, our_layer in (
        (policy.action_net, model.actor_head),
        (policy.value_net, model.critic_head),
    ):
        yield theirs_layer.weight, our_layer.weight
        yield theirs_layer.bias, our_layer.bias


def copy_weights_to_sb3(model, policy) -> None:
    with torch.no_grad():
        for theirs_param, our_param in sb3_parameter_pairs(model, policy):
            theirs_param.copy_(our_param)


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_update_matches_sb3(algo):
    """From the same weights and rollout, one update gives SB3's advantages and parameters.

    The rollout has terminations and truncations (a 12-step time limit), so this covers
    SB3's truncation bootstrap (``reward += gamma * V(terminal_observation)``) against
    vecaccel's ``final_obs``, GAE, the losses, advantage normalisation, clipping, gradient
    clipping and the optimizer.
    """
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import configure

    T, B, gamma, lam = 16, 4, 0.98, 0.8
    envs = vecaccel.make_vec([short_cartpole] * B, backend="serial", autoreset_mode="SameStep")
    shared = dict(gamma=gamma, gae_lambda=lam, ent_coef=0.01, learning_rate=1e-3)
    sb3_env = make_vec_env("CartPole-v1", n_envs=B)
    if algo == "ppo":
        ours = PPO(
            envs, num_envs=B, num_steps=T, update_epochs=3, num_minibatches=1,
            clip_vloss=False, clip_coef=0.2, seed=0, torch_threads=1, **shared,
        )  # fmt: skip
        theirs = sb3.PPO(
            "MlpPolicy", sb3_env, n_steps=T, batch_size=T * B, n_epochs=3, clip_range=0.2,
            seed=0, device="cpu", **shared,
        )  # fmt: skip
    else:
        ours = A2C(envs, num_envs=B, num_steps=T, seed=0, torch_threads=1, **shared)
        theirs = sb3.A2C("MlpPolicy", sb3_env, n_steps=T, seed=0, device="cpu", **shared)
    theirs.set_logger(configure(None, []))
    model = ours.model
    copy_weights_to_sb3(model, theirs.policy)

    batch = ours.sampler.collect()
    assert batch.terminated.any() and len(batch.final_index) > 0
    # SB3's buffer from the same transitions, with SB3's own truncation bootstrap
    with torch.no_grad():
        final_values = model.value(batch.final_obs)
        last_values = model.value(batch.next_obs)
    rewards = batch.rewards.clone()
    rewards[batch.final_index[:, 0], batch.final_index[:, 1]] += gamma * final_values
    dones = (batch.terminated | batch.truncated).numpy()
    buffer = theirs.rollout_buffer
    buffer.reset()
    for t in range(T):
        buffer.add(
            batch.obs[t].numpy(),
            batch.actions[t].numpy().reshape(-1, 1),
            rewards[t].numpy(),
            dones[t - 1] if t else np.zeros(B, dtype=bool),
            batch.extras["value"][t],
            batch.extras["log_prob"][t],
        )
    buffer.compute_returns_and_advantage(last_values, dones[-1])
    advantages, _ = compute_gae(
        batch.rewards, batch.extras["value"], last_values, batch.terminated, batch.truncated,
        final_values, batch.final_index, gamma, lam,
    )  # fmt: skip
    np.testing.assert_allclose(advantages.numpy(), buffer.advantages, rtol=1e-5, atol=1e-5)

    theirs.train()
    ours.update(batch, progress_remaining=1.0)
    for theirs_param, our_param in sb3_parameter_pairs(model, theirs.policy):
        torch.testing.assert_close(theirs_param, our_param, rtol=1e-4, atol=1e-6)
    ours.close()
    sb3_env.close()


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_training_tracks_sb3_exactly_given_the_same_random_draws(algo, monkeypatch):
    """Whole runs, rollouts and updates, from the same weights, env seeds and uniform draws.

    SB3 samples its actions with ``torch.multinomial``, vecaccel by inverse CDF from
    ``torch.rand``: the same distribution, different random streams. With SB3's sampling
    switched to vecaccel's, both libraries give the very same episodes, so any difference in
    the env steps they need to learn is the luck of the random stream, nothing in the algorithm.
    """
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.distributions import CategoricalDistribution
    from stable_baselines3.common.env_util import make_vec_env

    def inverse_cdf_sample(self):
        cdf = self.distribution.logits.log_softmax(-1).exp().cumsum(-1)
        uniform = torch.rand(cdf.shape[:-1] + (1,), dtype=cdf.dtype)
        return (cdf < uniform).sum(-1).clamp_(max=cdf.shape[-1] - 1)

    monkeypatch.setattr(CategoricalDistribution, "sample", inverse_cdf_sample)

    # constant rates: vecaccel reads its schedules before a rollout (as CleanRL does), SB3
    # after it, an offset of one update that is no part of this comparison
    seed, B = 3, 4
    sb3_env = make_vec_env("CartPole-v1", n_envs=B, seed=seed)
    ours_config = dict(backend="serial", num_envs=B, seed=seed, torch_threads=1, anneal_lr=False)
    if algo == "ppo":
        T, updates = 16, 4
        shared = dict(gamma=0.98, gae_lambda=0.8, ent_coef=0.0, learning_rate=1e-3)
        ours = PPO(
            "CartPole-v1", num_steps=T, update_epochs=5, num_minibatches=1, clip_coef=0.2,
            clip_vloss=False, **ours_config, **shared,
        )  # fmt: skip
        theirs = sb3.PPO(
            "MlpPolicy", sb3_env, n_steps=T, batch_size=T * B, n_epochs=5, clip_range=0.2,
            seed=seed, device="cpu", **shared,
        )  # fmt: skip
    else:
        T, updates = 5, 30
        shared = dict(gamma=0.99, gae_lambda=1.0, ent_coef=0.0, learning_rate=7e-4)
        ours = A2C("CartPole-v1", num_steps=T, **ours_config, **shared)
        theirs = sb3.A2C("MlpPolicy", sb3_env, n_steps=T, seed=seed, device="cpu", **shared)
    copy_weights_to_sb3(ours.model, theirs.policy)

    our_returns: list[float] = []
    sb3_returns: list[float] = []

    class Returns(BaseCallback):
        def _on_step(self) -> bool:
            sb3_returns.extend(i["episode"]["r"] for i in self.locals["infos"] if "episode" in i)
            return True

    torch.manual_seed(0)
    ours.learn(updates * T * B, callback=lambda a, m: our_returns.extend(a.last_episodes.returns))
    torch.manual_seed(0)
    theirs.learn(updates * T * B, callback=Returns())
    ours.close()
    sb3_env.close()

    assert len(our_returns) > 5 and our_returns == sb3_returns
    for theirs_param, our_param in sb3_parameter_pairs(ours.model, theirs.policy):
        torch.testing.assert_close(theirs_param, our_param, rtol=1e-4, atol=1e-5)


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
        agent.learn(total_steps=40_000)
    finally:
        agent.close()
    assert best_rolling_return(agent) >= 300


@pytest.mark.slow
def test_a2c_learns_cartpole():
    from vecaccel.trainers.algos.a2c import PRESETS

    agent = A2C(backend="serial", seed=1, torch_threads=1, log_every=1, **PRESETS["cartpole"])
    try:
        agent.learn(total_steps=60_000)
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
        if self.update_index == 4:  # the fifth update dies after the checkpoint of the fourth
            raise Interrupt
        return update(self, batch, progress_remaining)

    monkeypatch.setattr(type(crashing), "update", update_then_crash)
    with pytest.raises(Interrupt):
        crashing.learn(total)
    crashing.close()
    monkeypatch.undo()

    resumed = algo.load(tmp_path / "b", run_dir=tmp_path / "b", tensorboard=False)
    assert resumed.global_step == 4 * 3 * 16 and resumed.update_index == 4
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
        assert load_checkpoint(checkpoint)["update_index"] == 2, "update 1's, not after the error"
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


OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


# -- PPO with several minibatches against a CleanRL-style reference ------------------------------


def _reference_gae(rewards, values, next_value, terminated, truncated, finals, gamma, lam):
    T, B = rewards.shape
    adv = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        last = 0.0
        for t in reversed(range(T)):
            if terminated[t, b]:
                nv = 0.0
            elif truncated[t, b]:
                nv = finals[(t, b)]
            else:
                nv = values[t + 1, b] if t + 1 < T else next_value[b]
            delta = rewards[t, b] + gamma * nv - values[t, b]
            done = bool(terminated[t, b] or truncated[t, b])
            last = delta + (0.0 if done else gamma * lam * last)
            adv[t, b] = last
    return adv


def _synthetic_batch(agent, T=6, B=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, B, 3, generator=g)
    actions = torch.randint(0, 2, (T, B), generator=g)
    with torch.no_grad():
        logp, _, value = agent.model.evaluate(obs.reshape(-1, 3), actions.reshape(-1))
    # behaviour policy and values differ from the current ones, so clipping bites
    old_logp = (logp + 0.3 * torch.randn(T * B, generator=g)).reshape(T, B)
    old_value = (value + 0.5 * torch.randn(T * B, generator=g)).reshape(T, B)
    terminated = torch.zeros(T, B, dtype=torch.bool)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    terminated[2, 0] = terminated[4, 3] = True
    truncated[1, 1] = truncated[5, 2] = True
    final_index = torch.tensor([[1, 1], [5, 2]])
    final_obs = torch.randn(2, 3, generator=g)
    return SampleBatch(
        obs=obs,
        actions=actions,
        rewards=torch.randn(T, B, generator=g),
        terminated=terminated,
        truncated=truncated,
        valid=torch.ones(T, B, dtype=torch.bool),
        extras={"log_prob": old_logp, "value": old_value},
        next_obs=torch.randn(B, 3, generator=g),
        final_obs=final_obs,
        final_index=final_index,
    )


@pytest.mark.parametrize("target_kl", [None, 0.0], ids=["no-kl-stop", "kl-stop"])
def test_ppo_minibatch_update_matches_cleanrl_reference(target_kl, monkeypatch):
    """3 epochs x 4 minibatches of 6 from a 24-sample batch with terminations and
    truncations: per-minibatch advantage normalisation, clipped surrogate, clipped value loss
    (MSE, SB3's scale), entropy bonus, global grad-norm clip, Adam(eps=1e-5), each sample once
    per epoch, CleanRL's target_kl break after the epoch. Same minibatch permutations."""
    cfg = dict(gamma=0.97, gae_lambda=0.9, update_epochs=3, num_minibatches=4, clip_coef=0.2,
               clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
               learning_rate=3e-3, target_kl=target_kl)  # fmt: skip
    agent = PPO(None, env_id="CartPole-v1", observation_space=OBS,
                action_space=gym.spaces.Discrete(2), backend="serial", num_envs=4, num_steps=6,
                torch_threads=1, seed=0, **cfg)  # fmt: skip
    assert isinstance(agent.optimizer, FlatAdam)
    ref = copy.deepcopy(agent.model)
    batch = _synthetic_batch(agent)

    perms: list[torch.Tensor] = []
    randperm = torch.randperm

    def recording_randperm(*args, **kwargs):
        perm = randperm(*args, **kwargs)
        perms.append(perm.clone())
        return perm

    monkeypatch.setattr(torch, "randperm", recording_randperm)
    agent.update(batch, progress_remaining=1.0)
    monkeypatch.undo()

    # -- the reference, written from CleanRL's ppo.py --
    T, B = 6, 4
    n, mbs = T * B, 6
    for perm in perms:
        assert sorted(perm.tolist()) == list(range(n)), "each sample once per epoch"
    with torch.no_grad():
        finals_v = ref.value(batch.final_obs).double()
        next_v = ref.value(batch.next_obs).double()
    finals = {(1, 1): float(finals_v[0]), (5, 2): float(finals_v[1])}
    values = batch.extras["value"].double()
    adv = _reference_gae(batch.rewards.double(), values, next_v, batch.terminated,
                         batch.truncated, finals, cfg["gamma"], cfg["gae_lambda"])  # fmt: skip
    b_adv = adv.reshape(-1).float()
    b_ret = (adv + values).reshape(-1).float()
    b_obs, b_act = batch.obs.reshape(-1, 3), batch.actions.reshape(-1)
    b_logp, b_val = batch.extras["log_prob"].reshape(-1), batch.extras["value"].reshape(-1)
    opt = torch.optim.Adam(ref.parameters(), lr=cfg["learning_rate"], eps=1e-5)
    clip = cfg["clip_coef"]
    steps = 0
    for epoch in range(cfg["update_epochs"]):
        perm = perms[epoch]
        for start in range(0, n, mbs):
            mb = perm[start : start + mbs]
            newlogp, entropy, newv = ref.evaluate(b_obs[mb], b_act[mb])
            logratio = newlogp - b_logp[mb]
            ratio = logratio.exp()
            approx_kl = ((ratio - 1) - logratio).mean()
            a = b_adv[mb]
            a = (a - a.mean()) / (a.std() + 1e-8)
            pg = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_unclipped = (newv - b_ret[mb]) ** 2
            v_clipped = b_val[mb] + (newv - b_val[mb]).clamp(-clip, clip)
            v = torch.max(v_unclipped, (v_clipped - b_ret[mb]) ** 2).mean()
            loss = pg - cfg["ent_coef"] * entropy.mean() + cfg["vf_coef"] * v
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg["max_grad_norm"])
            opt.step()
            steps += 1
        if target_kl is not None and approx_kl > target_kl:
            break

    assert agent.optimizer.steps == steps, (
        f"expected {steps} optimizer steps (CleanRL's loop), vecaccel took {agent.optimizer.steps}"
    )
    for ours, theirs in zip(agent.model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-6)


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
    make = algorithm.make_env_for_training

    def make_and_spy(*args, **kwargs):
        env = make(*args, **kwargs)
        env.single_action_space = gym.spaces.MultiDiscrete([2, 3])
        close = env.close

        def spy_close(*a, **k):
            closed.append(True)
            return close(*a, **k)

        env.close = spy_close
        return env

    monkeypatch.setattr(algorithm, "make_env_for_training", make_and_spy)
    with pytest.raises(TypeError, match="MultiDiscrete"):
        PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=4, torch_threads=1)
    assert closed, "the trainer raised for its action space but left the envs it built open"


# -- the atari preset against CleanRL's ppo_atari.py -----------------------------------------------


def test_atari_preset_loss_is_cleanrl_ppo_atari_loss(monkeypatch):
    """PRESETS["atari"] is documented as "the standard Atari PPO (baselines, CleanRL
    ppo_atari.py)". Both write ``v_loss = 0.5 * mean(max(...))`` and ``vf_coef=0.5``, so the
    value term weighs 0.25 x MSE. vecaccel's value loss is the plain MSE (SB3's convention), so
    the preset's ``vf_coef`` is 0.25: with 0.5 it would put twice CleanRL's weight on the value
    term of a shared torso (and reach the 0.5 grad-norm clip sooner).

    The reference below is CleanRL's loss with CleanRL's own ``vf_coef=0.5``, not the preset's
    (which would ask for 0.125 x MSE: half CleanRL's weight)."""
    from vecaccel.trainers.algos.ppo import PRESETS

    preset = PRESETS["atari"]
    settings = {k: preset[k] for k in ("clip_coef", "ent_coef", "vf_coef", "learning_rate")}
    agent = PPO(None, env_id="CartPole-v1", observation_space=OBS,
                action_space=gym.spaces.Discrete(2), backend="serial", num_envs=4, num_steps=6,
                update_epochs=1, num_minibatches=1, torch_threads=1, seed=0, preset=None,
                **settings)  # fmt: skip
    batch = _synthetic_batch(agent)
    ref = copy.deepcopy(agent.model)
    losses = []
    monkeypatch.setattr(
        agent, "backward_step", lambda loss, clip: losses.append(float(loss.detach()))
    )
    agent.update(batch, progress_remaining=1.0)

    with torch.no_grad():
        next_v = ref.value(batch.next_obs)
        finals = ref.value(batch.final_obs)
        adv, ret = compute_gae(batch.rewards, batch.extras["value"], next_v, batch.terminated,
                               batch.truncated, finals, batch.final_index, 0.99, 0.95)  # fmt: skip
        newlogp, entropy, newv = ref.evaluate(batch.obs.reshape(-1, 3), batch.actions.reshape(-1))
        a, ret = adv.reshape(-1), ret.reshape(-1)
        a = (a - a.mean()) / (a.std() + 1e-8)
        old_v = batch.extras["value"].reshape(-1)
        ratio = (newlogp - batch.extras["log_prob"].reshape(-1)).exp()
        c = settings["clip_coef"]
        pg = torch.max(-a * ratio, -a * ratio.clamp(1 - c, 1 + c)).mean()
        v_clipped = old_v + (newv - old_v).clamp(-c, c)
        v_loss = 0.5 * torch.max((newv - ret) ** 2, (v_clipped - ret) ** 2).mean()  # CleanRL
        cleanrl_vf_coef = 0.5  # ppo_atari.py's default
        cleanrl = pg - settings["ent_coef"] * entropy.mean() + cleanrl_vf_coef * v_loss
    assert losses[0] == pytest.approx(float(cleanrl), rel=1e-5), (
        f"the atari preset's loss should be CleanRL ppo_atari's ({float(cleanrl):.6f}); got "
        f"{losses[0]:.6f}, whose value term is {settings['vf_coef']} x MSE instead of "
        f"{cleanrl_vf_coef} x 0.5 x MSE"
    )


CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)

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


# -- PPO: clipped surrogate and clipped value loss (hand-computed) ----------------------------


def test_ppo_clipped_surrogate_and_value_loss_by_hand():
    """One epoch, one minibatch, every step terminal (so returns = rewards): the policy and
    value losses equal CleanRL's formulas evaluated on the same numbers."""
    clip = 0.2
    agent = PPO(None, env_id="CartPole-v1", observation_space=CARTPOLE_OBS,
                action_space=gym.spaces.Discrete(2), update_epochs=1, num_minibatches=1,
                clip_coef=clip, clip_vloss=True, ent_coef=0.0, torch_threads=1,
                backend="serial", seed=0)  # fmt: skip
    B = 6
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(1, B, 4, generator=generator)
    actions = torch.tensor([[0, 1, 0, 1, 1, 0]])
    with torch.no_grad():
        new_logprob, _, new_value = agent.model.evaluate(obs[0], actions[0])
    # behaviour log-probs: ratios e^0.5, e^-0.5, 1, e^0.1, e^-0.3, e^0.25
    shifts = torch.tensor([-0.5, 0.5, 0.0, -0.1, 0.3, -0.25])
    old_logprob = (new_logprob - shifts)[None]
    # old values: some far from the current ones, so the value clip bites
    old_value = (new_value + torch.tensor([1.0, -1.0, 0.05, 0.0, 0.5, -0.3]))[None]
    rewards = torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.0, -1.0]])
    batch = SampleBatch(
        obs=obs,
        actions=actions,
        rewards=rewards,
        terminated=torch.ones(1, B, dtype=torch.bool),
        truncated=torch.zeros(1, B, dtype=torch.bool),
        valid=torch.ones(1, B, dtype=torch.bool),
        extras={"log_prob": old_logprob, "value": old_value},
        next_obs=torch.zeros(B, 4),
        final_obs=torch.zeros(0, 4),
        final_index=torch.zeros(0, 2, dtype=torch.int64),
    )
    metrics = agent.update(batch, progress_remaining=1.0)

    returns = rewards[0].double()
    advantages = returns - old_value[0].double()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = shifts.double().exp()
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)).mean()
    v_new, v_old = new_value.double(), old_value[0].double()
    v_clipped = v_old + (v_new - v_old).clamp(-clip, clip)
    v_loss = torch.max((v_new - returns) ** 2, (v_clipped - returns) ** 2).mean()
    assert metrics["losses/policy_loss"] == pytest.approx(float(pg), rel=1e-5, abs=1e-6)
    assert metrics["losses/value_loss"] == pytest.approx(float(v_loss), rel=1e-5)
    clipped = ((ratio - 1).abs() > clip).double().mean()
    assert metrics["losses/clipfrac"] == pytest.approx(float(clipped))
