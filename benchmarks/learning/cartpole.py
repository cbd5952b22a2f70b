"""PPO and A2C on CartPole-v1: wall-clock to a mean return of 475, vecaccel against SB3.

Both sides use rl-baselines3-zoo's CartPole-v1 hyperparameters (``hyperparams/ppo.yml``:
8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, ent_coef 0, learning rate
``lin_1e-3``, clip range ``lin_0.2``, n_timesteps 1e5, so the linear schedules reach 0 at 100,000
steps; ``hyperparams/a2c.yml``: 8 envs, ent_coef 0, n_timesteps 5e5, SB3's A2C defaults), the
same network (separate 64-64 tanh actor and critic MLPs, orthogonal init), one torch thread,
and the envs in the training process (vecaccel ``serial``, SB3 ``DummyVecEnv``: CartPole's step
costs microseconds, so worker processes would only add latency). Every run is its own
subprocess, and the seeds alternate between the two libraries so that both see the same drift
in the machine's load.

Both libraries are measured the same way: after each rollout (every ``8 * n_steps`` env
steps) the returns of the episodes that ended in it join a window of the last ``--window``
finished episodes; a run stops at the first rollout boundary where the window's mean reaches
``--threshold``. For vecaccel that check is its ``learn`` callback, which runs after the
rollout's update; for SB3 the window is checked in ``on_rollout_end`` and the clock is read at
the next ``on_rollout_start``, after SB3's ``train()`` of that rollout, so both clocks include the
same work. Reported are the wall-clock seconds (from building the env and agent, after the
imports), the CPU seconds of the process and the env steps to get there, with the medians over
the seeds and the ratio vecaccel/SB3.

Run (about 10 minutes on 2 CPU cores)::

    python benchmarks/learning/cartpole.py --seeds 1 2 3 4 5

Results go to ``benchmarks/results/learning_cartpole.{json,md}`` with the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

from vecaccel.bench import RunRecord, command_line, load_result, run_seeds

RESULTS = Path(__file__).resolve().parent.parent / "results"
NUM_ENVS = 8


def run_vecaccel(algo: str, seed: int, threshold: float, window: int, max_steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from vecaccel.trainers import A2C, PPO
    from vecaccel.trainers.algos.a2c import PRESETS as A2C_PRESETS
    from vecaccel.trainers.algos.ppo import PRESETS as PPO_PRESETS

    cls, presets = (PPO, PPO_PRESETS) if algo == "ppo" else (A2C, A2C_PRESETS)
    config = dict(presets["cartpole"])
    env_id = config.pop("env_id")
    recent: deque[float] = deque(maxlen=window)
    solved_at: dict[str, float] = {}

    start_wall, start_cpu = time.perf_counter(), time.process_time()
    agent = cls(
        env_id, backend="serial", seed=seed, torch_threads=1, log_every_steps=10**9, **config
    )

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
        """vecaccel's check, at SB3's rollout boundaries (see the module docstring)."""

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    recent.append(info["episode"]["r"])
            return not solved_at

        def _on_rollout_end(self) -> None:
            if len(recent) == window and sum(recent) / window >= threshold:
                solved_at["steps"] = self.num_timesteps

        def _on_rollout_start(self) -> None:
            if solved_at and "wall" not in solved_at:  # train() of the solving rollout is done
                solved_at.update(
                    wall=time.perf_counter() - start_wall, cpu=time.process_time() - start_cpu
                )

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
    if solved_at and "wall" not in solved_at:  # solved in the budget's last rollout
        solved_at.update(wall=time.perf_counter() - start_wall, cpu=time.process_time() - start_cpu)
    env.close()
    return _record(solved_at, start_wall, start_cpu, model.num_timesteps)


def run(library: str, algo: str, seed: int, threshold: float, window: int, max_steps: int) -> dict:
    """One run of ``algo`` with ``library``, in its own process (see ``vecaccel.bench.seeds``)."""
    runner = run_vecaccel if library == "vecaccel" else run_sb3
    return runner(algo, seed, threshold, window, max_steps)


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
    return statistics.median(values) if values else None


def _format(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "a2c"], choices=["ppo", "a2c"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--window", type=int, default=20, help="episodes in the moving mean")
    parser.add_argument(
        "--max-steps-ppo",
        type=int,
        default=100_000,
        help="rl-zoo's n_timesteps: the lin_ schedules' length",
    )
    parser.add_argument("--max-steps-a2c", type=int, default=500_000)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every run in this process: quick to start, for trial runs (the figures want a "
        "fresh process per run)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--summarize",
        type=Path,
        metavar="JSON",
        help="rewrite the tables from the runs of an earlier results JSON, running nothing",
    )
    args = parser.parse_args(argv)

    runs: list[dict] = []
    if args.summarize:
        earlier = load_result(args.summarize)
        run_record = RunRecord(earlier["meta"]["command"])
        runs = earlier["results"]
        args.algos = [algo for algo in ("ppo", "a2c") if any(r["algo"] == algo for r in runs)]
    else:
        run_record = RunRecord(command_line(argv, __file__))
        for algo in args.algos:
            max_steps = args.max_steps_ppo if algo == "ppo" else args.max_steps_a2c
            runs += run_seeds(
                __file__,
                "run",
                args.seeds,
                [{"library": "vecaccel", "algo": algo}, {"library": "sb3", "algo": algo}],
                common={"threshold": args.threshold, "window": args.window, "max_steps": max_steps},
                in_process=args.in_process,
                on_run=lambda record: print(json.dumps(record), flush=True),
            )
    command = run_record.command

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
        "| algo | library | solved | median wall s | median CPU s | median env steps "
        "| median wall ms per 1k steps | per seed wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
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
            # the speed of a step of learning, whatever luck the seed had with the threshold
            medians[library]["wall_ms_per_1k_steps"] = _median(
                [1e6 * r["wall"] / r["steps"] for r in mine if r["steps"]]
            )
            per_seed = ", ".join(
                f"{r['wall']:.1f}" + ("" if r["solved"] else " (not solved)") for r in mine
            )
            lines.append(
                f"| {algo.upper()} | {library} | {len(solved)}/{len(mine)} | "
                f"{_format(medians[library]['wall'])} | {_format(medians[library]['cpu'])} | "
                f"{_format(medians[library]['steps'], 0)} | "
                f"{_format(medians[library]['wall_ms_per_1k_steps'], 0)} | {per_seed} |"
            )
        ratio = {
            key: medians["vecaccel"][key] / medians["sb3"][key]
            if medians["vecaccel"][key] and medians["sb3"][key]
            else None
            for key in ("wall", "cpu", "steps", "wall_ms_per_1k_steps")
        }
        mean_steps = {
            library: sum(r["steps"] for r in runs if r["algo"] == algo and r["library"] == library)
            for library in ("vecaccel", "sb3")
        }
        ratio["mean_steps"] = mean_steps["vecaccel"] / mean_steps["sb3"]
        summary.append({"algo": algo, "medians": medians, "ratio_vecaccel_over_sb3": ratio})
        lines.append(
            f"| {algo.upper()} | ratio vecaccel/SB3 | | {_format(ratio['wall'], 2)} | "
            f"{_format(ratio['cpu'], 2)} | {_format(ratio['steps'], 2)} | "
            f"{_format(ratio['wall_ms_per_1k_steps'], 2)} | |"
        )
    loads = [r["load_before"] for r in runs]
    lines += [
        "",
        "A median is given only when every seed reached the threshold within the step budget "
        f"(PPO {args.max_steps_ppo:,}, A2C {args.max_steps_a2c:,} env steps). 1-minute load "
        f"average before the runs: {min(loads):.2f} to {max(loads):.2f} (median "
        f"{_median(loads):.2f}).",
        "",
        "vecaccel's PPO and A2C are SB3's algorithms step for step: from the same weights and "
        "rollout, one update gives SB3's advantages and parameters; with SB3's action sampling "
        "switched to vecaccel's (inverse CDF of the same `torch.rand` draws), both libraries play "
        "the very same episodes (`tests/trainers/algos/test_ppo_reference.py` and "
        "`test_a2c.py`: `test_update_matches_sb3`, "
        "`test_training_tracks_sb3_exactly_given_the_same_random_draws`). Each library draws "
        "its own random stream, so which seeds are lucky differs between them: the ratio of the "
        "median env steps is that luck (ratio of the mean env steps over the seeds: "
        + ", ".join(
            f"{entry['algo'].upper()} {entry['ratio_vecaccel_over_sb3']['mean_steps']:.2f}"
            for entry in summary
        )
        + "), and the wall ms per 1k steps is the speed of learning itself. Both clocks include "
        "building the envs and the model. SB3's also includes about 1 CPU second for the import "
        "of `torch._dynamo` that constructing a `torch.optim` optimizer triggers; vecaccel's "
        "MLP agents use the flat-buffer optimizers of `trainers/nets/optim.py` and never import it.",
    ]
    run_record.write(
        args.out / "learning_cartpole.json",
        runs,
        summary=summary,
        threshold=args.threshold,
        window=args.window,
        max_steps_ppo=args.max_steps_ppo,
        max_steps_a2c=args.max_steps_a2c,
        in_process=args.in_process,
    )
    (args.out / "learning_cartpole.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
