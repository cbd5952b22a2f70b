"""DQN, C51 and ε-Rainbow on CartPole-v1: env steps and wall-clock to a mean return of 475.

The vecaccel rows use the presets of :mod:`vecaccel.trainers.algos.dqn`, which differ only in the
extensions: ``cartpole`` (Double DQN, 3-step returns, batch 256 at replay ratio 32, 128-128 MLP,
one env) for DQN, ``cartpole-c51`` (the same with a 51-atom categorical head on [0, 100]) for
C51, and ``cartpole-rainbow`` (the same plus Dueling and prioritized replay: ε-Rainbow, ε-greedy
instead of noisy nets) for Rainbow. ε decays over ``--exploration-steps`` env steps whatever the
step budget; Rainbow's importance-sampling β anneals over ``--max-steps``.

The peer row is SB3's DQN with rl-baselines3-zoo's CartPole-v1 hyperparameters
(``hyperparams/dqn.yml``: learning rate 2.3e-3, batch 64, buffer 100,000, learning starts 1,000,
gamma 0.99, target update every 10 steps, 128 gradient steps every 256 env steps, so replay ratio
32 as in the vecaccel preset, ε to 0.04 over 16 % of the zoo's 50,000 steps, 256-256 MLP, one
env). Neither SB3 nor sb3-contrib has C51 or Rainbow (sb3-contrib's distributional agent is
QR-DQN), so those rows have no peer.

Every run is its own subprocess with one torch thread and the env in the training process
(vecaccel ``serial``, SB3 ``DummyVecEnv``); the libraries alternate seed by seed so that both
see the same drift in the machine's load. A run stops when the mean return of the last
``--window`` finished episodes reaches the last of ``--thresholds`` (475 by default, as in
``cartpole.py``); for every threshold are reported the env steps, gradient updates,
wall-clock and CPU seconds to reach it (wall-clock from building the env and agent, after the
imports), with medians over the seeds. The learning curves (return against env steps and
against wall-clock) go to the PNG. Results are rewritten after every run.

Run (about 25 minutes on 2 CPU cores)::

    nice -n 10 python benchmarks/learning/cartpole_dqn.py --seeds 1 2 3

Results go to ``benchmarks/results/learning_cartpole_dqn.{json,md,png}`` with the command line.
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

from vecaccel.bench import RunRecord, command_line, run_seeds

RESULTS = Path(__file__).resolve().parent.parent / "results"
ROWS = [("dqn", "vecaccel"), ("dqn", "sb3"), ("c51", "vecaccel"), ("rainbow", "vecaccel")]
PRESET_OF = {"dqn": "cartpole", "c51": "cartpole-c51", "rainbow": "cartpole-rainbow"}
ZOO_STEPS = 50_000  # rl-baselines3-zoo's budget, over which its exploration fraction applies


class Tracker:
    """Episode returns with their env step and wall-clock time, and when each threshold was met."""

    def __init__(self, thresholds: list[float], window: int, updates: Any) -> None:
        self.thresholds = sorted(thresholds)
        self.recent: deque[float] = deque(maxlen=window)
        self.updates = updates  # reads the agent's gradient-update count
        self.curve: list[tuple[int, float, float]] = []
        self.reached: dict[str, dict[str, float]] = {}
        self.start_wall = time.perf_counter()
        self.start_cpu = time.process_time()

    def add(self, step: int, episode_return: float) -> bool:
        """Record one episode; True once the moving mean reaches the highest threshold."""
        wall = time.perf_counter() - self.start_wall
        self.curve.append((int(step), round(wall, 3), float(episode_return)))
        self.recent.append(float(episode_return))
        if len(self.recent) < (self.recent.maxlen or 0):
            return False
        mean = sum(self.recent) / len(self.recent)
        for threshold in self.thresholds:
            if mean >= threshold and f"{threshold:g}" not in self.reached:
                self.reached[f"{threshold:g}"] = {
                    "steps": int(step),
                    "updates": int(self.updates()),
                    "wall": wall,
                    "cpu": time.process_time() - self.start_cpu,
                }
        return f"{self.thresholds[-1]:g}" in self.reached

    def record(self, steps: int) -> dict[str, Any]:
        return {
            "solved": f"{self.thresholds[-1]:g}" in self.reached,
            "reached": self.reached,
            "total_steps": int(steps),
            "total_updates": int(self.updates()),
            "total_wall": time.perf_counter() - self.start_wall,
            "total_cpu": time.process_time() - self.start_cpu,
            "curve": self.curve,
        }


def run_vecaccel(algo: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from vecaccel.trainers.algos.dqn import C51, DQN, PRESETS, Rainbow

    cls = {"dqn": DQN, "c51": C51, "rainbow": Rainbow}[algo]
    config = dict(PRESETS[PRESET_OF[algo]])
    config.pop("exploration_fraction", None)
    agent = cls(
        env="CartPole-v1",
        seed=seed,
        backend="serial",
        torch_threads=1,
        exploration_steps=args.exploration_steps,
        progress=False,
        tensorboard=False,
        log_every_steps=10**9,
        **config,
    )
    tracker = Tracker(args.thresholds, args.window, lambda: agent.num_updates)
    seen = 0

    def stop_when_solved(model: DQN) -> bool:
        nonlocal seen
        solved = False
        for step, episode_return, _ in model.episode_log[seen:]:
            solved = tracker.add(step, episode_return) or solved
        seen = len(model.episode_log)
        return not solved

    try:
        agent.learn(args.max_steps, callback=stop_when_solved)
    finally:
        agent.close()
    return tracker.record(agent.global_step)


def run(library: str, algo: str, seed: int, **settings: Any) -> dict[str, Any]:
    """One run of ``algo`` with ``library``, in its own process (see ``vecaccel.bench.seeds``);
    ``settings``: ``thresholds``, ``window``, ``max_steps``, ``exploration_steps``."""
    runner = run_vecaccel if library == "vecaccel" else run_sb3
    return runner(algo, seed, argparse.Namespace(**settings))


def run_sb3(algo: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    assert algo == "dqn", "SB3 has DQN only"
    model: Any = None
    tracker = Tracker(args.thresholds, args.window, lambda: model._n_updates)

    class StopWhenSolved(BaseCallback):
        def _on_step(self) -> bool:
            solved = False
            for info in self.locals["infos"]:
                if "episode" in info:
                    solved = tracker.add(self.num_timesteps, info["episode"]["r"]) or solved
            return not solved

    env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    model = DQN(
        "MlpPolicy",
        env,
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1_000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        # the zoo's 16 % of 50,000 steps, whatever this run's budget
        exploration_fraction=0.16 * ZOO_STEPS / args.max_steps,
        exploration_final_eps=0.04,
        policy_kwargs=dict(net_arch=[256, 256]),
        seed=seed,
        device="cpu",
    )
    model.learn(args.max_steps, callback=StopWhenSolved())
    env.close()
    return tracker.record(model.num_timesteps)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _format(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _name(algo: str) -> str:
    return "ε-Rainbow" if algo == "rainbow" else algo.upper()


def _moving_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _plot(runs: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True, sharey=True)
    colors = {row: f"C{i}" for i, row in enumerate(ROWS)}
    for run in runs:
        if not run["curve"]:
            continue
        steps, walls, returns = zip(*run["curve"])
        smooth = _moving_mean(list(returns), args.window)
        row = (run["algo"], run["library"])
        label = f"{_name(run['algo'])} ({run['library']})" if run["seed"] == args.seeds[0] else None
        axes[0].plot(steps, smooth, color=colors[row], alpha=0.8, label=label)
        axes[1].plot(walls, smooth, color=colors[row], alpha=0.8)
    for axis in axes:
        for threshold in args.thresholds:
            axis.axhline(threshold, color="gray", linestyle=":")
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel("wall-clock seconds (shared, niced machine)")
    axes[0].set_ylabel(f"return ({args.window}-episode mean)")
    axes[0].legend(loc="lower right")
    fig.suptitle(f"CartPole-v1, seeds {', '.join(map(str, args.seeds))}")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _report(
    runs: list[dict[str, Any]], args: argparse.Namespace, run_record: RunRecord
) -> list[str]:
    import stable_baselines3
    import torch

    rows = [row for row in ROWS if row[0] in args.algos]
    expected = len(args.seeds)
    loads = [run["load_before"] for run in runs]
    top = f"{max(args.thresholds):g}"
    lines = [
        f"# CartPole-v1, DQN family: env steps and wall-clock to a mean return of {top} "
        f"(last {args.window} episodes)",
        "",
        f"Command: `{run_record.command}`",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, shared "
        f"with other jobs (1-minute load average before the runs: {min(loads):.1f} to "
        f"{max(loads):.1f}; per run in the JSON) and niced, so wall-clock seconds are inflated "
        "and noisy; env steps and updates are not. Python "
        f"{platform.python_version()}, torch {torch.__version__}, SB3 "
        f"{stable_baselines3.__version__}, one torch thread, one env in the training process, "
        f"ε decaying over {args.exploration_steps:,} env steps (SB3: {int(0.16 * ZOO_STEPS):,}), "
        f"at most {args.max_steps:,} env steps a run.",
        "",
        "| algo | library | threshold | reached | median env steps | median updates | "
        "median wall s | median CPU s | per seed env steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    summary = []
    for algo, library in rows:
        mine = [r for r in runs if r["algo"] == algo and r["library"] == library]
        if not mine:
            continue
        for threshold in (f"{t:g}" for t in sorted(args.thresholds)):
            hits = [r["reached"][threshold] for r in mine if threshold in r["reached"]]
            complete = len(hits) == len(mine) == expected
            medians = {
                key: _median([hit[key] for hit in hits]) if complete else None
                for key in ("steps", "updates", "wall", "cpu")
            }
            summary.append(
                {
                    "algo": algo,
                    "library": library,
                    "threshold": float(threshold),
                    "reached": len(hits),
                    "runs": len(mine),
                    "medians": medians,
                }
            )
            per_seed = ", ".join(
                f"{r['reached'][threshold]['steps']:,}" if threshold in r["reached"] else "-"
                for r in mine
            )
            lines.append(
                f"| {_name(algo)} | {library} | {threshold} | {len(hits)}/{len(mine)} | "
                f"{_format(medians['steps'], 0)} | {_format(medians['updates'], 0)} | "
                f"{_format(medians['wall'])} | {_format(medians['cpu'])} | {per_seed} |"
            )
    lines += [
        "",
        f"A median is given only when all {expected} seeds reached the threshold ('-' in the "
        "per-seed list: not reached within the budget). SB3 has no C51 or Rainbow, so those "
        "rows have no peer. Learning curves (against env steps and wall-clock): "
        "`learning_cartpole_dqn.png`.",
    ]
    run_record.write(
        args.out / "learning_cartpole_dqn.json",
        runs,
        summary=summary,
        complete=len(runs) == expected * len(rows),
        thresholds=args.thresholds,
        window=args.window,
        max_steps=args.max_steps,
        exploration_steps=args.exploration_steps,
        in_process=args.in_process,
    )
    (args.out / "learning_cartpole_dqn.md").write_text("\n".join(lines) + "\n")
    _plot(runs, args, args.out / "learning_cartpole_dqn.png")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--algos", nargs="+", default=["dqn", "c51", "rainbow"], choices=sorted(PRESET_OF)
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument(
        "--thresholds",
        nargs="+",
        type=float,
        default=[400.0, 475.0],
        help="moving-mean returns to time; a run stops at the highest",
    )
    parser.add_argument("--window", type=int, default=20, help="episodes in the moving mean")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--exploration-steps", type=int, default=8_000)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="every run in this process: quick to start, for trial runs (the figures want a "
        "fresh process per run)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    run_record = RunRecord(command_line(argv, __file__))
    rows = [row for row in ROWS if row[0] in args.algos]
    runs: list[dict[str, Any]] = []
    lines: list[str] = []

    def report(record: dict[str, Any]) -> None:
        nonlocal lines
        runs.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "curve"}), flush=True)
        lines = _report(runs, args, run_record)  # the results so far, rewritten after every run

    run_seeds(
        __file__,
        "run",
        args.seeds,
        [{"library": library, "algo": algo} for algo, library in rows],
        common={
            "thresholds": args.thresholds,
            "window": args.window,
            "max_steps": args.max_steps,
            "exploration_steps": args.exploration_steps,
        },
        in_process=args.in_process,
        on_run=report,
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
