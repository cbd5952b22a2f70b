"""The ``serial`` backend, the in-process reference: step for step what Gymnasium's
``SyncVectorEnv`` does on real envs in either autoreset mode, env errors as ``WorkerError``, and
env functions whose spaces differ refused before any step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from vecaccel.errors import WorkerError
from vecaccel.plugins.serial import SerialVecEnv


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_steps_as_sync_vector_env_does(env_id: str, mode: AutoresetMode) -> None:
    fns = [lambda: gym.make(env_id, max_episode_steps=20)] * 3
    serial = SerialVecEnv(fns, autoreset_mode=mode)
    sync = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    try:
        obs, _ = serial.reset(seed=7)
        expected, _ = sync.reset(seed=7)
        np.testing.assert_array_equal(obs, expected)
        sync.action_space.seed(7)
        ended = 0
        for _ in range(45):
            actions = sync.action_space.sample()
            got = serial.step(actions)
            want = sync.step(actions)
            for mine, theirs in zip(got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(mine, theirs)
            ended += int(np.sum(got[2] | got[3]))
            if mode is AutoresetMode.SAME_STEP and (got[2] | got[3]).any():
                np.testing.assert_array_equal(
                    got[4]["final_obs"][got[4]["_final_obs"]].tolist(),
                    want[4]["final_obs"][want[4]["_final_obs"]].tolist(),
                )
        assert ended >= 3  # every env ran past its 20-step limit at least once
    finally:
        serial.close()
        sync.close()


class _FailingEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if action == 1:
            raise ValueError("action 1 breaks this env")
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_an_env_error_is_a_worker_error_naming_the_env() -> None:
    envs = SerialVecEnv([_FailingEnv] * 3)
    try:
        envs.reset(seed=0)
        envs.step(np.array([0, 0, 0]))
        with pytest.raises(WorkerError) as caught:
            envs.step(np.array([0, 1, 0]))
        assert 1 in caught.value.env_indices
        assert "action 1 breaks this env" in str(caught.value)
    finally:
        envs.close()


def test_env_functions_with_other_spaces_are_refused() -> None:
    fns = [lambda: gym.make("CartPole-v1"), lambda: gym.make("Acrobot-v1")]
    with pytest.raises(RuntimeError, match="env 1 has observation space"):
        SerialVecEnv(fns)
