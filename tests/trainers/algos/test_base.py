"""One public API for every algorithm, declared on the base and in SB3's shape: ``learn``,
``predict``, ``save``, ``load`` and the constructor, checked for every algorithm the registry
lists, the callbacks ``learn`` takes (ours and SB3's ``BaseCallback``), and the one gradient step
every update takes, which refuses a non-finite loss."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
import torch
from toy_envs import NanObsEnv, NanRewardEnv

import vecaccel
from vecaccel.trainers import A2C, PPO
from vecaccel.trainers.algos.base import Algorithm
from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm
from vecaccel.trainers.checkpoints.format import load_checkpoint
from vecaccel.trainers.config import registry
from vecaccel.trainers.nets.normalization import NonFiniteInputError
from vecaccel.trainers.runners.callbacks import CALLBACK_KEYS

torch.set_num_threads(1)

NAMES = registry.names()
API = ("__init__", "learn", "predict", "save", "load")

#: tiny runs of every algorithm on CartPole: on-policy 8-step batches of 2 envs (PQN's in 4
#: minibatches, its default 32 being more than the batch), off-policy 2 envs updating from the
#: 16th step
SETTINGS: dict[str, dict[str, Any]] = {
    "on_policy": dict(num_envs=2, num_steps=8),
    "off_policy": dict(num_envs=2, learning_starts=16, batch_size=8, buffer_size=500),
    "pqn": dict(num_envs=2, num_steps=8, num_minibatches=4),
}


def make(name: str, **extra: Any) -> Algorithm:
    cls = registry.get(name).load_class()
    family = "on_policy" if issubclass(cls, OnPolicyAlgorithm) else "off_policy"
    settings = SETTINGS.get(name, SETTINGS[family])
    return cls(
        "CartPole-v1",
        backend="serial",
        seed=0,
        progress=False,
        tensorboard=False,
        **settings,
        **extra,
    )


def vector_steps_per_iteration(agent: Algorithm) -> int:
    return agent.config.num_steps if isinstance(agent, OnPolicyAlgorithm) else 1


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("method", API)
def test_every_algorithm_has_the_bases_api(name: str, method: str) -> None:
    cls = registry.get(name).load_class()
    assert inspect.signature(getattr(cls, method)) == inspect.signature(
        getattr(Algorithm, method)
    ), f"{cls.__name__}.{method} differs from Algorithm.{method}"
    # declared once: no algorithm or family overrides it
    for klass in cls.__mro__[: cls.__mro__.index(Algorithm)]:
        assert method not in vars(klass), f"{klass.__name__} overrides {method}"


def test_the_api_is_sb3s_shape() -> None:
    def parameters(function: Any) -> list[tuple[str, Any, Any]]:
        return [
            (p.name, p.kind, p.default)
            for p in inspect.signature(function).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]

    positional, keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    learn = parameters(Algorithm.learn)
    assert learn[:3] == [
        ("self", positional, inspect.Parameter.empty),
        ("total_timesteps", positional, None),
        ("callback", positional, None),
    ]
    assert {(n, k) for n, k, _ in learn[3:]} >= {
        ("reset_num_timesteps", keyword),
        ("progress_bar", keyword),
        ("mode", keyword),
    }
    assert "total_steps" not in {n for n, _, _ in learn}
    assert parameters(Algorithm.predict) == [
        ("self", positional, inspect.Parameter.empty),
        ("observation", positional, inspect.Parameter.empty),
        ("state", positional, None),
        ("episode_start", positional, None),
        ("deterministic", positional, False),
    ]
    init = inspect.signature(Algorithm.__init__).parameters
    assert list(init)[:2] == ["self", "env"]
    assert all(p.kind is not positional for name, p in init.items() if name not in ("self", "env"))
    load = inspect.signature(Algorithm.load)
    assert list(load.parameters)[:2] == ["path", "env"]
    assert load.parameters["device"].kind is keyword
    assert load.return_annotation == "Self"
    assert inspect.signature(Algorithm.learn).return_annotation == "Self"


@pytest.mark.parametrize("name", NAMES)
def test_a_positional_callback_is_called_once_per_iteration_with_the_same_keys(name) -> None:
    seen: list[dict[str, Any]] = []
    agent = make(name)
    try:
        agent.learn(64, lambda agent, metrics: seen.append(metrics))
        per_iteration = agent.config.num_envs * vector_steps_per_iteration(agent)
    finally:
        agent.close()
    assert len(seen) == 64 // per_iteration
    assert [m["global_step"] for m in seen] == [per_iteration * (i + 1) for i in range(len(seen))]
    for metrics in seen:
        assert set(CALLBACK_KEYS) <= metrics.keys()
    assert seen[-1]["charts/updates"] == agent.num_updates > 0
    assert any(key.startswith("losses/") for key in seen[-1])


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_predict_takes_sb3s_positional_form(name) -> None:
    agent = make(name)
    try:
        obs = np.stack([agent.observation_space.sample() for _ in range(5)])
        actions, state = agent.predict(obs, None, None, True)
        assert state is None and actions.shape == (5,)
        np.testing.assert_array_equal(actions, agent.predict(obs, deterministic=True)[0])
        single, _ = agent.predict(obs[0], None, None, True)
        assert np.ndim(single) == 0 and single == actions[0]
    finally:
        agent.close()


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_a_loaded_agent_predicts_with_the_saved_normalisation(name, tmp_path) -> None:
    """The statistics come with the model: a loaded agent acts on the observations normalised
    as the trained one did, and predicting counts nothing."""
    agent = make(name, norm_obs=True, norm_reward=True)
    obs = np.random.default_rng(0).normal(0.0, 2.0, (6, 4)).astype(np.float32)
    try:
        agent.learn(64)
        assert agent.normalizer.obs.count == agent.normalizer.returns.count == 64
        expected, _ = agent.predict(obs, deterministic=True)
        path = agent.save(tmp_path / "agent.pt")
    finally:
        agent.close()
    loaded = type(agent).load(path)
    saved = agent.normalizer.state_dict()
    np.testing.assert_array_equal(loaded.normalizer.obs.data, agent.normalizer.obs.data)
    np.testing.assert_array_equal(loaded.normalizer.returns.data, agent.normalizer.returns.data)
    actions, _ = loaded.predict(obs, deterministic=True)
    np.testing.assert_array_equal(actions, expected)
    normalized = loaded.normalizer.normalize_obs(obs)
    assert not np.allclose(normalized, obs)
    np.testing.assert_array_equal(actions, loaded.act_for_predict(normalized, True))
    single, _ = loaded.predict(obs[0], deterministic=True)
    assert single == expected[0]
    assert torch.equal(loaded.normalizer.state_dict()["obs"]["mean"], saved["obs"]["mean"])
    assert loaded.normalizer.obs.count == 64  # predicting counted nothing


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_rewards_are_learnt_scaled_while_the_logged_returns_stay_the_envs_own(name) -> None:
    """CartPole pays 1 a step: with scaled rewards the rollouts (the replay buffer) hold other
    values, while each logged episodic return is still its episode's length."""
    agent = make(name, norm_reward=True, log_every_steps=0)
    learnt: list[np.ndarray] = []
    update = agent.update

    def keep_rewards(batch, *args):
        if isinstance(agent, OnPolicyAlgorithm):
            learnt.append(batch.rewards.detach().cpu().numpy().copy())
        return update(batch, *args)

    agent.update = keep_rewards  # type: ignore[method-assign]
    try:
        agent.learn(400)
        rows = [row for row in agent.logger.history if row.get("charts/episodic_return")]
        if not isinstance(agent, OnPolicyAlgorithm):
            stored = agent.buffer.arrays["rewards"]
            learnt.append(stored[stored != 0])  # CartPole's scaled rewards: never 0
    finally:
        agent.close()
    assert rows, "no episode ended"
    for row in rows:
        assert row["charts/episodic_return"] == pytest.approx(row["charts/episodic_length"])
    rewards = np.concatenate([r.reshape(-1) for r in learnt])
    assert len(rewards) and not np.allclose(rewards, 1.0)
    assert np.all(np.abs(rewards) <= agent.config.clip_reward)


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_a_nan_observation_stops_the_run_naming_the_env_before_it_is_counted(name) -> None:
    import functools

    env_fns = [NanObsEnv, functools.partial(NanObsEnv, nan_at=5)]
    envs = vecaccel.make_vec(env_fns, backend="serial", autoreset_mode="SameStep")
    cls = registry.get(name).load_class()
    settings = SETTINGS["on_policy" if issubclass(cls, OnPolicyAlgorithm) else "off_policy"]
    agent = cls(envs, norm_obs=True, seed=0, progress=False, tensorboard=False, **settings)
    try:
        with pytest.raises(NonFiniteInputError, match="env 1 returned a non-finite observation"):
            agent.learn(64)
        assert agent.normalizer.obs.count == 2 * 4  # the four steps before it, every env
        assert np.isfinite(agent.normalizer.obs.data).all()
    finally:
        envs.close()


