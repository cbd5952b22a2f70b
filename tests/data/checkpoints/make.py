"""Write the checkpoint fixtures of the current layout version that the compatibility tests load.

Each algorithm trains a few hundred CartPole-v1 steps on the serial backend, on the CPU, and is
saved to ``version<N>/<algo>/checkpoint.pt`` (N: the layout version written);
``expected.json`` beside it records a fixed batch of observations, the actions
``predict(obs, deterministic=True)`` returned for them, and the saved counters. The fixtures pin
the checkpoint format: a change that stops them loading, or that changes what they predict,
breaks checkpoints users already have. Fixtures of earlier versions are never rewritten.

Run from the repository root: ``python tests/data/checkpoints/make.py`` (every algorithm), or
with the names of the algorithms to write (``python tests/data/checkpoints/make.py pqn``), which
leaves the others' files as they are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
STEPS = 256
OBSERVATION_SEED = 7
NUM_OBSERVATIONS = 16


def fixed_observations() -> np.ndarray:
    """A fixed batch of CartPole observations (the state space's plausible range)."""
    rng = np.random.default_rng(OBSERVATION_SEED)
    scale = np.array([2.0, 2.0, 0.2, 2.0], dtype=np.float32)
    return (rng.uniform(-1.0, 1.0, size=(NUM_OBSERVATIONS, 4)) * scale).astype(np.float32)


def build(algo: str) -> Any:
    """A tiny agent of ``algo``, trained ``STEPS`` env steps."""
    from vecaccel.trainers import A2C, C51, DQN, PPO, PQN, Rainbow

    common = dict(backend="serial", seed=3, device="cpu", torch_threads=1, preset=None)
    if algo == "ppo":
        agent = PPO("CartPole-v1", num_envs=2, num_steps=32, hidden_sizes=(16, 16), **common)
    elif algo == "a2c":
        agent = A2C("CartPole-v1", num_envs=2, num_steps=8, hidden_sizes=(16, 16), **common)
    elif algo == "pqn":
        agent = PQN(
            "CartPole-v1",
            num_envs=2,
            num_steps=16,
            num_minibatches=4,
            hidden_sizes=(16, 16),
            progress=False,
            tensorboard=False,
            **common,
        )
    else:
        cls = {"dqn": DQN, "c51": C51, "rainbow": Rainbow}[algo]
        agent = cls(
            "CartPole-v1",
            num_envs=2,
            hidden_sizes=(16, 16),
            num_atoms=11 if algo != "dqn" else 51,
            v_min=0.0,
            v_max=50.0,
            batch_size=16,
            buffer_size=512,
            learning_starts=64,
            replay_ratio=4.0,
            target_update_period=64,
            progress=False,
            tensorboard=False,
            **common,
        )
    agent.learn(total_timesteps=STEPS)
    return agent


def counters(agent: Any) -> dict[str, int]:
    """The counters a checkpoint records, under the names the agent exposes."""
    names = ("global_step", "num_updates")
    return {name: int(getattr(agent, name)) for name in names if hasattr(agent, name)}


ALGORITHMS = ("ppo", "a2c", "dqn", "c51", "rainbow", "pqn")


def main(algorithms: tuple[str, ...] = ALGORITHMS) -> None:
    from vecaccel.trainers.checkpoints.writer import VERSION

    unknown = sorted(set(algorithms) - set(ALGORITHMS))
    if unknown:
        raise SystemExit(f"no fixture for {', '.join(unknown)}; choose of {', '.join(ALGORITHMS)}")
    torch.set_num_threads(1)
    obs = fixed_observations()
    for algo in algorithms:
        agent = build(algo)
        folder = HERE / f"version{VERSION}" / algo
        folder.mkdir(parents=True, exist_ok=True)
        agent.save(folder / "checkpoint.pt")
        actions, _ = agent.predict(obs, deterministic=True)
        expected = {
            "algo": algo,
            "observations": obs.tolist(),
            "actions": np.asarray(actions).astype(int).tolist(),
            "counters": counters(agent),
        }
        (folder / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        agent.close()
        size = (folder / "checkpoint.pt").stat().st_size
        print(f"{algo}: {size} bytes, counters {expected['counters']}")


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or ALGORITHMS)
