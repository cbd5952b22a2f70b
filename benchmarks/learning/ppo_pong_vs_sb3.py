"""End-to-end PPO training speed on Pong: vecaccel's PPO against Stable-Baselines3's, side by side.

The workload: ``PongNoFrameskip-v4`` with the standard Atari set-up, 16 envs, horizon
128, 4 epochs over minibatches of 256 (SB3 ``batch_size=256``; vecaccel ``num_minibatches=8``
of the 2,048-sample batch), the Nature CNN shared by policy and value (SB3 ``CnnPolicy``,
vecaccel ``ActorCritic``), Adam at 2.5e-4, clip 0.1, entropy 0.01, value 0.5.

Configurations (``--configs``):

| name | what |
| --- | --- |
| ``sb3-subproc`` | SB3 PPO, ``make_atari_env(..., vec_env_cls=SubprocVecEnv)`` + ``VecFrameStack(4)`` |
| ``sb3-dummy`` | the same on ``DummyVecEnv`` |
| ``fp32-nchw`` | vecaccel PPO, ``--preset atari``, fp32 with NCHW convolutions |
| ``fp32-cl`` | the same, channels_last (NHWC) convolutions |
| ``bf16-nchw`` | bfloat16 autocast in the CNN torso, NCHW |
| ``bf16-cl`` | bfloat16 autocast and channels_last |
| ``async-bf16-cl`` | ``bf16-cl`` with ``--async``: a rollout process samples the next batch while
  this process trains on the last one (policy lag 1) |

Each configuration runs in a fresh Python process (so one's threads, allocator and caches do not
carry over to the next), builds its envs, runs ``--warmup-updates`` PPO updates untimed and then
``--updates`` timed ones; training steps per second = env steps of the timed updates / their
wall-clock seconds (collecting and optimising both, start-up never), and steps per CPU-second
(the CPU time of the process and all its children, env workers included, over the same
window: on a machine shared with other jobs it varies much less than the wall-clock rate). With ``--repeat R`` the whole
list runs R times, interleaved, and the median is reported, so every configuration sees the
same drift in the machine's load. ``x sb3-...`` divides by SB3's rate measured in the same run.

Usage::

    python benchmarks/learning/ppo_pong_vs_sb3.py                    # 1 warm-up + 3 timed updates each
    python benchmarks/learning/ppo_pong_vs_sb3.py --configs sb3-dummy,bf16-cl --updates 2 --repeat 2 \\
        --json trial.json

Torch threads (``--torch-threads``, default 0): 0 applies vecaccel's automatic rule to *both*
libraries, one thread per core the env workers leave free and at least one (1 on 2 cores);
torch's spinning OpenMP threads otherwise compete with the env processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")

ENV_ID = "PongNoFrameskip-v4"
SB3_CONFIGS = ("sb3-subproc", "sb3-dummy")
VECACCEL_CONFIGS: dict[str, dict[str, Any]] = {
    "fp32-nchw": {"bf16": "off", "channels_last": False},
    "fp32-cl": {"bf16": "off", "channels_last": True},
    "bf16-nchw": {"bf16": "on", "channels_last": False},
    "bf16-cl": {"bf16": "on", "channels_last": True},
    "async-bf16-cl": {"bf16": "on", "channels_last": True, "async": True},
}
CONFIGS = (*SB3_CONFIGS, *VECACCEL_CONFIGS)


def torch_threads(requested: int, num_envs: int) -> int:
    """The thread count both libraries get: ``requested``, or vecaccel's automatic rule."""
    from vecaccel.trainers.services.threads import configure_torch_threads

    return configure_torch_threads(requested, "shm", num_envs)


