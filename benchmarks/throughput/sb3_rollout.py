"""SB3 PPO's rollout phase on ``SubprocVecEnv``, ``DummyVecEnv`` and vecaccel, side by side.

The vec env only matters while SB3 collects a rollout, so a callback times the rollout phase
(from ``_on_rollout_start`` to ``_on_rollout_end``: env steps plus the policy's forward passes)
and the run also reports end-to-end ``learn`` steps per second, where the gradient updates
dominate and bound what any vec env can gain.

Workloads:

* ``pong``: ``make_atari_env("PongNoFrameskip-v4")`` + ``VecFrameStack(4)``, ``CnnPolicy``,
  16 envs, ``n_steps=128``, 4 epochs, minibatches of 256.
* ``cartpole``: ``make_vec_env("CartPole-v1")``, ``MlpPolicy``, 16 envs, same PPO settings.

Usage::

    python benchmarks/throughput/sb3_rollout.py                          # 1 warm-up + 5 timed updates each
    python benchmarks/throughput/sb3_rollout.py --updates 2 --warmup-updates 1 --workloads cartpole
    python benchmarks/throughput/sb3_rollout.py --vec-envs subproc,vecaccel-shm --json out.json
    python benchmarks/throughput/sb3_rollout.py --rounds 3 --updates 4   # each config 3 times, interleaved
    python benchmarks/throughput/sb3_rollout.py --interleave --updates 12 # all built at once, updates in turn

Every configuration is built, warmed up with ``--warmup-updates`` PPO updates (not timed) and
then timed over ``--updates`` more; rollout steps per second = steps collected / seconds spent
in the rollout phase. Start-up (process creation, ROM loading) is never timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecFrameStack

from vecaccel.bench import RunRecord, command_line, machine_info
from vecaccel.sb3 import VecAccelEnv

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

try:  # SubprocVecEnv's forkserver/spawn workers import this module: register ALE ids there too
    import ale_py

    gym.register_envs(ale_py)
except ImportError:  # the cartpole workload still runs
    pass

WORKLOADS = ("pong", "cartpole")
VEC_ENVS = ("subproc", "dummy", "vecaccel-shm", "vecaccel-hybrid")


class RolloutTimer(BaseCallback):
    """Accumulates the wall-clock time of every rollout phase after the warm-up ones."""

    def __init__(self, warmup_rollouts: int) -> None:
        super().__init__()
        self.warmup_rollouts = warmup_rollouts
        self.rollouts = 0
        self.rollout_seconds: list[float] = []
        self._start = 0.0

    def _on_rollout_start(self) -> None:
        self._start = time.perf_counter()

    def _on_rollout_end(self) -> None:
        elapsed = time.perf_counter() - self._start
        self.rollouts += 1
        if self.rollouts > self.warmup_rollouts:
            self.rollout_seconds.append(elapsed)

    def _on_step(self) -> bool:
        return True


def vec_env_class(kind: str, args: argparse.Namespace) -> tuple[type[VecEnv], dict[str, Any]]:
    if kind == "subproc":
        return SubprocVecEnv, {"start_method": args.subproc_start_method}
    if kind == "dummy":
        return DummyVecEnv, {}
    if kind == "vecaccel" or kind.startswith("vecaccel-"):
        backend = kind.partition("-")[2] or args.backend
        options: dict[str, Any] = {"backend": backend}
        if args.num_workers is not None:
            options["num_workers"] = args.num_workers
        if args.context is not None:
            options["context"] = args.context
        return VecAccelEnv, options
    raise ValueError(f"unknown vec env {kind!r}; choose from {', '.join(VEC_ENVS)}")


def build(workload: str, kind: str, args: argparse.Namespace) -> tuple[VecEnv, str]:
    cls, kwargs = vec_env_class(kind, args)
    if workload == "pong":
        venv = make_atari_env(
            "PongNoFrameskip-v4",
            n_envs=args.n_envs,
            seed=args.seed,
            vec_env_cls=cls,
            vec_env_kwargs=kwargs,
        )
        return VecFrameStack(venv, n_stack=4), "CnnPolicy"
    if workload == "cartpole":
        venv = make_vec_env(
            "CartPole-v1",
            n_envs=args.n_envs,
            seed=args.seed,
            vec_env_cls=cls,
            vec_env_kwargs=kwargs,
        )
        return venv, "MlpPolicy"
    raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")


class TimedUpdates:
    """PPO updates with the clock around them: a subclass sets ``model``, ``timer`` (the
    callback), ``steps_per_update``, ``learn_seconds`` (a list) and ``_started`` (False)."""

    def run(self, updates: int, timed: bool = True) -> None:
        """``updates`` more PPO updates (rollout + training), the clock around them if timed."""
        start = time.perf_counter()
        self.model.learn(
            total_timesteps=updates * self.steps_per_update,
            callback=self.timer,
            reset_num_timesteps=not self._started,
        )
        self._started = True
        if timed:
            self.learn_seconds.append(time.perf_counter() - start)


class Config(TimedUpdates):
    """One configuration's vec env and PPO model, timed update by update."""

    def __init__(self, workload: str, kind: str, args: argparse.Namespace) -> None:
        self.record: dict[str, Any] = {"workload": workload, "vec_env": kind, "n_envs": args.n_envs}
        if kind == "vecaccel":
            self.record["vec_env"] = f"vecaccel-{args.backend}"
        self.venv, policy = build(workload, kind, args)
        try:
            self.model = PPO(
                policy,
                self.venv,
                n_steps=args.n_steps,
                n_epochs=args.n_epochs,
                batch_size=args.batch_size,
                seed=args.seed,
                device=args.device,
                verbose=0,
            )
        except BaseException:
            self.venv.close()
            raise
        self.steps_per_update = args.n_steps * args.n_envs
        self.timer = RolloutTimer(args.warmup_updates)
        self.learn_seconds: list[float] = []
        self._started = False

    def close(self) -> None:
        self.venv.close()

    def result(self) -> dict[str, Any]:
        rollouts = self.timer.rollout_seconds
        rollout_seconds = sum(rollouts)
        learn_seconds = sum(self.learn_seconds)
        timed_steps = len(rollouts) * self.steps_per_update
        return {
            **self.record,
            "updates": len(rollouts),
            "steps": timed_steps,
            "rollout_seconds": round(rollout_seconds, 3),
            "rollout_sps": round(timed_steps / rollout_seconds, 1),
            "rollout_sps_per_update": [round(self.steps_per_update / s, 1) for s in rollouts],
            "learn_seconds": round(learn_seconds, 3),
            "learn_sps": round(timed_steps / learn_seconds, 1),
            "rollout_share": round(rollout_seconds / learn_seconds, 3),
        }


