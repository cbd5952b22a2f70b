"""A2C and PPO: smoke runs on every backend, GAE against a plain loop, learning, exact resume."""

from __future__ import annotations

import csv
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vecaccel
from vecaccel.trainers import A2C, PPO
from vecaccel.trainers.a2c import A2CConfig
from vecaccel.trainers.advantages import compute_gae
from vecaccel.trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vecaccel.trainers.config import config_help, lr_scale
from vecaccel.trainers.envs import EpisodicLifeEnv, make_env_for_training
from vecaccel.trainers.logger import RunLogger
from vecaccel.trainers.ppo import PPOConfig

torch.set_num_threads(1)

ALGORITHMS = [PPO, A2C]
TINY = dict(num_envs=2, num_steps=8, num_workers=2, seed=0, torch_threads=1)


def backend_params() -> list:
    params = []
    for name in sorted(vecaccel.list_backends()):
        marks = []
        if name == "async":
            marks = [pytest.mark.skip(reason="steps a subset of envs per call; no [T, B] batch")]
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


# -- GAE --------------------------------------------------------------------------------------


def reference_gae(rewards, values, next_value, terminated, truncated, finals, gamma, lam):
    """Forward definition: A_t = sum_l (gamma*lam)^l delta_{t+l}, up to the episode's end."""
    T, B = rewards.shape
    advantages = np.zeros((T, B))
    for b in range(B):
        deltas = []
        for t in range(T):
            if terminated[t, b]:
                bootstrap = 0.0
            elif truncated[t, b]:
                bootstrap = finals[(t, b)]
            else:
                bootstrap = values[t + 1, b] if t + 1 < T else next_value[b]
            deltas.append(rewards[t, b] + gamma * bootstrap - values[t, b])
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                total += weight * deltas[k]
                if terminated[k, b] or truncated[k, b]:
                    break
                weight *= gamma * lam
            advantages[t, b] = total
    return advantages


@settings(max_examples=60, deadline=None)
@given(
    T=st.integers(1, 7),
    B=st.integers(1, 3),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
    data=st.data(),
)
def test_gae_matches_reference_loop(T, B, gamma, lam, data):
    floats = st.floats(-10, 10, allow_nan=False, width=32)
    rewards = np.array(data.draw(st.lists(floats, min_size=T * B, max_size=T * B))).reshape(T, B)
    values = np.array(data.draw(st.lists(floats, min_size=T * B, max_size=T * B))).reshape(T, B)
    next_value = np.array(data.draw(st.lists(floats, min_size=B, max_size=B)))
    flags = st.lists(st.sampled_from([0, 0, 0, 1, 2, 3]), min_size=T * B, max_size=T * B)
    kinds = np.array(data.draw(flags)).reshape(T, B)  # 1 terminated, 2 truncated, 3 both
    terminated = (kinds == 1) | (kinds == 3)
    truncated = (kinds == 2) | (kinds == 3)
    final_index = [
        (t, b) for t in range(T) for b in range(B) if truncated[t, b] and not terminated[t, b]
    ]
    final_values = np.array(
        data.draw(st.lists(floats, min_size=len(final_index), max_size=len(final_index)))
    )
    finals = dict(zip(final_index, final_values))

    advantages, returns = compute_gae(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(next_value, dtype=torch.float64),
        torch.tensor(terminated),
        torch.tensor(truncated),
        torch.tensor(final_values, dtype=torch.float64),
        torch.tensor(final_index, dtype=torch.int64).reshape(-1, 2),
        gamma,
        lam,
    )
    expected = reference_gae(rewards, values, next_value, terminated, truncated, finals, gamma, lam)
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(returns.numpy(), expected + values, rtol=1e-4, atol=1e-3)


# -- the same algorithm as SB3 -------------------------------------------------------------------


def short_cartpole() -> gym.Env:
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=12))


def sb3_parameter_pairs(model, policy):
    """``(SB3 parameter, the same parameter of vecaccel's ActorCritic)`` for the MLP policy."""
    twins = (policy.mlp_extractor.policy_net, policy.mlp_extractor.value_net)
    for copy, net in enumerate(twins):  # the TwinMLP's copy 0 is the actor, 1 the critic
        for layer, index in enumerate((0, 2)):  # Linear, Tanh, Linear, Tanh
            weight, bias = model.encoder.weights[layer][copy], model.encoder.biases[layer][copy]
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
    from vecaccel.trainers.ppo import PRESETS

    agent = PPO(backend="serial", seed=1, torch_threads=1, **PRESETS["cartpole"])
    try:
        agent.learn(total_steps=40_000)
    finally:
        agent.close()
    assert best_rolling_return(agent) >= 300


@pytest.mark.slow
def test_a2c_learns_cartpole():
    from vecaccel.trainers.a2c import PRESETS

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


def test_load_refuses_another_algorithm(tmp_path):
    agent = A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=4)
    agent.save(tmp_path / "a2c.pt")
    agent.close()
    with pytest.raises(CheckpointError, match="a2c"):
        PPO.load(tmp_path / "a2c.pt")


