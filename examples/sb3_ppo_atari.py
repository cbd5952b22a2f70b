"""Stable-Baselines3 PPO on Pong, with vecaccel's shared-memory workers as the vec env.

The switch from SB3's ``SubprocVecEnv`` is one argument of ``make_atari_env``::

    # SB3's own worker processes
    env = make_atari_env("PongNoFrameskip-v4", n_envs=8, vec_env_cls=SubprocVecEnv)
    # vecaccel's
    env = make_atari_env(
        "PongNoFrameskip-v4", n_envs=8,
        vec_env_cls=vecaccel.sb3.VecAccelEnv, vec_env_kwargs={"backend": "shm"},
    )

Everything else (``VecFrameStack``, ``CnnPolicy``, callbacks, ``model.save``) stays as it was.
The PPO settings are rl-zoo's for Atari. Pong needs about 2-10 M steps to be won; run a
short budget first to see it go:

    python examples/sb3_ppo_atari.py --timesteps 20000
    python examples/sb3_ppo_atari.py --vec-env subproc --timesteps 20000   # SB3's own, to compare

Requires ``pip install "vecaccel[sb3,atari]"``.
"""

from __future__ import annotations

import argparse
import time

import ale_py
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecFrameStack

import vecaccel.sb3

# Gymnasium >= 1.0 registers ALE ids only on request. At module level, so that SubprocVecEnv's
# forkserver workers (which import this file) see them too; VecAccelEnv registers them itself.
gym.register_envs(ale_py)


def make_env(kind: str, n_envs: int, seed: int, backend: str) -> VecEnv:
    """Pong with SB3's Atari pipeline, on the vec env of the given ``kind``."""
    if kind == "vecaccel":
        # the one-line switch: SB3 builds its env functions, vecaccel runs them
        env = make_atari_env(
            "PongNoFrameskip-v4",
            n_envs=n_envs,
            seed=seed,
            vec_env_cls=vecaccel.sb3.VecAccelEnv,
            vec_env_kwargs={"backend": backend},
        )
    else:
        cls = SubprocVecEnv if kind == "subproc" else DummyVecEnv
        env = make_atari_env("PongNoFrameskip-v4", n_envs=n_envs, seed=seed, vec_env_cls=cls)
    return VecFrameStack(env, n_stack=4)


def main() -> None:
    """Parses the command line, trains PPO and prints the end-to-end steps/s."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--vec-env", choices=["vecaccel", "subproc", "dummy"], default="vecaccel")
    parser.add_argument("--backend", default="shm", help="vecaccel backend (vecaccel only)")
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--timesteps", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--save", default=None, help="save the trained model to this path")
    args = parser.parse_args()

    env = make_env(args.vec_env, args.n_envs, args.seed, args.backend)
    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        n_epochs=4,
        batch_size=256,
        learning_rate=LinearSchedule(2.5e-4, 0.0, 1.0),
        clip_range=LinearSchedule(0.1, 0.0, 1.0),
        ent_coef=0.01,
        vf_coef=0.5,
        seed=args.seed,
        device=args.device,
        verbose=1,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps)
    elapsed = time.perf_counter() - start
    print(f"{args.timesteps} steps in {elapsed:.1f} s: {args.timesteps / elapsed:.0f} steps/s")
    if args.save:
        model.save(args.save)
    env.close()


# The guard is required: SubprocVecEnv's default start method (forkserver), and vecaccel's
# spawn/forkserver contexts, re-import this file in their worker processes.
if __name__ == "__main__":
    main()
