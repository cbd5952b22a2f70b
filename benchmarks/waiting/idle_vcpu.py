"""Does a CPU that waited step envs slower? Sleeping against spinning before a batch of Pong steps.

In SB3's loop a worker waits through the policy's forward pass (~6 ms) before each batch of env
steps. If a vCPU that slept were slower to step afterwards (cold caches, a low clock, a host that
descheduled it), a worker that spins instead, or that wakes up shortly before the next command,
would step faster. This measures one process, pinned to one CPU, stepping 8 Pong envs (SB3's
``AtariWrapper``) after each kind of wait. The kinds rotate batch by batch, so that drifts in the
machine's speed reach all of them alike.

Run (writes ``benchmarks/results/idle_vcpu.json``)::

    python benchmarks/waiting/idle_vcpu.py
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

from vecaccel.bench import RunRecord, command_line

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def waits(gap: float) -> dict[str, Callable[[], None]]:
    """The kinds of wait, each ``gap`` seconds long."""
    return {
        "sleep": lambda: time.sleep(gap),
        "spin": lambda: _spin(gap),
        "sleep, then spin 0.5 ms": lambda: (time.sleep(gap - 5e-4), _spin(5e-4)),
        "sleep, then spin 1 ms": lambda: (time.sleep(gap - 1e-3), _spin(1e-3)),
    }


def measure(batches: int, gap: float, num_envs: int, cpu: int | None) -> list[dict]:
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    gym.register_envs(ale_py)
    envs = [AtariWrapper(gym.make("PongNoFrameskip-v4")) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    rng = np.random.default_rng(0)
    kinds = waits(gap)
    times: dict[str, list[float]] = {name: [] for name in kinds}
    try:
        for _ in range(batches):
            for name, wait in kinds.items():
                wait()
                start = time.perf_counter()
                for env in envs:
                    _, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
                    if terminated or truncated:
                        env.reset()
                times[name].append(time.perf_counter() - start)
    finally:
        for env in envs:
            env.close()
    return [
        {
            "wait": name,
            "gap_ms": gap * 1e3,
            "num_envs": num_envs,
            "batches": batches,
            "median_batch_ms": float(np.median(t) * 1e3),
            "mean_batch_ms": float(np.mean(t) * 1e3),
        }
        for name, t in times.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=600, help="batches per kind of wait")
    parser.add_argument("--gap-ms", type=float, default=6.0, help="the wait before each batch")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: none)")
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "idle_vcpu.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    if args.gap_ms <= 1.0:
        parser.error("--gap-ms must exceed the longest spin (1 ms)")
    records = measure(args.batches, args.gap_ms / 1e3, args.num_envs, args.cpu)
    print("| wait before the batch | median batch ms | mean batch ms |")
    print("| --- | ---: | ---: |")
    for r in records:
        print(f"| {r['wait']} | {r['median_batch_ms']:.2f} | {r['mean_batch_ms']:.2f} |")
    if args.json:
        run_record.write(args.json, records)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
