"""PPO on mpe2's simple_spread_v3: vecaccel's trainer against SB3 PPO on SuperSuit, and random play.

simple_spread has 3 agents per env (vector observations of 18 numbers, 5 discrete actions) who
share a reward for covering 3 landmarks; an episode is 25 steps, every agent truncated together.
Both systems train one policy shared by all agents, one row per (env, agent):

- vecaccel: ``vecaccel train ppo --env mpe2.simple_spread_v3`` (here through the same
  ``PPO`` class the command builds), ``--num-envs`` PettingZoo envs on ``--backend``;
- SB3: ``PPO("MlpPolicy")`` on ``supersuit.concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env),
  num_envs, num_cpus=--supersuit-cpus, base_class="stable_baselines3")`` with ``VecMonitor``, as
  PettingZoo's SB3 tutorial does.

The settings are SB3's PPO defaults where both have them, set alike on both sides: separate 64-64
tanh actor and critic, Adam 3e-4 (constant), n_steps 128 per row, 4 minibatches, 4 epochs, gamma
0.99, GAE lambda 0.95, clip 0.2 without value clipping, entropy 0.01 (SB3: ``ent_coef=0.01``), value
weight 0.5, gradient norm 0.5, per-minibatch advantage normalisation, one torch thread. Steps count
rows (agent steps), as both libraries count them.

After each rollout the team returns (the sum over an env's 3 agents of their episode returns) of
the episodes that ended in it are recorded with the env steps and the wall-clock since the start
of training (building the envs and the agent included). Random play is the team return of
uniformly random actions over as many episodes. Each run is its own subprocess; the seeds
alternate between the systems so that both see the same drift in the machine's load.

Run (about 10 minutes on 2 CPU cores)::

    python benchmarks/learning/multiagent.py --seeds 1 2 3

Results go to ``benchmarks/results/multiagent_learning.{json,png}`` with the command line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from vecaccel.bench import RunRecord, command_line, run_seeds

RESULTS = Path(__file__).resolve().parent.parent / "results"
ENV_ID = "mpe2.simple_spread_v3"
AGENTS = 3
SETTINGS = dict(
    num_steps=128,
    num_minibatches=4,
    update_epochs=4,
    learning_rate=3e-4,
    gamma=0.99,
    gae_lambda=0.95,
    clip_coef=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
)


def run_vecaccel(seed: int, steps: int, num_envs: int, backend: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from vecaccel.trainers import PPO

    curve: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    agent = PPO(
        ENV_ID,
        num_envs=num_envs,
        backend=backend,
        seed=seed,
        preset=None,
        torch_threads=1,
        anneal_lr=False,
        clip_vloss=False,
        log_every_steps=10**12,
        **SETTINGS,
    )

    def record(agent: Any, metrics: dict) -> bool:
        team = metrics.get("charts/team_episodic_return")
        if team is not None:
            curve.append((agent.global_step, time.perf_counter() - start, float(team)))
        return True

    agent.learn(steps, callback=record)
    wall = time.perf_counter() - start
    agent.close()
    return {"curve": curve, "wall_s": wall, "steps": steps}


def run_sb3(seed: int, steps: int, num_envs: int, cpus: int) -> dict[str, Any]:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import supersuit as ss
    from mpe2 import simple_spread_v3
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.utils import set_random_seed
    from stable_baselines3.common.vec_env import VecMonitor

    curve: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    set_random_seed(seed)
    env = ss.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env())
    env = ss.concat_vec_envs_v1(env, num_envs, num_cpus=cpus, base_class="stable_baselines3")
    concat = env.venv
    # SuperSuit's ConcatVecEnv has no seed() for SB3 to call: seeding is a seeded reset
    concat.seed = lambda seed=None: concat.reset(seed=seed)
    env = VecMonitor(env)

    class Record(BaseCallback):
        def _on_training_start(self) -> None:
            self.sums = np.zeros(self.training_env.num_envs)
            self.team: list[float] = []

        def _on_step(self) -> bool:
            self.sums += self.locals["rewards"]
            done = np.asarray(self.locals["dones"], dtype=bool)
            if done.any():
                # the rows of env k are k*3..k*3+2; simple_spread ends all its agents at once
                for k in np.flatnonzero(done.reshape(-1, AGENTS).all(axis=1)):
                    self.team.append(float(self.sums[k * AGENTS : (k + 1) * AGENTS].sum()))
                self.sums[done] = 0.0
            return True

        def _on_rollout_end(self) -> None:
            if self.team:
                wall = time.perf_counter() - start
                curve.append((self.num_timesteps, wall, float(np.mean(self.team))))
                self.team = []

    model = PPO(
        "MlpPolicy",
        env,
        n_steps=SETTINGS["num_steps"],
        batch_size=num_envs * AGENTS * SETTINGS["num_steps"] // SETTINGS["num_minibatches"],
        n_epochs=SETTINGS["update_epochs"],
        learning_rate=SETTINGS["learning_rate"],
        gamma=SETTINGS["gamma"],
        gae_lambda=SETTINGS["gae_lambda"],
        clip_range=SETTINGS["clip_coef"],
        ent_coef=SETTINGS["ent_coef"],
        vf_coef=SETTINGS["vf_coef"],
        max_grad_norm=SETTINGS["max_grad_norm"],
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(steps, callback=Record())
    wall = time.perf_counter() - start
    env.close()
    return {"curve": curve, "wall_s": wall, "steps": steps}


def run_random(seed: int, episodes: int) -> dict[str, Any]:
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env()
    team: list[float] = []
    for episode in range(episodes):
        env.reset(seed=seed * 100_000 + episode)
        for agent in env.possible_agents:
            env.action_space(agent).seed(seed * 100_000 + episode)
        total = 0.0
        while env.agents:
            actions = {agent: env.action_space(agent).sample() for agent in env.agents}
            _, rewards, _, _, _ = env.step(actions)
            total += sum(rewards.values())
        team.append(total)
    env.close()
    return {"team_returns": team}


def run(system: str, seed: int, **settings: Any) -> dict[str, Any]:
    """One run of ``system`` (``vecaccel``, ``sb3_supersuit``, ``random``) in its own process
    (see ``vecaccel.bench.seeds``): ``settings`` are its runner's arguments."""
    runner = {"vecaccel": run_vecaccel, "sb3_supersuit": run_sb3, "random": run_random}[system]
    return runner(seed=seed, **settings)


