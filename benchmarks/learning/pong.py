"""PPO learning on Pong, and evidence that bf16 autocast and channels_last do not change it.

Three subcommands:

``run``
    Starts the learning run with the settings of ``benchmarks/learning/ppo_pong_vs_sb3.py`` (the
    ``atari`` preset, 16 envs x 128 steps, 4 epochs of minibatches of 256) through the command
    line, printing the exact command. ``--bf16 on`` (default) or ``off``; ``--channels-last``.

``plot RUN_DIR[=LABEL] ...``
    Reads each run's ``metrics.csv`` and writes ``OUT.png`` (episodic return against env steps
    and against wall-clock hours, one line per run, with the random-play score) and
    ``OUT.csv``/``OUT.json`` (per run: steps reached, hours, SPS, the running mean return and
    the best running mean). ``charts/episodic_return`` is the mean game score (unclipped, full
    games) of the episodes that ended in one update; the running mean is over the last
    ``--window`` updates that ended an episode.

``drift``
    Learning is unchanged if bf16 moves the parameters no further from fp32's than the run's own
    randomness does. One fixed set of real Pong batches (collected once, by the initial policy)
    is given to PPO updates in sequence, from the same initial weights, by: fp32 NCHW with
    shuffle seed 0 (the reference), fp32 channels_last, bf16 NCHW and bf16 channels_last with
    the same shuffles, and fp32 NCHW with other shuffle seeds (``--noise-seeds``: the
    algorithm's own noise, where only the minibatch order differs). After each
    update it reports each variant's policy KL from the reference on held-out frames, and its
    loss metrics; writes ``OUT.json`` and ``OUT.md``.

Usage::

    python benchmarks/learning/pong.py run --run-dir runs/pong-ppo --total-timesteps 3000000
    python benchmarks/learning/pong.py plot runs/pong-ppo=bf16 --out benchmarks/results/pong_learning
    python benchmarks/learning/pong.py drift --updates 8 --out benchmarks/results/pong_learning_drift
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from vecaccel.bench import RunRecord, command_line

ENV_ID = "PongNoFrameskip-v4"
#: Random play's Pong score in Mnih et al. (2015), Extended Data Table 2.
RANDOM_SCORE = -20.7


# -- run -----------------------------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> list[str]:
    """The ``vecaccel train ppo`` command line of the learning run."""
    command = [
        "vecaccel", "train", "ppo", "--preset", "atari", "--env", ENV_ID, "--backend", "shm",
        "--num-envs", str(args.num_envs), "--num-steps", "128",
        "--num-minibatches", str(args.num_envs * 128 // 256), "--update-epochs", "4",
        "--bf16", args.bf16, "--channels-last" if args.channels_last else "--no-channels-last",
        "--total-timesteps", str(args.total_timesteps), "--seed", str(args.seed), "--no-progress",
        "--run-dir", args.run_dir,
    ]  # fmt: skip
    return command


def cmd_run(args: argparse.Namespace) -> int:
    command = run_command(args)
    if args.nice:
        command = ["nice", "-n", str(args.nice), *command]
    print(" ".join(shlex.quote(part) for part in command), flush=True)
    return subprocess.call(command)


# -- plot ----------------------------------------------------------------------------------------


def read_run(run_dir: Path) -> list[tuple[int, float, float | None, float | None]]:
    """``(step, seconds, episodic_return or None, SPS or None)`` per logged update."""
    rows = []
    with open(run_dir / "metrics.csv", newline="") as file:
        for row in csv.DictReader(file):

            def number(key: str, row: dict[str, str] = row) -> float | None:
                value = row.get(key)
                return float(value) if value not in (None, "") else None

            rows.append(
                (
                    int(row["step"]),
                    float(row["time"]),
                    number("charts/episodic_return"),
                    number("charts/SPS"),
                )
            )
    return rows


def running_means(values: list[float], window: int) -> list[float]:
    out = []
    for index in range(len(values)):
        chunk = values[max(0, index + 1 - window) : index + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def summarize_run(label: str, run_dir: Path, window: int) -> dict[str, Any]:
    rows = read_run(run_dir)
    episodes = [(step, sec, ret) for step, sec, ret, _ in rows if ret is not None]
    returns = [ret for _, _, ret in episodes]
    means = running_means(returns, window)
    last_step, last_seconds = rows[-1][0], rows[-1][1]
    summary: dict[str, Any] = {
        "label": label,
        "run_dir": str(run_dir),
        "steps": last_step,
        "frames": 4 * last_step,
        "hours": round(last_seconds / 3600, 3),
        "mean_sps": round(last_step / last_seconds, 1) if last_seconds else None,
        "updates_with_episodes": len(episodes),
        "final_running_mean": round(means[-1], 2) if means else None,
        "best_running_mean": round(max(means), 2) if means else None,
        "window": window,
    }
    for threshold in (-20.0, -18.0, -15.0, -10.0, 0.0):
        reached = next((ep for ep, mean in zip(episodes, means) if mean >= threshold), None)
        summary[f"steps_to_{threshold:g}"] = reached[0] if reached else None
    summary["curve"] = [
        {"step": step, "seconds": sec, "episodic_return": ret, "running_mean": round(mean, 3)}
        for (step, sec, ret), mean in zip(episodes, means)
    ]
    return summary


def cmd_plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summaries = []
    for spec in args.runs:
        path, _, label = spec.partition("=")
        summaries.append(summarize_run(label or Path(path).name, Path(path), args.window))

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for summary in summaries:
        steps = [point["step"] for point in summary["curve"]]
        hours = [point["seconds"] / 3600 for point in summary["curve"]]
        raw = [point["episodic_return"] for point in summary["curve"]]
        mean = [point["running_mean"] for point in summary["curve"]]
        for axis, x in ((axes[0], steps), (axes[1], hours)):
            (line,) = axis.plot(x, mean, label=f"{summary['label']} (running mean)")
            axis.plot(x, raw, color=line.get_color(), alpha=0.25, linewidth=0.8)
    for axis, xlabel in ((axes[0], "agent steps (x4 frames)"), (axes[1], "wall-clock hours")):
        axis.axhline(RANDOM_SCORE, color="grey", linestyle="--", label="random play (-20.7)")
        axis.set_xlabel(xlabel)
        axis.set_ylabel("episodic return (game score)")
        axis.set_ylim(-21.5, 21.5)
        axis.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8)
    figure.suptitle(
        f"vecaccel PPO on {ENV_ID}: 16 envs x 128 steps, 4 epochs, minibatch 256, 2 CPU cores "
        f"(running mean over {args.window} updates)",
        fontsize=10,
    )
    figure.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out.with_suffix(".png"), dpi=110)

    with open(out.with_suffix(".csv"), "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["label", "step", "seconds", "episodic_return", "running_mean"])
        for summary in summaries:
            for point in summary["curve"]:
                writer.writerow(
                    [
                        summary["label"],
                        point["step"],
                        round(point["seconds"], 1),
                        point["episodic_return"],
                        point["running_mean"],
                    ]
                )
    args.run_record.write(
        out.with_suffix(".json"),
        [{k: v for k, v in s.items() if k != "curve"} for s in summaries],
        random_score=RANDOM_SCORE,
        window=args.window,
    )
    for summary in summaries:
        print({k: v for k, v in summary.items() if k != "curve"})
    print(f"wrote {out.with_suffix('.png')}, .csv, .json")
    return 0


# -- drift ---------------------------------------------------------------------------------------


def cmd_drift(args: argparse.Namespace) -> int:
    import torch

    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.ppo import PRESETS

    torch.set_num_threads(args.torch_threads)
    config = {
        **PRESETS["atari"],
        "num_envs": args.num_envs,
        "num_steps": 128,
        "num_minibatches": args.num_envs * 128 // 256,
        "update_epochs": 4,
        "seed": args.seed,
        "bf16": "off",
        "channels_last": False,
    }
    collector = PPO(ENV_ID, backend="shm", tensorboard=False, **config)
    started = time.perf_counter()
    batches = []
    try:
        collector.sampler.reset(seed=args.seed)
        for _ in range(args.updates + 1):
            batch = collector.sampler.collect()
            batches.append(type(batch)(*(_clone(field) for field in batch)))
    finally:
        collector.close()
    collect_seconds = time.perf_counter() - started
    # the last batch is never trained on: its frames measure how far the policies are apart
    held_out = batches.pop().obs.flatten(0, 1)
    initial_state = collector.model.state_dict()
    variants = {
        "fp32-nchw seed 0 (reference)": ("off", False, 0),
        "fp32-cl seed 0": ("off", True, 0),
        "bf16-nchw seed 0": ("on", False, 0),
        "bf16-cl seed 0": ("on", True, 0),
    }
    for seed in args.noise_seeds:
        variants[f"fp32-nchw seed {seed} (shuffle noise)"] = ("off", False, seed)
    agents = {}
    for name, (bf16, channels_last, _) in variants.items():
        agent = PPO(
            None,
            observation_space=collector.observation_space,
            action_space=collector.action_space,
            tensorboard=False,
            **{**config, "bf16": bf16, "channels_last": channels_last},
        )
        agent.model.load_state_dict(initial_state)
        agents[name] = agent
    generators = {
        name: torch.Generator().manual_seed(seed) for name, (*_, seed) in variants.items()
    }
    reference = next(iter(variants))
    records: list[dict[str, Any]] = []
    timings = dict.fromkeys(variants, 0.0)
    for update, batch in enumerate(batches, start=1):
        metrics = {}
        for name, agent in agents.items():
            # the update draws its minibatch permutations from torch's global generator
            torch.default_generator.set_state(generators[name].get_state())
            start = time.perf_counter()
            progress_remaining = 1.0 - (update - 1) / args.updates
            for group in agent.optimizer.param_groups:
                group["lr"] = agent.learning_rate * progress_remaining
            metrics[name] = agent.update(batch, progress_remaining)
            timings[name] += time.perf_counter() - start
            generators[name].set_state(torch.default_generator.get_state())
        with torch.no_grad():
            logits = {name: agent.model._heads(held_out)[0] for name, agent in agents.items()}
            values = {name: agent.model._heads(held_out)[1] for name, agent in agents.items()}
        for name in agents:
            record = {
                "update": update,
                "variant": name,
                "kl_from_reference": float(_kl(logits[reference], logits[name])),
                "value_rmse_from_reference": float(
                    (values[name] - values[reference]).pow(2).mean().sqrt()
                ),
                **{key.split("/")[1]: value for key, value in metrics[name].items()
                   if key.startswith("losses/")},
            }  # fmt: skip
            records.append(record)
    # how far the reference policy moved from the initial one (the scale of the KLs above)
    start_agent = PPO(
        None,
        observation_space=collector.observation_space,
        action_space=collector.action_space,
        tensorboard=False,
        **config,
    )
    start_agent.model.load_state_dict(initial_state)
    with torch.no_grad():
        moved = float(_kl(start_agent.model._heads(held_out)[0], logits[reference]))

    final = [r for r in records if r["update"] == len(batches)]
    lines = [
        f"After {len(batches)} PPO updates on the same {len(batches)} real Pong batches "
        f"({args.num_envs} envs x 128 steps each; 4 epochs, minibatches of 256), from the same "
        f"initial weights; policy KL and value RMSE from the reference on {len(held_out)} "
        f"held-out frames. The reference moved KL {moved:.2e} from the initial policy.",
        "",
        "| variant | KL from reference | value RMSE | policy loss | value loss | approx KL "
        "| clipfrac | update s (total) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in final:
        lines.append(
            f"| {r['variant']} | {r['kl_from_reference']:.2e} "
            f"| {r['value_rmse_from_reference']:.2e} | {r['policy_loss']:.4f} "
            f"| {r['value_loss']:.4f} | {r['approx_kl']:.5f} | {r['clipfrac']:.3f} "
            f"| {timings[r['variant']]:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average: {load}; collecting took {collect_seconds:.1f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(
        f"```bash\n{args.run_record.command}\n```\n\n{table}\n\nload average {load}\n"
    )
    args.run_record.write(
        out.with_suffix(".json"),
        records,
        torch_threads=torch.get_num_threads(),
        reference_moved_kl=moved,
        update_seconds=timings,
    )
    print(f"wrote {out.with_suffix('.md')} and .json")
    return 0 if all(math.isfinite(r["kl_from_reference"]) for r in records) else 1


def _clone(field: Any) -> Any:
    import torch

    if isinstance(field, torch.Tensor):
        return field.clone()
    if isinstance(field, dict):
        return {key: _clone(value) for key, value in field.items()}
    return field


def _kl(p_logits: Any, q_logits: Any) -> Any:
    """Mean KL(p || q) of categorical policies given by logits."""
    p_log, q_log = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (p_log.exp() * (p_log - q_log)).sum(-1).mean()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start the learning run")
    run.add_argument("--run-dir", default="runs/pong-ppo")
    run.add_argument("--total-timesteps", type=int, default=3_000_000)
    run.add_argument("--num-envs", type=int, default=16)
    run.add_argument("--bf16", default="on", choices=("on", "off", "auto"))
    run.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--nice", type=int, default=10, help="niceness (0: none)")
    run.set_defaults(handler=cmd_run)

    plot = sub.add_parser("plot", help="learning curves and summary of finished or running runs")
    plot.add_argument("runs", nargs="+", help="RUN_DIR or RUN_DIR=LABEL")
    plot.add_argument("--window", type=int, default=20, help="updates in the running mean")
    plot.add_argument("--out", default="benchmarks/results/pong_learning")
    plot.set_defaults(handler=cmd_plot)

    drift = sub.add_parser("drift", help="fp32 against bf16 over several PPO updates")
    drift.add_argument("--updates", type=int, default=8)
    drift.add_argument("--num-envs", type=int, default=8)
    drift.add_argument("--seed", type=int, default=0)
    drift.add_argument("--torch-threads", type=int, default=1)
    drift.add_argument(
        "--noise-seeds",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[1, 2],
        help="shuffle seeds of the fp32 runs that measure the algorithm's own noise",
    )
    drift.add_argument("--out", default="benchmarks/results/pong_learning_drift")
    drift.set_defaults(handler=cmd_drift)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.run_record = RunRecord(command_line(argv, __file__))
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
