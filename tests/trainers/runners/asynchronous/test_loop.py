"""The asynchronous runner: one loop for every algorithm, fed by its family's feed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vecaccel.trainers import A2C, C51, DQN, PPO, AsyncRunner, Rainbow
from vecaccel.trainers.algos.off_policy.feed import ReplayFeed
from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm
from vecaccel.trainers.algos.on_policy.feed import RolloutFeed
from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME, load_checkpoint
from vecaccel.trainers.cli import async_flags
from vecaccel.trainers.runners.asynchronous import loop as async_loop
from vecaccel.trainers.runners.asynchronous import runner as async_runner

torch.set_num_threads(1)

RUNTIME = dict(progress=False, tensorboard=False, torch_threads=1, backend="serial", seed=0)


@pytest.mark.parametrize("cls", [PPO, A2C, DQN, C51, Rainbow], ids=lambda c: c.__name__)
def test_every_algorithm_trains_async_through_the_one_loop(
    cls: type, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``from vecaccel.trainers import AsyncRunner`` runs each of the five algorithms, through
    the one loop fed by its family's feed."""
    feeds: list[Any] = []
    run_async = async_loop.run_async

    def spy(agent: Any, feed: Any, *args: Any, **kwargs: Any) -> Any:
        feeds.append(feed)
        return run_async(agent, feed, *args, **kwargs)

    monkeypatch.setattr(async_runner, "run_async", spy)
    if issubclass(cls, OnPolicyAlgorithm):
        agent = cls(None, env_id="CartPole-v1", num_envs=2, num_steps=8, hidden_sizes=(16,),
                    run_dir=str(tmp_path), **RUNTIME)  # fmt: skip
        runner = AsyncRunner(agent)
        assert runner.run(32, context="fork") is agent
        stats = runner.stats
        assert stats.updates == agent.num_updates == 2
        assert isinstance(feeds[0], RolloutFeed)
    else:
        agent = cls(
            env=None, env_id="CartPole-v1", batch_size=8, buffer_size=400, learning_starts=64,
            num_envs=2, hidden_sizes=(16,), run_dir=str(tmp_path), **RUNTIME,
        )  # fmt: skip
        runner = AsyncRunner(agent)
        assert runner.run(200, context="fork") is agent
        stats = runner.stats
        assert stats.updates == agent.num_updates > 0
        assert agent.replay_ratio == pytest.approx(stats.replay_ratio)
        assert isinstance(feeds[0], ReplayFeed)
    assert len(feeds) == 1
    assert stats.env_steps == agent.global_step
    assert "charts/policy_lag" in agent.logger.history[-1]
    assert agent.async_run and agent.envs is None  # the collector process had them
    # the checkpoint records the mode, so that a resumed run goes on asynchronously
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["async"] is True


def test_the_command_lines_entry_point_trains_and_records_the_async_options(tmp_path: Any) -> None:
    code = async_flags.train(
        PPO, "CartPole-v1", 32, run_dir=str(tmp_path), weight_sync_period=2,
        num_envs=2, num_steps=8, **RUNTIME,
    )  # fmt: skip
    assert code == 0
    assert PPO.load(tmp_path).async_options == {"weight_sync_period": 2, "fixed_lag": False}


def test_train_async_refuses_a_weight_sync_period_below_one() -> None:
    with pytest.raises(ValueError, match="weight_sync_period must be at least 1, got 0"):
        async_flags.train(
            PPO, "CartPole-v1", 32, weight_sync_period=0, num_envs=2, num_steps=8, **RUNTIME
        )
