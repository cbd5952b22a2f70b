"""Stable-Baselines3 PPO on PettingZoo's pistonball: one CNN policy shared by every piston.

PettingZoo's SB3 tutorial goes through SuperSuit (``pettingzoo_env_to_vec_env_v1`` and
``concat_vec_envs_v1``); with vecaccel the PettingZoo env goes to ``make_vec`` directly, one row
per (env, piston), stepped in shared-memory workers::

    python examples/multiagent_pistonball.py --timesteps 2000
    python examples/multiagent_pistonball.py --envs 8 --timesteps 200000 --save pistonball.zip

Each row is one of SB3's envs; rows of agents that are not live hold zeros (pistonball's pistons
all live to the end, so here every row is active). The observations are downscaled 84x84
grayscale frames, stacked 3 deep, as in the tutorial, with SB3's own wrappers on top.

Requires ``pip install "vecaccel[sb3,pettingzoo]"``.
"""

from __future__ import annotations

import argparse
import time

from gymnasium.vector import AutoresetMode
from pettingzoo.butterfly import pistonball_v6
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecFrameStack, VecMonitor

import vecaccel
from vecaccel.sb3 import to_sb3


def make_pistonball(n_pistons: int, max_cycles: int):
    """A pistonball env with 84x84 grayscale observations (what a Nature CNN takes)."""
    import numpy as np
    from gymnasium import spaces
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    class Downscaled(BaseParallelWrapper):
        def observation_space(self, agent):
            return spaces.Box(0, 255, (84, 84, 1), np.uint8)

        @staticmethod
        def _small(frame):
            gray = frame.mean(axis=2)  # 457 x 120
            rows = np.linspace(0, gray.shape[0] - 1, 84).astype(int)
            cols = np.linspace(0, gray.shape[1] - 1, 84).astype(int)
            return gray[np.ix_(rows, cols)].astype(np.uint8)[..., None]

        def reset(self, seed=None, options=None):
            obs, infos = self.env.reset(seed=seed, options=options)
            return {agent: self._small(o) for agent, o in obs.items()}, infos

        def step(self, actions):
            obs, rewards, terms, truncs, infos = self.env.step(actions)
            return (
                {agent: self._small(o) for agent, o in obs.items()},
                rewards,
                terms,
                truncs,
                infos,
            )

    return Downscaled(
        pistonball_v6.parallel_env(n_pistons=n_pistons, continuous=False, max_cycles=max_cycles)
    )


class PistonballFn:
    """A picklable env function, so the workers may start with spawn too."""

    def __init__(self, n_pistons: int, max_cycles: int) -> None:
        self.n_pistons, self.max_cycles = n_pistons, max_cycles

    def __call__(self):
        return make_pistonball(self.n_pistons, self.max_cycles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--envs", type=int, default=4, help="pistonball envs (rows: envs x pistons)"
    )
    parser.add_argument("--pistons", type=int, default=20, help="pistons (agents) per env")
    parser.add_argument("--max-cycles", type=int, default=125, help="steps per episode")
    parser.add_argument("--timesteps", type=int, default=2000, help="agent-steps to train")
    parser.add_argument("--backend", default="shm", help="vecaccel backend")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", default=None, help="where to save the model (.zip)")
    args = parser.parse_args()

    envs = vecaccel.make_vec(
        PistonballFn(args.pistons, args.max_cycles),
        args.envs,
        backend=args.backend,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    print(
        f"{envs.num_multiagent_envs} envs x {envs.agents_per_env} agents = {envs.num_envs} rows "
        f"on {args.backend}"
    )
    venv = VecFrameStack(VecMonitor(to_sb3(envs)), n_stack=3)
    rows = envs.num_envs
    model = PPO(
        "CnnPolicy",
        venv,
        n_steps=max(8, 2048 // rows),
        batch_size=min(256, max(8, 2048 // rows) * rows),
        n_epochs=4,
        learning_rate=2.5e-4,
        ent_coef=0.01,
        seed=args.seed,
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps)
    seconds = time.perf_counter() - start
    print(
        f"{model.num_timesteps} agent-steps in {seconds:.1f} s ({model.num_timesteps / seconds:.0f}/s)"
    )
    if args.save:
        model.save(args.save)
    venv.close()


if __name__ == "__main__":
    main()