def test_corrupt_checkpoints_raise_clear_errors(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"weights": torch.arange(1000.0), "step": 3})
    assert load_checkpoint(path)["step"] == 3
    data = path.read_bytes()

    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path)

    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)

    path.write_bytes(b"")
    with pytest.raises(CheckpointError):
        load_checkpoint(path)

    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError):
        load_checkpoint(path)

    torch.save([1, 2, 3], path)  # a plain torch file that is not a dict
    with pytest.raises(CheckpointError, match="not a dict"):
        load_checkpoint(path)

    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    assert issubclass(CheckpointError, ValueError)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"version": 1})

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", failing_replace)
    with pytest.raises(OSError):
        save_checkpoint(path, {"version": 2})
    monkeypatch.undo()
    assert load_checkpoint(path)["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left


# -- learning-rate scaling, configs, logging, Atari set-up ---------------------------------------


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


@pytest.mark.parametrize("config_cls", [PPOConfig, A2CConfig])
def test_every_config_field_is_documented(config_cls):
    docs = config_help(config_cls)
    missing = [f.name for f in dataclasses.fields(config_cls) if not docs.get(f.name)]
    assert not missing


def test_run_logger_files_and_resume(tmp_path):
    logger = RunLogger(tmp_path, 300, progress=False)
    for step in (100, 200, 300):
        logger.log(step, {"charts/episodic_return": step / 10, "losses/value_loss": 1.0})
    assert logger.close() == tmp_path / "learning_curve.png"
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    assert any((tmp_path / "tb").iterdir())

    resumed = RunLogger(tmp_path, 400, use_tensorboard=False, progress=False, resume_step=200)
    resumed.log(300, {"charts/SPS": 5.0})  # a new column rewrites the header
    resumed.close()
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [100, 200, 300]
    assert rows[-1]["charts/SPS"] == "5.0" and rows[-1]["charts/episodic_return"] == ""


def test_atari_setup_uses_gymnasium_wrappers():
    pytest.importorskip("ale_py")
    envs = make_env_for_training("BreakoutNoFrameskip-v4", 1, backend="serial", seed=0)
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
        env = envs.envs[0]
        names = []
        while hasattr(env, "env"):
            names.append(type(env).__name__)
            env = env.env
        for wrapper in ("FrameStackObservation", "ClipReward", "EpisodicLifeEnv",
                        "AtariPreprocessing", "RecordEpisodeStatistics"):  # fmt: skip
            assert wrapper in names
    finally:
        envs.close()
    evaluation = make_env_for_training(
        "BreakoutNoFrameskip-v4", 1, backend="serial", training=False
    )
    try:
        env = evaluation.envs[0]
        wrappers = set()
        while hasattr(env, "env"):
            wrappers.add(type(env).__name__)
            env = env.env
        assert not wrappers & {"ClipReward", "EpisodicLifeEnv"}
    finally:
        evaluation.close()


def test_life_loss_ends_the_episode_but_not_the_game():
    pytest.importorskip("ale_py")
    from vecaccel.manager import register_envs

    register_envs()
    env = EpisodicLifeEnv(
        gym.wrappers.AtariPreprocessing(gym.make("BreakoutNoFrameskip-v4"), noop_max=0)
    )
    env.reset(seed=0)
    lives = env.unwrapped.ale.lives()
    for _ in range(2000):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated:
            break
    assert terminated and not env.game_over
    assert env.unwrapped.ale.lives() == lives - 1
    env.reset()
    assert env.unwrapped.ale.lives() == lives - 1  # the same game goes on
    env.close()


# -- config values, multi-axis Box actions, non-finite losses ----------------------------------


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


class _MatrixActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(
        np.array([[-1, -2], [-3, -4]], np.float32), np.array([[1, 2], [3, 4]], np.float32)
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, np.float32)), action
        self.t += 1
        reward = -float(np.abs(action).sum())
        return np.full(3, 0.1 * self.t, np.float32), reward, False, self.t >= 5, {}


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_multi_axis_box_actions_batch_clip_save_load_predict(algo, tmp_path):
    """Box(2, 2) actions: [T, B, 2, 2] in the batch, clipped per element to low/high (which
    differ by element) before the env, and predict, save and load keep the shape."""
    envs = vecaccel.make_vec([_MatrixActionEnv] * 3, backend="serial", autoreset_mode="SameStep")
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
        space = _MatrixActionEnv.action_space
        assert ((several >= space.low) & (several <= space.high)).all()
        loaded = algo.load(agent.save(tmp_path / "agent.pt"))
        np.testing.assert_array_equal(
            loaded.predict(np.zeros(3, np.float32), deterministic=True)[0], one
        )
    finally:
        envs.close()


class _NanRewardEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, nan_at: int = 20) -> None:
        self.nan_at = nan_at
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        self.steps += 1
        reward = float("nan") if self.steps == self.nan_at else 1.0
        return np.zeros(2, np.float32), reward, False, self.t >= 10, {}


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda c: c.__name__)
def test_nan_loss_stops_before_the_step_and_writes_no_checkpoint(algo, tmp_path):
    """A NaN reward in the third rollout: the error names the update and the step, the
    parameters are those of the last good step (finite), and no checkpoint is written after it."""
    envs = vecaccel.make_vec([_NanRewardEnv] * 2, backend="serial", autoreset_mode="SameStep")
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
