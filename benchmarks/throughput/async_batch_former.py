"""The async batch former against a fixed batch, on envs with a long tail and a costly policy.

Each env step sleeps ``--step-ms`` (1 ms), and one step in ``--slow-every`` (50, drawn at random)
sleeps ``--slow-factor`` times that (20 ms) instead, as a remote simulator or a renderer does.
The caller's policy costs ``--policy-ms`` (3 ms) a call whatever the batch's size, simulated
by a sleep in the caller. Sleeps, not busy loops, so that the machine's cores are not the bound:
each row records the CPU the workers and the caller used, as a share of the cores.

Rows (``async``, one worker per env): fixed batches (``batch_size=B``, the floor equal to the
ceiling; 8, 14 and 16 of 16 envs) and the batch former (``min_batch_size``, ``max_batch_size``,
``batch_wait_s``; floors 4 and 14, ceiling 16, deadline 0.5 ms). Each row gives env steps per
second, its share of the ideal, the mean batch, and the age of the oldest env of each batch
(``last_ready_age_s``: how long a ready env waited before the caller got it), mean, p95 and max.

**The ideal.** Each env must spend a step and a policy call per env step, so no scheduler with
one caller passes ``num_envs / (mean step + policy call)`` steps/s, the mean step being
``(1 - 1/slow_every) * fast + slow / slow_every``. Its three inputs are timed in this process in
every round (the sleeps as the machine gives them, oversleep included); the cores would bound
it only at ``cores / CPU per env step``, which the CPU column shows is far off.

The configurations run in alternating trials (A, B, C, A, B, C...), each in fresh workers and
timed for ``--seconds``; the table gives each figure's median over the trials.

Run (writes ``benchmarks/results/async_batch_former.json``)::

    python benchmarks/throughput/async_batch_former.py --seconds 4 --trials 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


class TailSleepEnv(gym.Env):
    """Sleeps ``step_s`` a step, and ``slow_s`` instead on a fraction ``p_slow`` of steps."""

    def __init__(self, step_s: float, slow_s: float, p_slow: float) -> None:
        self.step_s, self.slow_s, self.p_slow = step_s, slow_s, p_slow
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        slow = self.np_random.random() < self.p_slow
        time.sleep(self.slow_s if slow else self.step_s)
        return np.zeros(4, np.float32), 1.0, False, False, {}


class Factory:
    """Picklable env function (the workers may start under spawn)."""

    def __init__(self, step_s: float, slow_s: float, p_slow: float) -> None:
        self.args = (step_s, slow_s, p_slow)

    def __call__(self) -> TailSleepEnv:
        return TailSleepEnv(*self.args)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (``None`` where ``/proc`` is absent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float | None:
    """CPU seconds of this process and of ``pids``, together."""
    times = [process_cpu_s(pid) for pid in pids]
    if any(t is None for t in times):
        return None
    return time.process_time() + sum(t for t in times if t is not None)


def mean_sleep_s(seconds: float, duration_s: float) -> float:
    """The mean time ``time.sleep(duration_s)`` takes, timed for about ``seconds``."""
    count, start = 0, time.perf_counter()
    while True:
        time.sleep(duration_s)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / count


def ideal_inputs(args: argparse.Namespace) -> dict[str, float]:
    """The fast step, the slow step and the policy call as this machine sleeps them, and the
    ideal they give."""
    budget = max(0.05, args.seconds / 8)
    fast = mean_sleep_s(budget, args.step_ms / 1e3)
    slow = mean_sleep_s(budget, args.step_ms * args.slow_factor / 1e3)
    policy = mean_sleep_s(budget, args.policy_ms / 1e3)
    p_slow = 1.0 / args.slow_every
    mean_step = (1 - p_slow) * fast + p_slow * slow
    return {
        "fast_step_ms": fast * 1e3,
        "slow_step_ms": slow * 1e3,
        "policy_ms": policy * 1e3,
        "mean_step_ms": mean_step * 1e3,
        "ideal_steps_per_s": args.num_envs / (mean_step + policy),
    }


def measure(
    factory: Factory, args: argparse.Namespace, trial: int, options: dict[str, Any]
) -> dict[str, float | None]:
    """One trial of one configuration: steps/s, batch sizes, ages and CPU over ``--seconds``."""
    envs = vecaccel.make_vec(
        factory, args.num_envs, backend="async", num_workers=args.num_workers, **options
    )
    policy_s = args.policy_ms / 1e3
    try:
        pids = [worker.process.pid for worker in envs.pool.workers]
        obs, _ = envs.reset(seed=trial)
        warm_until = time.perf_counter() + min(0.5, args.seconds / 4)
        while time.perf_counter() < warm_until:
            time.sleep(policy_s)
            obs, *_ = envs.step(np.zeros(len(obs), dtype=np.int64))
        ages: list[float] = []
        steps = calls = 0
        cpu_before, start = cpu_s(pids), time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            time.sleep(policy_s)  # the policy's forward pass
            obs, *_ = envs.step(np.zeros(len(obs), dtype=np.int64))
            ages.append(envs.last_ready_age_s)
            steps += len(obs)
            calls += 1
        elapsed = time.perf_counter() - start
        cpu_after = cpu_s(pids)
    finally:
        envs.close()
    used = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return {
        "steps_per_s": steps / elapsed,
        "mean_batch": steps / calls,
        "age_mean_ms": float(np.mean(ages)) * 1e3,
        "age_p95_ms": float(np.percentile(ages, 95)) * 1e3,
        "age_max_ms": float(np.max(ages)) * 1e3,
        "cpu_share": None if used is None else used / elapsed / usable_cores(),
    }


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def configurations(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each row's name and its ``make_vec`` options."""
    rows: dict[str, dict[str, Any]] = {
        f"fixed batch_size={size}": {"batch_size": size} for size in args.fixed_batch_sizes
    }
    for low, high, wait_ms in args.former or [(4, args.num_envs, 0.5), (14, args.num_envs, 0.5)]:
        rows[f"former {low:g}..{high:g}, wait {wait_ms:g} ms"] = {
            "min_batch_size": int(low),
            "max_batch_size": int(high),
            "batch_wait_s": wait_ms / 1e3,
        }
    return rows


