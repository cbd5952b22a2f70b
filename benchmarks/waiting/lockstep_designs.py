"""Lock-step designs for envs of uneven step cost, side by side with the machine's ceiling.

A lock-step step ends when the slowest worker's slice is done, and between two steps every
worker waits for the caller: the wake-up of its process, the caller's own work. On Pong
(``AtariPreprocessing``, up to 30 no-op frames at every reset) and on CartPole (steps of
microseconds, where the fixed cost of a step dominates) this measures, in one run, the trials alternating their order:

* ``ceiling``: one process per usable CPU, each stepping its own raw env (no lock-step);
* ``bare lock-step, block``: one process per CPU stepping its share of the raw envs, woken by a
  byte on a pipe and answering with one, no vecaccel code: what a lock-step design that sleeps
  between steps can reach here;
* ``bare lock-step, spin``: the same, each process looking for its next byte without sleeping;
* ``shm`` as shipped (its workers sleep between steps), ``shm`` whose workers look for the
  next step for 300 µs before they sleep (``worker_spin_us``, only while the steps come that
  close together), more workers than CPUs (the kernel balances them), one worker per env;
* ``hybrid`` (the caller steps a share itself) and ``async`` with half the envs per batch.

Each measurement reports steps/s, its share of the ceiling of the same trial, and the CPU
seconds per second that the vec env's workers used (1.0: a worker kept its core busy). With
``--pause-ms`` the loop also sleeps between steps, as a training loop does for the policy's
forward pass, and measures shm's two settings so: workers that spin only while the gaps fit in
their spin then cost no more CPU than sleeping ones.

Run (writes ``benchmarks/results/lockstep_designs.json``)::

    python benchmarks/waiting/lockstep_designs.py --pause-ms 0,2 --seconds 4 --trials 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import statistics
import sys
import time
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

import vecaccel
from vecaccel.bench import RunRecord, command_line, parse_workloads
from vecaccel.bench.ceiling import measure_ceiling
from vecaccel.bench.timing import ACTION_BATCHES, sample_actions
from vecaccel.bench.workloads import resolve_env
from vecaccel.worker import usable_cpus
from vecaccel.worker.cpus import limit_threads_after_envs, limit_threads_before_envs

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def _bare_worker(env_fn: Any, count: int, seed: int, spin: bool, cmd: Any, done: Any) -> None:
    """Step ``count`` raw envs once per byte on ``cmd``; answer each with a byte."""
    limit_threads_before_envs(1)
    envs = [env_fn() for _ in range(count)]
    limit_threads_after_envs(1)
    for k, env in enumerate(envs):
        env.reset(seed=seed + k)
    actions = sample_actions(envs[0].action_space, ACTION_BATCHES, seed)
    cmd_fd, done_fd = cmd.fileno(), done.fileno()
    poller = select.poll()
    poller.register(cmd_fd, select.POLLIN)
    os.write(done_fd, b"r")
    i = 0
    while True:
        if spin:
            while not poller.poll(0):
                pass
        if os.read(cmd_fd, 1) != b"s":
            break
        for env in envs:
            _, _, terminated, truncated, _ = env.step(actions[i % ACTION_BATCHES])
            if terminated or truncated:
                env.reset()
        i += 1
        os.write(done_fd, b"d")


class BareLockstep:
    """The simplest lock-step: one process per CPU, a byte there and a byte back per step."""

    def __init__(self, env_fn: Any, num_envs: int, processes: int, spin: bool) -> None:
        bounds = np.linspace(0, num_envs, processes + 1).round().astype(int)
        self.procs, self.cmds, self.dones = [], [], []
        for k in range(processes):
            cmd_r, cmd_w = mp.Pipe(duplex=False)
            done_r, done_w = mp.Pipe(duplex=False)
            count = int(bounds[k + 1] - bounds[k])
            proc = mp.Process(
                target=_bare_worker,
                args=(env_fn, count, int(bounds[k]), spin, cmd_r, done_w),
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
            self.cmds.append(cmd_w.fileno())
            self.dones.append(done_r.fileno())
            self._keep = getattr(self, "_keep", []) + [cmd_r, cmd_w, done_r, done_w]
        for fd in self.dones:
            os.read(fd, 1)
        self.num_envs = num_envs

    def step(self) -> None:
        for fd in self.cmds:
            os.write(fd, b"s")
        for fd in self.dones:
            os.read(fd, 1)

    def worker_pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def close(self) -> None:
        for fd in self.cmds:
            os.write(fd, b"q")
        for proc in self.procs:
            proc.join(5)


class VecAccel:
    """A vecaccel vec env stepped with random actions (``async``: a batch of the envs a step)."""

    def __init__(self, env_fn: Any, num_envs: int, backend: str, options: dict[str, Any]) -> None:
        self.envs = vecaccel.make_vec(env_fn, num_envs, backend=backend, **options)
        self.envs.reset(seed=0)
        self.num_envs = int(options.get("batch_size") or num_envs)
        batched = batch_space(self.envs.single_action_space, self.num_envs)
        self.actions = sample_actions(batched, ACTION_BATCHES, 0)
        self.i = 0

    def step(self) -> None:
        self.envs.step(self.actions[self.i % ACTION_BATCHES])
        self.i += 1

    def worker_pids(self) -> list[int]:
        return [worker.process.pid for worker in self.envs.pool.workers]

    def close(self) -> None:
        self.envs.close()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _time(impl: Any, seconds: float, warmup: float, pause: float) -> tuple[float, float]:
    """Steps/s of ``impl`` and its workers' mean CPU seconds per second."""
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        impl.step()
    pids = impl.worker_pids()
    before = [_cpu_seconds(pid) for pid in pids]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        impl.step()
        steps += impl.num_envs
        if pause:
            time.sleep(pause)
    elapsed = time.perf_counter() - start
    busy = [(_cpu_seconds(pid) - b) / elapsed for pid, b in zip(pids, before)]
    return steps / elapsed, statistics.fmean(busy)


