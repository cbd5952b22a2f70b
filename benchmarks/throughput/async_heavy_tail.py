"""Async pooling against lock-step on an env with heavy-tailed step times.

Each step costs ``--cpu-ms`` of CPU; a fraction ``--p-slow`` of steps also sleeps ``--sleep-ms``
(as a remote simulator or a renderer does). ``shm`` steps all envs in lock-step, so every step
waits for the slowest env; ``async`` returns the first ``batch_size`` envs that are ready.

Run (writes ``benchmarks/results/async_heavy_tail.json``)::

    python benchmarks/throughput/async_heavy_tail.py --seconds 8
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import vecaccel
from vecaccel.bench import RunRecord, command_line
from vecaccel.testing.envs import HeavyTailEnv

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


class Factory:
    def __init__(self, cpu_s: float, p_slow: float, sleep_s: float) -> None:
        self.args = (cpu_s, p_slow, sleep_s)

    def __call__(self) -> HeavyTailEnv:
        return HeavyTailEnv(*self.args)


def measure(backend: str, factory: Factory, num_envs: int, seconds: float, **options) -> float:
    envs = vecaccel.make_vec(factory, num_envs, backend=backend, **options)
    try:
        obs, infos = envs.reset(seed=0)
        batch = obs.shape[0]
        actions = np.zeros(batch, dtype=np.int64)
        for _ in range(20):  # warm-up
            envs.step(actions)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            envs.step(actions)
            steps += batch
        return steps / (time.perf_counter() - start)
    finally:
        envs.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--cpu-ms", type=float, default=0.2)
    parser.add_argument("--p-slow", type=float, default=0.02)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "async_heavy_tail.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    factory = Factory(args.cpu_ms / 1e3, args.p_slow, args.sleep_ms / 1e3)
    common = {"num_workers": args.num_workers}
    rows = {
        "shm": measure("shm", factory, args.num_envs, args.seconds, **common),
        "async": measure(
            "async", factory, args.num_envs, args.seconds, batch_size=args.batch_size, **common
        ),
    }
    # lock-step: each step costs N*cpu/cores of CPU plus, in expectation, the slowest sleep
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu_bound = cores / (args.cpu_ms / 1e3)
    print(
        f"heavy-tailed env: {args.cpu_ms} ms CPU/step, {args.p_slow:.0%} of steps sleep "
        f"{args.sleep_ms} ms; {args.num_envs} envs, {args.num_workers} workers, "
        f"batch_size {args.batch_size}, {cores} cores"
    )
    print(f"{'backend':<10} {'steps/s':>10} {'vs shm':>8}")
    for name, rate in rows.items():
        print(f"{name:<10} {rate:>10.0f} {rate / rows['shm']:>7.2f}x")
    print(f"CPU-bound ceiling (cores / cpu per step): {cpu_bound:.0f} steps/s")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        results = [{"backend": name, "steps_per_s": rate} for name, rate in rows.items()]
        run_record.write(
            args.json,
            results,
            summary={
                "ratio_async_vs_shm": rows["async"] / rows["shm"],
                "cpu_bound_ceiling": cpu_bound,
            },
            args=vars(args),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
