"""``max_concurrency=1`` against no cap, on envs that each hold one shared lock while they step.

Each env takes an exclusive ``flock`` on one file for its whole step and sleeps ``--hold-ms``
(5 ms) holding it, as envs that share one licence, device or renderer do: the lock serialises
the steps whatever the backend does. ``--num-envs`` envs (8) run one per worker on ``shm``
(``--backend``), in lock-step, with no cap and with ``max_concurrency=1`` (one semaphore around
each env's step), in alternating trials timed for ``--seconds`` each, in fresh workers.

Each env stamps, per step, when ``step`` was called, when it got the lock and when it left. Each
row gives steps/s and its share of the ideal; the share of the time the lock was held (steps/s
times the row's own hold time); per env step, the time blocked on the file lock
(called to locked), the time holding it, and the time outside ``step`` (its reply, the caller's
turn and, with the cap, the wait for the semaphore, which is taken before ``step`` is called);
the most envs inside ``step`` at once and the most holding the lock at once
(``vecaccel.testing.envs.most_inside_at_once``); and the CPU the workers and the caller used,
as a share of the cores.

**The ideal.** The lock lets one step through at a time, so no backend passes ``1 / hold`` steps
per second, ``hold`` being the time one env holds the lock in a step, stepped alone in this
process in every round (the sleep as the machine gives it).

Run (writes ``benchmarks/results/max_concurrency.json``)::

    python benchmarks/throughput/max_concurrency.py --seconds 4 --trials 3
"""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import tempfile
import time
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from async_batch_former import process_cpu_s, usable_cores
from gymnasium import spaces

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line
from vecaccel.testing.envs import most_inside_at_once

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


class LockedEnv(gym.Env):
    """Holds an exclusive ``flock`` on ``lock_path`` for ``hold_s`` each step, and reports when
    ``step`` was called, when it got the lock and when it left (``time.monotonic()``, one clock
    for every process)."""

    def __init__(self, lock_path: str, hold_s: float) -> None:
        self.lock_path, self.hold_s = lock_path, hold_s
        self.observation_space = spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        called = time.monotonic()
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            locked = time.monotonic()
            time.sleep(self.hold_s)
            left = time.monotonic()
        self.t += 1
        info = {"called": called, "locked": locked, "left": left}
        return np.array([self.t], np.float32), 1.0, False, False, info


class Factory:
    """Picklable env function (the workers may start under spawn)."""

    def __init__(self, lock_path: str, hold_s: float) -> None:
        self.args = (lock_path, hold_s)

    def __call__(self) -> LockedEnv:
        return LockedEnv(*self.args)


def hold_alone_s(factory: Factory, seconds: float) -> float:
    """The time one env holds the lock in a step (got it to left), stepped alone in this
    process: the part of a step the lock serialises, the ideal's input."""
    env = factory()
    env.reset(seed=0)
    held, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        info = env.step(0)[-1]
        held.append(info["left"] - info["locked"])
    return float(np.mean(held))


