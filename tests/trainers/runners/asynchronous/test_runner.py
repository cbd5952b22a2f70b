"""Asynchronous training: a collector process and the optimiser share a replay buffer (DQN family)
or rollouts (PPO, A2C) in shared memory.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import TINY_ASYNC_DQN

from vecaccel.trainers import AsyncRunner
from vecaccel.trainers.algos.dqn import DQN
from vecaccel.trainers.runners.asynchronous.runner import AsyncStats

torch.set_num_threads(1)


def run_async(agent: Any, total_timesteps: int, **options: Any) -> AsyncStats:
    """``AsyncRunner(agent).run(total_timesteps, **options)``, and the stats it measured."""
    runner = AsyncRunner(agent)
    runner.run(total_timesteps, **options)
    assert runner.stats is not None
    return runner.stats


TINY = TINY_ASYNC_DQN


def test_async_replay_ratio_is_enforced_throughout(tmp_path) -> None:
    agent = DQN(env=None, env_id="CartPole-v1", run_dir=str(tmp_path), **TINY)
    stats = run_async(agent, 3_000)
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
    stats = run_async(agent, 20_000, fixed_lag=True)
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
        **{**TINY, "buffer_size": 800},
    )
    # forked samplers: three runs a test, and the default spawn is run by the tests around
    stats = run_async(agent, 1_200, context="fork", **options)
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


@pytest.mark.slow
def test_async_ppo_learns_cartpole_and_logs_policy_lag() -> None:
    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.ppo import PRESETS

    config = {k: v for k, v in PRESETS["cartpole"].items() if k != "env_id"}
    agent = PPO(None, env_id="CartPole-v1", backend="serial", torch_threads=1, seed=1, **config)
    # a fixed lag makes the run repeat exactly: with the lag left to the scheduler, the last
    # returns of this run ended anywhere from 170 to 500 (40k steps), and once at 247 (60k)
    stats = run_async(agent, 60_000, fixed_lag=True)
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
    from vecaccel.trainers import PPO

    agent = PPO(None, env_id="CartPole-v1", backend="serial", torch_threads=1, seed=seed, num_envs=2,
        num_steps=16, num_minibatches=2, update_epochs=2, progress=False, tensorboard=False,
    )  # fmt: skip
    # forked rollout processes: three runs a test, and the default spawn is run by the others
    stats = run_async(agent, 6 * 32, context="fork", **options)
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


def test_fixed_lag_needs_every_updates_weights() -> None:
    from vecaccel.trainers import PPO

    agent = PPO(None, env_id="CartPole-v1", backend="serial", num_envs=2)
    with pytest.raises(ValueError, match="weight_sync_period=1.*got weight_sync_period=2"):
        run_async(agent, 64, fixed_lag=True, weight_sync_period=2)


def test_async_dqn_checkpoint_holds_the_replay_buffer_and_resumes(tmp_path) -> None:
    """An async run's checkpoint carries its replay buffer; a loaded agent goes on from its
    counters with that buffer, training from its first steps (no second warm-up)."""
    agent = DQN(env=None, env_id="CartPole-v1", run_dir=str(tmp_path), **TINY)
    first = run_async(agent, 1_200)
    saved = {name: array.copy() for name, array in agent.buffer.arrays.items()}
    assert first.updates == pytest.approx((1_200 - 200) * 4.0 / 16, abs=1)
    assert sorted(p.name for p in tmp_path.glob("checkpoint.replay-1200-*.npz"))

    resumed = DQN.load(tmp_path)
    assert resumed.async_run and resumed.global_step == 1_200
    assert resumed.num_updates == first.updates
    second = run_async(resumed, 800, reset_num_timesteps=False)
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
            **{**TINY, "buffer_size": 400, "learning_starts": 1_000},  # no update slows the end
        )
        run_async(agent, 300, context="fork")
    finally:
        gym.registry.pop(env_id, None)
    assert len(agent.episode_log) == len(log.read_text().split())


def test_single_rank_async_ppo_error_inside_an_update_keeps_the_last_checkpoint(tmp_path) -> None:
    """An update that fails after stepping the optimizer (backward_step's FloatingPointError on
    a later minibatch) leaves weights part-way through an update the counters do not count: the
    run's last checkpoint must stay as it was, as after an error on several ranks."""
    from vecaccel.trainers import PPO
    from vecaccel.trainers.checkpoints.format import load_checkpoint

    agent = PPO(None, env_id="CartPole-v1", backend="serial", num_envs=2, num_steps=16, update_epochs=1,
        num_minibatches=2, run_dir=str(tmp_path), hidden_sizes=(16,), torch_threads=1,
        seed=0, progress=False, tensorboard=False,
    )  # fmt: skip
    run_async(agent, 64, poll_interval=0.001)
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
        run_async(agent, 96, poll_interval=0.001)
    assert len(calls) == 2
    assert checkpoint.read_bytes() == before, "no checkpoint of a half-done update"


