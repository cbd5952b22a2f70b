"""The two runners, SyncRunner and AsyncRunner, and the public interface they drive every
algorithm through."""

from __future__ import annotations

from typing import Any

import pytest

from vecaccel.trainers import A2C, C51, DQN, PPO, PQN, AsyncRunner, Rainbow, SyncRunner
from vecaccel.trainers.algos.base import Algorithm
from vecaccel.trainers.algos.off_policy import OffPolicyAlgorithm
from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm
from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME, load_checkpoint
from vecaccel.trainers.runners import sync as runner

ON_POLICY = dict(num_envs=2, num_steps=8, hidden_sizes=(8,))
OFF_POLICY = dict(
    num_envs=2,
    hidden_sizes=(8,),
    batch_size=8,
    buffer_size=256,
    learning_starts=32,
    num_atoms=11,
    v_min=0.0,
    v_max=20.0,
)
COMMON = dict(backend="serial", seed=0, device="cpu", torch_threads=1, tensorboard=False)
ALGORITHMS = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "c51": C51, "rainbow": Rainbow, "pqn": PQN}


def settings_of(algo: str) -> dict[str, Any]:
    cls = ALGORITHMS[algo]
    settings = ON_POLICY if issubclass(cls, OnPolicyAlgorithm) else OFF_POLICY
    if algo == "dqn":
        settings = {k: v for k, v in settings.items() if k not in ("num_atoms", "v_min", "v_max")}
    if algo == "pqn":  # its default 32 minibatches would not fit the 16-step batch
        settings = {**settings, "num_minibatches": 4}
    return {**settings, **COMMON}


def make(algo: str, **extra: Any) -> Algorithm:
    return ALGORITHMS[algo]("CartPole-v1", **settings_of(algo), **extra)


def make_without_envs(algo: str, **extra: Any) -> Algorithm:
    """An agent for the asynchronous runner: its collector process builds the envs."""
    return ALGORITHMS[algo](None, env_id="CartPole-v1", **settings_of(algo), **extra)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_sync_runner_runs_every_algorithm(algo):
    """``from vecaccel.trainers import SyncRunner`` runs each of the six algorithms (its twin,
    AsyncRunner, in asynchronous/test_loop.py)."""
    agent = make(algo)
    try:
        assert SyncRunner(agent).run(64) is agent
        assert agent.global_step >= 64 and agent.num_updates > 0
        assert not agent.async_run
    finally:
        agent.close()


@pytest.mark.parametrize("algo", ["a2c", "rainbow", "pqn"])
def test_learn_in_async_mode_is_the_async_runner(algo):
    agent = make_without_envs(algo)
    assert agent.learn(64, mode="async", context="fork") is agent
    assert agent.async_run and agent.global_step >= 64 and agent.num_updates > 0


def test_learn_refuses_an_unknown_mode_and_options_that_do_not_fit():
    agent = make_without_envs("ppo")
    with pytest.raises(ValueError, match="mode must be one of 'sync', 'async'"):
        agent.learn(32, mode="threads")
    with pytest.raises(ValueError, match="no asynchronous options"):
        agent.learn(32, fixed_lag=True)


def test_the_runners_train_any_algorithm_and_nothing_else():
    class NotAnAlgorithm:
        checkpoint_key = "on_policy"  # a section name alone does not make an algorithm

    for runner_cls in (SyncRunner, AsyncRunner):
        with pytest.raises(TypeError, match="trains an Algorithm, got NotAnAlgorithm"):
            runner_cls(NotAnAlgorithm()).run(8)
    assert issubclass(DQN, OffPolicyAlgorithm) and issubclass(C51, OffPolicyAlgorithm)
    assert issubclass(PPO, OnPolicyAlgorithm) and not issubclass(PPO, OffPolicyAlgorithm)


