"""Session-10 review of the fixes in 8230aa4..HEAD (worker startup over the data socket, lossy
observation casts, the action server's step pairing, Discrete(start) in the trainers).

Every test states correct behaviour (none found failing in this session: they are kept as
regression tests for the paths the fixes touched). Envs are module level so that spawn workers
can import them.
"""

from __future__ import annotations

import functools
import os
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers_envs import WideSpacesEnv

import vecaccel
from vecaccel.worker import process as worker_process

torch.set_num_threads(1)


# -- envs ---------------------------------------------------------------------------------------


class ShiftedCartPole(gym.ActionWrapper):
    """CartPole with ``Discrete(2, start=3)``: any action outside 3..4 is an error."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Discrete(2, start=3)

    def action(self, action):
        action = int(action)
        if action not in (3, 4):
            raise ValueError(f"action {action} outside Discrete(2, start=3)")
        return action - 3


def make_shifted_cartpole(**kwargs) -> gym.Env:
    return ShiftedCartPole(gym.make("CartPole-v1", **kwargs))


SHIFTED_ID = "Session10ShiftedCartPole-v0"
if SHIFTED_ID not in gym.registry:
    gym.register(SHIFTED_ID, entry_point=make_shifted_cartpole)


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _startup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "vecaccel-startup"]


# -- checks that hold (kept as regression tests) -----------------------------------------------


def test_worker_dying_mid_startup_raises_and_leaves_no_thread_or_fd(monkeypatch, leak_check):
    """A worker that dies half-way through reading its (large) startup message: the pool
    raises WorkerError at once, and the writer thread and its duplicate socket are gone."""
    warm = vecaccel.make_vec([WideSpacesEnv] * 2, backend="shm", num_workers=2, context="fork")
    warm.close()  # multiprocessing's own lazily made fds exist from here on
    before = _fds()

    def dying(fd):
        os.read(fd, 1000)
        os._exit(3)

    monkeypatch.setattr(worker_process, "read_startup", dying)  # inherited by forked workers
    for _ in range(2):
        with pytest.raises(vecaccel.WorkerError, match="exited with code 3"):
            vecaccel.make_vec(
                [WideSpacesEnv] * 2, backend="shm", num_workers=2, context="fork",
                start_timeout=60,
            )  # fmt: skip
    monkeypatch.undo()
    for thread in _startup_threads():
        thread.join(5.0)
    assert not _startup_threads()
    assert _fds() <= before


@pytest.mark.parametrize("context", ["fork"])  # spawn's large startup: test_lifecycle.py
def test_restarted_worker_gets_a_large_startup_and_steps(context, leak_check):
    """respawn() sends the startup message again (through the writer thread for large spaces)
    and joins it; the restarted env reports worker_restarted and steps afterwards."""
    envs = vecaccel.make_vec(
        [WideSpacesEnv] * 2, backend="shm", num_workers=2, context=context,
        on_worker_failure="restart",
    )  # fmt: skip
    try:
        envs.reset(seed=0)
        for _ in range(2):
            os.kill(envs.pool.workers[0].process.pid, 9)
            obs, _, _, truncated, infos = envs.step(np.array([1, 0]))
            assert truncated.tolist() == [True, False]
            assert infos["worker_restarted"][0]
            assert (obs[1] == 0).all()
        envs.step(np.array([1, 0]))  # the NEXT_STEP reset of the restarted env
        obs, *_ = envs.step(np.array([1, 0]))
        assert (obs[0] == 1).all() and (obs[1] == 0).all()
        assert not _startup_threads()
    finally:
        envs.close()


def _slow_cartpole(sleep_at: int | None = None, seconds: float = 0.0) -> gym.Env:
    from test_action_server_review import SlowStep

    return SlowStep(gym.make("CartPole-v1"), sleep_at, seconds)


def test_alternating_action_server_drops_a_timed_out_step_and_stays_in_step_with_serial():
    """With alternating halves, the step given up is the *other* half's; the next step_async
    drops it and acts for that half, and every later batch is that half's true next state."""
    reference = vecaccel.make_vec("CartPole-v1", 4, backend="serial")
    states = [reference.reset(seed=0)[0]]
    for _ in range(4):
        states.append(reference.step(np.zeros(4, np.int64))[0])
    reference.close()
    fns = [functools.partial(_slow_cartpole, 2, 1.0)] + [_slow_cartpole] * 3
    # a worker per env: a half's envs never wait behind the sleeping env 0 in its worker
    envs = vecaccel.make_vec(
        fns, backend="action_server", device="cpu", alternating=True, num_workers=4
    )
    try:
        actions = torch.zeros(2, dtype=torch.int64)
        envs.reset(seed=0)
        expected_steps = [0, 1, 1]
        for steps in expected_steps:
            obs, *_, infos = envs.step(actions)
            np.testing.assert_allclose(obs.numpy(), states[steps][infos["env_id"]])
        envs.step_async(actions)  # half B's step 2; half A's (env 0 sleeps) is awaited
        with pytest.raises(TimeoutError):
            envs.step_wait(timeout=0.05)
        for steps, ids in ((2, [1, 3]), (3, [0, 2]), (3, [1, 3])):
            obs, *_, infos = envs.step(actions)
            assert infos["env_id"].tolist() == ids
            np.testing.assert_allclose(obs.numpy(), states[steps][ids])
    finally:
        envs.close()


def test_dqn_and_ppo_with_discrete_start_save_load_predict_and_eval_cli(tmp_path):
    """Discrete(2, start=3): learn, save, load with overrides reaching Adam, predict and
    ``vecaccel eval`` all act in 3..4 (the env raises otherwise)."""
    from vecaccel.cli import main as cli_main
    from vecaccel.trainers.dqn import DQN
    from vecaccel.trainers.ppo import PPO

    agent = DQN(
        SHIFTED_ID, learning_starts=32, batch_size=8, buffer_size=300, hidden_sizes=(16,),
        progress=False, tensorboard=False, device="cpu", num_envs=2, run_dir=str(tmp_path / "dqn"),
    )  # fmt: skip
    try:
        agent.learn(96)
        path = agent.save(tmp_path / "dqn.pt")
    finally:
        agent.close()
    loaded = DQN.load(path, learning_rate=1e-2, adam_eps=1e-3)
    assert loaded.action_space == gym.spaces.Discrete(2, start=3)
    assert [(g["lr"], g["eps"]) for g in loaded.optimizer.param_groups] == [(1e-2, 1e-3)]
    actions, _ = loaded.predict(np.zeros((6, 4), np.float32), deterministic=False)
    assert set(actions.tolist()) <= {3, 4}
    assert cli_main(["eval", str(path), "--episodes", "1"]) == 0

    ppo = PPO(
        SHIFTED_ID, backend="serial", num_envs=2, num_steps=8, seed=0, torch_threads=1,
        tensorboard=False, run_dir=str(tmp_path / "ppo"),
    )  # fmt: skip
    try:
        ppo.learn(32)
        ppo_path = ppo.save(tmp_path / "ppo.pt")
    finally:
        ppo.close()
    for deterministic in (True, False):
        actions, _ = PPO.load(ppo_path).predict(np.zeros((6, 4), np.float32), deterministic)
        assert set(actions.tolist()) <= {3, 4}
    assert cli_main(["eval", str(ppo_path), "--episodes", "1", "--stochastic"]) == 0
