"""A small program written against vecaccel's types, as a user's would be.

``mypy --strict examples/typed_user.py`` passes against the installed package (its ``py.typed``);
``tests/package/test_wheel.py`` checks it so. Run it with ``python examples/typed_user.py`` (the training
part needs ``vecaccel[train]``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import vecaccel
from vecaccel.trainers import PPO


def mean_step_reward(env_id: str, num_envs: int, steps: int, backend: str = "shm") -> float:
    """The mean reward per env step of random actions on ``num_envs`` copies of ``env_id``."""
    envs: gym.vector.VectorEnv = vecaccel.make_vec(env_id, num_envs, backend=backend)
    total = 0.0
    try:
        obs, infos = envs.reset(seed=0)
        for _ in range(steps):
            obs, rewards, terminated, truncated, infos = envs.step(envs.action_space.sample())
            total += float(np.mean(rewards))
    finally:
        envs.close()
    return total / steps


def train_briefly(env_id: str, total_timesteps: int) -> PPO:
    """A PPO agent trained for ``total_timesteps`` env steps on the serial backend."""
    agent = PPO(env_id, backend="serial", num_envs=2, num_steps=16)
    agent.learn(total_timesteps)
    return agent


if __name__ == "__main__":
    print("backends:", ", ".join(vecaccel.list_backends()))
    print("mean reward per step:", mean_step_reward("CartPole-v1", 4, 50))
    train_briefly("CartPole-v1", 64).close()
