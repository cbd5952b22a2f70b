"""Lifecycle benchmark: create/close cycles leave nothing behind; dead workers are reported fast.

Measures, for a process backend (default ``shm``):

1. ``--cycles`` create/reset/step/close cycles (default 1,000): the open file descriptors
   (``/proc/self/fd``), the ``/dev/shm`` entries and this process's children before and after
   (after one warm-up cycle, which creates the allocator arena and, under spawn, the resource
   tracker, both kept for the life of the process), and the time per cycle.
2. Dead-worker report latency: from the moment a worker dies to the ``WorkerError`` in the caller,
   for a worker SIGKILLed from outside while the caller waits in ``step_wait``, for a worker that
   kills itself inside a step (SIGKILL, segfault, ``os._exit``; the env writes
   ``time.monotonic()``, a system-wide clock on Linux, just before), and for a worker killed
   while idle (from the next ``step`` call to the error).
3. Orphaned workers: from SIGKILLing the caller's process to its workers being gone, with the
   workers idle and with a worker busy in a long step.

Usage::

    python benchmarks/reliability/lifecycle.py          # 1,000 fork cycles, all latencies
    python benchmarks/reliability/lifecycle.py --context spawn --cycles 50 --json lifecycle-spawn.json

What it checks: a dead worker is reported within 1 s, and 1,000 cycles leave ``/dev/shm``, the
fds and the process table as they were.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line
from vecaccel.testing.envs import counter_fns, env_pid
from vecaccel.testing.leaks import (
    child_pids,
    open_fds,
    process_gone,
    shm_entries,
    wait_until,
)

NUM_ENVS = 4
ACTIONS = np.zeros(NUM_ENVS, dtype=np.int64)


def make(backend, context, faulty=None):
    return vecaccel.make_vec(
        counter_fns(NUM_ENVS, faulty), backend=backend, num_workers=2, context=context
    )


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "n": len(values),
        "median_ms": round(statistics.median(values) * 1e3, 2),
        "max_ms": round(values[-1] * 1e3, 2),
        "min_ms": round(values[0] * 1e3, 2),
    }


# ---------------------------------------------------------------------------------------------
# 1. create/close cycles


def cycles(backend: str, context: str, count: int) -> dict:
    def one():
        envs = make(backend, context)
        envs.reset(seed=0)
        envs.step(ACTIONS)
        envs.close()

    one()  # warm-up
    gc.collect()
    before = {"fds": open_fds(), "shm": shm_entries(), "children": child_pids()}
    started = time.perf_counter()
    for k in range(count):
        one()
        if (k + 1) % 100 == 0:
            print(f"  {k + 1}/{count} cycles", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    gc.collect()
    wait_until(lambda: child_pids() == before["children"], 5.0)
    after = {"fds": open_fds(), "shm": shm_entries(), "children": child_pids()}
    return {
        "cycles": count,
        "seconds_per_cycle": round(elapsed / count, 4),
        "fds_before": len(before["fds"]),
        "fds_after": len(after["fds"]),
        "shm_new": sorted(after["shm"] - before["shm"]),
        "shm_gone": sorted(before["shm"] - after["shm"]),
        "children_before": len(before["children"]),
        "children_after": len(after["children"]),
        "unchanged": len(before["fds"]) == len(after["fds"])
        and after["shm"] - before["shm"] == set()
        and before["children"] == after["children"],
    }


# ---------------------------------------------------------------------------------------------
# 2. dead-worker report latency


def external_kill_latency(backend: str, context: str, repeats: int) -> list[float]:
    """SIGKILL a worker from outside while the caller waits in step_wait()."""
    out = []
    for _ in range(repeats):
        envs = make(backend, context, {0: {"sleep_step": 2, "sleep_seconds": 60.0}})
        try:
            envs.reset(seed=0)
            pid = envs.call_indices(env_pid, [0])[0]
            envs.step(ACTIONS)
            envs.step_async(ACTIONS)
            killed_at = []

            def kill(pid=pid, killed_at=killed_at):
                time.sleep(0.1)
                killed_at.append(time.monotonic())
                os.kill(pid, signal.SIGKILL)

            killer = threading.Thread(target=kill)
            killer.start()
            try:
                envs.step_wait()
            except vecaccel.WorkerError:
                out.append(time.monotonic() - killed_at[0])
            else:
                raise AssertionError("the dead worker was not reported")
            finally:
                killer.join()
        finally:
            envs.close()
    return out


def self_fault_latency(backend: str, context: str, kind: str, repeats: int) -> list[float]:
    """A worker dies inside a step; latency from the env's last time stamp to the error."""
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for k in range(repeats):
            stamp = os.path.join(folder, f"{kind}-{k}")
            faulty = {1: {"fault": kind, "fault_step": 2, "stamp_path": stamp}}
            envs = make(backend, context, faulty)
            try:
                envs.reset(seed=0)
                envs.step(ACTIONS)
                try:
                    envs.step(ACTIONS)
                except vecaccel.WorkerError:
                    reported = time.monotonic()
                else:
                    raise AssertionError("the dead worker was not reported")
                with open(stamp) as file:
                    out.append(reported - float(file.read()))
            finally:
                envs.close()
    return out