def measure(
    factory: Factory, args: argparse.Namespace, trial: int, cap: int | None
) -> dict[str, float | None]:
    """One trial of one configuration over ``--seconds``."""
    options: dict[str, Any] = {} if cap is None else {"max_concurrency": cap}
    envs = vecaccel.make_vec(
        factory, args.num_envs, backend=args.backend, num_workers=args.num_envs, **options
    )
    actions = np.zeros(args.num_envs, dtype=np.int64)
    try:
        pids = [worker.process.pid for worker in envs.pool.workers]
        envs.reset(seed=trial)
        for _ in range(5):  # warm-up
            envs.step(actions)
        called, locked, left = [], [], []
        workers_before = [process_cpu_s(pid) for pid in pids]
        caller_before, start = time.process_time(), time.perf_counter()
        steps = 0
        while time.perf_counter() - start < args.seconds:
            *_, infos = envs.step(actions)
            # copies: the info arrays may be reused by the next step
            called.append(np.array(infos["called"]))
            locked.append(np.array(infos["locked"]))
            left.append(np.array(infos["left"]))
            steps += args.num_envs
        elapsed = time.perf_counter() - start
        workers_after = [process_cpu_s(pid) for pid in pids]
        caller_cpu = time.process_time() - caller_before
    finally:
        envs.close()
    calls, locks, lefts = np.array(called), np.array(locked), np.array(left)  # [step, env]
    known = None not in workers_before and None not in workers_after
    worker_cpu = (
        sum(b - a for a, b in zip(workers_before, workers_after)) if known else None  # type: ignore[operator]
    )
    hold_s = float((lefts - locks).mean())
    return {
        "steps_per_s": steps / elapsed,
        "lock_busy_share": steps / elapsed * hold_s,
        "lock_wait_ms": float((locks - calls).mean()) * 1e3,
        "hold_ms": hold_s * 1e3,
        "outside_ms": float((calls[1:] - lefts[:-1]).mean()) * 1e3,
        "most_inside_step": most_inside_at_once(list(zip(calls.ravel(), lefts.ravel()))),
        "most_holding_lock": most_inside_at_once(list(zip(locks.ravel(), lefts.ravel()))),
        "worker_cpu_share": None if worker_cpu is None else worker_cpu / elapsed / usable_cores(),
        "caller_cpu_share": caller_cpu / elapsed / usable_cores(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8, help="envs, one worker each")
    parser.add_argument("--backend", default="shm", help="a process backend (default: shm)")
    parser.add_argument("--hold-ms", type=float, default=5.0, help="each step's sleep, locked")
    parser.add_argument("--seconds", type=float, default=4.0, help="each trial's timed seconds")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "max_concurrency.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.json:
        check_output_path(args.json)
    run_record = RunRecord(command_line(argv, __file__))
    caps: dict[str, int | None] = {"no cap": None, "max_concurrency=1": 1}
    trials: dict[str, list[dict[str, Any]]] = {name: [] for name in caps}
    holds = []
    with tempfile.TemporaryDirectory() as folder:
        factory = Factory(os.path.join(folder, "licence.lock"), args.hold_ms / 1e3)
        for trial in range(args.trials):
            holds.append(hold_alone_s(factory, max(0.05, args.seconds / 4)))
            for name, cap in caps.items():
                trials[name].append(measure(factory, args, trial, cap))
                print(f"trial {trial + 1}: {name}: {trials[name][-1]['steps_per_s']:.1f} steps/s")
    hold = statistics.median(holds)
    ideal = 1.0 / hold
    rows = []
    for name, runs in trials.items():
        row: dict[str, Any] = {"config": name}
        for key in runs[0]:
            values = [run[key] for run in runs if run[key] is not None]
            row[key] = statistics.median(values) if values else None
        row["trials_steps_per_s"] = [run["steps_per_s"] for run in runs]
        row["share_of_ideal"] = row["steps_per_s"] / ideal
        rows.append(row)
    print(
        f"{args.num_envs} envs on {args.backend}, one worker each, {usable_cores()} cores; "
        f"a step holds the lock {hold * 1e3:.2f} ms (stepped alone)"
    )
    print(
        f"{'config':<18} {'steps/s':>8} {'ideal':>6} {'busy':>5} {'lock ms':>8} {'hold':>6} {'outside':>8} "
        f"{'in step':>8} {'locked':>7} {'workers':>8} {'caller':>7}"
    )
    for row in rows:
        workers = "-" if row["worker_cpu_share"] is None else f"{row['worker_cpu_share']:.1%}"
        print(
            f"{row['config']:<18} {row['steps_per_s']:>8.1f} {row['share_of_ideal']:>6.0%} "
            f"{row['lock_busy_share']:>5.0%} "
            f"{row['lock_wait_ms']:>8.2f} {row['hold_ms']:>6.2f} {row['outside_ms']:>8.2f} "
            f"{row['most_inside_step']:>8} {row['most_holding_lock']:>7} {workers:>8} "
            f"{row['caller_cpu_share']:>7.1%}"
        )
    print(f"ideal: 1 / hold = {ideal:.1f} steps/s")
    if args.json:
        run_record.write(
            args.json,
            rows,
            summary={
                "ideal_steps_per_s": ideal,
                "ideal_formula": "1 / hold (the lock held in one env's step, stepped alone)",
                "hold_alone_ms": hold * 1e3,
                "cap_over_no_cap": rows[1]["steps_per_s"] / rows[0]["steps_per_s"],
            },
            args=vars(args),
            hold_alone_ms=[h * 1e3 for h in holds],
            usable_cores=usable_cores(),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