def cpu_seconds_tree(pid: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` (default: this one) and all its descendants.

    On a machine shared with other jobs the wall-clock rate depends on how much of the CPUs the
    others leave; the CPU time a configuration spends per env step (policy, optimiser and env
    workers together) does not, so both are reported. Linux only (``/proc``); elsewhere NaN.
    """
    pid = os.getpid() if pid is None else pid
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return float("nan")
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        # after the command name: state ppid ... utime stime cutime cstime (fields 14-17); the
        # reaped children's time (cutime, cstime) keeps a process that ended inside the window
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = sum(int(value) for value in fields[11:15]) / tick
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += times.get(current, 0.0)
        stack.extend(children.get(current, []))
    return total


def _stamp() -> tuple[float, float]:
    return time.perf_counter(), cpu_seconds_tree()


def _rates(steps: int, start: tuple[float, float], end: tuple[float, float]) -> dict[str, Any]:
    seconds, cpu = end[0] - start[0], end[1] - start[1]
    return {
        "steps": steps,
        "seconds": round(seconds, 3),
        "sps": round(steps / seconds, 1),
        "cpu_seconds": round(cpu, 2),
        "steps_per_cpu_second": round(steps / cpu, 1) if cpu > 0 else None,
    }


def measure_sb3(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """SB3 PPO: a callback stamps the start of every rollout; the first timed one starts the clock."""
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    gym.register_envs(ale_py)
    threads = torch_threads(args.torch_threads, args.num_envs)

    class Stamps(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rollout_starts: list[tuple[float, float]] = []

        def _on_rollout_start(self) -> None:
            self.rollout_starts.append(_stamp())

        def _on_step(self) -> bool:
            return True

    vec_env_cls = SubprocVecEnv if name == "sb3-subproc" else DummyVecEnv
    # fork, as `vecaccel bench` does: forkserver workers would each import torch afresh
    kwargs = {"start_method": "fork"} if vec_env_cls is SubprocVecEnv else {}
    venv = VecFrameStack(
        make_atari_env(
            ENV_ID,
            n_envs=args.num_envs,
            seed=args.seed,
            vec_env_cls=vec_env_cls,
            vec_env_kwargs=kwargs,
        ),
        n_stack=4,
    )
    try:
        model = PPO(
            "CnnPolicy",
            venv,
            learning_rate=2.5e-4,
            n_steps=args.num_steps,
            batch_size=args.minibatch_size,
            n_epochs=args.epochs,
            clip_range=0.1,
            ent_coef=0.01,
            vf_coef=0.5,
            seed=args.seed,
            device="cpu",
            verbose=0,
        )
        stamps = Stamps()
        steps_per_update = args.num_steps * args.num_envs
        updates = args.warmup_updates + args.updates
        model.learn(total_timesteps=updates * steps_per_update, callback=stamps)
        end = _stamp()
    finally:
        venv.close()
    return {
        "torch_threads": threads,
        "torch_threads_in_force": torch.get_num_threads(),
        **_rates(args.updates * steps_per_update, stamps.rollout_starts[args.warmup_updates], end),
    }


def measure_vecaccel(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """vecaccel PPO through its Python API; every logged update (one per update) is stamped."""
    import torch

    from vecaccel.trainers import PPO
    from vecaccel.trainers.algos.ppo import PRESETS
    from vecaccel.trainers.services.logger import RunLogger

    settings = dict(VECACCEL_CONFIGS[name])
    async_mode = settings.pop("async", False)
    threads = torch_threads(args.torch_threads, args.num_envs)
    batch = args.num_envs * args.num_steps
    config = {
        **PRESETS["atari"],
        "num_envs": args.num_envs,
        "num_steps": args.num_steps,
        "update_epochs": args.epochs,
        "num_minibatches": batch // args.minibatch_size,
        "torch_threads": threads,
        "seed": args.seed,
        "checkpoint_every": 0,
        "log_every_steps": 0,
        **settings,
    }
    config.pop("env_id")
    # the sync and the async runner both log every update through RunLogger.log: stamp there
    stamps: list[tuple[int, tuple[float, float]]] = []
    original_log = RunLogger.log

    def stamped_log(self: Any, step: int, metrics: dict[str, float]) -> None:
        stamps.append((step, _stamp()))
        original_log(self, step, metrics)

    RunLogger.log = stamped_log  # type: ignore[method-assign]
    updates = args.warmup_updates + args.updates
    if async_mode:
        from vecaccel.trainers import AsyncRunner

        agent = PPO(None, env_id=ENV_ID, progress=False, tensorboard=False, **config)
        try:
            AsyncRunner(agent).run(updates * batch)
        finally:
            agent.close()
    else:
        agent = PPO(ENV_ID, progress=False, tensorboard=False, **config)
        try:
            agent.learn(total_timesteps=updates * batch)
        finally:
            agent.close()
    first = next(s for s in stamps if s[0] >= args.warmup_updates * batch)
    last = stamps[-1]
    return {
        "torch_threads": threads,
        "torch_threads_in_force": torch.get_num_threads(),
        "bf16_in_force": bool(agent.model.encoder.bf16),
        "channels_last": bool(agent.model.encoder.channels_last),
        **_rates(last[0] - first[0], first[1], last[1]),
    }


def measure(config: str, **options: Any) -> dict[str, Any]:
    """Measure ``config`` with the command line's ``options`` (in its own process, see
    :func:`run_one`)."""
    args = argparse.Namespace(**options)
    return (measure_sb3 if config in SB3_CONFIGS else measure_vecaccel)(config, args)


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Measure ``name`` in a fresh interpreter; return its record."""
    from vecaccel.bench import ChildRunError, run_in_child

    options = {
        key: getattr(args, key)
        for key in (
            "updates", "warmup_updates", "num_envs", "num_steps", "epochs", "minibatch_size",
            "torch_threads", "seed",
        )
    }  # fmt: skip
    started = time.perf_counter()
    try:
        record = run_in_child(__file__, "measure", {"config": name, **options})
    except ChildRunError as exc:
        tail = str(exc).strip().splitlines()[-5:]
        return {"config": name, "error": " | ".join(tail)}
    record.update(config=name, process_seconds=round(time.perf_counter() - started, 1))
    record["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return record


def summarize(samples: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Medians per configuration, with ratios to SB3's in the same run."""
    rows = []
    for name, records in samples.items():
        good = [r for r in records if "sps" in r]
        row: dict[str, Any] = {"config": name, "samples": [r.get("sps") for r in records]}
        if good:
            row["sps"] = statistics.median(r["sps"] for r in good)
            cpu = [r["steps_per_cpu_second"] for r in good if r.get("steps_per_cpu_second")]
            row["steps_per_cpu_second"] = statistics.median(cpu) if cpu else None
            row["torch_threads"] = good[0]["torch_threads_in_force"]
        else:
            row["error"] = records[0].get("error")
        rows.append(row)
    by_name = {row["config"]: row for row in rows}
    for row in rows:
        for peer in SB3_CONFIGS:
            base = by_name.get(peer)
            if base and "sps" in base and "sps" in row:
                row[f"x_{peer}"] = round(row["sps"] / base["sps"], 2)
                if base.get("steps_per_cpu_second") and row.get("steps_per_cpu_second"):
                    ratio = row["steps_per_cpu_second"] / base["steps_per_cpu_second"]
                    row[f"cpu_x_{peer}"] = round(ratio, 2)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    nan = float("nan")
    lines = [
        "| config | torch threads | training steps/s (median) | samples | x sb3-subproc "
        "| x sb3-dummy | steps per CPU-second | CPU x sb3-subproc | CPU x sb3-dummy |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if "sps" not in row:
            lines.append(f"| {row['config']} | | error: {row.get('error')} | | | | | | |")
            continue
        samples = ", ".join(f"{s:.0f}" if s is not None else "err" for s in row["samples"])
        lines.append(
            f"| {row['config']} | {row['torch_threads']} | {row['sps']:.0f} | {samples} "
            f"| {row.get('x_sb3-subproc', nan):.2f} | {row.get('x_sb3-dummy', nan):.2f} "
            f"| {row.get('steps_per_cpu_second') or nan:.0f} "
            f"| {row.get('cpu_x_sb3-subproc', nan):.2f} | {row.get('cpu_x_sb3-dummy', nan):.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help=", ".join(CONFIGS))
    parser.add_argument("--updates", type=int, default=3, help="timed PPO updates per config")
    parser.add_argument("--warmup-updates", type=int, default=1, help="untimed updates first")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved repeats (median)")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument("--torch-threads", type=int, default=0, help="0: vecaccel's rule, both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "ppo_pong_vs_sb3.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.updates < 1 or args.warmup_updates < 1:
        parser.error("--updates and --warmup-updates must be at least 1")
    if (args.num_envs * args.num_steps) % args.minibatch_size:
        parser.error("--minibatch-size must divide num_envs * num_steps")
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # imported here: the children measure SB3 and vecaccel without vecaccel.bench
    from vecaccel.bench import RunRecord, command_line

    run_record = RunRecord(command_line(argv, __file__))
    names = args.configs.split(",")
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for repeat in range(args.repeat):
        for name in names:
            print(f"[{repeat + 1}/{args.repeat}] {name} ...", file=sys.stderr, flush=True)
            record = run_one(name, args)
            print(f"    {record}", file=sys.stderr, flush=True)
            samples[name].append(record)
    rows = summarize(samples)
    print(format_table(rows))
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average at the end: {load}")
    failed = any("sps" not in r for records in samples.values() for r in records)
    if args.json:
        import torch

        run_record.write(
            args.json,
            rows,
            torch_version=torch.__version__,
            bf16_hardware={
                "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
                "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
            },
            samples=samples,
            options={k: v for k, v in vars(args).items() if k != "json"},
        )
        print(f"wrote {os.path.abspath(args.json)}")
    return 1 if failed else 0


# The guard matters: worker processes started with spawn or forkserver re-import this file.
if __name__ == "__main__":
    raise SystemExit(main())
