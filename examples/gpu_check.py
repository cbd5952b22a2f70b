"""GPU check for the action server: tensors stay on the device, pinned staging and alternation work.

Run on a machine with CUDA:
    python examples/gpu_check.py --env PongNoFrameskip-v4 --num-envs 16 --seconds 20

It asserts (with :func:`vecaccel.testing.action_server.check_action_server`) that observations,
rewards and flags come back on the GPU, that the staging buffers are pinned, that each
alternating half is served in turn, and that each half's trajectory equals a serial replay of the
same actions; then it prints throughput of rollout collection with the Nature-CNN actor-critic
of the trainers on the GPU, with and without alternation. Exits non-zero on CPU-only machines
unless ``--allow-cpu`` is given (then it runs the same checks on the CPU, without pinning).
``benchmarks/gpu/gpu_run.py`` runs the same checks as the first part of its GPU benchmark.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import vecaccel
from vecaccel.bench.policy_loop import policy_steps_per_second
from vecaccel.testing.action_server import check_action_server
from vecaccel.trainers.envs.make import make_env_fn
from vecaccel.trainers.nets.networks import ActorCritic


def main(argv: list[str] | None = None) -> int:
    """Runs the checks, then the throughput with and without alternation; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--allow-cpu", action="store_true")
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        device = "cuda"
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    elif args.allow_cpu:
        device = "cpu"
        # the policy shares the cores with the env workers, and torch's default of one spinning
        # thread per core would starve them: alternation only pays when both sides get cores
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))
        print("no CUDA device: running the checks on the CPU")
    else:
        print("no CUDA device found (use --allow-cpu to run the checks on the CPU)")
        return 2
    factory = make_env_fn(args.env, atari=True, training=False)
    report = check_action_server([factory] * min(args.num_envs, 8), device)
    staged = "pinned staging, " if report["pinned_staging"] else ""
    print(f"correctness: tensors on {device}, {staged}alternating halves exact: OK")
    probe = factory()
    policy = ActorCritic(probe.observation_space, probe.action_space, network="cnn")
    probe.close()
    policy = policy.to(device).eval()
    for alternating in (False, True):
        envs = vecaccel.make_vec(
            [factory] * args.num_envs,
            backend="action_server",
            device=device,
            alternating=alternating,
        )
        try:
            rate = policy_steps_per_second(envs, policy, args.seconds, device=device)
        finally:
            envs.close()
        print(f"{args.env}: {args.num_envs} envs, alternating={alternating}: {rate:.0f} steps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
