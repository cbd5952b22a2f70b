"""Spin-then-block against blocking: how the parent waits for the ``shm`` workers.

The parent can spin on the workers' shared "done" counters for ``spin_us`` before it blocks in
``poll``. Spinning saves a wake-up when steps are short, but on a machine where every core runs
a worker it takes a core the workers need. This measures both on CartPole (cheap steps) and on an
env whose steps cost ~1 ms of CPU, with as many workers as cores and with fewer.

Run (writes ``benchmarks/results/spin_vs_block.json``)::

    python benchmarks/waiting/spin_vs_block.py --seconds 3
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import numpy as np

import vecaccel
from vecaccel.bench import RunRecord, command_line
from vecaccel.testing.envs import HeavyTailEnv
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def _rate(env, n: int, workers: int, spin_us: float, seconds: float) -> float:
    envs = vecaccel.make_vec(env, n, backend="shm", num_workers=workers, spin_us=spin_us)
    try:
        envs.reset(seed=0)
        actions = np.zeros(n, dtype=np.int64)
        for _ in range(20):
            envs.step(actions)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            envs.step(actions)
            steps += n
        return steps / (time.perf_counter() - start)
    finally:
        envs.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "spin_vs_block.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    cpus = usable_cpus()
    slow = functools.partial(HeavyTailEnv, 0.001, 0.0, 0.0)
    cases = [("CartPole-v1", "CartPole-v1", 64), ("1 ms CPU/step", slow, 8)]
    rows = []
    for label, env, n in cases:
        for workers in sorted({cpus, max(1, cpus - 1)}):
            for spin in (0.0, 20.0, 100.0):
                rate = _rate(env, n, workers, spin, args.seconds)
                rows.append(
                    {
                        "env": label,
                        "num_envs": n,
                        "workers": workers,
                        "spin_us": spin,
                        "steps_per_s": rate,
                    }
                )
                print(
                    f"{label:<14} n={n:<3} workers={workers} spin_us={spin:>5.0f}: "
                    f"{rate:>9.0f} steps/s",
                    flush=True,
                )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        run_record.write(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
