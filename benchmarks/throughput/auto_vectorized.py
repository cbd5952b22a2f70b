"""``auto`` over a batched simulator, side by side with the simple ways: the native vector env
alone and vectorized ``shm``.

For each ``num_envs`` it times, in alternating trials of ``--seconds`` each (random actions
sampled before the clock starts):

* ``native``: ``make_vec(fn, n, vectorized=True, backend="serial")``, Gymnasium's
  ``CartPoleVectorEnv`` stepped in this one process;
* ``shm``: the same vector env function, one ``CartPoleVectorEnv`` per worker, one worker per
  usable CPU;
* ``hybrid``: the caller steps one slice beside the workers;
* ``auto``: ``backend="auto"``, whose probe and choice are rebuilt in every trial (the choice
  of each trial is recorded);
* ``ceiling``: one process per usable CPU, each stepping its own native vector env, the envs
  of all of them summing to ``n`` (:func:`vecaccel.bench.ceiling.measure_vector_ceiling`).

With ``--pong`` (EnvPool installed) it also times Pong from EnvPool, 16 envs: EnvPool alone
with one thread per CPU in ``serial``, ``shm`` over EnvPool slices of one thread each, and
``auto`` on the EnvPool function of EnvPool's default threads. Without EnvPool, the Pong rows
are recorded as pending.

The result keeps every trial and reports each implementation's best and median, and ``auto``
against the better of ``native`` and ``shm``.

Run (writes ``benchmarks/results/auto_vectorized.json``)::

    python benchmarks/throughput/auto_vectorized.py --num-envs 256,4096 --seconds 3 --trials 3 --pong
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line
from vecaccel.bench.ceiling import measure_vector_ceiling
from vecaccel.bench.timing import measure
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")


def native_cartpole(n: int) -> gym.vector.VectorEnv:
    """Gymnasium's batched CartPole (its ``vector_entry_point``)."""
    return gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")


def cartpole_cases(n: int, workers: int) -> dict[str, tuple[str, Callable[[], Any]]]:
    """``{name: (impl for measure's reset, build)}`` for CartPole at ``n`` envs."""

    def build(backend: str, **options: Any) -> tuple[str, Callable[[], Any]]:
        make = functools.partial(
            vecaccel.make_vec, native_cartpole, n, backend=backend, vectorized=True, **options
        )
        return f"vecaccel-{backend}", make

    return {
        "native": build("serial"),
        "shm": build("shm", num_workers=workers),
        "hybrid": build("hybrid"),
        "auto": build("auto"),
    }


def pong_cases(n: int, workers: int) -> dict[str, tuple[str, Callable[[], Any]]]:
    """EnvPool Pong: alone (``workers`` threads), ``shm`` slices of one thread, and ``auto``."""
    from vecaccel.adapters.envpool import envpool_vector_fn

    def build(backend: str, fn: Any, **options: Any) -> tuple[str, Callable[[], Any]]:
        make = functools.partial(vecaccel.make_vec, fn, n, backend=backend, vectorized=True)
        return f"vecaccel-{backend}", functools.partial(make, **options)

    return {
        "native": build("serial", envpool_vector_fn("Pong-v5", num_threads=workers)),
        "shm": build("shm", envpool_vector_fn("Pong-v5", num_threads=1), num_workers=workers),
        "auto": build("auto", envpool_vector_fn("Pong-v5")),
    }


def noting_choice(build: Callable[[], Any], into: list[str]) -> Callable[[], Any]:
    """``build``, which makes an ``auto`` vector env, noting its choice as ``backend(options)``
    in ``into`` each time it is called."""

    def noted() -> Any:
        envs = build()
        record = envs.metadata["backend"]
        options = ", ".join(f"{key}={value}" for key, value in record["options"].items())
        into.append(f"{record['name']}({options})")
        return envs

    return noted