@pytest.mark.parametrize("name", ["a2c", "rainbow", "pqn"])
def test_load_returns_the_class_and_takes_a_device(name, tmp_path) -> None:
    agent = make(name)
    try:
        agent.learn(32)
        path = agent.save(tmp_path / "agent.pt")
    finally:
        agent.close()
    cls = type(agent)
    loaded = cls.load(path, device="cpu")
    assert type(loaded) is cls and loaded.global_step == 32
    assert loaded.device == torch.device("cpu")


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_the_budget_is_named_total_timesteps(name) -> None:
    agent = make(name)
    try:
        agent.learn(total_timesteps=16)
        assert agent.global_step == 16
    finally:
        agent.close()


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_reset_num_timesteps_counts_from_zero_or_goes_on(name) -> None:
    agent = make(name)
    try:
        agent.learn(32)
        agent.learn(16)
        assert agent.global_step == 16
        agent.learn(16, reset_num_timesteps=False)
        assert agent.global_step == 32
    finally:
        agent.close()


def test_progress_bar_is_for_the_run_only() -> None:
    agent = make("a2c")
    try:
        agent.learn(16, progress_bar=True)
        assert agent.progress is False
    finally:
        agent.close()


def test_a_callback_that_is_not_callable_is_refused() -> None:
    agent = make("ppo")
    try:
        with pytest.raises(TypeError, match="BaseCallback"):
            agent.learn(16, callback=3)
    finally:
        agent.close()


