"""Would finer-grained workers balance a lock-step step? Self-scheduled chains against lock-step.

``benchmarks/waiting/lockstep_balance.py`` shows a lock-step step waiting for whichever CPU is slow at the
moment. A step can balance itself if its envs come in more, smaller units than there are CPUs:
here 16 Pong envs (SB3's ``AtariWrapper``) are split over ``U`` processes, and each step starts
one process per CPU; every process, once done, claims the next unclaimed unit (a shared counter)
and wakes its process, so the CPU that is fast at the moment steps more units. ``U`` equal to the
CPU count is plain lock-step. With ``--pin`` a woken process is first moved to its waker's CPU,
so that each chain stays on one CPU. Before each step the caller runs SB3's CNN forward pass on
16 frames, as in SB3's loop. The configurations are built at once and measured in turn, the
order alternating from round to round, so that drifts in the machine's speed reach all alike.

Run (writes ``benchmarks/results/self_scheduling.json``)::

    python benchmarks/waiting/self_scheduling.py --units 2,4,8,16
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import time
from multiprocessing.connection import wait as wait_any
from typing import Any

import numpy as np
from lockstep_balance import forward_pass

from vecaccel.bench import RunRecord, command_line
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

GO, STOP, END, READY = b"g", b"q", b"e", b"r"


def _unit(
    index: int,
    num_envs: int,
    cmd: Any,
    done: Any,
    peers: list[Any],
    counter: Any,
    pids: Any,
    pin: bool,
) -> None:
    """One unit's process: step its envs on GO, then hand the step on to the next unclaimed
    unit, or report the end of its chain to the caller."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    gym.register_envs(ale_py)
    envs = [AtariWrapper(gym.make("PongNoFrameskip-v4")) for _ in range(num_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=100 * index + i)
    rng = np.random.default_rng(index)
    getcpu = ctypes.CDLL(None).sched_getcpu if pin else None
    done.send_bytes(READY)
    try:
        while cmd.recv_bytes() == GO:
            for env in envs:
                _, _, terminated, truncated, _ = env.step(int(rng.integers(6)))
                if terminated or truncated:
                    env.reset()
            with counter.get_lock():
                claimed = counter.value
                counter.value += 1
            if claimed < len(peers):
                if getcpu is not None:
                    try:
                        os.sched_setaffinity(int(pids[claimed]), {getcpu()})
                    except OSError:
                        pass
                peers[claimed].send_bytes(GO)
            else:
                done.send_bytes(END)
    finally:
        for env in envs:
            env.close()


class Chains:
    """16 envs in ``units`` processes, ``heads`` chains at a time (one per CPU)."""

    def __init__(
        self, units: int, heads: int, total_envs: int, pin: bool, context: str | None
    ) -> None:
        if units < 1 or total_envs % units:
            raise ValueError(f"units must divide the {total_envs} envs, got {units}")
        ctx = mp.get_context(context)
        self.units, self.heads, self.pin = units, min(heads, units), pin
        self.counter = ctx.Value("i", 0)
        self.pids = ctx.Array("q", units)
        cmd_pairs = [ctx.Pipe(duplex=False) for _ in range(units)]
        done_pairs = [ctx.Pipe(duplex=False) for _ in range(units)]
        self.cmds = [send for _, send in cmd_pairs]
        self.dones = [recv for recv, _ in done_pairs]
        self.procs = []
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.head_cpus = [cpus[k % len(cpus)] for k in range(self.heads)] if cpus else []
        try:
            for k in range(units):
                proc = ctx.Process(
                    target=_unit,
                    args=(
                        k,
                        total_envs // units,
                        cmd_pairs[k][0],
                        done_pairs[k][1],
                        self.cmds,
                        self.counter,
                        self.pids,
                        pin,
                    ),
                    daemon=True,
                )
                proc.start()
                self.procs.append(proc)
                self.pids[k] = proc.pid
            for recv, _ in cmd_pairs:  # the children's ends: a dead child then reads as EOF
                recv.close()
            for _, send in done_pairs:
                send.close()
            for conn in self.dones:
                if conn.recv_bytes() != READY:
                    raise RuntimeError("a unit process did not start")
        except BaseException:
            self.close()
            raise

    def step(self) -> None:
        """One lock-step step of every env: start a chain per CPU, wait for every chain's end."""
        self.counter.value = self.heads
        for k in range(self.heads):
            if self.pin and self.head_cpus:
                os.sched_setaffinity(self.procs[k].pid, {self.head_cpus[k]})
            self.cmds[k].send_bytes(GO)
        sentinels = {proc.sentinel: k for k, proc in enumerate(self.procs)}
        ended = 0
        while ended < self.heads:
            for ready in wait_any([*self.dones, *sentinels]):
                if ready in sentinels:  # forked siblings hold its pipes: no EOF would come
                    code = self.procs[sentinels[ready]].exitcode
                    raise RuntimeError(f"unit {sentinels[ready]} died (exit code {code})")
                if ready.recv_bytes() == END:
                    ended += 1

    def close(self) -> None:
        for conn in self.cmds:
            try:
                conn.send_bytes(STOP)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()


def measure(
    units: list[int],
    rounds: int,
    steps: int,
    pin: bool,
    total_envs: int = 16,
    context: str | None = None,
    pause: Any = None,
) -> list[dict[str, Any]]:
    """Every configuration's env-phase seconds, ``steps`` per round (the first two untimed)."""
    heads = usable_cpus()
    pause = pause or forward_pass()
    pools: dict[int, Chains] = {}
    times: dict[int, list[float]] = {u: [] for u in units}
    try:
        for u in units:
            pools[u] = Chains(u, heads, total_envs, pin, context)
        for r in range(rounds):
            for u in units if r % 2 == 0 else units[::-1]:
                for i in range(steps):
                    pause()
                    start = time.perf_counter()
                    pools[u].step()
                    if i >= 2:
                        times[u].append(time.perf_counter() - start)
    finally:
        for pool in pools.values():
            pool.close()
    return [
        {
            "units": u,
            "envs_per_unit": total_envs // u,
            "chains": min(heads, u),
            "pin": pin,
            "steps": len(times[u]),
            "mean_ms": round(float(np.mean(times[u])) * 1e3, 3) if times[u] else None,
            "median_ms": round(float(np.median(times[u])) * 1e3, 3) if times[u] else None,
        }
        for u in units
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--units", default="2,4,8,16", help="comma-separated processes for the --envs envs"
    )
    parser.add_argument(
        "--envs", type=int, default=16, help="Pong envs in all, split over the units (default 16)"
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40, help="steps per round (2 untimed)")
    parser.add_argument("--pin", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--context", default=None, help="multiprocessing start method")
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "self_scheduling.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    try:
        units = [int(u) for u in args.units.split(",")]
    except ValueError:
        parser.error(f"--units: integers, got {args.units!r}")
    bad = [u for u in units if u < 1 or args.envs % u]
    if bad:
        parser.error(f"--units: each must divide {args.envs}, got {bad}")
    if args.rounds < 1 or args.steps < 3 or args.envs < 1:
        parser.error("--rounds and --envs must be at least 1 and --steps at least 3")
    pins = {"no": [False], "yes": [True], "both": [False, True]}[args.pin]
    records = []
    for pin in pins:
        records += measure(units, args.rounds, args.steps, pin, args.envs, args.context)
    print("| processes | envs each | woken on the waker's CPU | steps | mean ms | median ms |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for r in records:
        print(
            f"| {r['units']} | {r['envs_per_unit']} | {'yes' if r['pin'] else 'no'} | "
            f"{r['steps']} | {r['mean_ms']:.2f} | {r['median_ms']:.2f} |"
        )
    if args.json:
        run_record.write(args.json, records)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
