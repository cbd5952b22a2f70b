"""``backend="auto"`` against the best configuration ``vecaccel tune`` finds, env by env.

For every env and env count this runs :func:`vecaccel.tune.autotune` over every registered
backend and its settings (``auto`` among them, probed as ``make_vec`` probes it), then measures
the best configuration and ``auto``'s choice again, side by side in ``--trials`` alternating
trials, so that the ratio does not rest on one sample of each. The figure is
``auto / best``, the median over the trials.

Run (writes ``benchmarks/results/auto_vs_tune.json``)::

    python benchmarks/throughput/auto_vs_tune.py --seconds 2 --trials 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from vecaccel.bench import RunRecord, command_line, parse_workloads
from vecaccel.bench.workloads import resolve_env
from vecaccel.tune import autotune, measure_trial

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
WORKLOADS = {"CartPole-v1": [16, 64, 256], "pong": [8, 16]}


def compare(name: str, num_envs: int, seconds: float, trials: int) -> dict[str, Any]:
    """Tune ``name`` at ``num_envs``, then time the best trial and auto's in alternation."""
    env_fn = resolve_env(name).env_fn
    tuned = autotune(env_fn, [num_envs], seconds=seconds)
    ranked = [t for t in tuned if t.error is None]
    auto = next(t for t in ranked if t.auto)
    best = ranked[0]  # auto's own setting, when it is the fastest (tune times it once)
    fns = [env_fn] * num_envs
    rates: dict[str, list[float]] = {"auto": [], "best": []}
    for trial in range(trials):
        pairs = [("auto", auto), ("best", best)]
        for key, config in pairs if trial % 2 == 0 else pairs[::-1]:
            rates[key].append(measure_trial(fns, config, seconds))
    ratios = [a / b for a, b in zip(rates["auto"], rates["best"])]
    record = {
        "env": name,
        "num_envs": num_envs,
        "best": best.label,
        "best_call": best.call(name),
        "auto": auto.label,
        "auto_reason": auto.reason,
        "tune": [
            {"config": t.label, "options": t.options, "steps_per_s": t.steps_per_s} for t in tuned
        ],
        "best_steps_per_s": rates["best"],
        "auto_steps_per_s": rates["auto"],
        "auto_over_best": statistics.median(ratios),
    }
    print(
        f"{name} x{num_envs}: best {best.label} {best.options} "
        f"{statistics.median(rates['best']):,.0f} steps/s, auto {auto.label} {auto.options} "
        f"{statistics.median(rates['auto']):,.0f}: auto/best {record['auto_over_best']:.2f}",
        flush=True,
    )
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials of the two")
    parser.add_argument(
        "--workload",
        action="append",
        help="ENV=N1,N2 (repeatable; default: CartPole-v1=16,64,256 and pong=8,16)",
    )
    parser.add_argument("--json", default=os.path.join(RESULTS, "auto_vs_tune.json"))
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    try:  # the action server's policy runs in this process: one thread, as the trainers use
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    workloads = parse_workloads(args.workload, WORKLOADS)
    records = [
        compare(name, n, args.seconds, args.trials)
        for name, counts in workloads.items()
        for n in counts
    ]
    run_record.write(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
