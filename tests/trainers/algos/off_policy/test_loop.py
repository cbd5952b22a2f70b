"""The DQN family's side of the synchronous loop: one ε-greedy vector step per iteration into the
replay buffer, then the updates the replay ratio allows and the target network's when due; the
transitions it stores, a second run on the same buffer, and the callbacks once per vector step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import SMALL_DQN, TINY_DQN, serial_cartpole

import vecaccel
from vecaccel.trainers.algos.dqn import DQN

torch.set_num_threads(1)

TINY = TINY_DQN


def test_a_dqn_without_envs_refuses_to_learn() -> None:
    agent = DQN(env=None, device="cpu")
    with pytest.raises(RuntimeError, match="no env"):
        agent.learn(10)


def test_dqn_calls_a_callback_passed_positionally_and_stops_on_false() -> None:
    steps: list[int] = []
    agent = DQN("CartPole-v1", backend="serial", num_envs=2, learning_starts=8, batch_size=8,
                progress=False, tensorboard=False)  # fmt: skip
    try:
        agent.learn(1_000, lambda agent, metrics: steps.append(agent.global_step) or len(steps) < 5)
    finally:
        agent.close()
    assert steps == [2, 4, 6, 8, 10] and agent.global_step == 10


@pytest.mark.parametrize(
    ("replay_ratio", "batch_size", "num_envs"), [(4.0, 8, 1), (64.0, 16, 3), (0.5, 32, 4)]
)
def test_replay_ratio_is_enforced(replay_ratio, batch_size, num_envs) -> None:
    envs = serial_cartpole(num_envs)
    try:
        agent = DQN(
            env=envs,
            **{
                **TINY,
                "replay_ratio": replay_ratio,
                "batch_size": batch_size,
                "log_every_steps": 60,
            },
        )
        agent.learn(300)
        steps = agent.global_step
        learn_from = max(64, num_envs * (1 + 1 + 1))
        expected = int(replay_ratio * (steps - learn_from) // batch_size)
        assert agent.num_updates == expected
        measured = agent.replay_ratio
        assert replay_ratio - batch_size / (steps - learn_from) <= measured <= replay_ratio
        logged = [
            row["charts/replay_ratio"]
            for row in agent.logger.history
            if "charts/replay_ratio" in row
        ]
        assert logged and logged[-1] == pytest.approx(measured)
    finally:
        envs.close()


def test_second_learn_call_keeps_the_buffer_consistent() -> None:
    envs = serial_cartpole()
    try:
        agent = DQN(env=envs, n_step=3, **TINY)
        agent.learn(150)
        agent.learn(150)  # resets the envs mid-episode: the buffer closes those episodes
        assert agent.global_step == 150
        batch = agent.buffer.sample(256)
        assert np.all(np.isfinite(batch.reward)) and np.all(batch.discount <= 1.0)
    finally:
        envs.close()


def test_target_network_updates_every_period(monkeypatch) -> None:
    envs = serial_cartpole(2)
    calls: list[int] = []
    try:
        agent = DQN(
            env=envs,
            **{**SMALL_DQN, "learning_starts": 40},
            target_update_period=30,
            replay_ratio=4.0,
        )
        original = DQN.update_target

        def spy(self):
            calls.append(self.global_step)
            original(self)

        monkeypatch.setattr(DQN, "update_target", spy)
        agent.learn(200)
    finally:
        envs.close()
    assert calls and all(b - a == 30 for a, b in zip(calls, calls[1:])), calls
    assert calls[-1] > 200 - 30


# -- the loop stores the transitions the envs produced ----------------------------------------


class _Recorder:
    """Wraps a vector env's reset/step and keeps, per env, the transitions it produced."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs
        self.transitions: list[list[dict]] = [[] for _ in range(self.num_envs)]
        self.obs = None
        self._step, self._reset = envs.step, envs.reset
        envs.step, envs.reset = self.step, self.reset

    def reset(self, **kwargs):
        out = self._reset(**kwargs)
        self.obs = np.array(out[0], copy=True)
        return out

    def step(self, actions):
        out = self._step(actions)
        next_obs, reward, terminated, truncated, infos = out
        for b in range(self.num_envs):
            done = bool(terminated[b] or truncated[b])
            final = infos["final_obs"][b] if done else next_obs[b]
            self.transitions[b].append(
                dict(
                    obs=self.obs[b].copy(),
                    action=int(actions[b]),
                    reward=float(reward[b]),
                    terminated=bool(terminated[b]),
                    truncated=bool(truncated[b]),
                    next_obs=np.array(final, copy=True),
                )
            )
        self.obs = np.array(next_obs, copy=True)
        return out


def _reference_target(episode: list[dict], i: int, n: int, gamma: float):
    ret = 0.0
    for k in range(n):
        t = episode[i + k]
        ret += gamma**k * t["reward"]
        if t["terminated"]:
            return ret, 0.0, t["next_obs"]
        if t["truncated"]:
            return ret, gamma ** (k + 1), t["next_obs"]
    return ret, gamma**n, episode[i + n - 1]["next_obs"]


@pytest.mark.parametrize("prioritized", [False, True])
def test_loop_stores_the_env_transitions_with_n_step_targets(prioritized) -> None:
    """DQN.learn on CartPole cut by a 7-step TimeLimit (truncations) with a wrapping buffer:
    every sampleable transition has the n-step return, discount and bootstrap observation of
    the trajectory the envs really produced (truncation bootstraps from final_obs)."""
    envs = vecaccel.make_vec(
        [lambda: gym.make("CartPole-v1", max_episode_steps=7)] * 2,
        backend="serial",
        autoreset_mode=vecaccel.AutoresetMode.SAME_STEP,
    )
    recorder = _Recorder(envs)
    gamma, n = 0.5, 3
    try:
        agent = DQN(
            env=envs,
            **{**SMALL_DQN, "buffer_size": 40},
            n_step=n,
            gamma=gamma,
            prioritized=prioritized,
        )
        agent.learn(120)  # 60 vector steps into 20 slots per env: the ring wraps
    finally:
        envs.close()
    buffer = agent.buffer
    assert np.any(buffer.truncated)
    valid = np.flatnonzero(buffer._valid_mask().reshape(-1))
    assert len(valid) > 20
    batch = buffer.get(valid)
    where = {}
    for b, episode in enumerate(recorder.transitions):
        for i, t in enumerate(episode):
            where[t["obs"].tobytes()] = (b, i)
    for row in range(len(valid)):
        b, i = where[batch.obs[row].tobytes()]
        episode = recorder.transitions[b]
        ret, discount, next_obs = _reference_target(episode, i, n, gamma)
        assert batch.action[row] == episode[i]["action"]
        assert batch.reward[row] == pytest.approx(ret, abs=1e-5)
        assert batch.discount[row] == pytest.approx(discount, abs=1e-7)
        if discount > 0:
            np.testing.assert_array_equal(batch.next_obs[row], next_obs)
