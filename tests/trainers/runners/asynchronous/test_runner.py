"""The asynchronous runner around either family's feed: no collector process is left behind when
a run cannot start, both families' collector processes act in a ``Discrete(n, start)`` space, and
normalise with the statistics the trainer hands over with its weights (each feed's own behaviour: ``algos/on_policy/test_feed.py``, ``algos/off_policy/test_feed.py``).
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import train_async

torch.set_num_threads(1)

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
                train_async(agent, 2_000, context="fork")
            else:
                agent = PPO(
                    None, env_id="CartPole-v1", num_envs=2, num_steps=8, torch_threads=1,
                    tensorboard=False, run_dir=bad_run_dir,
                )  # fmt: skip
                train_async(agent, 64, context="fork")
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
            train_async(agent, 400, fixed_lag=fixed_lag, context="fork")
            assert agent.action_space.start == 1
            assert agent.num_updates > 0
        else:
            agent = PPO(
                None, env_id=env_id, num_envs=2, num_steps=16, backend="serial",
                torch_threads=1, tensorboard=False,
            )  # fmt: skip
            train_async(agent, 128, context="fork")
            assert agent.num_updates > 0
            actions, _ = agent.predict(np.zeros((8, OBS_DIM), np.float32))
            assert set(actions.tolist()) <= {1, 2}
    finally:
        gym.registry.pop(env_id, None)
    sent = [int(line) for line in log.read_text().split()]
    assert sent and set(sent) <= {1, 2}, sorted(set(sent))


# -- normalisation: the trainer's statistics, handed over with the weights ---------------------


def _known_statistics(agent: Any, mean: float) -> None:
    """Statistics of a million samples: observations of mean ``mean`` and std 5, returns of
    std 100; what a run of a few hundred steps adds barely moves them."""
    normalizer = agent.normalizer
    normalizer.obs.data[:] = [mean] * OBS_DIM + [25.0] * OBS_DIM + [1e6]
    normalizer.returns.data[:] = [0.0, 1e4, 1e6]


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_the_sampler_normalises_with_the_trainers_statistics(algo: str) -> None:
    """The collector process acts on and hands over observations normalised by the trainer's
    statistics (CartPole's, all within 3.5 of 0, become about (x - 20) / 5), rewards scaled by
    them (1 / 100), and the moments it counted come back into them. PPO's trainer moves its
    mean to -20 during its first update: every later batch, collected with the weights
    published after it (a fixed lag), is normalised by that mean."""
    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.dqn import DQN

    normalization = dict(norm_obs=True, norm_reward=True, backend="serial", num_envs=2,
                         torch_threads=1, progress=False, tensorboard=False)  # fmt: skip
    if algo == "ppo":
        agent: Any = PPO(None, env_id="CartPole-v1", num_steps=16, **normalization)
        batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        update = agent.update

        def keep(batch: Any, progress_remaining: float = 1.0) -> Any:
            batches.append((batch.obs.clone(), batch.rewards.clone()))
            if len(batches) == 1:
                agent.normalizer.obs.data[:OBS_DIM] = -20.0
            return update(batch, progress_remaining)

        agent.update = keep
        _known_statistics(agent, 20.0)
        train_async(agent, 128, fixed_lag=True, context="fork")
        assert len(batches) == 4
        # batches 0 and 1 act with the first weights, batch n >= 2 with those of update n - 1;
        # a batch's first row is what the last step of the one before returned, normalised then
        first = torch.cat([obs for obs, _ in batches[:2]])
        later = torch.cat([obs[1:] for obs, _ in batches[2:]])
        assert float(first.max()) < -3.0 and float(first.min()) > -5.0
        assert float(later.min()) > 3.0 and float(later.max()) < 5.0
        rewards = torch.cat([r for _, r in batches])
    else:
        agent = DQN(env=None, env_id="CartPole-v1", batch_size=16, buffer_size=500,
                    learning_starts=64, hidden_sizes=(16,), async_max_lead=32,
                    **normalization)  # fmt: skip
        agent.prepare_async()  # the networks and the normaliser, for one env of env_id
        _known_statistics(agent, 20.0)
        train_async(agent, 128, context="fork")
        stored = agent.buffer.sample(64).obs
        assert float(stored.max()) < -3.0 and float(stored.min()) > -5.0
        rewards = torch.as_tensor(agent.buffer.rewards)
        rewards = rewards[rewards != 0]  # the slots written
        assert len(rewards) == 128
    torch.testing.assert_close(rewards, torch.full_like(rewards, 0.01), rtol=1e-3, atol=0)
    # the sampler's counts came back: a million and every step of the run
    assert agent.normalizer.obs.count == agent.normalizer.returns.count == 1e6 + 128
