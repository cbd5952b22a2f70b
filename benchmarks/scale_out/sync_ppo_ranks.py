"""Synchronous data-parallel PPO on CartPole: 2 gloo ranks against 1 rank, on this machine.

Both arms train the ``cartpole`` preset of :mod:`vecaccel.trainers.algos.ppo` (rl-zoo's settings) for the
same total env steps with the same *effective* batch of 256 transitions per update: one rank with
8 envs × 32 steps, or two ranks (``torchrun --standalone --nproc_per_node 2``) with 4 envs × 32
steps each, their gradients averaged by DistributedDataParallel. Every process runs one torch
thread and the ``serial`` backend, so the two ranks use the machine's two cores. Reported: total
sampling-and-training throughput (env steps/s over all ranks, as logged by rank 0), wall-clock,
and the learning curve (mean episodic return by env steps), with the steps and seconds until the
logged return first reaches 475.

Run (a few minutes on 2 CPU cores)::

    python benchmarks/scale_out/sync_ppo_ranks.py --total-timesteps 100000

Results go to ``benchmarks/results/sync_ppo_ranks.{json,png}`` with the command line.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vecaccel.bench import RunRecord, command_line

RESULTS = Path(__file__).resolve().parent.parent / "results"


def run_arm(ranks: int, total_timesteps: int, seed: int, run_dir: Path) -> dict[str, Any]:
    """Train one arm; return its wall-clock and its metrics rows."""
    train = [
        "train", "ppo", "--preset", "cartpole", "--env", "CartPole-v1", "--backend", "serial",
        "--num-envs", str(8 // ranks), "--total-timesteps", str(total_timesteps), "--seed", str(seed),
        "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard", "--torch-threads", "1",
        "--checkpoint-every", "0",
    ]  # fmt: skip
    if ranks == 1:
        command = [sys.executable, "-m", "vecaccel", *train]
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={ranks}", "-m", "vecaccel", *train,
        ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    curve = [
        (int(float(r["step"])), float(r["time"]), float(r["charts/episodic_return"]))
        for r in rows
        if r.get("charts/episodic_return")
    ]
    solved = next(((s, t) for s, t, ret in curve if ret >= 475), (None, None))
    return {
        "ranks": ranks,
        "envs_per_rank": 8 // ranks,
        "command": shlex.join(command),
        "wall_clock_s": round(wall, 2),
        "training_seconds": float(rows[-1]["time"]),
        "SPS_total": round(float(rows[-1]["charts/SPS"]), 1),
        "steps_to_475": solved[0],
        "seconds_to_475": solved[1],
        "final_return": curve[-1][2] if curve else None,
        "curve": curve[:: max(1, len(curve) // 40)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=Path("runs/sync_ppo_ranks"))
    parser.add_argument("--out", type=Path, default=RESULTS / "sync_ppo_ranks.json")
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    arms = [
        run_arm(ranks, args.total_timesteps, args.seed, args.work_dir / f"ranks{ranks}")
        for ranks in (1, 2)
    ]
    summary = {"throughput_ratio_2_over_1": round(arms[1]["SPS_total"] / arms[0]["SPS_total"], 3)}
    run_record.write(
        args.out, arms, summary=summary, total_steps=args.total_timesteps, seed=args.seed
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
        for arm in arms:
            steps, times, returns = zip(*arm["curve"]) if arm["curve"] else ([], [], [])
            label = f"{arm['ranks']} rank(s) x {arm['envs_per_rank']} envs"
            axes[0].plot(steps, returns, label=label)
            axes[1].plot(times, returns, label=label)
        axes[0].set_xlabel("environment steps (all ranks)")
        axes[1].set_xlabel("seconds")
        for axis in axes:
            axis.set_ylabel("episodic return")
            axis.grid(alpha=0.3)
            axis.legend()
        fig.savefig(args.out.with_suffix(".png"), dpi=110)
    except ImportError:
        pass
    brief = {**summary, "arms": [{k: v for k, v in a.items() if k != "curve"} for a in arms]}
    print(json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
