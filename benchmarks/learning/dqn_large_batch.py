"""DQN on CartPole: batch 2048 with a scaled learning rate against batch 32.

The claim under test (Stooke & Abbeel, 2018): at a fixed replay ratio, a much larger training
batch with a suitably scaled learning rate does not cost sample complexity. Both arms use the
``cartpole`` preset of :mod:`vecaccel.trainers.algos.dqn` (Double DQN, 3-step returns, replay ratio 32)
and differ only in the batch size and the learning rate, which follows ``lr_scaling`` from the
batch-32 value (linear by default: with the replay ratio fixed, batch 2048 makes 64 times fewer
updates). The target network is refreshed every 250 env steps in both arms. Each run stops when the mean return of the last 10 episodes reaches the
threshold; reported are the env steps, gradient updates and wall-clock seconds to get there
(medians over the seeds), and their ratio between the arms.

Run (about 10 minutes on 2 CPU cores)::

    python benchmarks/learning/dqn_large_batch.py --seeds 1 2 3

Results go to ``benchmarks/results/dqn_large_batch.{json,md,png}`` with the command line
(``--out DIR`` writes them elsewhere, e.g. for a trial run that should not replace them).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vecaccel.bench import RunRecord, command_line, run_seeds
from vecaccel.trainers.algos.dqn import DQN, PRESETS

RESULTS = Path(__file__).resolve().parent.parent / "results"


def run_one(
    batch_size: int,
    seed: int,
    threshold: float,
    max_steps: int,
    lr_scaling: str,
    window: int,
    target_update_period: int,
) -> dict[str, Any]:
    """Train until the moving mean return reaches ``threshold`` (or ``max_steps``)."""
    config = dict(PRESETS["cartpole"])
    # the exploration schedule must not depend on the step budget, so that both arms explore alike
    config.update(
        batch_size=batch_size,
        buffer_size=50_000,
        exploration_steps=int(config.pop("exploration_fraction") * 20_000),
        lr_scaling=lr_scaling,
        target_update_period=target_update_period,
        seed=seed,
        progress=False,
        tensorboard=False,
        log_every_steps=10**9,
    )
    agent = DQN(env="CartPole-v1", **config)
    start = time.perf_counter()
    reached: dict[str, Any] = {}

    def stop_at_threshold(model: DQN) -> bool:
        returns = [r for _, r, _ in model.episode_log[-window:]]
        if len(returns) == window and np.mean(returns) >= threshold:
            reached.update(
                steps=model.global_step,
                updates=model.num_updates,
                seconds=time.perf_counter() - start,
            )
            return False
        return True

    try:
        agent.learn(max_steps, callback=stop_at_threshold)
    finally:
        agent.close()
    return {
        "batch_size": batch_size,
        "seed": seed,
        "learning_rate": agent.learning_rate,
        "lr_scale": agent.lr_scale,
        "solved": bool(reached),
        "steps": reached.get("steps"),
        "updates": reached.get("updates"),
        "seconds": reached.get("seconds"),
        "total_steps": agent.global_step,
        "total_updates": agent.num_updates,
        "total_seconds": time.perf_counter() - start,
        "replay_ratio": agent.replay_ratio,
        "curve": [(step, ret) for step, ret, _ in agent.episode_log],
    }


def run(batch_size: int, seed: int, **settings: Any) -> dict[str, Any]:
    """:func:`run_one` in its own process (see ``vecaccel.bench.seeds``), ``settings`` by name."""
    torch.set_num_threads(settings.pop("threads"))
    return run_one(batch_size, seed, **settings)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run[key] is not None]
    return float(np.median(values)) if len(values) == len(runs) else None


def _cell(value: float | None, spec: str = "") -> str:
    """A value for the report, ``-`` where there is none (a run that did not reach the
    threshold, or stopped before its first update)."""
    return "-" if value is None else format(value, spec)


def _write_report(results: dict[str, Any], run_record: RunRecord, out: Path = RESULTS) -> None:
    settings = {
        key: value
        for key, value in results.items()
        if key not in ("command", "runs", "summary", "step_ratio")
    }
    run_record.write(
        out / "dqn_large_batch.json",
        results["runs"],
        summary={"medians": results["summary"], "step_ratio": results["step_ratio"]},
        **settings,
    )
    lines = [
        "# DQN on CartPole-v1: batch 2048 with scaled learning rate vs batch 32",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Threshold: mean return of the last {results['window']} episodes >= "
        f"{results['threshold']}; replay ratio {results['replay_ratio']} for both; "
        f"learning-rate scaling `{results['lr_scaling']}`; target update every "
        f"{results['target_update_period']} env steps; at most {results['max_steps']} env steps.",
        f"Machine: {results['machine']}, torch {results['torch']}, {results['threads']} thread(s). "
        "Seconds are wall-clock on that machine, which other jobs may have shared.",
        "",
        "| batch | lr | seed | solved | env steps | updates | seconds | replay ratio |",
        "| ---: | ---: | ---: | :---: | ---: | ---: | ---: | ---: |",
    ]
    for run in results["runs"]:
        lines.append(
            f"| {run['batch_size']} | {run['learning_rate']:.2e} | {run['seed']} | "
            f"{'yes' if run['solved'] else 'no'} | {_cell(run['steps'])} | {_cell(run['updates'])} | "
            f"{_cell(run['seconds'], '.1f')} | {_cell(run['replay_ratio'], '.2f')} |"
        )
    lines += ["", "Medians (over seeds; '-' when a seed did not reach the threshold):", ""]
    lines += ["| batch | env steps | updates | seconds |", "| ---: | ---: | ---: | ---: |"]
    for batch, summary in results["summary"].items():
        cells = [_cell(summary[k], ".0f") for k in ("steps", "updates", "seconds")]
        lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    ratio = results.get("step_ratio")
    lines += [
        "",
        f"Env-step ratio (large / small batch, medians): "
        f"{'n/a' if ratio is None else f'{ratio:.2f}'} (target: <= 1.25).",
        "",
    ]
    (out / "dqn_large_batch.md").write_text("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axis = plt.subplots(figsize=(6.5, 3.8), constrained_layout=True)
    colors = {}
    for run in results["runs"]:
        if not run["curve"]:
            continue
        steps, returns = np.array(run["curve"]).T
        width = min(10, len(returns))  # a run stopped after a few episodes has a short curve
        smooth = np.convolve(returns, np.ones(width) / width, mode="valid")
        color = colors.setdefault(run["batch_size"], f"C{len(colors)}")
        label = f"batch {run['batch_size']}" if run["seed"] == results["seeds"][0] else None
        axis.plot(steps[width - 1 :], smooth, color=color, alpha=0.8, label=label)
    axis.axhline(results["threshold"], color="gray", linestyle=":")
    axis.set_xlabel("environment steps")
    axis.set_ylabel("return (10-episode mean)")
    axis.legend()
    fig.savefig(out / "dqn_large_batch.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--batch-sizes", type=int, nargs=2, default=[32, 2048])
    parser.add_argument("--threshold", type=float, default=400.0)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=50_000)
    parser.add_argument("--lr-scaling", default="linear", choices=["none", "linear", "sqrt"])
    parser.add_argument("--target-update-period", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every run in this process: quick to start, for trial runs (the figures want a "
        "fresh process per run)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"folder for the results (default {RESULTS})"
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))

    def report(run: dict[str, Any]) -> None:
        print(
            f"batch {run['batch_size']:5d} seed {run['seed']}: solved={run['solved']} "
            f"steps={run['steps']} updates={run['updates']} seconds={run['seconds']} "
            f"replay_ratio={_cell(run['replay_ratio'], '.2f')}",
            flush=True,
        )

    runs = run_seeds(
        __file__,
        "run",
        args.seeds,
        [{"batch_size": batch_size} for batch_size in args.batch_sizes],
        common={
            "threshold": args.threshold,
            "max_steps": args.max_steps,
            "lr_scaling": args.lr_scaling,
            "window": args.window,
            "target_update_period": args.target_update_period,
            "threads": args.threads,
        },
        in_process=args.in_process,
        on_run=report,
    )
    summary = {}
    for batch_size in args.batch_sizes:
        arm = [run for run in runs if run["batch_size"] == batch_size]
        summary[str(batch_size)] = {k: _median(arm, k) for k in ("steps", "updates", "seconds")}
    small, large = (summary[str(b)]["steps"] for b in args.batch_sizes)
    results = {
        "command": run_record.command,
        "threshold": args.threshold,
        "window": args.window,
        "max_steps": args.max_steps,
        "lr_scaling": args.lr_scaling,
        "target_update_period": args.target_update_period,
        "replay_ratio": PRESETS["cartpole"]["replay_ratio"],
        "seeds": args.seeds,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": torch.__version__,
        "threads": args.threads,
        "in_process": args.in_process,
        "runs": runs,
        "summary": summary,
        "step_ratio": None if not (small and large) else large / small,
    }
    _write_report(results, run_record, args.out)
    print(json.dumps({"summary": summary, "step_ratio": results["step_ratio"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
