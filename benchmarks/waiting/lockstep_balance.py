"""What lock-step costs when the CPUs' speeds differ from moment to moment.

A lock-step vec env (vecaccel ``shm``, one worker per CPU) finishes a step when its slowest
worker does. On a quiet machine the workers take about the same time; on a VM whose vCPUs swing
between a fast and a slow state independently, each step waits for whichever CPU is slow at the
moment. ``SubprocVecEnv``'s one process per env lets the kernel move envs from a slow CPU to a
fast one; two 8-env workers cannot.

This starts one process per CPU, pinned, each with ``--num-envs`` Pong envs (SB3's
``AtariWrapper``), and steps them in lock-step with a pause before each batch, as SB3's loop
pauses for the policy's forward pass (``--pause sleep``, or ``--pause forward`` for SB3's CNN
run by the caller, on one of the CPUs, as in SB3's loop). For every batch it records each CPU's time, and reports:

* ``lockstep_ms``: the mean of the slowest CPU's time (what a lock-step step waits for);
* ``balanced_ms``: the mean of the CPUs' mean time (a perfectly balanced step, free of cost);
* ``penalty``: their ratio, the share of a lock-step step lost to imbalance;
* ``lag1_corr``: how much one batch's difference between the CPUs predicts the next one's.

Run (writes ``benchmarks/results/lockstep_balance.json``)::

    python benchmarks/waiting/lockstep_balance.py
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from vecaccel.bench import RunRecord, command_line
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

PAUSES = ("sleep", "forward")


def _stepper(cpu: int | None, num_envs: int, seed: int, conn: Any) -> None:
    """Step ``num_envs`` Pong envs once per byte received; answer each batch's seconds."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    gym.register_envs(ale_py)
    envs = [AtariWrapper(gym.make("PongNoFrameskip-v4")) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    rng = np.random.default_rng(seed)
    conn.send_bytes(b"ready")
    try:
        while conn.recv_bytes() == b"step":
            start = time.perf_counter()
            for env in envs:
                _, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
                if terminated or truncated:
                    env.reset()
            conn.send_bytes(struct.pack("d", time.perf_counter() - start))
    finally:
        for env in envs:
            env.close()


def cpus_to_pin(count: int) -> list[int | None]:
    """A CPU for each of ``count`` workers among those this process may use, distinct while
    there are enough (``None`` where pinning is unavailable)."""
    if not hasattr(os, "sched_getaffinity"):
        return [None] * count
    allowed = sorted(os.sched_getaffinity(0))
    return [allowed[i % len(allowed)] for i in range(count)]


def forward_pass(batch: int = 16) -> Callable[[], None]:
    """SB3's ``CnnPolicy`` features (NatureCNN) on a batch of 4x84x84 frames, one torch thread:
    the work the caller does between two steps of SB3's loop."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.torch_layers import NatureCNN

    torch.set_num_threads(1)
    net = NatureCNN(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
    frames = torch.randint(0, 255, (batch, 4, 84, 84), dtype=torch.uint8)

    def run() -> None:
        with torch.no_grad():
            net(frames.float() / 255.0)

    return run


def measure(
    batches: int,
    gap: float,
    num_envs: int,
    workers: int,
    context: str | None = None,
    pause: str = "sleep",
) -> np.ndarray:
    """Seconds of each worker for each batch: an array ``(batches, workers)``.

    Before each batch the caller sleeps ``gap`` seconds (``pause="sleep"``), or runs a forward
    pass of SB3's CNN on 16 frames (``pause="forward"``; ``gap`` is not used then).
    """
    if pause not in PAUSES:
        raise ValueError(f"pause must be one of {PAUSES}, got {pause!r}")
    wait = forward_pass() if pause == "forward" else (lambda: time.sleep(gap))
    ctx = mp.get_context(context)
    conns, procs = [], []
    try:
        for k, cpu in enumerate(cpus_to_pin(workers)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_stepper, args=(cpu, num_envs, 1000 * k, child), daemon=True)
            proc.start()
            child.close()
            conns.append(parent)
            procs.append(proc)
        for conn in conns:
            if conn.recv_bytes() != b"ready":
                raise RuntimeError("a stepper process did not start")
        times = np.empty((batches, workers))
        for b in range(batches):
            wait()  # the policy's forward pass, in SB3's loop
            for conn in conns:
                conn.send_bytes(b"step")
            for k, conn in enumerate(conns):
                times[b, k] = struct.unpack("d", conn.recv_bytes())[0]
        return times
    finally:
        for conn in conns:
            try:
                conn.send_bytes(b"stop")
            except OSError:
                pass
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def summarize(times: np.ndarray) -> dict[str, Any]:
    """The figures of the module docstring from per-batch, per-worker seconds."""
    slowest, mean = times.max(axis=1), times.mean(axis=1)
    record: dict[str, Any] = {
        "batches": int(times.shape[0]),
        "workers": int(times.shape[1]),
        "per_worker_mean_ms": [round(float(t) * 1e3, 3) for t in times.mean(axis=0)],
        "per_worker_median_ms": [round(float(t) * 1e3, 3) for t in np.median(times, axis=0)],
        "lockstep_ms": round(float(slowest.mean()) * 1e3, 3),
        "balanced_ms": round(float(mean.mean()) * 1e3, 3),
        "penalty": round(float(slowest.mean() / mean.mean()), 4),
        "share_over_1.3x": round(float((slowest > 1.3 * times.min(axis=1)).mean()), 4),
        "lag1_corr": None,
    }
    if times.shape[0] > 2 and times.shape[1] > 1:
        diff = times[:, 0] - times[:, 1]
        if diff[:-1].std() > 0 and diff[1:].std() > 0:
            record["lag1_corr"] = round(float(np.corrcoef(diff[:-1], diff[1:])[0, 1]), 4)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument(
        "--pause",
        default=",".join(PAUSES),
        help="comma-separated, each measured in turn: before each batch the caller sleeps "
        "--gap-ms (sleep) or runs SB3's CNN on 16 frames (forward)",
    )
    parser.add_argument("--gap-ms", type=float, default=6.0, help="the sleep before each batch")
    parser.add_argument("--num-envs", type=int, default=8, help="envs per worker")
    parser.add_argument("--workers", type=int, default=None, help="default: the usable CPUs")
    parser.add_argument("--context", default=None, help="multiprocessing start method")
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "lockstep_balance.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    if args.batches < 1 or args.num_envs < 1:
        parser.error("--batches and --num-envs must be at least 1")
    pauses = args.pause.split(",")
    unknown = [p for p in pauses if p not in PAUSES]
    if unknown:
        parser.error(f"--pause: unknown {unknown}; choose from {', '.join(PAUSES)}")
    workers = args.workers or usable_cpus()
    records = []
    for pause in pauses:
        times = measure(
            args.batches, args.gap_ms / 1e3, args.num_envs, workers, args.context, pause
        )
        records.append(
            {
                "pause": pause,
                "gap_ms": args.gap_ms if pause == "sleep" else None,
                "num_envs": args.num_envs,
                **summarize(times),
            }
        )
        for key, value in records[-1].items():
            print(f"{key}: {value}")
    if args.json:
        run_record.write(args.json, records)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
