"""The replay feed of the asynchronous loop: the DQN family trains on chunks of steps a collector
process hands over, adds them to its own replay buffer in order and holds the replay ratio at
every chunk's end; a fixed lag repeats exactly, and a checkpoint carries the buffer a resumed run
goes on with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from helpers import TINY_ASYNC_DQN, train_async

from vecaccel.trainers.algos.dqn import DQN

torch.set_num_threads(1)


def test_async_replay_ratio_is_enforced_throughout(tmp_path) -> None:
    agent = DQN(env=None, env_id="CartPole-v1", run_dir=str(tmp_path), **TINY_ASYNC_DQN)
    stats = train_async(agent, 3_000)
    assert stats.env_steps == 3_000
    # every transition reached the buffer, those the sampler kept while the lock was taken too
    assert agent.buffer.steps_added == 3_000
    assert abs(stats.replay_ratio - 4.0) <= 0.4, stats
    assert agent.replay_ratio == pytest.approx(stats.replay_ratio)
    # the ratio logged during the run is within 10% once the sampler's allowed lead (16 updates'
    # worth, 64 steps here) is small against the steps since learning started
    logged = [
        (row["step"], float(row["charts/replay_ratio"]))
        for row in agent.logger.history
        if row.get("charts/replay_ratio") is not None and float(row["step"]) >= 1_500
    ]
    assert len(logged) >= 5
    for step, ratio in logged:
        assert abs(ratio - 4.0) <= 0.4, (step, ratio)
    assert stats.updates == pytest.approx((3_000 - 200) * 4.0 / 16, abs=1)
    assert (tmp_path / "checkpoint.pt").exists()
    reloaded = DQN.load(tmp_path / "checkpoint.pt")
    assert reloaded.num_updates == stats.updates
    assert "charts/policy_lag" in agent.logger.history[-1]
    # the collector process's vector env says where its time goes
    assert 0.0 <= agent.logger.history[-1]["stats/env_share"] <= 1.0


@pytest.mark.slow
def test_async_dqn_learns_cartpole() -> None:
    agent = DQN(
        env=None,
        env_id="CartPole-v1",
        preset="cartpole",
        seed=1,
        progress=False,
        tensorboard=False,
        torch_threads=1,
    )
    # a fixed lag makes the run repeat whatever the machine's load (seeds 1-6 end between 189
    # and 368 over the last ten episodes); throttled instead, the interleaving follows the load
    stats = train_async(agent, 20_000, fixed_lag=True)
    returns = [episode_return for _, episode_return, _ in agent.episode_log]
    # random play scores about 22; other CPUs may round differently, so ask for 100
    assert np.mean(returns[-10:]) >= 100, returns[-20:]
    assert abs(stats.replay_ratio - 32.0) <= 0.1


def _short_async_dqn(seed: int, **options: Any) -> tuple[Any, Any]:
    agent = DQN(
        env=None,
        env_id="CartPole-v1",
        seed=seed,
        prioritized=True,
        n_step=3,
        **{**TINY_ASYNC_DQN, "buffer_size": 800},
    )
    # forked samplers: three runs a test, and the default spawn is run by the tests around
    stats = train_async(agent, 1_200, context="fork", **options)
    return agent, stats


def test_async_dqn_with_a_fixed_lag_repeats_exactly() -> None:
    first, stats = _short_async_dqn(seed=5, fixed_lag=True)
    second, _ = _short_async_dqn(seed=5, fixed_lag=True)
    # the replay ratio holds exactly: (1200 - 200) steps x 4 / 16 per batch
    assert stats.env_steps == 1_200 and stats.updates == 250
    assert first.buffer.steps_added == 1_200
    # chunks of half the lead (16 updates' worth = 64 steps): acted on with the weights after
    # the chunk before the last, so 8 to 16 updates behind at each update
    assert 8 <= stats.mean_policy_lag <= 16
    a, b = first.q_network.state_dict(), second.q_network.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert first.episode_log == second.episode_log
    # the whole prioritized buffer too: transitions, sum tree and max priority
    mine, theirs = first.buffer.arrays, second.buffer.arrays
    assert "tree_sum" in mine
    assert all(np.array_equal(mine[name], theirs[name]) for name in mine)
    other, _ = _short_async_dqn(seed=6, fixed_lag=True)
    c = other.q_network.state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_async_dqn_checkpoint_holds_the_replay_buffer_and_resumes(tmp_path) -> None:
    """An async run's checkpoint carries its replay buffer; a loaded agent goes on from its
    counters with that buffer, training from its first steps (no second warm-up)."""
    agent = DQN(env=None, env_id="CartPole-v1", run_dir=str(tmp_path), **TINY_ASYNC_DQN)
    # forked collectors: the spawned one is test_async_replay_ratio_is_enforced_throughout's
    first = train_async(agent, 1_200, context="fork")
    saved = {name: array.copy() for name, array in agent.buffer.arrays.items()}
    assert first.updates == pytest.approx((1_200 - 200) * 4.0 / 16, abs=1)
    assert sorted(p.name for p in tmp_path.glob("checkpoint.replay-1200-*.npz"))

    resumed = DQN.load(tmp_path)
    assert resumed.async_run and resumed.global_step == 1_200
    assert resumed.num_updates == first.updates
    second = train_async(resumed, 800, reset_num_timesteps=False, context="fork")
    assert second.env_steps == 800 and resumed.global_step == 2_000
    # the restored buffer is sampled at once: the replay ratio holds from the first step on
    # (a warm-up of learning_starts would leave (800 - 200) * 4 / 16 = 150 updates)
    assert second.updates >= 800 * 4.0 / 16 - 8, second
    assert resumed.num_updates == first.updates + second.updates
    # the buffer went on from the saved one: the rows it has not written over since are there
    assert resumed.buffer.steps_added == 2_000
    arrays = resumed.buffer.arrays
    saved_cursor, cursor = int(saved["cursor"][0]), int(arrays["cursor"][0])
    assert cursor < saved_cursor  # the ring wrapped round (final observations take rows too)
    for name in ("actions", "rewards", "frames"):
        np.testing.assert_array_equal(
            arrays[name][cursor:saved_cursor], saved[name][cursor:saved_cursor], err_msg=name
        )
    # the CSV goes on from the checkpoint's step
    steps = [float(row["step"]) for row in resumed.logger.history]
    assert steps == sorted(steps) and steps[-1] == 2_000


class _EpisodeLoggingCartPole:
    """Factory of a 5-step CartPole that appends a line to ``log`` for every episode it ends
    (the env lives in the collector process)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, **kwargs: Any) -> Any:
        import gymnasium as gym

        log = self.log

        class EpisodeLog(gym.Wrapper):
            def step(self, action: Any) -> Any:
                result = super().step(action)
                if result[2] or result[3]:
                    with open(log, "a") as file:
                        file.write("end\n")
                return result

        return EpisodeLog(gym.make("CartPole-v1", max_episode_steps=5, **kwargs))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_async_dqn_logs_the_episodes_of_its_last_steps(seed: int, tmp_path) -> None:
    """The throttled sampler counts a step before its queue's feeder thread has sent the
    episodes it ended; the optimiser, seeing the budget done, drained the queue at once and
    could miss them if it drained the queue as soon as it saw the budget done. It waits for
    the sampler to exit, draining meanwhile."""
    import gymnasium as gym

    log = tmp_path / "episodes.txt"
    env_id = f"VecaccelEpisodeLoggingCartPole-{seed}-v0"
    gym.register(id=env_id, entry_point=_EpisodeLoggingCartPole(str(log)))  # fork inherits it
    try:
        agent = DQN(
            env=None,
            env_id=env_id,
            seed=seed,
            backend="serial",
            num_envs=2,
            # no update slows the end
            **{**TINY_ASYNC_DQN, "buffer_size": 400, "learning_starts": 1_000},
        )
        train_async(agent, 300, context="fork")
    finally:
        gym.registry.pop(env_id, None)
    assert len(agent.episode_log) == len(log.read_text().split())
