"""Soak: every backend stepped for a set time under random injected faults.

Each backend steps 8 :class:`FaultEnv` envs on 2 workers with ``on_worker_failure="restart"``
and ``step_timeout``; every few thousand env steps (never more than 1.5 x ``--fault-every``
apart, so well over one fault per 10,000 steps) one env gets a fault at its next step: an
exception, ``os._exit``, SIGKILL, a segfault, or a hang that only ``step_timeout`` ends (the
first five faults of each backend go through every kind, then kinds are drawn at random). Slow
steps, shorter than ``step_timeout``, are mixed in and must *not* count as failures. The serial
backend runs the envs in this process, so it only gets exceptions, which it must report as
``WorkerError``.

Every call runs under a watchdog (``--watchdog`` seconds); a call that exceeds it is a hang.
For each backend the soak reports the env steps, the faults injected and the faults accounted
for (the faulty env came back restarted with the matching reason, or, on serial, the
``WorkerError`` named it), the envs restarted alongside (the other envs of a dead worker),
restarts nobody asked for, hangs, the slowest call, and the child processes, ``/dev/shm``
entries and file descriptors left after ``close()``. It prints a table, writes JSON, and exits
with 1 unless there were no hangs, no leaks, no stray errors, and every fault was accounted for.

Run (``--minutes`` is the stepping time of the whole run, shared equally by the backends, each
clock starting once the backend's envs are up; writes
``benchmarks/results/soak.json``)::

    python benchmarks/reliability/soak.py --minutes 30
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import os
import signal
import sys
import time
from typing import Any

import numpy as np

import vecaccel
from vecaccel.bench import RunRecord, check_output_path, command_line
from vecaccel.testing.envs import fault_env_fns
from vecaccel.testing.leaks import child_pids, leaked_shm, shm_entries, wait_until

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

BACKENDS = ("serial", "shm", "async", "action_server")
KINDS = ("raise", "kill", "segfault", "exit", "hang")
WEIGHTS = {"raise": 0.35, "kill": 0.25, "segfault": 0.2, "exit": 0.15, "hang": 0.05}
#: What the restart reason of an env says for each fault.
REASONS = {
    "raise": "InjectedFault",
    "kill": "SIGKILL",
    "segfault": "SIGSEGV",
    "exit": "exited with code 3",
    "hang": "step_timeout",
}
HARD = ("kill", "segfault", "exit", "hang")  # the whole worker is restarted


def open_fds() -> dict[int, str]:
    """This process's file descriptors and what they point to (the listing's own fd left out)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass  # the descriptor of the listing itself, closed by now
    return fds


def warm_up(args: argparse.Namespace) -> None:
    """Make and close one vector env first: multiprocessing keeps the arena of its shared-memory
    heap (one descriptor) open for reuse, and later envs reuse it; that is not a leak."""
    envs = vecaccel.make_vec(fault_env_fns(args.num_envs), backend="shm", context=args.context)
    envs.close()


class Hang(Exception):
    """A call ran past the watchdog."""