def summarize(trials: dict[tuple[str, int, str], list[float]]) -> list[dict[str, Any]]:
    """One row per (env, num_envs, implementation): best and median, and the ratios of
    ``auto`` against the better of ``native`` and ``shm`` (best against best)."""
    rows = []
    for (env_name, n, name), rates in trials.items():
        row: dict[str, Any] = {
            "env": env_name,
            "num_envs": n,
            "impl": name,
            "steps_per_s": max(rates),
            "median_steps_per_s": statistics.median(rates),
            "trials": rates,
        }
        native = trials.get((env_name, n, "native"))
        if native:
            row["x_native"] = max(rates) / max(native)
        ceiling = trials.get((env_name, n, "ceiling"))
        if ceiling:
            row["share_of_ceiling"] = max(rates) / max(ceiling)
        simple = [max(trials[(env_name, n, other)]) for other in ("native", "shm")
                  if trials.get((env_name, n, other))]  # fmt: skip
        if name == "auto" and simple:
            row["x_better_simple"] = max(rates) / max(simple)
            medians = [statistics.median(trials[(env_name, n, other)]) for other in ("native", "shm")
                       if trials.get((env_name, n, other))]  # fmt: skip
            row["x_better_simple_median"] = statistics.median(rates) / max(medians)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", default="256,4096", help="comma-separated CartPole sizes")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per trial")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=3, help="alternating trials of each")
    parser.add_argument("--pong", action="store_true", help="also EnvPool Pong (needs envpool)")
    parser.add_argument("--pong-envs", type=int, default=16)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "auto_vectorized.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.json:
        check_output_path(args.json)
    run_record = RunRecord(command_line(argv, __file__))
    workers = usable_cpus()
    sizes = [int(n) for n in args.num_envs.split(",")]
    pending: dict[str, str] = {}
    workloads: list[tuple[str, int, Callable[..., dict]]] = [
        ("CartPole-v1", n, cartpole_cases) for n in sizes
    ]
    if args.pong:
        if importlib.util.find_spec("envpool") is None:
            pending["Pong-v5 (EnvPool)"] = (
                "EnvPool is not installed: pip install 'vecaccel[envpool]'"
            )
        else:
            workloads.append(("Pong-v5 (EnvPool)", args.pong_envs, pong_cases))
    trials: dict[tuple[str, int, str], list[float]] = {}
    choices: dict[str, list[str]] = {}
    for trial in range(args.trials):
        for env_name, n, cases_of in workloads:
            cases = cases_of(n, workers)
            # the order turns each trial, so that no implementation always runs first
            names = list(cases)
            names = names[trial % len(names) :] + names[: trial % len(names)]
            for name in names:
                impl, build = cases[name]
                if name == "auto":
                    build = noting_choice(build, choices.setdefault(f"{env_name} n={n}", []))
                rate, _ = measure(impl, build, n, args.seconds, args.warmup, seed=trial)
                trials.setdefault((env_name, n, name), []).append(rate)
                print(
                    f"trial {trial} {env_name} n={n} {name:<8} {rate:>14,.0f} steps/s", flush=True
                )
            if env_name == "CartPole-v1":
                rate, _ = measure_vector_ceiling(
                    native_cartpole, n, args.seconds, args.warmup, seed=trial, processes=workers
                )
                trials.setdefault((env_name, n, "ceiling"), []).append(rate)
                print(f"trial {trial} {env_name} n={n} ceiling  {rate:>14,.0f} steps/s", flush=True)
    rows = summarize(trials)
    for row in rows:
        ratios = "  ".join(
            f"{key}={value:.2f}" for key, value in row.items() if key.startswith(("x_", "share"))
        )
        print(
            f"{row['env']} n={row['num_envs']} {row['impl']:<8} {row['steps_per_s']:>14,.0f}  {ratios}"
        )
    for env_name, reason in pending.items():
        rows.append({"env": env_name, "num_envs": args.pong_envs, "pending": reason})
        print(f"{env_name}: pending ({reason})")
    if args.json:
        for (env_name, n, name), rates in trials.items():
            if name == "ceiling":
                run_record.add_ceiling(
                    env_name, max(rates), min(workers, n), num_envs=n, vector_env=True
                )
        run_record.write(
            args.json,
            rows,
            ceiling="one process per usable CPU, each stepping its own native CartPoleVectorEnv "
            "of n / processes envs, summed",
            workers=workers,
            trials=args.trials,
            seconds=args.seconds,
            auto_choices=choices,
            summary={
                f"{row['env']} n={row['num_envs']}": row["x_better_simple"]
                for row in rows
                if "x_better_simple" in row
            },
            summary_rule="best trial of each; x_better_simple is auto's best over the better "
            "of native's and shm's best (x_better_simple_median: the same with medians)",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