# -- fixed data --------------------------------------------------------------------------------

OBS_DIM = 4


# -- the async runner: no process left behind ------------------------------------------------


def _async_children() -> list[Any]:
    return [
        p
        for p in multiprocessing.active_children()
        if p.name in ("vecaccel-async-sampler", "vecaccel-async-rollout")
    ]


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_async_runner_leaves_no_sampler_when_the_run_directory_is_unusable(
    algo: str, tmp_path: Path
) -> None:
    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.dqn import DQN

    # fork: the collector process is running at once (with spawn it is still unpickling its spec
    # when the error comes, and dies of the locks the optimiser has freed meanwhile)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    bad_run_dir = str(blocker / "run")  # cannot be created
    before = {p.pid for p in _async_children()}
    try:
        with pytest.raises(OSError):
            if algo == "dqn":
                agent = DQN(env=None, env_id="CartPole-v1", batch_size=16, buffer_size=500, learning_starts=64,
                    hidden_sizes=(16,), torch_threads=1, progress=False, tensorboard=False,
                    run_dir=bad_run_dir,
                )  # fmt: skip
                run_async(agent, 2_000, context="fork")
            else:
                agent = PPO(
                    None, env_id="CartPole-v1", num_envs=2, num_steps=8, torch_threads=1,
                    tensorboard=False, run_dir=bad_run_dir,
                )  # fmt: skip
                run_async(agent, 64, context="fork")
        deadline = time.monotonic() + 5.0
        left = [p for p in _async_children() if p.pid not in before]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in _async_children() if p.pid not in before and p.is_alive()]
        assert not left, f"{[p.name for p in left]} still running after the run raised"
    finally:
        for proc in _async_children():
            if proc.pid not in before:
                proc.kill()
                proc.join(timeout=5)


# -- the async runners act in a Discrete(n, start) space ---------------------------------------


class _ShiftedCartPole:
    """Factory of CartPole with ``Discrete(2, start=1)`` (actions 1 and 2) that appends every
    action it is sent to ``log`` (the env lives in the collector process)."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self, **kwargs: Any) -> Any:
        import gymnasium as gym

        log = self.log

        class ShiftedActions(gym.ActionWrapper):
            def __init__(self, env: Any) -> None:
                super().__init__(env)
                self.action_space = gym.spaces.Discrete(2, start=1)

            def action(self, action: Any) -> int:
                with open(log, "a") as file:
                    file.write(f"{int(action)}\n")
                return int(action) - 1

        return ShiftedActions(gym.make("CartPole-v1", **kwargs))


@pytest.mark.parametrize(("algo", "fixed_lag"), [("dqn", False), ("dqn", True), ("ppo", False)])
def test_async_runner_acts_in_a_discrete_space_with_a_start(
    algo: str, fixed_lag: bool, tmp_path: Path
) -> None:
    """The async DQN sampler and the on-policy rollout process act in ``start..start+n-1``: a
    ``Discrete(2, start=1)`` env gets actions 1..2, never 0 (and the losses index the
    network's outputs with 0..1)."""
    import gymnasium as gym

    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.dqn import DQN

    log = tmp_path / "actions.txt"
    env_id = f"VecaccelScaleOutShiftedCartPole-{algo}-{int(fixed_lag)}-v0"
    # fork: the collector process inherits this registration
    gym.register(id=env_id, entry_point=_ShiftedCartPole(str(log)))
    try:
        if algo == "dqn":
            agent = DQN(
                env=None, env_id=env_id, batch_size=16, buffer_size=500, learning_starts=64,
                hidden_sizes=(16,), torch_threads=1, progress=False, tensorboard=False,
                backend="serial", num_envs=2, async_max_lead=32,
            )  # fmt: skip
            run_async(agent, 400, fixed_lag=fixed_lag, context="fork")
            assert agent.action_space.start == 1
            assert agent.num_updates > 0
        else:
            agent = PPO(
                None, env_id=env_id, num_envs=2, num_steps=16, backend="serial",
                torch_threads=1, tensorboard=False,
            )  # fmt: skip
            run_async(agent, 128, context="fork")
            assert agent.num_updates > 0
            actions, _ = agent.predict(np.zeros((8, OBS_DIM), np.float32))
            assert set(actions.tolist()) <= {1, 2}
    finally:
        gym.registry.pop(env_id, None)
    sent = [int(line) for line in log.read_text().split()]
    assert sent and set(sent) <= {1, 2}, sorted(set(sent))
