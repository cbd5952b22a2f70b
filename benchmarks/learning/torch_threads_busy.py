"""PPO training speed beside busy processes: automatic torch threads against fixed counts.

torch's intra-op threads wait for each other after every operation, so a run whose threads fill
every core slows down many times over when another process takes one. This trains PPO (its
preset) alone and beside one and two busy loops (processes that are not the run's own, as another
user's job; ``--busy-nice`` nices them, as a long run in the background is,
``--busy-setsid`` starts each with ``setsid``, in a scheduler autogroup of its own, as
``setsid nohup`` or another terminal does, and ``--busy-kind train`` makes each a PQN training run on MinAtar), with
``--torch-threads 0`` (automatic: the default) and with each fixed count from
1 to the usable CPUs. Each row is the run's own steps/s (its last ``charts/SPS``, set-up left
out); the figure is the default's share of the best fixed count in the same condition, the ideal
being 1.0. Conditions and settings alternate within each trial, so a drift of the machine reaches
them alike.

Run (writes ``benchmarks/results/torch_threads_busy.json``)::

    python benchmarks/learning/torch_threads_busy.py
    python benchmarks/learning/torch_threads_busy.py --games minatar --trials 1   # a short look
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vecaccel.bench import RunRecord, command_line
from vecaccel.bench.seeds import start_elsewhere
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

#: game: (preset, env id, env steps a run takes)
GAMES = {
    "minatar": ("minatar", "MinAtar/Breakout-v0", 32_768),
    "pong": ("atari", "PongNoFrameskip-v4", 6_144),
    "mujoco": ("mujoco", "HalfCheetah-v5", 8_192),
}

#: what keeps the other cores busy: a Python busy loop, or a PQN training run on MinAtar (a
#: process that sleeps and wakes as it steps its envs and updates, as a real job beside does)
BUSY_COMMANDS = {
    "loop": ["-c", "while True: pass"],
    "train": [
        "-m", "vecaccel", "train", "pqn", "--preset", "minatar", "--env", "MinAtar/Breakout-v0",
        "--total-timesteps", "1000000000", "--no-progress", "--no-tensorboard",
        "--run-dir", "{run_dir}",
    ],
}  # fmt: skip


@contextmanager
def busy_loops(
    count: int, nice: int = 0, kind: str = "loop", setsid: bool = False
) -> Iterator[list[int]]:
    """``count`` busy processes of ``kind`` (:data:`BUSY_COMMANDS`) that are not this process's
    children (their shell exits at once), at ``nice`` (a niced job, as a long benchmark run in
    the background is), each started with ``setsid`` where asked."""
    pids = []
    with tempfile.TemporaryDirectory() as folder:
        for index in range(count):
            run_dir = os.path.join(folder, f"busy{index}")
            words = [word.format(run_dir=run_dir) for word in BUSY_COMMANDS[kind]]
            pids.append(start_elsewhere([sys.executable, *words], nice=nice, setsid=setsid))
        time.sleep(0.5 if kind == "loop" else 10.0)  # a training run is busy once it has started
        try:
            yield pids
        finally:
            _stop(pids)


def _stop(pids: list[int], grace_s: float = 30.0) -> None:
    """End the busy processes: SIGTERM (a training run closes its envs), SIGKILL after
    ``grace_s``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def train(game: str, threads: int, seed: int) -> dict:
    """One ``vecaccel train ppo`` run of ``game``; its steps/s and wall time."""
    preset, env_id, steps = GAMES[game]
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        command = [
            sys.executable, "-m", "vecaccel", "train", "ppo", "--preset", preset,
            "--env", env_id, "--total-timesteps", str(steps), "--torch-threads", str(threads),
            "--seed", str(seed), "--no-progress", "--no-tensorboard", "--run-dir", str(run_dir),
        ]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        with open(run_dir / "metrics.csv") as rows:
            last = list(csv.DictReader(rows))[-1]
    return {
        "steps": int(float(last["step"])),
        "steps_per_s": float(last["charts/SPS"]),
        "wall_s": wall,
        "thread_warning": "TorchThreadsWarning" in done.stderr,
    }


def summarize(rows: list[dict], settings: list[int]) -> list[dict]:
    """Per game and busy count: the mean steps/s of each setting, and the default's share of the
    best fixed count."""
    out = []
    for game in dict.fromkeys(r["game"] for r in rows):
        for busy in sorted({r["busy"] for r in rows if r["game"] == game}):
            means = {}
            for threads in settings:
                sps = [
                    r["steps_per_s"]
                    for r in rows
                    if (r["game"], r["busy"], r["threads"]) == (game, busy, threads)
                ]
                means[threads] = sum(sps) / len(sps)
            fixed = {t: v for t, v in means.items() if t > 0}
            best = max(fixed, key=fixed.__getitem__)
            out.append(
                {
                    "game": game,
                    "busy": busy,
                    "steps_per_s": {str(t): round(v, 1) for t, v in means.items()},
                    "best_fixed": best,
                    "default_vs_best": means[0] / fixed[best],
                    "one_thread_vs_best": fixed[1] / fixed[best],
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", nargs="+", choices=sorted(GAMES), default=["minatar", "pong"])
    parser.add_argument("--busy", nargs="+", type=int, default=[0, 1, 2], help="busy loops beside")
    parser.add_argument("--trials", type=int, default=2, help="runs of each setting")
    parser.add_argument(
        "--busy-nice", type=int, default=0, help="the busy loops' nice value (default: 0)"
    )
    parser.add_argument(
        "--busy-kind", choices=sorted(BUSY_COMMANDS), default="loop", help="what keeps cores busy"
    )
    parser.add_argument(
        "--busy-setsid",
        action="store_true",
        help="start each busy process with setsid, in a scheduler autogroup of its own",
    )
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "torch_threads_busy.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    settings = [0, *range(1, usable_cpus() + 1)]
    rows = []
    for trial in range(args.trials):
        for game in args.games:
            for busy in args.busy:
                with busy_loops(busy, args.busy_nice, args.busy_kind, args.busy_setsid):
                    # the order of the settings turns with the trial
                    turn = trial % len(settings)
                    for threads in settings[turn:] + settings[:turn]:
                        row = {"game": game, "busy": busy, "threads": threads, "trial": trial,
                               "busy_nice": args.busy_nice, "busy_kind": args.busy_kind,
                               "busy_setsid": args.busy_setsid}  # fmt: skip
                        row.update(train(game, threads, seed=trial + 1))
                        rows.append(row)
                        print(
                            f"{game} busy={busy} threads={threads or 'auto'}: "
                            f"{row['steps_per_s']:.0f} steps/s ({row['wall_s']:.1f} s)",
                            flush=True,
                        )
    summary = summarize(rows, settings)
    fixed = " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in settings[1:])
    print(f"| game | busy loops | default | {fixed} | default / best fixed |")
    print("| --- | ---: | ---: |" + " ---: |" * len(settings))
    for s in summary:
        cells = " | ".join(f"{s['steps_per_s'][str(t)]:,.0f}" for t in settings[1:])
        print(
            f"| {s['game']} | {s['busy']} | {s['steps_per_s']['0']:,.0f} | {cells} | "
            f"{s['default_vs_best']:.2f} |"
        )
    if args.json:
        run_record.write(args.json, rows, summary={"conditions": summary})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