def _final(curve: list, fraction: float = 0.2) -> float:
    """Mean team return over the last ``fraction`` of the run's rollouts."""
    points = [r for _, _, r in curve]
    tail = points[-max(1, int(len(points) * fraction)) :]
    return sum(tail) / len(tail)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("pettingzoo", "mpe2", "supersuit", "stable_baselines3", "torch", "gymnasium"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _plot(runs: list[dict[str, Any]], random_team: float, seeds: list[int], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (by_steps, by_wall) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = {"vecaccel": "tab:blue", "sb3_supersuit": "tab:orange"}
    for run in runs:
        if run["system"] not in colours:
            continue
        steps, wall, team = zip(*run["curve"])
        label = run["system"] if run["seed"] == seeds[0] else None
        by_steps.plot(steps, team, color=colours[run["system"]], alpha=0.7, label=label)
        by_wall.plot(wall, team, color=colours[run["system"]], alpha=0.7, label=label)
    for axis in (by_steps, by_wall):
        axis.axhline(random_team, color="gray", ls="--", label="random play")
        axis.grid(alpha=0.3)
    by_steps.set_xlabel("agent steps")
    by_wall.set_xlabel("wall-clock s")
    by_steps.set_ylabel("mean team return per rollout")
    by_steps.legend()
    fig.suptitle(f"PPO on {ENV_ID}, seeds {seeds}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=200_000, help="agent steps per run")
    parser.add_argument("--num-envs", type=int, default=8, help="PettingZoo envs (x3 rows)")
    parser.add_argument("--backend", default="shm", help="vecaccel backend")
    parser.add_argument(
        "--supersuit-cpus", type=int, default=2, help="concat_vec_envs_v1 num_cpus (0: in-process)"
    )
    parser.add_argument("--random-episodes", type=int, default=200)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every run in this process: quick to start, for trial runs (the figures want a "
        "fresh process per run)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "multiagent_learning.json")
    args = parser.parse_args(argv)

    run_record = RunRecord(command_line(argv, __file__))

    def report(record: dict[str, Any]) -> None:
        record["final_team_return"] = _final(record["curve"])
        print(
            f"{record['system']} seed {record['seed']}: {record['wall_s']:.1f} s, final team "
            f"return {record['final_team_return']:.1f} (load {record['load_before']})",
            flush=True,
        )

    common = {"steps": args.steps, "num_envs": args.num_envs}
    arms = [
        {"system": "vecaccel", "backend": args.backend},
        {"system": "sb3_supersuit", "cpus": args.supersuit_cpus},
    ]
    runs = run_seeds(
        __file__,
        "run",
        args.seeds,
        arms,
        common=common,
        alternate=True,
        in_process=args.in_process,
        on_run=report,
    )
    # the arms' own options label the runs, but belong to the settings
    for record in runs:
        record.pop("backend", None)
        record.pop("cpus", None)
    random_runs = run_seeds(
        __file__,
        "run",
        args.seeds,
        [{"system": "random"}],
        common={"episodes": args.random_episodes},
        in_process=args.in_process,
    )
    random_team = _mean([r for run in random_runs for r in run["team_returns"]])

    summary: dict[str, Any] = {}
    for system in ("vecaccel", "sb3_supersuit"):
        mine = [run for run in runs if run["system"] == system]
        summary[system] = {
            "mean_wall_s": _mean([run["wall_s"] for run in mine]),
            "mean_final_team_return": _mean([run["final_team_return"] for run in mine]),
            "mean_first_team_return": _mean([run["curve"][0][2] for run in mine]),
        }
    summary["wall_ratio"] = (
        summary["vecaccel"]["mean_wall_s"] / summary["sb3_supersuit"]["mean_wall_s"]
    )
    settings = {
        "env": ENV_ID,
        "settings": {**SETTINGS, "num_envs": args.num_envs, "rows": args.num_envs * AGENTS},
        "steps": args.steps,
        "backend": args.backend,
        "supersuit_cpus": args.supersuit_cpus,
        "seeds": args.seeds,
        "random_team_return": random_team,
        "library_versions": _versions(),
        "in_process": args.in_process,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run_record.write(args.out, runs, summary=summary, **settings)
    _plot(runs, random_team, args.seeds, args.out.with_suffix(".png"))
    print(json.dumps({"random_team_return": random_team, **summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
