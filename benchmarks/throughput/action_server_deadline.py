"""The action server with a deadline against fixed halves and every env at once, on envs with a
long tail and a policy whose cost grows with the batch.

Each env step sleeps ``--step-ms`` (1 ms), and one step in ``--slow-every`` (50, drawn at random)
sleeps ``--slow-factor`` times that (20 ms) instead: the env of ``async_batch_former.py``, one
worker per env, so that each env finishes on its own (a worker steps its envs one after another,
and a slow step would hold its neighbours). The caller's policy costs ``--policy-ms`` (2 ms) a call
plus ``--policy-per-env-ms`` (0.125 ms) per env of the batch, simulated by a sleep in the caller:
a forward pass's fixed cost (launch, weights read once) and its per-row cost, without the
cores' load in the figure (torch itself is kept to one thread: it only carries the tensors).

Rows (``action_server`` on ``device="cpu"``): every env at once (no alternation), fixed halves
(``alternating=True``) and the deadline (``min_batch_size``, ``max_batch_size``,
``batch_wait_s``: whichever envs reported, a floor, a ceiling and a wait after the first
arrival). Each row gives env steps per second, its share of the ideal, the mean batch, the
age of the oldest env of each batch (``last_ready_age_s``: how long a ready env waited before
the caller got it), mean, p95 and max, the mean step as the workers slept it (each env observes
its own step's duration), the caller's time in the policy and the CPU used.

**The ideal.** With a policy call of ``c0 + c1 * B`` for a batch of ``B`` and a mean batch
``b``, one caller passes at most ``b / (c0 + c1 * b)`` steps/s (it is never idle), and each env
spends a step and the call that serves it per env step, so ``num_envs`` envs pass at most
``num_envs / (s + c0 + c1 * b)`` (``s`` the mean step; the batch an env step is served in is
``b`` or larger on average, so its call costs at least ``c0 + c1 * b``). The first bound grows with ``b`` and the second falls: a perfect
scheduler batches every env once per step and call, at the ``b*`` where the two meet, the root
of ``c1 * b**2 + (s + c0 - num_envs * c1) * b - num_envs * c0 = 0``, and reaches
``num_envs / (s + c0 + c1 * b*)``. Its inputs (the fast and the slow step, the call at a batch
of 1 and of ``num_envs``, ``c0`` and ``c1`` fitted to the two) are timed in this process in every
round, as the machine sleeps them.

The configurations run in alternating trials (A, B, C, A, B, C...), each in fresh workers and
timed for ``--seconds``; the table gives each figure's median over the trials.

Run (writes ``benchmarks/results/action_server_deadline.json``)::

    python benchmarks/throughput/action_server_deadline.py --seconds 4 --trials 3
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from typing import Any

import numpy as np
import torch
from async_batch_former import (
    Factory,
    TailSleepEnv,
    cpu_s,
    mean_sleep_s,
    summarize,
    usable_cores,
)

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


class TimedTailSleepEnv(TailSleepEnv):
    """``TailSleepEnv`` that observes how long its step took (``obs[0]``, seconds): the steps as
    the workers slept them, beside the parent's timing of the ideal's inputs."""

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        start = time.perf_counter()
        obs, *rest = super().step(action)
        obs[0] = time.perf_counter() - start
        return (obs, *rest)


class TimedFactory(Factory):
    """Picklable env function of :class:`TimedTailSleepEnv`."""

    def __call__(self) -> TimedTailSleepEnv:
        return TimedTailSleepEnv(*self.args)


def policy_s(args: argparse.Namespace, batch: int) -> float:
    """The policy's cost for a batch of ``batch`` envs, in seconds: ``c0 + c1 * batch``."""
    return (args.policy_ms + args.policy_per_env_ms * batch) / 1e3


def ideal_batch(num_envs: int, step_s: float, c0_s: float, c1_s: float) -> float:
    """The batch ``b*`` at which the caller's bound ``b / (c0 + c1 b)`` meets the envs' bound
    ``num_envs / (s + c0 + c1 b)``: the positive root of
    ``c1 b**2 + (s + c0 - num_envs c1) b - num_envs c0``, written so that it holds at ``c1 = 0``.

    Example:
        >>> round(ideal_batch(16, 1.5, 3.0, 0.0), 3)  # no per-env cost: 16 * 3 / 4.5
        10.667
    """
    c1_s = max(0.0, c1_s)
    b = step_s + c0_s - num_envs * c1_s
    return 2 * num_envs * c0_s / (b + math.sqrt(b * b + 4 * c1_s * num_envs * c0_s))


def ideal_inputs(args: argparse.Namespace) -> dict[str, float]:
    """The fast step, the slow step and the policy call at a batch of 1 and of ``num_envs`` as
    this machine sleeps them, ``c0`` and ``c1`` through those two calls, and the ideal."""
    budget = max(0.05, args.seconds / 10)
    fast = mean_sleep_s(budget, args.step_ms / 1e3)
    slow = mean_sleep_s(budget, args.step_ms * args.slow_factor / 1e3)
    call_one = mean_sleep_s(budget, policy_s(args, 1))
    call_all = mean_sleep_s(budget, policy_s(args, args.num_envs))
    c1 = max(0.0, (call_all - call_one) / max(1, args.num_envs - 1))
    c0 = call_one - c1
    p_slow = 1.0 / args.slow_every
    mean_step = (1 - p_slow) * fast + p_slow * slow
    batch = ideal_batch(args.num_envs, mean_step, c0, c1)
    return {
        "fast_step_ms": fast * 1e3,
        "slow_step_ms": slow * 1e3,
        "mean_step_ms": mean_step * 1e3,
        "policy_one_ms": call_one * 1e3,
        "policy_all_ms": call_all * 1e3,
        "c0_ms": c0 * 1e3,
        "c1_ms": c1 * 1e3,
        "ideal_batch": batch,
        "ideal_steps_per_s": args.num_envs / (mean_step + c0 + c1 * batch),
    }