class Watchdog:
    """Bounds each call: ``SIGALRM`` raises :class:`Hang` in the main thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.slowest = 0.0

        def alarm(signum, frame):
            raise Hang(f"a call took more than {seconds} s")

        signal.signal(signal.SIGALRM, alarm)

    @contextlib.contextmanager
    def guard(self):
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.slowest = max(self.slowest, time.monotonic() - start)


def backend_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "serial":
        return {}
    options: dict[str, Any] = {
        "num_workers": args.num_workers,
        "context": args.context,
        "on_worker_failure": "restart",
        "max_restarts": 10**9,
        "step_timeout": args.step_timeout,
    }
    if name == "async":
        options["batch_size"] = args.num_envs // 2  # partial batches: envs come back at random
    if name == "action_server":
        options.update(device=args.device, alternating=True)
    return options


class BackendSoak:
    """One backend's soak: its vector env, the faults in flight, and the counts."""

    def __init__(self, name: str, args: argparse.Namespace, rng: np.random.Generator) -> None:
        self.name = name
        self.args = args
        self.rng = rng
        self.watchdog = Watchdog(args.watchdog)
        self.kinds = ("raise",) if name == "serial" else KINDS
        self.cycle = list(self.kinds)  # every kind once first, then at random
        self.injected: collections.Counter[str] = collections.Counter()
        self.accounted: collections.Counter[str] = collections.Counter()
        self.collateral = 0
        self.slow_steps = 0
        self.unexplained: list[str] = []
        self.errors: list[str] = []
        self.hangs = 0
        self.env_steps = 0
        self.failures_counted = 0  # env.failures, summed over the vector envs of the run
        self.outstanding: dict[int, str] = {}  # env -> fault armed, not yet reported
        self.collateral_due: dict[int, str] = {}  # env -> fault that took its worker down
        self.envs: Any = None

    # -- the vector env -----------------------------------------------------------------------

    def open(self) -> None:
        args = self.args
        fns = fault_env_fns(
            args.num_envs, slow_seconds=args.step_timeout / 5, hang_seconds=args.watchdog * 2
        )
        with self.watchdog.guard():
            self.envs = vecaccel.make_vec(
                fns, backend=self.name, **backend_options(self.name, args)
            )
            _, infos = self.envs.reset(seed=int(self.rng.integers(2**31)), options={})
        self.ids = np.asarray(infos.get("env_id", np.arange(args.num_envs)))
        self.outstanding.clear()
        self.collateral_due.clear()
        if self.name == "serial":
            self.worker_envs = [tuple(range(args.num_envs))]
        else:
            self.worker_envs = [tuple(w.env_indices) for w in self.envs.pool.workers]

    def close(self, terminate: bool = False) -> None:
        if self.envs is None:
            return
        self.failures_counted += getattr(self.envs, "failures", 0)
        with self.watchdog.guard():
            self.envs.close(terminate=terminate)
        self.envs = None

    def reopen_after(self, what: str, error: BaseException) -> None:
        """Something unexpected: note it, replace the vector env, go on."""
        self.errors.append(f"{what}: {type(error).__name__}: {error}")
        lost = len(self.outstanding)
        self.outstanding.clear()  # their faults can no longer be reported
        self.errors.extend([f"{lost} armed faults lost with the vector env"] if lost else [])
        try:
            self.close(terminate=True)
        except Hang:
            self.hangs += 1
        self.open()

    # -- faults -------------------------------------------------------------------------------

    def group_of(self, env: int) -> tuple[int, ...]:
        return next(group for group in self.worker_envs if env in group)

    def inject(self) -> bool:
        """Arm one fault on an env whose worker has none in flight; ``False`` if none is free."""
        busy = set(self.outstanding) | set(self.collateral_due)
        free = [
            env
            for env in range(self.args.num_envs)
            if not busy.intersection(self.group_of(env)) or self.name == "serial"
        ]
        if self.name == "serial":
            free = [env for env in free if env not in busy]
        if not free:
            return False
        env = int(self.rng.choice(free))
        if self.cycle:
            kind = self.cycle.pop(0)
        else:
            weights = np.array([WEIGHTS[k] for k in self.kinds])
            kind = str(self.rng.choice(self.kinds, p=weights / weights.sum()))
        with self.watchdog.guard():
            self.envs.set_attr_indices("inject", kind, [env])
        self.injected[kind] += 1
        self.outstanding[env] = kind
        if kind in HARD:
            for other in self.group_of(env):
                if other != env:
                    self.collateral_due[other] = kind
        if self.rng.random() < self.args.slow_prob:  # a slow step elsewhere: not a failure
            calm = [e for e in range(self.args.num_envs) if e not in self.group_of(env)]
            if calm and self.name != "serial":
                with self.watchdog.guard():
                    self.envs.set_attr_indices("inject", "slow", [int(self.rng.choice(calm))])
                self.slow_steps += 1
        return True

    def note_restarts(self, infos: dict) -> None:
        if "worker_restarted" not in infos:
            return
        ids = np.asarray(infos.get("env_id", np.arange(self.args.num_envs)))
        for position in np.flatnonzero(infos["_worker_restarted"]):
            env, reason = int(ids[position]), str(infos["restart_reason"][position])
            kind = self.outstanding.get(env)
            if kind is not None and REASONS[kind] in reason:
                self.accounted[kind] += 1
                del self.outstanding[env]
                continue
            kind = self.collateral_due.get(env)
            if kind is not None and REASONS[kind] in reason:
                self.collateral += 1
                del self.collateral_due[env]
                continue
            self.unexplained.append(f"env {env}: {reason}")

    # -- the run --------------------------------------------------------------------------------

    def actions(self) -> Any:
        actions = self.rng.integers(0, 3, size=len(self.ids))
        if self.name == "action_server":
            import torch

            return torch.as_tensor(actions)
        return actions

    def step(self) -> None:
        try:
            with self.watchdog.guard():
                obs, rew, term, trunc, infos = self.envs.step(self.actions())
        except Hang as error:
            self.hangs += 1
            self.reopen_after("step", error)
            return
        except vecaccel.WorkerError as error:
            raised = self.name == "serial" and len(error.env_indices) == 1
            env = error.env_indices[0] if raised else None
            if raised and self.outstanding.get(env) == "raise" and "InjectedFault" in str(error):
                self.accounted["raise"] += 1  # serial reports the exception; reset and go on
                del self.outstanding[env]
                with self.watchdog.guard():
                    _, infos = self.envs.reset(seed=int(self.rng.integers(2**31)), options={})
                return
            self.reopen_after("step", error)
            return
        self.ids = np.asarray(infos.get("env_id", np.arange(len(rew))))
        self.env_steps += len(self.ids)
        self.note_restarts(infos)

    def run(self, seconds: float) -> dict[str, Any]:
        gc.collect()
        base_children, base_shm, base_fds = child_pids(), shm_entries(), open_fds()
        self.open()
        self.actions()  # the action server's first batch imports torch: not part of the time
        # the clock starts once the envs are up, so that a slow start (a loaded machine, the
        # action server's device) does not eat a short run's time
        started = time.monotonic()
        interval = self.args.fault_every
        next_fault = int(self.rng.integers(interval // 2, interval * 3 // 2 + 1))
        end = started + seconds
        drain_until = end + 3 * self.args.step_timeout + 5.0
        while True:
            now = time.monotonic()
            if now >= end:  # no new faults; wait for the ones in flight to be reported
                if (not self.outstanding and not self.collateral_due) or now >= drain_until:
                    break
            elif self.env_steps >= next_fault and self.inject():
                next_fault = self.env_steps + int(
                    self.rng.integers(interval // 2, interval * 3 // 2 + 1)
                )
            self.step()
        elapsed = time.monotonic() - started
        unaccounted = dict(collections.Counter(self.outstanding.values()))
        try:
            self.close()
        except Hang:
            self.hangs += 1
        leaked_children = set()
        if not wait_until(lambda: not (child_pids() - base_children), 10.0):
            leaked_children = child_pids() - base_children
        gc.collect()
        leaked_fds = sorted(
            f"{fd} -> {target}" for fd, target in open_fds().items() if base_fds.get(fd) != target
        )
        injected = sum(self.injected.values())
        accounted = sum(self.accounted.values())
        result = {
            "backend": self.name,
            "seconds": round(elapsed, 1),
            "env_steps": self.env_steps,
            "env_steps_per_s": round(self.env_steps / elapsed),
            "faults_injected": injected,
            "faults_by_kind": dict(self.injected),
            "faults_accounted": accounted,
            "accounted_by_kind": dict(self.accounted),
            "faults_unaccounted": unaccounted,
            "env_steps_per_fault": round(self.env_steps / max(injected, 1)),
            "restarted_alongside": self.collateral,
            "collateral_unreported": len(self.collateral_due),
            "slow_steps": self.slow_steps,
            "restarts_unexplained": self.unexplained,
            "env_failures_counted": self.failures_counted,
            "errors": self.errors,
            "hangs": self.hangs,
            "slowest_call_s": round(self.watchdog.slowest, 2),
            "leaked_processes": sorted(leaked_children),
            "leaked_shm": sorted(leaked_shm(base_shm)),
            "leaked_fds": leaked_fds,
        }
        restart_counts_agree = self.name == "serial" or self.failures_counted == accounted
        result["ok"] = bool(
            injected == accounted
            and restart_counts_agree
            and not self.collateral_due
            and not self.unexplained
            and not self.errors
            and not self.hangs
            and not leaked_children
            and not result["leaked_shm"]
            and not leaked_fds
            and (injected >= 1 and self.env_steps / injected <= 10_000)
        )
        return result


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| backend | env steps | steps/s | faults injected | accounted for | restarted alongside "
        "| unexplained restarts | hangs | slowest call (s) | leaked procs / shm / fds | ok |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["faults_by_kind"].items()))
        leaks = f"{len(r['leaked_processes'])} / {len(r['leaked_shm'])} / {len(r['leaked_fds'])}"
        lines.append(
            f"| {r['backend']} | {r['env_steps']:,} | {r['env_steps_per_s']:,} "
            f"| {r['faults_injected']} ({kinds}) | {r['faults_accounted']} "
            f"| {r['restarted_alongside']} | {len(r['restarts_unexplained'])} | {r['hangs']} "
            f"| {r['slowest_call_s']} | {leaks} | {'yes' if r['ok'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="the whole run")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--context", default="fork")
    parser.add_argument("--device", default="cpu", help="the action server's device")
    parser.add_argument("--fault-every", type=int, default=4000, help="mean env steps per fault")
    parser.add_argument("--step-timeout", type=float, default=2.0)
    parser.add_argument("--slow-prob", type=float, default=0.3, help="a slow step per fault")
    parser.add_argument("--watchdog", type=float, default=30.0, help="a longer call is a hang")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(RESULTS, "soak.json"))
    args = parser.parse_args(argv)
    if args.fault_every * 3 // 2 > 10_000:
        parser.error("--fault-every above 6666 allows gaps over 10,000 steps between faults")
    if args.out:
        try:
            check_output_path(args.out, "--out")
        except ValueError as exc:
            parser.error(str(exc))
    run_record = RunRecord(command_line(argv, __file__))
    backends = [b for b in args.backends.split(",") if b]
    seconds = args.minutes * 60 / len(backends)
    rng = np.random.default_rng(args.seed)
    warm_up(args)
    results = []
    for name in backends:
        results.append(BackendSoak(name, args, rng).run(seconds))
    text = table(results)
    print(text)
    ok = all(r["ok"] for r in results)
    if args.out:
        run_record.write(args.out, results, summary={"ok": ok, "table": text}, config=vars(args))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