def idle_kill_latency(backend: str, context: str, repeats: int) -> list[float]:
    """A worker killed while idle: from the next step() call to the error."""
    out = []
    for _ in range(repeats):
        envs = make(backend, context)
        try:
            envs.reset(seed=0)
            pid = envs.call_indices(env_pid, [3])[0]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda pid=pid: process_gone(pid), 5.0)
            started = time.monotonic()
            try:
                envs.step(ACTIONS)
            except vecaccel.WorkerError:
                out.append(time.monotonic() - started)
            else:
                raise AssertionError("the dead worker was not reported")
        finally:
            envs.close()
    return out


# ---------------------------------------------------------------------------------------------
# 3. orphaned workers

PARENT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import vecaccel
    from vecaccel.testing.envs import counter_fns, env_pid

    def main():
        busy = sys.argv[3] == "busy"
        faulty = {0: {"sleep_step": 1, "sleep_seconds": 60.0}} if busy else None
        envs = vecaccel.make_vec(counter_fns(4, faulty), backend=sys.argv[2], num_workers=2,
                                 context=sys.argv[1])
        envs.reset(seed=0)
        print(" ".join(str(pid) for pid in sorted(set(envs.call(env_pid)))), flush=True)
        if busy:
            envs.step_async(np.zeros(4, dtype=np.int64))
        time.sleep(120)

    if __name__ == "__main__":
        main()
    """
)


def orphan_exit_latency(backend: str, context: str, busy: bool, repeats: int) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "parent.py")
        with open(script, "w") as file:
            file.write(PARENT_SCRIPT)
        for _ in range(repeats):
            parent = subprocess.Popen(
                [sys.executable, script, context, backend, "busy" if busy else "idle"],
                stdout=subprocess.PIPE,
                text=True,
            )
            pids = [int(pid) for pid in parent.stdout.readline().split()]
            time.sleep(0.3)  # let the busy worker enter its long step
            killed = time.monotonic()
            parent.kill()
            parent.wait()
            parent.stdout.close()
            gone = wait_until(
                lambda pids=pids: all(process_gone(p) for p in pids), 90.0, interval=0.005
            )
            out.append(time.monotonic() - killed if gone else float("inf"))
            for pid in pids:  # never leave one behind, whatever was measured
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="shm")
    parser.add_argument("--context", default="fork", choices=["fork", "spawn", "forkserver"])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=10, help="repeats of each latency")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    if args.json:
        check_output_path(args.json)

    results: dict = {"backend": args.backend, "context": args.context}
    print(f"{args.cycles} create/close cycles ({args.backend}, {args.context})...", flush=True)
    results["cycles"] = cycles(args.backend, args.context, args.cycles)
    c = results["cycles"]
    print(
        f"  {c['seconds_per_cycle'] * 1e3:.1f} ms/cycle; fds {c['fds_before']} -> "
        f"{c['fds_after']}; new /dev/shm entries {c['shm_new'] or 'none'}; children "
        f"{c['children_before']} -> {c['children_after']}; unchanged: {c['unchanged']}"
    )

    latencies = {
        "external SIGKILL during step_wait": external_kill_latency(
            args.backend, args.context, args.repeats
        ),
        "SIGKILL inside step": self_fault_latency(
            args.backend, args.context, "sigkill", args.repeats
        ),
        "segfault inside step": self_fault_latency(
            args.backend, args.context, "segfault", args.repeats
        ),
        "os._exit inside step": self_fault_latency(
            args.backend, args.context, "exit", args.repeats
        ),
        "killed while idle (from next step)": idle_kill_latency(
            args.backend, args.context, args.repeats
        ),
    }
    orphans = max(1, args.repeats // 5)
    latencies["orphaned idle workers exit"] = orphan_exit_latency(
        args.backend, args.context, False, orphans
    )
    latencies["orphaned busy worker exits"] = orphan_exit_latency(
        args.backend, args.context, True, orphans
    )
    results["latency"] = {name: summary(values) for name, values in latencies.items()}
    print(f"\n{'dead-worker report latency':40s} {'n':>3s} {'median ms':>10s} {'max ms':>10s}")
    for name, stats in results["latency"].items():
        print(f"{name:40s} {stats['n']:3d} {stats['median_ms']:10.2f} {stats['max_ms']:10.2f}")
    if args.json:
        rows = [{"measure": "cycles", **c}]
        rows += [{"measure": name, **stats} for name, stats in results["latency"].items()]
        run_record.write(
            args.json, rows, backend=args.backend, context=args.context, repeats=args.repeats
        )
    return 0 if c["unchanged"] else 1


if __name__ == "__main__":
    sys.exit(main())