def test_the_runners_and_the_checkpoint_code_name_no_family():
    from pathlib import Path

    import vecaccel.trainers as trainers

    root = Path(trainers.__file__).parent
    words = ("OnPolicy", "OffPolicy", "on_policy", "off_policy")
    for folder in ("runners", "checkpoints", "cli"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            assert not any(word in text for word in words), path


def test_the_async_runner_needs_an_env_id_for_its_sampler():
    import gymnasium as gym

    envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")
    agent = PPO(envs, **settings_of("ppo"))
    agent.config.env_id = None  # a vector env of its own: the sampler could not rebuild it
    try:
        with pytest.raises(ValueError, match="env_id"):
            AsyncRunner(agent).run(16, context="fork")
    finally:
        envs.close()


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_learns_through_the_sync_runner(algo, monkeypatch):
    runs: list[Algorithm] = []
    loggers: list[Any] = []
    run, open_logger = runner.SyncRunner.run, runner.open_run_logger

    def spy_run(self, *args, **kwargs):
        runs.append(self.agent)
        return run(self, *args, **kwargs)

    def spy_logger(*args, **kwargs):
        loggers.append(open_logger(*args, **kwargs))
        return loggers[-1]

    monkeypatch.setattr(runner.SyncRunner, "run", spy_run)
    monkeypatch.setattr(runner, "open_run_logger", spy_logger)
    agent = make(algo)
    try:
        assert agent.learn(64) is agent
        assert runs == [agent]
        assert len(loggers) == 1 and agent.logger is loggers[0]
        assert agent.global_step >= 64 and agent.target_steps == agent.global_step
    finally:
        agent.close()


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_the_runner_checkpoints_every_algorithm_at_the_end(algo, tmp_path):
    agent = make(algo, run_dir=tmp_path)
    try:
        agent.learn(64)
    finally:
        agent.close()
    state = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert state["global_step"] == agent.global_step
    assert (tmp_path / "metrics.csv").exists()


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_callbacks_get_the_agent_and_the_metrics_and_can_stop(algo):
    seen: list[tuple[Algorithm, dict[str, Any]]] = []

    def callback(agent: Algorithm, metrics: dict[str, Any]) -> bool:
        seen.append((agent, metrics))
        return len(seen) < 3

    agent = make(algo)
    try:
        agent.learn(10_000, callback=callback)
        assert len(seen) == 3 and all(entry[0] is agent for entry in seen)
        assert all(isinstance(metrics, dict) for _, metrics in seen)
        if isinstance(agent, OnPolicyAlgorithm):  # every update's metrics
            assert all("charts/SPS" in metrics for _, metrics in seen)
        assert agent.global_step < 10_000
    finally:
        agent.close()


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_one_parameter_callbacks_still_work(algo):
    calls: list[int] = []

    def callback(agent: Algorithm) -> bool:
        calls.append(agent.global_step)
        return len(calls) < 2

    agent = make(algo)
    try:
        agent.learn(10_000, callback=callback)
        assert len(calls) == 2
    finally:
        agent.close()


SHARED = (
    "algo_name",
    "checkpoint_key",
    "config_cls",
    "begin_run",
    "async_feed",
    "prepare_async",
    "checkpoint_section",
    "checkpoint_target_steps",
    "gather_rank_checkpoint",
    "from_checkpoint",
    "learn",
    "update",
    "write_checkpoint",
    "save",
    "load",
    "predict",
    "close",
    "set_budget",
    "set_target_steps",
    "restart_seed",
    "make_envs",
)
ON_POLICY_METHODS = (
    "attach_env",
    "to_model_actions",
    "sampler_policy",
    "make_sampler",
    "reset_envs",
    "acting",
    "progress_remaining",
    "apply_learning_rate",
)
OFF_POLICY_METHODS = (
    "attach_env",
    "attach_spaces",
    "build_networks",
    "act",
    "epsilon",
    "buffer_kwargs",
    "make_buffer",
    "sample_batch",
    "update_target",
    "restore_replay",
    "take_resume_state",
    "set_resume_point",
    "collect",
    "start_episodes",
)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_has_the_public_interface_of_its_family(algo):
    cls = ALGORITHMS[algo]
    assert issubclass(cls, Algorithm) and cls.algo_name == algo
    assert cls.checkpoint_key in ("on_policy", "off_policy")
    on_policy = issubclass(cls, OnPolicyAlgorithm)
    assert on_policy != issubclass(cls, OffPolicyAlgorithm)
    family = ON_POLICY_METHODS if on_policy else OFF_POLICY_METHODS
    missing = [name for name in SHARED + family if not hasattr(cls, name)]
    assert not missing, missing


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_the_attributes_a_runner_reads_are_there_after_construction(algo):
    agent = make(algo)
    try:
        for name in (
            "config",
            "device",
            "world_size",
            "is_main",
            "run_dir",
            "progress",
            "tensorboard",
            "envs",
            "observation_space",
            "action_space",
            "action_start",
            "global_step",
            "num_updates",
            "target_steps",
            "learning_rate",
            "lr_scale",
            "logger",
            "elapsed_before",
            "async_run",
            "async_options",
            "env_id",
        ):
            getattr(agent, name)
        assert agent.envs is not None and agent.num_updates == 0 and agent.global_step == 0
        assert agent.run_dir is None and agent.env_id == "CartPole-v1"
        assert isinstance(agent.restart_seed(), int)
    finally:
        agent.close()


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_callbacks_run_in_async_mode_once_per_turn(algo):
    from vecaccel.trainers.runners.callbacks import CALLBACK_KEYS

    seen: list[dict[str, Any]] = []

    def callback(agent: Algorithm, metrics: dict[str, Any]) -> bool:
        seen.append(metrics)
        return len(seen) < 3

    agent = make_without_envs(algo)
    try:
        agent.learn(10_000, callback=callback, mode="async", context="fork")
        assert len(seen) == 3, "a callback returning False ends the run after its turn"
        assert all(set(CALLBACK_KEYS) <= set(metrics) for metrics in seen)
        steps = [metrics["global_step"] for metrics in seen]
        assert steps == sorted(steps) and steps[-1] == agent.global_step < 10_000
    finally:
        agent.close()


def test_sb3_callbacks_run_in_async_mode():
    callbacks = pytest.importorskip("stable_baselines3.common.callbacks")

    class Counting(callbacks.BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rollouts = self.started = self.ended = 0

        def _on_training_start(self) -> None:
            self.started += 1

        def _on_rollout_start(self) -> None:
            self.rollouts += 1

        def _on_step(self) -> bool:
            assert "rewards" in self.locals and "dones" in self.locals
            return True

        def _on_training_end(self) -> None:
            self.ended += 1

    counting = Counting()
    agent = make_without_envs("ppo")
    try:
        agent.learn(32, callback=counting, mode="async", context="fork")
        assert (counting.started, counting.ended) == (1, 1)
        assert counting.rollouts == agent.num_updates and counting.n_calls == 32 // 2
    finally:
        agent.close()