def designs(env_fn: Any, num_envs: int, cpus: int) -> list[tuple[str, Any]]:
    """(name, builder) of every design measured at ``num_envs`` (one worker per env only up to
    32 envs)."""
    half = max(1, num_envs // 2)
    sleep = {"worker_spin_us": 0}
    chosen = [
        ("bare lock-step, block", lambda: BareLockstep(env_fn, num_envs, cpus, spin=False)),
        ("bare lock-step, spin", lambda: BareLockstep(env_fn, num_envs, cpus, spin=True)),
        ("shm", lambda: VecAccel(env_fn, num_envs, "shm", {})),
        (
            "shm, workers spin 300 µs",
            lambda: VecAccel(env_fn, num_envs, "shm", {"worker_spin_us": 300}),
        ),
        (
            f"shm, {2 * cpus} workers",
            lambda: VecAccel(env_fn, num_envs, "shm", {"num_workers": 2 * cpus, **sleep}),
        ),
    ]
    if num_envs <= 32:
        chosen.append(
            (
                f"shm, {num_envs} workers",
                lambda: VecAccel(env_fn, num_envs, "shm", {"num_workers": num_envs, **sleep}),
            )
        )
    return chosen + [
        ("hybrid", lambda: VecAccel(env_fn, num_envs, "hybrid", {})),
        (f"async, batch {half}", lambda: VecAccel(env_fn, num_envs, "async", {"batch_size": half})),
    ]


#: The designs measured with a pause between steps: what shm's spinning workers cost then.
PAUSED_DESIGNS = ("shm", "shm, workers spin 300 µs")


def measure_designs(
    target: Any, num_envs: int, chosen: list[tuple[str, Any]], pause_ms: float, args: Any
) -> list[dict[str, Any]]:
    """Alternating trials of the ``chosen`` designs at ``num_envs``; one record per design
    (medians) and one per trial's ceiling."""
    rows: list[dict[str, Any]] = []
    trials: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in chosen}
    for trial in range(args.trials):
        ceiling, _ = measure_ceiling(target, args.seconds, args.warmup, seed=trial)
        rows.append(
            {
                "env": target.label,
                "num_envs": num_envs,
                "trial": trial,
                "design": "ceiling",
                "steps_per_s": ceiling,
            }
        )
        for name, build in chosen if trial % 2 == 0 else chosen[::-1]:
            impl = build()
            try:
                rate, busy = _time(impl, args.seconds, args.warmup, pause_ms / 1e3)
            finally:
                impl.close()
            trials[name].append((rate, rate / ceiling, busy))
            print(
                f"{num_envs:>3} envs, pause {pause_ms:g} ms, trial {trial}: {name:<24}"
                f" {rate:>8,.0f} steps/s  {rate / ceiling:.2f} of the ceiling"
                f" ({ceiling:,.0f}), workers busy {busy:.2f}",
                flush=True,
            )
    for name, values in trials.items():
        rows.append(
            {
                "env": target.label,
                "num_envs": num_envs,
                "pause_ms": pause_ms,
                "design": name,
                "steps_per_s": statistics.median(v[0] for v in values),
                "share_of_ceiling": statistics.median(v[1] for v in values),
                "worker_cpu_per_s": statistics.median(v[2] for v in values),
                "trials": [v[0] for v in values],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload",
        action="append",
        help="ENV=N1,N2: pong or a Gymnasium id and its env counts (repeatable; default: "
        "pong=8,16 and CartPole-v1=64,256)",
    )
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--pause-ms",
        default="0",
        help="comma-separated sleeps between steps; past 0 only shm's two settings are measured",
    )
    parser.add_argument("--only", action="append", help="a design to measure (repeatable)")
    parser.add_argument("--json", default=os.path.join(RESULTS, "lockstep_designs.json"))
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    cpus = usable_cpus()
    workloads = parse_workloads(args.workload, {"pong": [8, 16], "CartPole-v1": [64, 256]})
    rows: list[dict[str, Any]] = []
    for env, counts in workloads.items():
        target = resolve_env(env)
        for pause_ms in [float(p) for p in args.pause_ms.split(",")]:
            keep = set(args.only) if args.only else None if not pause_ms else set(PAUSED_DESIGNS)
            for num_envs in counts:
                chosen = designs(target.env_fn, num_envs, cpus)
                chosen = [d for d in chosen if keep is None or d[0] in keep]
                rows.extend(measure_designs(target, num_envs, chosen, pause_ms, args))
    print(f"\n{'env':<12} {'envs':>4} {'pause':>5}  {'design':<24} {'steps/s':>9} {'share':>6}")
    for row in rows:
        if "share_of_ceiling" in row:
            print(
                f"{row['env']:<12} {row['num_envs']:>4} {row['pause_ms']:>5g}  {row['design']:<24}"
                f" {row['steps_per_s']:>9,.0f} {row['share_of_ceiling']:>6.2f}"
                f" {row['worker_cpu_per_s']:>5.2f}"
            )
    for row in rows:
        if row["design"] == "ceiling":
            run_record.add_ceiling(
                row["env"], row["steps_per_s"], cpus, num_envs=row["num_envs"], trial=row["trial"]
            )
    run_record.write(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