# -- SB3's callbacks as they are ---------------------------------------------------------------


def sb3_recorder(stop_after_steps: int | None = None) -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class Recorder(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[str] = []
            self.timesteps: list[int] = []

        def _on_training_start(self) -> None:
            self.events.append("training_start")
            self.env = self.training_env

        def _on_rollout_start(self) -> None:
            self.events.append("rollout_start")

        def _on_step(self) -> bool:
            self.events.append("step")
            self.timesteps.append(self.num_timesteps)
            assert {"rewards", "dones"} <= self.locals.keys()
            return stop_after_steps is None or self.n_calls < stop_after_steps

        def _on_rollout_end(self) -> None:
            self.events.append("rollout_end")

        def _on_training_end(self) -> None:
            self.events.append("training_end")

    return Recorder()


@pytest.mark.parametrize("name", ["a2c", "ppo", "dqn", "c51", "rainbow", "pqn"])
def test_an_sb3_callback_is_called_where_sb3_calls_it(name) -> None:
    pytest.importorskip("stable_baselines3")
    callback = sb3_recorder()
    agent = make(name)
    try:
        agent.learn(32, callback)
        steps = vector_steps_per_iteration(agent)
        num_envs = agent.config.num_envs
    finally:
        agent.close()
    assert callback.model is agent and callback.env is not None
    iterations = 32 // (num_envs * steps)
    one = ["rollout_start", *["step"] * steps, "rollout_end"]
    assert callback.events == ["training_start", *one * iterations, "training_end"]
    assert callback.n_calls == iterations * steps  # vector steps, as SB3 counts them
    assert callback.num_timesteps == 32


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_an_sb3_callback_stops_training_before_the_update(name) -> None:
    pytest.importorskip("stable_baselines3")
    callback = sb3_recorder(stop_after_steps=1)
    agent = make(name)
    try:
        agent.learn(1_000, callback)
        collected = agent.global_step
        updates = agent.num_updates
    finally:
        agent.close()
    assert callback.events[-2:] == ["step", "training_end"] and callback.n_calls == 1
    assert updates == 0 and 0 < collected < 1_000


def test_sb3_and_our_callbacks_together() -> None:
    pytest.importorskip("stable_baselines3")
    ours: list[int] = []
    sb3 = sb3_recorder()
    agent = make("a2c")
    try:
        agent.learn(32, [sb3, lambda agent: ours.append(agent.global_step)])
    finally:
        agent.close()
    assert ours == [16, 32] and sb3.n_calls == 16


# -- one gradient step, the base's ------------------------------------------------------------


@pytest.mark.parametrize("name", ["dqn", "c51", "rainbow"])
@pytest.mark.parametrize("max_grad_norm", [10.0, 0.0])
def test_the_dqn_family_refuses_a_non_finite_step(name, max_grad_norm) -> None:
    """A NaN observation makes the loss NaN: the base's gradient step raises before the optimizer
    would make every parameter NaN, with clipping or without."""
    from vecaccel.trainers.replay.buffer import ReplaySample

    agent = make(name, max_grad_norm=max_grad_norm)
    try:
        agent.learn(32)
        _, batch = agent.sample_batch(0.5)
        before = [p.detach().clone() for p in agent.q_network.parameters()]
        poisoned = batch._replace(obs=np.full_like(batch.obs, np.nan))
        assert isinstance(poisoned, ReplaySample)
        with pytest.raises(FloatingPointError, match="non-finite loss"):
            agent.update(poisoned)
        after = list(agent.q_network.parameters())
        assert all(torch.equal(a, b) for a, b in zip(before, after))
    finally:
        agent.close()


@pytest.mark.parametrize("algo", [PPO, A2C], ids=lambda c: c.__name__)
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


@pytest.mark.parametrize("name", NAMES)
def test_every_update_takes_the_bases_gradient_step(name, monkeypatch) -> None:
    agent = make(name)
    steps: list[float] = []
    step = agent.backward_step

    def counted(loss: Any, max_grad_norm: float) -> Any:
        steps.append(max_grad_norm)
        return step(loss, max_grad_norm)

    monkeypatch.setattr(agent, "backward_step", counted)
    try:
        agent.learn(32)
    finally:
        agent.close()
    assert steps and set(steps) == {agent.config.max_grad_norm}
    assert "backward_step" not in vars(type(agent)) and all(
        "backward_step" not in vars(klass)
        for klass in type(agent).__mro__[: type(agent).__mro__.index(Algorithm)]
    )


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_sb3s_own_eval_and_checkpoint_callbacks_work(name, tmp_path) -> None:
    """SB3's EvalCallback evaluates with the agent's predict and logs through its logger;
    CheckpointCallback saves with its save."""
    pytest.importorskip("stable_baselines3")
    import gymnasium as gym
    from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    eval_env = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1"))])
    evaluate = EvalCallback(eval_env, n_eval_episodes=2, eval_freq=8, log_path=str(tmp_path))
    save = CheckpointCallback(save_freq=8, save_path=str(tmp_path / "saves"), name_prefix=name)
    agent = make(name, run_dir=str(tmp_path / "run"))
    try:
        with pytest.warns(UserWarning, match="not of the same type"):
            agent.learn(64, [evaluate, save])
    finally:
        agent.close()
        eval_env.close()
    assert evaluate.n_calls == 32 and len(evaluate.evaluations_results) == 4
    assert any("eval/mean_reward" in row for row in agent.logger.history)
    saved = sorted((tmp_path / "saves").iterdir())
    assert len(saved) == 4
    loaded = type(agent).load(saved[-1])
    assert loaded.global_step == agent.global_step


def test_a_misspelled_setting_is_one_line_naming_the_setting_it_meant():
    from vecaccel.trainers import PPO

    with pytest.raises(TypeError) as caught:
        PPO("CartPole-v1", learning_rat=1e-3)
    assert str(caught.value) == "unknown PPO setting 'learning_rat'; did you mean 'learning_rate'?"
    # with nothing close, the settings there are
    with pytest.raises(TypeError, match=r"^unknown PPO setting 'gpu'; its settings: env_id, "):
        PPO("CartPole-v1", gpu=True)


@pytest.mark.parametrize("name", NAMES)
def test_an_agent_built_from_env_id_refuses_an_unknown_id_as_make_vec_does(name) -> None:
    """``env=None`` with ``env_id=``: the envs are made later (by ``learn``, or the asynchronous
    runner's collector), so the id is checked when the agent is built, in the caller."""
    import multiprocessing

    cls = registry.get(name).load_class()
    with pytest.raises(ValueError) as layer:
        vecaccel.make_vec("CartPol-v1", 2)
    with pytest.raises(ValueError) as agent:
        cls(None, env_id="CartPol-v1", backend="shm", num_envs=2, tensorboard=False)
    assert str(agent.value) == str(layer.value)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_a_loaded_agent_makes_no_env_of_its_id(name, tmp_path) -> None:
    """A checkpoint loads to predict in a process where its env is not registered: the saved
    spaces build the networks, and the id is checked only where envs are made."""
    import gymnasium as gym

    env_id = "VecaccelLoadTest-v0"
    gym.register(env_id, entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        cls = registry.get(name).load_class()
        settings = SETTINGS["on_policy" if issubclass(cls, OnPolicyAlgorithm) else "off_policy"]
        agent = cls(env_id, backend="serial", seed=0, progress=False, tensorboard=False, **settings)
        try:
            agent.learn(16)
            path = agent.save(tmp_path / "agent.pt")
            obs, _ = agent.envs.reset(seed=0)
        finally:
            agent.close()
    finally:
        del gym.registry[env_id]
    loaded = cls.load(path)
    assert loaded.env_id == env_id
    assert loaded.predict(obs, deterministic=True)[0].shape == (2,)
