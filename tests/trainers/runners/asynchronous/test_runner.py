"""The asynchronous runner around either family's feed: no collector process is left behind when
a run cannot start, and both families' collector processes act in a ``Discrete(n, start)`` space
(each feed's own behaviour: ``algos/on_policy/test_feed.py``, ``algos/off_policy/test_feed.py``).
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
