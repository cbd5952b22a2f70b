"""The on-policy feed of the asynchronous loop: whole rollouts from a rollout process through a
double buffer, one update per batch, the policy lag logged, a fixed lag that repeats exactly, and
the checkpoint a failed update leaves alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from helpers import train_async
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers import A2C, PPO
from vecaccel.trainers.algos.on_policy.feed import _next_log
from vecaccel.trainers.checkpoints.format import load_checkpoint

torch.set_num_threads(1)


@pytest.mark.slow
def test_async_ppo_learns_cartpole_and_logs_policy_lag() -> None:
    from vecaccel.trainers.algos.ppo import PRESETS

    config = {k: v for k, v in PRESETS["cartpole"].items() if k != "env_id"}
    agent = PPO(None, env_id="CartPole-v1", backend="serial", torch_threads=1, seed=1, **config)
    # a fixed lag makes the run repeat exactly: with the lag left to the scheduler, the last
    # returns of this run ended anywhere from 170 to 500 (40k steps), and once at 247 (60k)
    stats = train_async(agent, 60_000, fixed_lag=True)
    returns = [
        row["charts/episodic_return"]
        for row in agent.logger.history
        if row.get("charts/episodic_return") is not None
    ]
    assert np.mean(returns[-5:]) >= 300, returns[-10:]
    # double buffering with a fixed lag: each batch after the first was collected one update ago
    lags = [row["charts/policy_lag"] for row in agent.logger.history]
    assert lags[0] == 0 and set(lags[1:]) == {1}
    assert 0.5 <= stats.mean_policy_lag <= 1.0


def _short_async_ppo(seed: int, **options: Any) -> tuple[Any, Any]:
    agent = PPO(None, env_id="CartPole-v1", backend="serial", torch_threads=1, seed=seed, num_envs=2,
        num_steps=16, num_minibatches=2, update_epochs=2, progress=False, tensorboard=False,
    )  # fmt: skip
    # forked rollout processes: three runs a test, and the default spawn is run by the others
    stats = train_async(agent, 6 * 32, context="fork", **options)
    return agent, stats


def test_async_ppo_with_a_fixed_lag_repeats_exactly() -> None:
    first, stats = _short_async_ppo(seed=5, fixed_lag=True)
    second, _ = _short_async_ppo(seed=5, fixed_lag=True)
    assert stats.updates == 6
    lags = [row["charts/policy_lag"] for row in first.logger.history]
    assert lags == [0, 1, 1, 1, 1, 1]
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other, _ = _short_async_ppo(seed=6, fixed_lag=True)
    c = other.model.state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_the_action_servers_stamps_give_the_lag_of_each_halfs_older_first_row() -> None:
    """Alternating halves: the half that finishes a batch first acts once more with that
    batch's weights, and that action is its row 0 of the next batch; the env's stamps count it
    one update older than the rest."""
    T = 8
    agent = PPO(None, env_id="CartPole-v1", backend="action_server", num_workers=1,
        backend_options={"alternating": True}, torch_threads=1, seed=0, num_envs=4, num_steps=T,
        num_minibatches=2, update_epochs=1, progress=False, tensorboard=False,
    )  # fmt: skip
    train_async(agent, 6 * 4 * T, context="fork", fixed_lag=True)
    lags = [row["charts/policy_lag"] for row in agent.logger.history]
    # half the envs, one row of T, one update older
    assert lags == [0, 1] + [1 + 1 / (2 * T)] * 4
    # the rollout process's vector env says where its time goes
    shares = [row["stats/env_share"] + row["stats/policy_share"] + row["stats/transport_share"]
              for row in agent.logger.history]  # fmt: skip
    assert shares == pytest.approx([1.0] * 6)


def test_fixed_lag_needs_every_updates_weights() -> None:
    agent = PPO(None, env_id="CartPole-v1", backend="serial", num_envs=2)
    with pytest.raises(ValueError, match="weight_sync_period=1.*got weight_sync_period=2"):
        train_async(agent, 64, fixed_lag=True, weight_sync_period=2)


def test_the_async_runner_counts_on_policy_steps_from_zero_too() -> None:
    agent = A2C(None, env_id="CartPole-v1", backend="serial", num_envs=2, num_steps=8, seed=0,
                progress=False, tensorboard=False)  # fmt: skip
    try:
        agent.learn(32, mode="async", context="fork")
        agent.learn(16, mode="async", context="fork")
        assert agent.global_step == 16 and agent.num_updates == 1
        agent.learn(16, mode="async", context="fork", reset_num_timesteps=False)
        assert agent.global_step == 32 and agent.num_updates == 2
        # a budget is collected in whole rollouts: 20 steps are two batches of 16
        agent.learn(20, mode="async", context="fork")
        assert agent.global_step == 32 and agent.num_updates == 2
    finally:
        agent.close()


def test_single_rank_async_ppo_error_inside_an_update_keeps_the_last_checkpoint(tmp_path) -> None:
    """An update that fails after stepping the optimizer (backward_step's FloatingPointError on
    a later minibatch) leaves weights part-way through an update the counters do not count: the
    run's last checkpoint must stay as it was, as after an error on several ranks."""
    agent = PPO(None, env_id="CartPole-v1", backend="serial", num_envs=2, num_steps=16, update_epochs=1,
        num_minibatches=2, run_dir=str(tmp_path), hidden_sizes=(16,), torch_threads=1,
        seed=0, progress=False, tensorboard=False,
    )  # fmt: skip
    # forked: the rollout process under spawn is the command line's (cli/test_async_flags.py)
    train_async(agent, 64, poll_interval=0.001, context="fork")
    checkpoint = tmp_path / "checkpoint.pt"
    before = checkpoint.read_bytes()
    assert load_checkpoint(checkpoint)["num_updates"] == 2
    update, calls = agent.update, []

    def failing_update(batch, progress_remaining):
        calls.append(1)
        if len(calls) == 2:  # the second update of this call: one minibatch stepped, then NaN
            with torch.no_grad():
                for p in agent.model.parameters():
                    p.add_(1.0)
            raise FloatingPointError("update 3: the gradient norm is nan")
        return update(batch, progress_remaining)

    agent.update = failing_update
    with pytest.raises(FloatingPointError, match="gradient norm is nan"):
        train_async(agent, 96, poll_interval=0.001, context="fork")
    assert len(calls) == 2
    assert checkpoint.read_bytes() == before, "no checkpoint of a half-done update"


@given(st.integers(0, 10**9), st.integers(-5, 10**6))
@settings(max_examples=50, deadline=None, derandomize=True)
def test_the_next_row_is_due_at_the_first_multiple_of_the_period_after_the_step(step, every):
    due = _next_log(step, every)
    if every <= 0:  # every step logs
        assert due == step
    else:
        assert due > step and due % every == 0 and due - every <= step
