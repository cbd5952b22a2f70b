"""MuJoCo locomotion from EnvPool against Gymnasium's MuJoCo envs in vecaccel's workers: steps
per second of ``Hopper-v5`` and ``HalfCheetah-v5`` (random actions).

For each env and ``num_envs`` it times, in alternating trials of ``--seconds`` each (random
actions sampled before the clock starts):

* ``shm``: Gymnasium's env, one per env, in vecaccel's ``shm`` workers, one per usable CPU;
* ``envpool``: EnvPool's task of the same id (its v5 tasks take Gymnasium v5's defaults: the
  same models, frame skips, rewards and time limits) alone in this process through
  ``vecaccel.adapters.envpool`` (``make_vec(envpool_vector_fn(id, num_threads=CPUs), n,
  backend="serial", vectorized=True)``), EnvPool's threads stepping the envs;
* ``envpool-shm``: EnvPool slices of one thread each in vecaccel's ``shm`` workers (the same
  threads as ``envpool``, one process boundary more);
* ``raw``: one Gymnasium env stepped in a loop, the single-core rate;
* ``ceiling``: one process per usable CPU, each stepping its own raw Gymnasium env, summed.

Without EnvPool the EnvPool rows are recorded as pending, with the reason. The result keeps
every trial and reports each implementation's best and median, and EnvPool's against ``shm``.

Run (writes ``benchmarks/results/mujoco_envpool.json``)::

    python benchmarks/throughput/mujoco_envpool.py --num-envs 8,32 --seconds 2 --trials 3
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
from typing import Any

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line, measure_ceiling
from vecaccel.bench.timing import measure, measure_raw
from vecaccel.bench.workloads import resolve_env
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")
ENVS = ("Hopper-v5", "HalfCheetah-v5")
#: the implementations EnvPool provides, pending where it is not installed
ENVPOOL_IMPLS = ("envpool", "envpool-shm")


def cases(env_id: str, n: int, workers: int, envpool: bool) -> dict[str, tuple[str, Any]]:
    """``{name: (impl for measure's reset, build)}`` for ``env_id`` at ``n`` envs."""
    found: dict[str, tuple[str, Any]] = {
        "shm": (
            "vecaccel-shm",
            functools.partial(vecaccel.make_vec, env_id, n, backend="shm", num_workers=workers),
        ),
    }
    if envpool:
        from vecaccel.adapters.envpool import envpool_vector_fn

        alone = envpool_vector_fn(env_id, num_threads=workers)
        sliced = envpool_vector_fn(env_id, num_threads=1)
        found["envpool"] = (
            "vecaccel-serial",
            functools.partial(vecaccel.make_vec, alone, n, backend="serial", vectorized=True),
        )
        found["envpool-shm"] = (
            "vecaccel-shm",
            functools.partial(
                vecaccel.make_vec, sliced, n, backend="shm", vectorized=True, num_workers=workers
            ),
        )
    return found


def summarize(trials: dict[tuple[str, int, str], list[float]]) -> list[dict[str, Any]]:
    """One row per (env, num_envs, implementation): best and median of its trials, and its
    ratio to ``shm`` and to the ceiling (best against best)."""
    rows = []
    for (env_id, n, name), rates in trials.items():
        row: dict[str, Any] = {
            "env": env_id,
            "num_envs": n,
            "impl": name,
            "steps_per_s": max(rates),
            "median_steps_per_s": statistics.median(rates),
            "trials": rates,
        }
        shm = trials.get((env_id, n, "shm"))
        if shm and name != "shm":
            row["x_shm"] = max(rates) / max(shm)
            row["x_shm_median"] = statistics.median(rates) / statistics.median(shm)
        ceiling = next(
            (found for (env, _, other), found in trials.items()
             if env == env_id and other == "ceiling"),
            None,
        )  # fmt: skip
        if ceiling and name != "ceiling":
            row["share_of_ceiling"] = max(rates) / max(ceiling)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(ENVS), help="comma-separated MuJoCo ids")
    parser.add_argument("--num-envs", default="8,32", help="comma-separated sizes")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per trial")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=3, help="alternating trials of each")
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "mujoco_envpool.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.json:
        check_output_path(args.json)
    run_record = RunRecord(command_line(argv, __file__))
    workers = usable_cpus()
    env_ids = args.envs.split(",")
    sizes = [int(n) for n in args.num_envs.split(",")]
    envpool = importlib.util.find_spec("envpool") is not None
    trials: dict[tuple[str, int, str], list[float]] = {}

    def note(env_id: str, n: int, name: str, rate: float, trial: int) -> None:
        trials.setdefault((env_id, n, name), []).append(rate)
        print(f"trial {trial} {env_id} n={n} {name:<12} {rate:>12,.0f} steps/s", flush=True)

    for trial in range(args.trials):
        for env_id in env_ids:
            target = resolve_env(env_id)
            note(env_id, 1, "raw", measure_raw(target, args.seconds, args.warmup, trial), trial)
            rate, _ = measure_ceiling(target, args.seconds, args.warmup, seed=trial)
            note(env_id, workers, "ceiling", rate, trial)
            for n in sizes:
                built = cases(env_id, n, workers, envpool)
                # the order turns each trial, so that no implementation always runs first
                names: list[str] = list(built)
                names = names[trial % len(names) :] + names[: trial % len(names)]
                for name in names:
                    impl, build = built[name]
                    rate, _ = measure(impl, build, n, args.seconds, args.warmup, seed=trial)
                    note(env_id, n, name, rate, trial)
    rows = summarize(trials)
    for row in rows:
        ratios = "  ".join(
            f"{key}={value:.2f}" for key, value in row.items() if key.startswith(("x_", "share"))
        )
        print(
            f"{row['env']} n={row['num_envs']} {row['impl']:<12} {row['steps_per_s']:>12,.0f}  "
            f"{ratios}"
        )
    pending = None if envpool else "EnvPool is not installed: pip install 'vecaccel[envpool]'"
    if pending:
        for env_id in env_ids:
            for n in sizes:
                for name in ENVPOOL_IMPLS:
                    rows.append({"env": env_id, "num_envs": n, "impl": name, "pending": pending})
        print(f"EnvPool rows: pending ({pending})")
    if args.json:
        for (env_id, _, name), rates in trials.items():
            if name == "ceiling":
                for trial, rate in enumerate(rates):
                    run_record.add_ceiling(env_id, rate, workers, trial=trial)
        run_record.write(
            args.json,
            rows,
            ceiling="one process per usable CPU, each stepping its own raw Gymnasium env, summed",
            workers=workers,
            trials=args.trials,
            seconds=args.seconds,
            summary={
                f"{row['env']} n={row['num_envs']} {row['impl']}": row["x_shm"]
                for row in rows
                if "x_shm" in row
            },
            summary_rule="best trial of each against shm's best (x_shm_median: the medians)",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
