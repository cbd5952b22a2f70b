"""Agent-steps/s on PettingZoo's pistonball: vecaccel against SuperSuit, one process and the ceiling.

pistonball_v6 (20 pistons, 457x120x3 image observations), ``--num-envs`` envs (160 rows by
default), random actions. Measured side by side, in alternating trials:

- ``raw``: one process stepping one PettingZoo env (``env.step(dict)``), no vector env;
- vecaccel ``shm`` (also with ``copy=False``, which hands out views of shared memory instead of
  copying 26 MB of observations a step, and with one worker per env, which the kernel balances
  over the CPUs), and ``async`` with half the envs per batch: ``make_vec`` on the PettingZoo env;
- SuperSuit: ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), N, num_cpus=C,
  base_class="gymnasium")``, the route of PettingZoo's SB3 tutorial (skipped without supersuit:
  ``pip install supersuit``);
- the ceiling: one process per usable CPU, each stepping its own raw env, rates summed.

Run (writes ``benchmarks/results/multiagent_pistonball.json``)::

    python benchmarks/throughput/multiagent_pistonball.py --seconds 6 --trials 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import numpy as np

import vecaccel
from vecaccel.bench import RunRecord, command_line
from vecaccel.worker import usable_cpus

#: The row of the ceiling: one process per usable CPU, each stepping its own raw env, summed.
CEILING = "ceiling (one raw env per CPU)"
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def make_env():
    from pettingzoo.butterfly import pistonball_v6

    return pistonball_v6.parallel_env()


def _random_actions(rows: int, seed: int, batches: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (rows, 1)).astype(np.float32) for _ in range(batches)]


def _time_raw(seconds: float, warmup: float, seed: int) -> tuple[int, float]:
    """(agent-steps, elapsed s) of one raw PettingZoo env in this process."""
    env = make_env()
    env.reset(seed=seed)
    agents = env.possible_agents
    actions = [
        {agent: row for agent, row in zip(agents, batch)}
        for batch in _random_actions(len(agents), seed)
    ]
    step_count = 0

    def step() -> int:
        nonlocal step_count
        live = env.agents
        env.step({agent: actions[step_count % len(actions)][agent] for agent in live})
        step_count += 1
        if not env.agents:
            env.reset()
        return len(live)

    try:
        return _timed(step, seconds, warmup)
    finally:
        env.close()


def _timed(step, seconds: float, warmup: float) -> tuple[int, float]:
    """(steps, elapsed s) of calling ``step`` (which returns the steps it took) for ``seconds``
    after ``warmup`` untimed seconds."""
    steps = 0
    start = time.perf_counter()
    timing = False
    while True:
        now = time.perf_counter()
        if not timing and now - start >= warmup:
            timing, start, steps = True, now, 0
        elif timing and now - start >= seconds:
            break
        steps += step()
    return steps, time.perf_counter() - start


def _ceiling_process(seconds: float, warmup: float, seed: int, barrier, conn) -> None:
    barrier.wait(120)
    conn.send(_time_raw(seconds, warmup, seed))
    conn.close()


def measure_ceiling(seconds: float, warmup: float, processes: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    pipes, procs = [], []
    for k in range(processes):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_ceiling_process, args=(seconds, warmup, k, barrier, sender))
        proc.start()
        pipes.append(receiver)
        procs.append(proc)
    total = 0.0
    for receiver in pipes:
        steps, elapsed = receiver.recv()
        total += steps / elapsed
    for proc in procs:
        proc.join(10)
    return total


def _time_vector(envs, rows: int, seconds: float, warmup: float, seed: int) -> float:
    actions = _random_actions(rows, seed)
    envs.reset(seed=seed)
    batches = iter(range(1 << 62))

    def step() -> int:
        envs.step(actions[next(batches) % len(actions)])
        return rows

    steps, elapsed = _timed(step, seconds, warmup)
    return steps / elapsed


def measure_vecaccel(backend: str, num_envs: int, seconds: float, warmup: float, **options):
    envs = vecaccel.make_vec(make_env, num_envs, backend=backend, **options)
    try:
        return _time_vector(envs, envs.batch_size, seconds, warmup, seed=0)
    finally:
        envs.close()


def measure_supersuit(num_envs: int, cpus: int, seconds: float, warmup: float) -> float:
    import supersuit as ss

    vec = ss.pettingzoo_env_to_vec_env_v1(make_env())
    envs = ss.concat_vec_envs_v1(vec, num_envs, num_cpus=cpus, base_class="gymnasium")
    try:
        return _time_vector(envs, envs.num_envs, seconds, warmup, seed=0)
    finally:
        envs.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8, help="pistonball envs (20 rows each)")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per trial")
    parser.add_argument("--warmup", type=float, default=1.5, help="untimed seconds per trial")
    parser.add_argument("--trials", type=int, default=3, help="alternating trials per config")
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "multiagent_pistonball.json"),
        help="where the results go (default: %(default)s; '' writes nothing)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    cpus = usable_cpus()
    try:
        import supersuit  # noqa: F401

        have_supersuit = True
    except ImportError:
        have_supersuit = False
        print("supersuit is not installed (pip install supersuit): its rows are skipped")
    configs = {
        "raw (one process)": lambda: _rate(*_time_raw(args.seconds, args.warmup, 0)),
        "vecaccel shm": lambda: measure_vecaccel(
            "shm", args.num_envs, args.seconds, args.warmup, num_workers=cpus
        ),
        "vecaccel shm, copy=False": lambda: measure_vecaccel(
            "shm", args.num_envs, args.seconds, args.warmup, num_workers=cpus, copy=False
        ),
        "vecaccel shm, one worker per env": lambda: measure_vecaccel(
            "shm", args.num_envs, args.seconds, args.warmup, num_workers=args.num_envs
        ),
        "vecaccel async (half the envs per batch)": lambda: measure_vecaccel(
            "async",
            args.num_envs,
            args.seconds,
            args.warmup,
            num_workers=cpus,
            batch_size=max(1, args.num_envs // 2),
        ),
        CEILING: lambda: measure_ceiling(args.seconds, args.warmup, cpus),
    }
    if have_supersuit:
        configs[f"SuperSuit concat_vec_envs_v1, num_cpus={cpus}"] = lambda: measure_supersuit(
            args.num_envs, cpus, args.seconds, args.warmup
        )
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for trial in range(args.trials):
        for name, run in configs.items():  # alternating, so that drifting load hits every config
            rates[name].append(run())
            print(f"trial {trial}: {name}: {rates[name][-1]:,.0f} agent-steps/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    raw = medians["raw (one process)"]
    ceiling = medians[CEILING]
    supersuit_rate = next((v for k, v in medians.items() if k.startswith("SuperSuit")), None)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"\npistonball_v6, {args.num_envs} envs ({args.num_envs * 20} rows), {cpus} CPUs")
    print(f"{'config':<46} {'agent-steps/s':>14} {'x raw':>7} {'of ceiling':>11}")
    results = []
    for name, rate in medians.items():
        print(f"{name:<46} {rate:>14,.0f} {rate / raw:>6.2f}x {rate / ceiling:>10.0%}")
        record = {"config": name, "agent_steps_per_s": rate, "trials": rates[name]}
        record["x_raw"], record["share_of_ceiling"] = rate / raw, rate / ceiling
        if supersuit_rate:
            record["x_supersuit"] = rate / supersuit_rate
        results.append(record)
    print(f"load average after the run: {load}")
    if args.json:
        run_record.add_ceiling(
            "pistonball_v6", ceiling, cpus, unit="agent-steps/s", trials=rates[CEILING]
        )
        run_record.write(args.json, results, args=vars(args), cpus=cpus)
    return 0


def _rate(steps: int, elapsed: float) -> float:
    return steps / elapsed


if __name__ == "__main__":
    raise SystemExit(main())
