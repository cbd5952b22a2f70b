"""GPU check for the action server: tensors stay on the device, pinned staging and alternation work.

Run on a machine with CUDA:
    python examples/gpu_check.py --env PongNoFrameskip-v4 --num-envs 16 --seconds 20

It asserts that observations, rewards and flags come back on the GPU, that the staging buffers
are pinned, that each alternating half is served in turn, and that each half's trajectory equals
a serial replay of the same actions; then it prints throughput of rollout collection with a
Nature-CNN policy on the GPU, with and without alternation. Exits non-zero on CPU-only machines
unless ``--allow-cpu`` is given (then it runs the same checks on the CPU, without pinning).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import vecaccel
from vecaccel.trainers.envs import AtariEnvFactory
from vecaccel.trainers.models import NatureCNN


class Policy(nn.Module):
    """A Nature-CNN torso and a linear head that samples discrete actions."""

    def __init__(self, actions: int) -> None:
        super().__init__()
        self.torso = NatureCNN(4, 84)
        self.head = nn.Linear(512, actions)

    @torch.no_grad()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Samples one action per observation of the ``[B, 4, 84, 84]`` batch."""
        return torch.distributions.Categorical(logits=self.head(self.torso(obs))).sample()


def check_correctness(factory: Callable[[], gym.Env], device: torch.device, n: int) -> None:
    """Asserts device placement, pinned staging and exact alternating halves on ``n`` envs.

    The reference is the ``serial`` backend stepped with the same per-env actions.
    """
    rng = np.random.default_rng(0)
    steps = 30
    actions = rng.integers(0, 6, (n, steps))
    serial = vecaccel.make_vec([factory] * n, backend="serial")
    obs, _ = serial.reset(seed=1)
    expected = [obs]
    for t in range(steps):
        expected.append(serial.step(actions[:, t])[0])
    serial.close()
    expected = np.stack(expected, 1)  # [n, T+1, ...]

    envs = vecaccel.make_vec(
        [factory] * n, backend="action_server", device=str(device), alternating=True
    )
    try:
        obs, infos = envs.reset(seed=1)
        halves = [np.arange(0, n, 2), np.arange(1, n, 2)]
        assert obs.device.type == device.type, obs.device
        if device.type == "cuda":
            # no public attribute says how observations are staged, so the check reads the
            # backend's staging buffers themselves
            staging = envs._staging[0]["obs"]
            assert staging.is_pinned(), "observations are not staged through pinned memory"
        seen = {0: [obs.cpu().numpy()], 1: []}
        used, group = [0, 0], 0
        for _ in range(2 * steps - 1):
            ids = halves[group]
            acts = torch.as_tensor(actions[ids, used[group]], device=device)
            obs, rew, term, trunc, infos = envs.step(acts)
            used[group] += 1
            group = 1 - group
            assert infos["env_id"].tolist() == halves[group].tolist(), "halves not alternating"
            for tensor in (obs, rew, term, trunc):
                assert tensor.device.type == device.type, tensor.device
            seen[group].append(obs.cpu().numpy())
        for g, ids in enumerate(halves):
            got = np.stack(seen[g], 0)
            want = expected[ids].swapaxes(0, 1)[: len(got)]
            np.testing.assert_array_equal(got, want)
    finally:
        envs.close()
    staged = "pinned staging, " if device.type == "cuda" else ""  # nothing is pinned on the CPU
    print(f"correctness: tensors on {device}, {staged}alternating halves exact: OK")


def throughput(
    factory: Callable[[], gym.Env], device: torch.device, n: int, seconds: float, alternating: bool
) -> float:
    """Steps/s of rollout collection with :class:`Policy` on ``device``, after a warm-up."""
    probe = factory()
    policy = Policy(probe.action_space.n).to(device).eval()
    probe.close()
    envs = vecaccel.make_vec(
        [factory] * n, backend="action_server", device=str(device), alternating=alternating
    )
    try:
        obs, _ = envs.reset(seed=0)
        for _ in range(10):
            obs, *_ = envs.step(policy(obs))
        if device.type == "cuda":
            torch.cuda.synchronize()
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            obs, *_ = envs.step(policy(obs))
            steps += obs.shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
        return steps / (time.perf_counter() - start)
    finally:
        envs.close()


def main(argv: list[str] | None = None) -> int:
    """Runs the checks, then the throughput with and without alternation; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--allow-cpu", action="store_true")
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        device = torch.device("cuda")
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    elif args.allow_cpu:
        device = torch.device("cpu")
        # the policy shares the cores with the env workers, and torch's default of one spinning
        # thread per core would starve them: alternation only pays when both sides get cores
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))
        print("no CUDA device: running the checks on the CPU")
    else:
        print("no CUDA device found (use --allow-cpu to run the checks on the CPU)")
        return 2
    factory = AtariEnvFactory(args.env, training=False)
    check_correctness(factory, device, min(args.num_envs, 8))
    for alternating in (False, True):
        rate = throughput(factory, device, args.num_envs, args.seconds, alternating)
        print(f"{args.env}: {args.num_envs} envs, alternating={alternating}: {rate:.0f} steps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
