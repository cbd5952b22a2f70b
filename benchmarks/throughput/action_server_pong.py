"""Rollout collection with a Nature-CNN policy on Pong: the action server against the SB3 way.

Every variant collects steps with the same policy network, torch on one thread in the parent
(so the other core simulates):

* ``sb3_subproc``: SB3's ``SubprocVecEnv`` plus one policy forward per step in the parent;
* ``shm``: vecaccel's lock-step shared-memory backend plus the same forward;
* ``action_server``: torch tensors in and out, all envs per step;
* ``action_server_alternating``: two halves; the policy runs on one while the other simulates.

It also measures the parts alone (a forward over all observations, one lock-step env step)
and prints the ideal speed-up of perfect overlap over a serial loop with no overhead.

Run (writes ``benchmarks/results/action_server_pong.json``)::

    python benchmarks/throughput/action_server_pong.py --seconds 10
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from torch import nn

import vecaccel
from vecaccel.bench import RunRecord, command_line
from vecaccel.trainers.envs.make import make_env_fn
from vecaccel.trainers.nets.networks import NatureCNN

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


class Policy(nn.Module):
    def __init__(self, actions: int) -> None:
        super().__init__()
        self.torso = NatureCNN(4, 84)
        self.head = nn.Linear(512, actions)

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.torso(obs))
        return torch.distributions.Categorical(logits=logits).sample()


def _rate(loop, seconds: float, warmup: int = 10) -> float:
    for _ in range(warmup):
        loop()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += loop()
    return steps / (time.perf_counter() - start)


def run_sb3(factory, policy, n, seconds):
    from stable_baselines3.common.vec_env import SubprocVecEnv

    envs = SubprocVecEnv([factory] * n, start_method="fork")
    try:
        obs = [envs.reset()]

        def loop():
            actions = policy(torch.as_tensor(obs[0])).numpy()
            obs[0], *_ = envs.step(actions)
            return n

        return _rate(loop, seconds)
    finally:
        envs.close()


def run_vecaccel(factory, policy, n, seconds, backend, **options):
    envs = vecaccel.make_vec([factory] * n, backend=backend, **options)
    try:
        obs = [envs.reset(seed=0)[0]]
        tensors = backend == "action_server"
        batch = obs[0].shape[0]

        def loop():
            current = obs[0] if tensors else torch.as_tensor(obs[0])
            actions = policy(current)
            obs[0], *_ = envs.step(actions if tensors else actions.numpy())
            return batch

        return _rate(loop, seconds)
    finally:
        envs.close()


def parts(factory, policy, n, seconds):
    envs = vecaccel.make_vec([factory] * n, backend="shm")
    try:
        obs, _ = envs.reset(seed=0)
        actions = np.zeros(n, dtype=np.int64)
        step_rate = _rate(lambda: (envs.step(actions), n)[1], seconds / 2)
    finally:
        envs.close()
    batch = torch.as_tensor(obs)
    forward_rate = _rate(lambda: (policy(batch), n)[1], seconds / 2)
    return n / step_rate, n / forward_rate  # seconds per lock-step step, per forward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "action_server_pong.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    torch.set_num_threads(args.threads)
    factory = make_env_fn(args.env, atari=True, training=False)
    probe = factory()
    policy = Policy(probe.action_space.n).eval()
    probe.close()
    n = args.num_envs
    step_s, forward_s = parts(factory, policy, n, args.seconds)
    # a lock-step env step keeps every core busy for step_s and the forward one core for
    # forward_s; perfectly overlapped, the same CPU work spreads over all cores
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    overlapped_s = max(forward_s, (forward_s + cores * step_s) / cores)
    ideal = (step_s + forward_s) / overlapped_s
    rows = {"sb3_subproc": run_sb3(factory, policy, n, args.seconds)}
    rows["shm"] = run_vecaccel(factory, policy, n, args.seconds, "shm")
    rows["action_server"] = run_vecaccel(factory, policy, n, args.seconds, "action_server")
    rows["action_server_alternating"] = run_vecaccel(
        factory, policy, n, args.seconds, "action_server", alternating=True
    )
    serial_ideal = n / (step_s + forward_s)
    print(f"{args.env}, {n} envs, Nature-CNN policy, torch threads={args.threads}, {cores} cores")
    print(
        f"parts: one lock-step env step {step_s * 1e3:.2f} ms, one forward {forward_s * 1e3:.2f} ms;"
        f" serial loop with no overhead {serial_ideal:.0f} steps/s;"
        f" perfect overlap on {cores} cores would give {ideal:.2f}x that"
    )
    base = rows["sb3_subproc"]
    print(f"{'variant':<28} {'steps/s':>9} {'vs SB3 way':>11}")
    for name, rate in rows.items():
        print(f"{name:<28} {rate:>9.0f} {rate / base:>10.2f}x")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        results = [
            {"variant": name, "steps_per_s": rate, "vs_sb3": rate / base}
            for name, rate in rows.items()
        ]
        run_record.write(
            args.json,
            results,
            summary={
                "step_ms": step_s * 1e3,
                "forward_ms": forward_s * 1e3,
                "ideal_overlap_gain": ideal,
            },
            args=vars(args),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