def summarize(trials: dict[str, list[dict[str, Any]]], ideal: float) -> list[dict[str, Any]]:
    """One row per configuration: each figure's median over the trials, and the share of the
    ideal (the median ideal of the rounds)."""
    rows = []
    for name, runs in trials.items():
        row: dict[str, Any] = {"config": name}
        for key in runs[0]:
            values = [run[key] for run in runs if run[key] is not None]
            row[key] = statistics.median(values) if values else None
        row["trials_steps_per_s"] = [run["steps_per_s"] for run in runs]
        row["share_of_ideal"] = row["steps_per_s"] / ideal
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument(
        "--num-workers", type=int, default=None, help="default: one per env (sleeps overlap)"
    )
    parser.add_argument("--step-ms", type=float, default=1.0, help="a fast step's sleep")
    parser.add_argument("--slow-every", type=float, default=50.0, help="1 step in N is slow")
    parser.add_argument("--slow-factor", type=float, default=20.0, help="slow step / fast step")
    parser.add_argument("--policy-ms", type=float, default=3.0, help="the policy's sleep a call")
    parser.add_argument("--fixed-batch-sizes", type=int, nargs="+", default=[8, 14, 16])
    parser.add_argument(
        "--former",
        type=float,
        nargs=3,
        action="append",
        metavar=("MIN", "MAX", "WAIT_MS"),
        help="a batch former row: floor, ceiling, deadline in ms; repeat for more rows "
        "(default: 4 num_envs 0.5 and 14 num_envs 0.5)",
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="each trial's timed seconds")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "async_batch_former.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.num_workers is None:
        args.num_workers = args.num_envs
    if args.json:
        check_output_path(args.json)
    run_record = RunRecord(command_line(argv, __file__))
    factory = Factory(
        args.step_ms / 1e3, args.step_ms * args.slow_factor / 1e3, 1.0 / args.slow_every
    )
    configs = configurations(args)
    trials: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    rounds = []
    for trial in range(args.trials):
        rounds.append(ideal_inputs(args))
        for name, options in configs.items():
            trials[name].append(measure(factory, args, trial, options))
            print(f"trial {trial + 1}: {name}: {trials[name][-1]['steps_per_s']:.0f} steps/s")
    ideal = statistics.median(r["ideal_steps_per_s"] for r in rounds)
    rows = summarize(trials, ideal)
    inputs = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(
        f"{args.num_envs} envs, {args.num_workers} workers, {usable_cores()} cores; step "
        f"{inputs['fast_step_ms']:.2f} ms, 1 in {args.slow_every:g} {inputs['slow_step_ms']:.2f} "
        f"ms (mean {inputs['mean_step_ms']:.2f}), policy {inputs['policy_ms']:.2f} ms a call"
    )
    print(
        f"{'config':<32} {'steps/s':>8} {'ideal':>6} {'batch':>6} "
        f"{'age ms':>7} {'p95':>6} {'max':>6} {'CPU':>5}"
    )
    for row in rows:
        cpu = "-" if row["cpu_share"] is None else f"{row['cpu_share']:.0%}"
        print(
            f"{row['config']:<32} {row['steps_per_s']:>8.0f} {row['share_of_ideal']:>6.0%} "
            f"{row['mean_batch']:>6.1f} {row['age_mean_ms']:>7.2f} {row['age_p95_ms']:>6.2f} "
            f"{row['age_max_ms']:>6.2f} {cpu:>5}"
        )
    print(f"ideal: num_envs / (mean step + policy) = {ideal:.0f} steps/s")
    if args.json:
        best = max(rows, key=lambda row: row["steps_per_s"])
        run_record.write(
            args.json,
            rows,
            summary={
                "ideal_steps_per_s": ideal,
                "ideal_formula": "num_envs / (mean_step + policy)",
                **inputs,
                "best": best["config"],
                "best_share_of_ideal": best["share_of_ideal"],
            },
            args=vars(args),
            rounds=rounds,
            usable_cores=usable_cores(),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
