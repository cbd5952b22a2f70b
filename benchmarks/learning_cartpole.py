"""PPO and A2C on CartPole-v1: wall-clock to a mean return of 475, vecaccel against SB3.

Both sides use rl-baselines3-zoo's CartPole-v1 hyperparameters (``hyperparams/ppo.yml``:
8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, ent_coef 0, learning rate
``lin_1e-3``, clip range ``lin_0.2``; ``hyperparams/a2c.yml``: 8 envs, ent_coef 0, SB3's A2C
defaults), the same network (separate 64-64 tanh actor and critic MLPs, orthogonal init), one
torch thread, and the envs in the training process (vecaccel ``serial``, SB3 ``DummyVecEnv``:
CartPole's step costs microseconds, so worker processes would only add latency). Every run
is its own subprocess, and the seeds alternate between the two libraries so that both see
the same drift in the machine's load.

A run stops when the mean return of the last ``--window`` finished episodes reaches
``--threshold``; reported are the wall-clock seconds (from building the env and agent, after the
imports), the CPU seconds of the process and the env steps to get there, with the medians over
the seeds and the ratio vecaccel/SB3.

Run (about 10 minutes on 2 CPU cores)::

    python benchmarks/learning_cartpole.py --seeds 1 2 3

Results go to ``benchmarks/results/learning_cartpole.{json,md}`` with the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
NUM_ENVS = 8


def run_vecaccel(algo: str, seed: int, threshold: float, window: int, max_steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from vecaccel.trainers import A2C, PPO
    from vecaccel.trainers.a2c import PRESETS as A2C_PRESETS
    from vecaccel.trainers.ppo import PRESETS as PPO_PRESETS

    cls, presets = (PPO, PPO_PRESETS) if algo == "ppo" else (A2C, A2C_PRESETS)
    config = dict(presets["cartpole"])
    env_id = config.pop("env_id")
    recent: deque[float] = deque(maxlen=window)
    solved_at: dict[str, float] = {}

    start_wall, start_cpu = time.perf_counter(), time.process_time()
    agent = cls(env_id, backend="serial", seed=seed, torch_threads=1, log_every=10**9, **config)

    def stop_when_solved(agent: Any, metrics: dict) -> bool:
        recent.extend(agent.last_episodes.returns)
        if len(recent) == window and sum(recent) / window >= threshold:
            solved_at.update(
                wall=time.perf_counter() - start_wall,
                cpu=time.process_time() - start_cpu,
                steps=agent.global_step,
            )
            return False
        return True

    agent.learn(max_steps, callback=stop_when_solved)
    agent.close()
    return _record(solved_at, start_wall, start_cpu, agent.global_step)


def run_sb3(algo: str, seed: int, threshold: float, window: int, max_steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import A2C, PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    recent: deque[float] = deque(maxlen=window)
    solved_at: dict[str, float] = {}

    class StopWhenSolved(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    recent.append(info["episode"]["r"])
            if len(recent) == window and sum(recent) / window >= threshold:
                solved_at.update(
                    wall=time.perf_counter() - start_wall,
                    cpu=time.process_time() - start_cpu,
                    steps=self.num_timesteps,
                )
                return False
            return True

    def linear(initial: float):
        return lambda progress_remaining: progress_remaining * initial

    start_wall, start_cpu = time.perf_counter(), time.process_time()
    env = make_vec_env("CartPole-v1", n_envs=NUM_ENVS, seed=seed)
    if algo == "ppo":
        model = PPO(
            "MlpPolicy",
            env,
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=linear(1e-3),
            clip_range=linear(0.2),
            seed=seed,
            device="cpu",
        )
    else:
        model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu")
    model.learn(max_steps, callback=StopWhenSolved())
    env.close()
    return _record(solved_at, start_wall, start_cpu, model.num_timesteps)


def _record(solved_at: dict, start_wall: float, start_cpu: float, steps: int) -> dict:
    if solved_at:
        return {"solved": True, **solved_at}
    return {
        "solved": False,
        "wall": time.perf_counter() - start_wall,
        "cpu": time.process_time() - start_cpu,
        "steps": steps,
    }


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _format(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "a2c"], choices=["ppo", "a2c"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--window", type=int, default=20, help="episodes in the moving mean")
    parser.add_argument("--max-steps-ppo", type=int, default=200_000)
    parser.add_argument("--max-steps-a2c", type=int, default=500_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--worker", nargs=3, metavar=("LIB", "ALGO", "SEED"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)

    if args.worker:  # one run, in its own process; prints its record as JSON
        library, algo, seed = args.worker
        run = run_vecaccel if library == "vecaccel" else run_sb3
        max_steps = args.max_steps_ppo if algo == "ppo" else args.max_steps_a2c
        print(json.dumps(run(algo, int(seed), args.threshold, args.window, max_steps)))
        return 0

    command = "python benchmarks/learning_cartpole.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    runs: list[dict] = []
    for algo in args.algos:
        for seed in args.seeds:
            for library in ("vecaccel", "sb3"):
                worker = [sys.executable, __file__, "--worker", library, algo, str(seed)]
                worker += ["--threshold", str(args.threshold), "--window", str(args.window)]
                worker += ["--max-steps-ppo", str(args.max_steps_ppo)]
                worker += ["--max-steps-a2c", str(args.max_steps_a2c)]
                load = os.getloadavg()[0]
                out = subprocess.run(worker, capture_output=True, text=True, check=True)
                record = json.loads(out.stdout.strip().splitlines()[-1])
                record.update(library=library, algo=algo, seed=seed, load_before=round(load, 2))
                runs.append(record)
                print(json.dumps(record), flush=True)

    import stable_baselines3
    import torch

    summary = []
    lines = [
        f"# CartPole-v1: wall-clock to a mean return of {args.threshold:g} "
        f"(last {args.window} episodes)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
        f"(shared; 1-minute load average before each run is in the JSON), Python "
        f"{platform.python_version()}, torch {torch.__version__}, SB3 {stable_baselines3.__version__}, "
        f"one torch thread, envs in the training process.",
        "",
        "| algo | library | solved | median wall s | median CPU s | median env steps | per seed wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for algo in args.algos:
        medians = {}
        for library in ("vecaccel", "sb3"):
            mine = [r for r in runs if r["algo"] == algo and r["library"] == library]
            solved = [r for r in mine if r["solved"]]
            medians[library] = {
                key: _median([r[key] for r in solved]) if len(solved) == len(mine) else None
                for key in ("wall", "cpu", "steps")
            }
            per_seed = ", ".join(
                f"{r['wall']:.1f}" + ("" if r["solved"] else " (not solved)") for r in mine
            )
            lines.append(
                f"| {algo.upper()} | {library} | {len(solved)}/{len(mine)} | "
                f"{_format(medians[library]['wall'])} | {_format(medians[library]['cpu'])} | "
                f"{_format(medians[library]['steps'], 0)} | {per_seed} |"
            )
        ratio = {
            key: medians["vecaccel"][key] / medians["sb3"][key]
            if medians["vecaccel"][key] and medians["sb3"][key]
            else None
            for key in ("wall", "cpu", "steps")
        }
        summary.append({"algo": algo, "medians": medians, "ratio_vecaccel_over_sb3": ratio})
        lines.append(
            f"| {algo.upper()} | ratio vecaccel/SB3 | | {_format(ratio['wall'], 2)} | "
            f"{_format(ratio['cpu'], 2)} | {_format(ratio['steps'], 2)} | |"
        )
    lines += [
        "",
        "A median is given only when every seed reached the threshold within the step budget "
        f"(PPO {args.max_steps_ppo:,}, A2C {args.max_steps_a2c:,} env steps).",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"command": command, "runs": runs, "summary": summary, "time": time.ctime()}
    (args.out / "learning_cartpole.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "learning_cartpole.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