def measure(workload: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration: warm-up updates, then ``args.updates`` timed ones."""
    config = Config(workload, kind, args)
    try:
        if args.warmup_updates:
            config.run(args.warmup_updates, timed=False)
        config.run(args.updates)
    finally:
        config.close()
    return config.result()


def measure_interleaved(workload: str, kinds: list[str], args: argparse.Namespace) -> list[dict]:
    """Every configuration built at once and updated in turn, one PPO update each, the order
    rotating from update to update: a change in the machine's load reaches all of them alike,
    and update ``u`` of one configuration can be paired with update ``u`` of another."""
    configs: list[Config] = []
    try:
        for kind in kinds:
            print(f"{workload} / {kind}: building ...", file=sys.stderr)
            configs.append(Config(workload, kind, args))
        for config in configs:
            if args.warmup_updates:
                config.run(args.warmup_updates, timed=False)
        for update in range(args.updates):
            print(f"{workload}: update {update + 1} of {args.updates} ...", file=sys.stderr)
            shift = update % len(configs)
            for config in configs[shift:] + configs[:shift]:
                config.run(1)
    finally:
        for config in configs:
            config.close()
    records = [config.result() for config in configs]
    add_paired_ratios(records)
    return records


def add_paired_ratios(records: list[dict[str, Any]]) -> None:
    """``paired_x_PEER``: the median over updates of this config's rollout rate in update ``u``
    divided by the peer's in the same update (interleaved runs only)."""
    by_kind = {r["vec_env"]: r for r in records}
    for record in records:
        for peer in ("subproc", "dummy"):
            base = by_kind.get(peer)
            if base is None:
                continue
            ratios = [
                mine / theirs
                for mine, theirs in zip(
                    record["rollout_sps_per_update"], base["rollout_sps_per_update"]
                )
            ]
            record[f"paired_x_{peer}"] = [round(r, 3) for r in ratios]
            record[f"paired_x_{peer}_median"] = round(statistics.median(ratios), 3)


def add_ratios(records: list[dict[str, Any]]) -> None:
    """``x subproc``/``x dummy``: rollout-phase speed relative to SB3's own vec envs."""
    by_key = {(r["workload"], r["vec_env"]): r for r in records}
    for record in records:
        for peer in ("subproc", "dummy"):
            base = by_key.get((record["workload"], peer))
            if base is not None:
                record[f"rollout_x_{peer}"] = round(record["rollout_sps"] / base["rollout_sps"], 2)
                record[f"learn_x_{peer}"] = round(record["learn_sps"] / base["learn_sps"], 2)


def pool_rounds(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per configuration from its runs in every round: steps and seconds summed,
    each round's rollout rate and ratios kept beside them."""
    if len(rounds) == 1:
        return rounds[0]
    pooled: dict[str, dict[str, Any]] = {}
    for runs in rounds:
        for run in runs:
            record = pooled.get(run["vec_env"])
            if record is None:
                record = pooled[run["vec_env"]] = {
                    **{k: run[k] for k in ("workload", "vec_env", "n_envs")},
                    "updates": 0,
                    "steps": 0,
                    "rollout_seconds": 0.0,
                    "learn_seconds": 0.0,
                    "rollout_sps_per_update": [],
                    "rounds": [],
                }
            for key in ("updates", "steps", "rollout_seconds", "learn_seconds"):
                record[key] += run[key]
            record["rollout_sps_per_update"] += run["rollout_sps_per_update"]
            record["rounds"].append(
                {
                    key: run[key]
                    for key in ("rollout_sps", "rollout_x_subproc", "rollout_x_dummy")
                    if key in run
                }
            )
    records = [pooled[kind] for kind in (run["vec_env"] for run in rounds[0])]
    for record in records:
        record["rollout_sps"] = round(record["steps"] / record["rollout_seconds"], 1)
        record["learn_sps"] = round(record["steps"] / record["learn_seconds"], 1)
        record["rollout_share"] = round(record["rollout_seconds"] / record["learn_seconds"], 3)
        record["rollout_seconds"] = round(record["rollout_seconds"], 3)
        record["learn_seconds"] = round(record["learn_seconds"], 3)
    return records


def format_table(records: list[dict[str, Any]]) -> str:
    header = (
        "| workload | vec env | envs | timed updates | rollout steps/s | x subproc | x dummy "
        "| learn steps/s | learn x subproc | rollout share |"
    )
    lines = [header, "| " + " | ".join(["---"] * 10) + " |"]
    for r in records:
        lines.append(
            f"| {r['workload']} | {r['vec_env']} | {r['n_envs']} | {r['updates']} "
            f"| {r['rollout_sps']:.0f} | {r.get('rollout_x_subproc', float('nan')):.2f} "
            f"| {r.get('rollout_x_dummy', float('nan')):.2f} | {r['learn_sps']:.0f} "
            f"| {r.get('learn_x_subproc', float('nan')):.2f} | {r['rollout_share']:.0%} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="pong,cartpole")
    parser.add_argument(
        "--vec-envs",
        default=",".join(VEC_ENVS),
        help="subproc, dummy, vecaccel (with --backend) or vecaccel-BACKEND, comma-separated",
    )
    parser.add_argument("--updates", type=int, default=5, help="timed PPO updates per config")
    parser.add_argument("--warmup-updates", type=int, default=1, help="untimed updates first")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every configuration this many times, in alternating order (forward, then "
        "reversed...), so that drifts in the machine's load reach all of them alike; the "
        "table pools the rounds and the JSON keeps each round's rates and ratios",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="build every configuration first, then run their timed updates in turn (one "
        "update each, the order rotating), so that all of them see the same moments of the "
        "machine's load; the JSON adds each update's paired ratio and their median",
    )
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--n-steps", type=int, default=128)
    parser.add_argument("--n-epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--backend", default="shm", help="vecaccel backend")
    parser.add_argument("--num-workers", type=int, default=None, help="vecaccel worker count")
    parser.add_argument("--context", default=None, help="vecaccel start method")
    parser.add_argument(
        "--subproc-start-method", default=None, help="SubprocVecEnv start method (SB3 default)"
    )
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json",
        default=None,
        help="write every record to this JSON file (default: each workload's records to "
        "benchmarks/results/sb3_rollout_WORKLOAD.json)",
    )
    args = parser.parse_args(argv)
    if args.updates < 1:
        parser.error("--updates must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.interleave and args.rounds > 1:
        parser.error("--interleave pairs updates within one round: leave --rounds at 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    records = []
    for workload in args.workloads.split(","):
        kinds = args.vec_envs.split(",")
        if args.interleave:
            records.extend(measure_interleaved(workload, kinds, args))
            continue
        rounds: list[list[dict[str, Any]]] = []
        for round_index in range(args.rounds):
            order = kinds if round_index % 2 == 0 else kinds[::-1]
            runs = []
            for kind in order:
                print(f"{workload} / {kind} (round {round_index + 1}) ...", file=sys.stderr)
                runs.append(measure(workload, kind, args))
            add_ratios(runs)
            rounds.append(runs)
        records.extend(pool_rounds(rounds))
    add_ratios(records)
    print(format_table(records))
    info = machine_info()
    print(
        f"\n{info['usable_cpus']} usable CPUs, load average {info['load_average']}, "
        f"torch threads {torch.get_num_threads()}; median rollout steps/s per update: "
        + ", ".join(
            f"{r['workload']}/{r['vec_env']} {statistics.median(r['rollout_sps_per_update']):.0f}"
            for r in records
        )
    )
    paired = [
        f"{r['workload']}/{r['vec_env']} {r['paired_x_subproc_median']:.2f}"
        for r in records
        if "paired_x_subproc_median" in r and r["vec_env"] != "subproc"
    ]
    if paired:
        print("median paired rollout ratio against subproc: " + ", ".join(paired))
    if args.json:
        outputs = {args.json: records}
    else:
        outputs = {
            os.path.join(RESULTS, f"sb3_rollout_{workload}.json"): [
                r for r in records if r["workload"] == workload
            ]
            for workload in args.workloads.split(",")
        }
    for path, written in outputs.items():
        run_record.write(
            path,
            written,
            torch_threads=torch.get_num_threads(),
            options={k: v for k, v in vars(args).items() if k != "json"},
        )
        print(f"wrote {os.path.abspath(path)}")
    return 0


# The guard matters: SubprocVecEnv's default start method (forkserver) re-imports this file.
if __name__ == "__main__":
    raise SystemExit(main())