def measure(
    factory: TimedFactory, args: argparse.Namespace, trial: int, options: dict[str, Any]
) -> dict[str, float | None]:
    """One trial of one configuration: steps/s, batch sizes, ages, the caller's time in the
    policy and the CPU over ``--seconds``."""
    envs = vecaccel.make_vec(
        factory,
        args.num_envs,
        backend="action_server",
        device="cpu",
        num_workers=args.num_workers,
        **options,
    )
    try:
        pids = [worker.process.pid for worker in envs.pool.workers]
        obs, _ = envs.reset(seed=trial)
        warm_until = time.perf_counter() + min(0.5, args.seconds / 4)
        while time.perf_counter() < warm_until:
            time.sleep(policy_s(args, len(obs)))
            obs, *_ = envs.step(torch.zeros(len(obs), dtype=torch.int64))
        ages: list[float] = []
        steps = calls = 0
        slept = 0.0
        in_policy = 0.0
        cpu_before, start = cpu_s(pids), time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            called = time.perf_counter()
            time.sleep(policy_s(args, len(obs)))  # the policy's forward pass
            in_policy += time.perf_counter() - called
            obs, *_ = envs.step(torch.zeros(len(obs), dtype=torch.int64))
            ages.append(envs.last_ready_age_s)
            slept += float(obs[:, 0].sum())
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
        "step_ms": slept / steps * 1e3,
        "age_mean_ms": float(np.mean(ages)) * 1e3,
        "age_p95_ms": float(np.percentile(ages, 95)) * 1e3,
        "age_max_ms": float(np.max(ages)) * 1e3,
        "policy_share": in_policy / elapsed,
        "cpu_share": None if used is None else used / elapsed / usable_cores(),
    }


def configurations(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each row's name and its ``make_vec`` options."""
    rows: dict[str, dict[str, Any]] = {
        "every env at once": {},
        "alternating halves": {"alternating": True},
    }
    defaults = [(4, args.num_envs, 0.5), (11, args.num_envs, 0.5), (11, args.num_envs, 3.0)]
    for low, high, wait_ms in args.deadline or defaults:
        rows[f"deadline {low:g}..{high:g}, wait {wait_ms:g} ms"] = {
            "min_batch_size": int(low),
            "max_batch_size": int(high),
            "batch_wait_s": wait_ms / 1e3,
        }
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
    parser.add_argument("--policy-ms", type=float, default=2.0, help="the policy's sleep a call")
    parser.add_argument(
        "--policy-per-env-ms", type=float, default=0.125, help="the policy's sleep per env"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        nargs=3,
        action="append",
        metavar=("MIN", "MAX", "WAIT_MS"),
        help="a deadline row: floor, ceiling, wait in ms; repeat for more rows "
        "(default: 4 num_envs 0.5, 11 num_envs 0.5 and 11 num_envs 3)",
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="each trial's timed seconds")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "action_server_deadline.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.num_workers is None:
        args.num_workers = args.num_envs
    if args.json:
        check_output_path(args.json)
    # torch only carries the tensors here: one thread leaves the cores to the workers
    torch.set_num_threads(1)
    run_record = RunRecord(command_line(argv, __file__))
    factory = TimedFactory(
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
        f"ms (mean {inputs['mean_step_ms']:.2f}), policy {inputs['c0_ms']:.2f} ms + "
        f"{inputs['c1_ms']:.3f} ms per env a call"
    )
    print(
        f"{'config':<32} {'steps/s':>8} {'ideal':>6} {'batch':>6} "
        f"{'age ms':>7} {'p95':>6} {'max':>6} {'step':>5} {'policy':>6} {'CPU':>5}"
    )
    for row in rows:
        cpu = "-" if row["cpu_share"] is None else f"{row['cpu_share']:.0%}"
        print(
            f"{row['config']:<32} {row['steps_per_s']:>8.0f} {row['share_of_ideal']:>6.0%} "
            f"{row['mean_batch']:>6.1f} {row['age_mean_ms']:>7.2f} {row['age_p95_ms']:>6.2f} "
            f"{row['age_max_ms']:>6.2f} {row['step_ms']:>5.2f} {row['policy_share']:>6.0%} "
            f"{cpu:>5}"
        )
    print(
        f"ideal: num_envs / (mean step + c0 + c1 * b*), b* = {inputs['ideal_batch']:.1f}: "
        f"{ideal:.0f} steps/s"
    )
    if args.json:
        best = max(rows, key=lambda row: row["steps_per_s"])
        run_record.write(
            args.json,
            rows,
            summary={
                "ideal_steps_per_s": ideal,
                "ideal_formula": "num_envs / (mean_step + c0 + c1 * b*), b* the positive root "
                "of c1 b^2 + (mean_step + c0 - num_envs c1) b - num_envs c0",
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
