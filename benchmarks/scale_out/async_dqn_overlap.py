"""Async DQN on CartPole: does sampling overlap optimisation? One core each.

Four measurements, each with one torch thread per process, the optimiser pinned to one CPU and
the collector process to another (when the machine has two):

1. **standalone sampling**: the async collector process alone (acting with the Q-network, stepping
   ``num_envs`` serial envs, handing chunks of steps over to the optimiser, which adds them to
   its replay buffer), no updates due;
2. **standalone updates**: ``update`` in a loop on a filled buffer, nothing else running;
3. **co-run control**: 1 and 2 at the same time, sharing nothing (the update loop has its own
   buffer): what the machine itself allows two busy processes (shared caches, memory, clock,
   other tenants), the ceiling for 4; and the update loop while a pure-Python busy loop (no
   memory traffic, no syscalls) runs on the sampler's CPU, which shows whether the two CPUs
   slow each other down by merely being busy (as SMT siblings or an overcommitted host do);
4. **async**: both together, with the replay ratio set to the *balanced* value
   ``update_rate × batch / sampling_rate`` of the standalone rates, so neither side should have
   to wait if the overlap is perfect. Reported: each rate as a fraction of its standalone rate,
   and the replay ratio measured against the setting.

The 1-minute load average is recorded before and after: on a shared machine other jobs take
cycles from both sides.

Run (about a minute)::

    python benchmarks/scale_out/async_dqn_overlap.py

Results go to ``benchmarks/results/async_dqn_overlap.json`` with the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vecaccel.bench import RunRecord, command_line
from vecaccel.trainers.algos.dqn import DQN
from vecaccel.trainers.envs.make import make_env_for_training
from vecaccel.trainers.runners.asynchronous.runner import AsyncRunner, AsyncStats

RESULTS = Path(__file__).resolve().parent.parent / "results"


def _agent(args: argparse.Namespace, **overrides: Any) -> DQN:
    config: dict[str, Any] = dict(
        preset="cartpole",
        num_envs=args.num_envs,
        backend="serial",
        batch_size=args.batch_size,
        progress=False,
        tensorboard=False,
        torch_threads=1,
        log_every_steps=10**9,
        seed=args.seed,
    )
    config.update(overrides)
    agent = DQN(env=None, env_id="CartPole-v1", **config)
    AsyncRunner(agent)  # gives the agent its networks, for the env its sampler will step
    return agent


def _run_async(agent: DQN, total_timesteps: int, **options: Any) -> AsyncStats:
    """``AsyncRunner(agent).run(total_timesteps, **options)``; the stats it measured."""
    runner = AsyncRunner(agent)
    runner.run(total_timesteps, **options)
    assert runner.stats is not None
    return runner.stats


def _filled_agent(args: argparse.Namespace) -> DQN:
    """An agent with its own (not shared) buffer of 5,000 random CartPole transitions."""
    agent = _agent(args)
    envs = make_env_for_training("CartPole-v1", args.num_envs, backend="serial", seed=args.seed)
    agent.envs = envs
    agent.buffer = agent.make_buffer(args.num_envs)
    obs, _ = envs.reset(seed=args.seed)
    for _ in range(5_000 // args.num_envs):
        actions = envs.action_space.sample()
        next_obs, reward, terminated, truncated, infos = envs.step(actions)
        agent.buffer.add(obs, actions, reward, terminated, truncated, infos.get("final_obs"))
        obs = next_obs
    envs.close()
    for _ in range(20):  # warm-up
        agent.update(agent.buffer.sample(args.batch_size))
    return agent


def _update_loop(agent: DQN, batch_size: int, running: Any) -> float:
    """Updates per second of ``update`` while ``running()`` holds."""
    updates, start = 0, time.perf_counter()
    while running():
        agent.update(agent.buffer.sample(batch_size))
        updates += 1
    return updates / (time.perf_counter() - start)


def standalone_update_rate(args: argparse.Namespace) -> float:
    """Updates per second of ``update`` on a filled buffer, nothing else running."""
    agent = _filled_agent(args)
    start = time.perf_counter()
    return _update_loop(agent, args.batch_size, lambda: time.perf_counter() - start < args.seconds)


def _busy_loop(cpu: int, stop: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    count = 0
    while not stop.is_set():
        for _ in range(100_000):
            count += 1


def busy_neighbour_update_rate(args: argparse.Namespace, cpu: int) -> float:
    """Updates per second of ``update`` while a busy loop runs on ``cpu``."""
    import multiprocessing

    agent = _filled_agent(args)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    process = ctx.Process(target=_busy_loop, args=(cpu, stop))
    process.start()
    try:
        time.sleep(1.0)  # the busy loop is running
        start = time.perf_counter()
        return _update_loop(
            agent, args.batch_size, lambda: time.perf_counter() - start < args.seconds
        )
    finally:
        stop.set()
        process.join()


def corun_rates(args: argparse.Namespace, sampler_cpu: int) -> tuple[float, float]:
    """The control: the standalone sampler and update loop at the same time, sharing nothing.

    The sampler's optimiser side (it only polls, no update is ever due) runs in a thread here,
    polling every 5 ms; the update loop runs while the sampler steps.
    """
    updater = _filled_agent(args)
    sampler_agent = _agent(args, learning_starts=10**9)
    result: dict[str, Any] = {}

    def sample() -> None:
        result["stats"] = _run_async(
            sampler_agent,
            args.sample_steps,
            collector_affinity={sampler_cpu},
            poll_interval=0.005,
        )

    thread = threading.Thread(target=sample)
    thread.start()
    while thread.is_alive() and sampler_agent.global_step == 0:  # the sampler starts up
        time.sleep(0.001)
    update_rate = _update_loop(updater, args.batch_size, thread.is_alive)
    thread.join()
    return result["stats"].sampling_rate, update_rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=6.0, help="standalone update timing")
    parser.add_argument("--sample-steps", type=int, default=60_000)
    parser.add_argument("--async-steps", type=int, default=120_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-lead", type=int, default=0, help="async_max_lead (0: the default)")
    parser.add_argument("--weight-sync-period", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "async_dqn_overlap.json")
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    torch.set_num_threads(1)
    cpus = sorted(os.sched_getaffinity(0))
    optimiser_cpu, sampler_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (cpus[0], cpus[0])
    os.sched_setaffinity(0, {optimiser_cpu})

    # 1. the sampler alone: no update ever falls due
    agent = _agent(args, learning_starts=10**9)
    alone = _run_async(agent, args.sample_steps, collector_affinity={sampler_cpu})
    sampling_rate = alone.sampling_rate
    print(f"standalone sampling: {sampling_rate:.0f} env steps/s", file=sys.stderr)

    # 2. updates alone
    update_rate = standalone_update_rate(args)
    print(f"standalone updates: {update_rate:.1f} updates/s", file=sys.stderr)

    # 3. the control: both loops at once, sharing nothing
    corun_sampling, corun_updates = corun_rates(args, sampler_cpu)
    print(
        f"co-run control: {corun_sampling:.0f} env steps/s ({corun_sampling / sampling_rate:.2f}x), "
        f"{corun_updates:.1f} updates/s ({corun_updates / update_rate:.2f}x)",
        file=sys.stderr,
    )

    busy_neighbour_updates = busy_neighbour_update_rate(args, sampler_cpu)
    print(
        f"updates with a busy loop on the other CPU: {busy_neighbour_updates:.1f} updates/s "
        f"({busy_neighbour_updates / update_rate:.2f}x)",
        file=sys.stderr,
    )

    # 4. both, at the replay ratio that balances the standalone rates
    ratio = update_rate * args.batch_size / sampling_rate
    agent = _agent(
        args,
        replay_ratio=ratio,
        learning_starts=1_000,
        async_max_lead=args.max_lead,
    )
    both = _run_async(
        agent,
        args.async_steps,
        collector_affinity={sampler_cpu},
        weight_sync_period=args.weight_sync_period,
    )
    returns = [r for _, r, _ in agent.episode_log]
    settings = {
        "num_envs": args.num_envs,
        "batch_size": args.batch_size,
        "async_max_lead": args.max_lead,
        "async_weight_sync_period": args.weight_sync_period,
        "optimiser_cpu": optimiser_cpu,
        "sampler_cpu": sampler_cpu,
    }
    result = {
        "standalone_sampling_steps_per_s": round(sampling_rate, 1),
        "standalone_updates_per_s": round(update_rate, 2),
        "corun_control_sampling_steps_per_s": round(corun_sampling, 1),
        "corun_control_updates_per_s": round(corun_updates, 2),
        "corun_control_sampling_fraction": round(corun_sampling / sampling_rate, 3),
        "corun_control_update_fraction": round(corun_updates / update_rate, 3),
        "busy_neighbour_updates_per_s": round(busy_neighbour_updates, 2),
        "busy_neighbour_update_fraction": round(busy_neighbour_updates / update_rate, 3),
        "replay_ratio_setting": round(ratio, 3),
        "async_sampling_steps_per_s": round(both.sampling_rate, 1),
        "async_updates_per_s": round(both.update_rate, 2),
        "sampling_fraction_of_standalone": round(both.sampling_rate / sampling_rate, 3),
        "update_fraction_of_standalone": round(both.update_rate / update_rate, 3),
        "replay_ratio_measured": round(both.replay_ratio, 3),
        "optimizer_wait_fraction": round(both.optimizer_wait_fraction, 3),
        "sampler_wait_fraction": round(both.sampler_wait_fraction, 3),
        "mean_policy_lag_updates": round(both.mean_policy_lag, 2),
        "async_env_steps": both.env_steps,
        "async_seconds": round(both.seconds, 2),
        "mean_return_last_10_episodes": float(np.mean(returns[-10:])) if returns else None,
    }
    run_record.write(args.out, [result], **settings)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
