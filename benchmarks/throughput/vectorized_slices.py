"""Batched simulators as worker slices: vectorized ``shm`` against the native vector env alone.

For each ``num_envs`` it measures, with random actions sampled before the clock starts:

* ``native``: Gymnasium's batched ``CartPoleVectorEnv`` (its ``vector_entry_point``) stepped in
  this one process;
* ``shm-vectorized`` (and ``hybrid-vectorized``): ``make_vec("CartPole-v1", n,
  vectorized=True)``, one ``CartPoleVectorEnv`` per worker over its slice;
* ``shm-per-env``: today's ``shm``, one Gymnasium env per env, at the same size;
* ``ceiling``: one process per usable CPU, each stepping its own native vector env, the envs
  of all of them summing to ``n`` (:func:`vecaccel.bench.ceiling.measure_vector_ceiling`).

With ``--ppo`` it also trains PPO on CartPole end to end (the ``cartpole`` preset, its
minibatches cut to 1,024 samples) on ``--ppo-envs`` envs, vectorized ``shm`` against per-env
``shm``: env steps per second of the whole run (updates included) and the seconds until the
mean return of the episodes of one update first reaches 475.

With ``--pong`` (EnvPool installed) it also measures Pong from EnvPool: EnvPool alone with
``num_threads`` = the usable CPUs, against vecaccel ``shm`` over EnvPool slices, one worker
per CPU each with an EnvPool of one thread (the same threads in all).

Rounds are interleaved (``--repeat``) so that a change in the machine's load reaches every
implementation alike; the best round of each is kept.

Run (writes ``benchmarks/results/vectorized_slices.json``)::

    python benchmarks/throughput/vectorized_slices.py --num-envs 256,4096 --seconds 3 --repeat 3 --pong
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line
from vecaccel.bench.ceiling import measure_vector_ceiling
from vecaccel.bench.timing import measure
from vecaccel.envs.vectorized_slices import VectorEnvFn
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")


def _native(n: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")


def cartpole_cases(n: int, workers: int) -> dict[str, tuple[str, Callable[[], Any]]]:
    """``{name: (impl for measure's reset, build)}`` for CartPole at ``n`` envs."""
    return {
        "native": ("gym-native", functools.partial(_native, n)),
        "shm-vectorized": (
            "vecaccel-shm",
            functools.partial(
                vecaccel.make_vec,
                "CartPole-v1",
                n,
                backend="shm",
                num_workers=workers,
                vectorized=True,
            ),
        ),
        "hybrid-vectorized": (
            "vecaccel-hybrid",
            functools.partial(
                vecaccel.make_vec,
                "CartPole-v1",
                n,
                backend="hybrid",
                vectorized=True,
            ),
        ),
        "shm-per-env": (
            "vecaccel-shm",
            functools.partial(
                vecaccel.make_vec, "CartPole-v1", n, backend="shm", num_workers=workers
            ),
        ),
    }


def pong_cases(n: int, workers: int) -> dict[str, tuple[str, Callable[[], Any]]]:
    """EnvPool Pong alone (``workers`` threads) against vecaccel slices of one thread each."""
    import warnings

    import envpool

    from vecaccel.adapters.envpool import envpool_vector_fn

    def alone() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return envpool.make_gymnasium("Pong-v5", num_envs=n, num_threads=workers, seed=0)

    return {
        "envpool-alone": ("envpool", alone),
        "shm-envpool-slices": (
            "vecaccel-shm",
            functools.partial(
                vecaccel.make_vec,
                envpool_vector_fn("Pong-v5", num_threads=1),
                n,
                backend="shm",
                num_workers=workers,
                vectorized=True,
            ),
        ),
    }


def ppo_run(n: int, budget: int, workers: int, vectorized: bool, seed: int) -> dict[str, Any]:
    """Train PPO on ``n`` CartPole envs for ``budget`` steps; steps/s and seconds to 475."""
    import time

    import numpy as np

    from vecaccel.trainers.algos.ppo import PPO

    envs = vecaccel.make_vec(
        "CartPole-v1", n, backend="shm", num_workers=workers, vectorized=vectorized
    )
    agent = PPO(envs, env_id="CartPole-v1", seed=seed, num_minibatches=max(1, n * 32 // 1024))
    per_update = n * agent.config.num_steps
    started = time.perf_counter()
    to_475 = None
    steps = 0
    try:
        while steps < budget:
            agent.learn(per_update)
            steps += per_update
            returns = agent.last_episodes.returns if agent.last_episodes else []
            if to_475 is None and returns and np.mean(returns) >= 475:
                to_475 = time.perf_counter() - started
        elapsed = time.perf_counter() - started
    finally:
        envs.close()
    return {"steps_per_s": steps / elapsed, "seconds_to_475": to_475, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", default="4096", help="comma-separated CartPole sizes")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds (best kept)")
    parser.add_argument("--pong", action="store_true", help="also EnvPool Pong (needs envpool)")
    parser.add_argument("--pong-envs", type=int, default=16)
    parser.add_argument("--ppo", action="store_true", help="also PPO on CartPole end to end")
    parser.add_argument("--ppo-envs", type=int, default=1024)
    parser.add_argument("--ppo-steps", type=int, default=1_000_000)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "vectorized_slices.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.json:
        check_output_path(args.json)
    run_record = RunRecord(command_line(argv, __file__))
    workers = usable_cpus()
    best: dict[tuple[str, str, int], float] = {}
    sizes = [int(n) for n in args.num_envs.split(",")]
    for round_ in range(args.repeat):
        workloads = [("CartPole-v1", n, cartpole_cases(n, workers)) for n in sizes]
        if args.pong:
            workloads.append(("Pong-v5", args.pong_envs, pong_cases(args.pong_envs, workers)))
        for env_name, n, cases in workloads:
            for name, (impl, build) in cases.items():
                rate, _ = measure(impl, build, n, args.seconds, args.warmup, seed=round_)
                key = (env_name, name, n)
                best[key] = max(best.get(key, 0.0), rate)
                print(
                    f"round {round_} {env_name} n={n} {name:<20} {rate:>12,.0f} steps/s", flush=True
                )
            if env_name == "CartPole-v1":
                build_fn = VectorEnvFn("CartPole-v1", AutoresetMode.NEXT_STEP)
                rate, _ = measure_vector_ceiling(
                    build_fn, n, args.seconds, args.warmup, seed=round_, processes=workers
                )
                key = (env_name, "ceiling", n)
                best[key] = max(best.get(key, 0.0), rate)
                print(
                    f"round {round_} {env_name} n={n} {'ceiling':<20} {rate:>12,.0f} steps/s",
                    flush=True,
                )
    rows = []
    if args.ppo:
        for vectorized in (True, False):
            name = "ppo-shm-vectorized" if vectorized else "ppo-shm-per-env"
            run = ppo_run(args.ppo_envs, args.ppo_steps, workers, vectorized, seed=1)
            rows.append({"env": "CartPole-v1", "impl": name, "num_envs": args.ppo_envs, **run})
            print(f"{name:<22} {run}", flush=True)
    for (env_name, name, n), rate in best.items():
        row: dict[str, Any] = {"env": env_name, "impl": name, "num_envs": n, "steps_per_s": rate}
        baseline = "native" if env_name == "CartPole-v1" else "envpool-alone"
        for label, other in (
            (f"x_{baseline.replace('-', '_')}", baseline),
            ("x_shm_per_env", "shm-per-env"),
            ("share_of_ceiling", "ceiling"),
        ):
            if (env_name, other, n) in best:
                row[label] = rate / best[(env_name, other, n)]
        rows.append(row)
        print(
            f"{env_name} n={n} {name:<20} {rate:>12,.0f} steps/s  "
            + "  ".join(f"{k}={v:.2f}" for k, v in row.items() if k.startswith(("x_", "share")))
        )
    if args.json:
        for (env_name, name, n), rate in best.items():
            if name == "ceiling":
                processes = min(workers, n)
                run_record.add_ceiling(env_name, rate, processes, num_envs=n, vector_env=True)
        run_record.write(
            args.json,
            rows,
            ceiling="one process per usable CPU, each stepping its own native CartPoleVectorEnv "
            "of n / processes envs, summed",
            workers=workers,
            repeat=args.repeat,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
