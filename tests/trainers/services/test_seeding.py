"""Seeded training runs repeat exactly."""

from __future__ import annotations

import pytest
import torch

from vecaccel.trainers import A2C, PPO

torch.set_num_threads(1)


# -- seeding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["ppo-pendulum", "a2c", "rainbow"])
def test_seeded_runs_repeat(algo):
    def run() -> list[torch.Tensor]:
        if algo == "ppo-pendulum":
            agent = PPO("Pendulum-v1", backend="serial", num_envs=2, num_steps=8,
                        update_epochs=2, torch_threads=1, seed=5)  # fmt: skip
            agent.learn(32)
            params = agent.model.parameters()
        elif algo == "a2c":
            agent = A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=5,
                        torch_threads=1, seed=5)  # fmt: skip
            agent.learn(40)
            params = agent.model.parameters()
        else:
            from vecaccel.trainers import Rainbow

            agent = Rainbow("CartPole-v1", v_min=0.0, v_max=50.0, learning_starts=32,
                            batch_size=8, buffer_size=200, replay_ratio=2.0, device="cpu",
                            progress=False, tensorboard=False, torch_threads=1, seed=5)  # fmt: skip
            agent.learn(96)
            params = agent.q_network.parameters()
        out = [p.detach().clone() for p in params]
        agent.close()
        return out

    first, second = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(first, second))
