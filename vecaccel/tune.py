"""``vecaccel tune``: try backends and their settings on an env for a few seconds each, keep the best.

PufferLib's autotuner varies workers and batch sizes; this one also chooses among backends
(``serial``, ``shm``, ``hybrid``, ``async``, ``action_server`` with and without alternation).
It also measures what ``backend="auto"`` would build: the same probe of one env's step cost
(:func:`vecaccel.probe.probe_step_cost`) and the same rule (:func:`vecaccel.probe.choose_backend`),
so its line shows how close the automatic choice comes to the best one.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import vecaccel
from vecaccel import probe
from vecaccel.make import _env_fns
from vecaccel.worker import usable_cpus

__all__ = ["Trial", "candidate_configs", "measure", "autotune", "format_call"]


@dataclass
class Trial:
    """One configuration and what it measured."""

    backend: str
    num_envs: int
    options: dict[str, Any] = field(default_factory=dict)
    steps_per_s: float = 0.0
    error: str | None = None
    auto: bool = False
    """Whether this is the configuration ``backend="auto"`` chooses (``reason`` says why)."""
    reason: str = ""

    @property
    def label(self) -> str:
        """The backend's name, as ``auto->shm`` for the automatic choice."""
        return f"auto->{self.backend}" if self.auto else self.backend

    def call(self, env: str) -> str:
        return format_call(env, self.num_envs, self.backend, self.options)


def format_call(env: str, num_envs: int, backend: str, options: dict[str, Any]) -> str:
    """The ``make_vec`` call that reproduces a configuration.

    Example:
        >>> format_call("CartPole-v1", 8, "shm", {"num_workers": 2})
        "vecaccel.make_vec('CartPole-v1', 8, backend='shm', num_workers=2)"
    """
    extra = "".join(f", {key}={value!r}" for key, value in options.items())
    return f"vecaccel.make_vec({env!r}, {num_envs}, backend={backend!r}{extra})"


def candidate_configs(
    num_envs_options: Sequence[int],
    backends: Iterable[str],
    cpus: int | None = None,
    step_s: float | None = None,
) -> list[Trial]:
    """The configurations to try: workers, envs per worker, batch sizes and alternation.

    ``"auto"`` stands for the configuration :func:`vecaccel.probe.choose_backend` picks for
    one env's step cost ``step_s`` (which it then requires).

    Example:
        >>> [t.label for t in candidate_configs([64], ["auto", "shm"], cpus=2, step_s=1e-3)]
        ['auto->shm', 'shm', 'shm', 'shm']
    """
    cpus = cpus or usable_cpus()
    workers = sorted({1, max(1, cpus // 2), cpus, 2 * cpus})
    trials: list[Trial] = []
    for backend, n in itertools.product(backends, num_envs_options):
        if backend == "auto":
            if step_s is None:
                raise ValueError("the auto candidate needs the step cost (step_s)")
            choice = probe.choose_backend(step_s, n, cpus)
            trials.append(Trial(choice.backend, n, choice.options, auto=True, reason=choice.reason))
        elif backend == "serial":
            trials.append(Trial("serial", n))
        elif backend == "shm":
            trials.extend(Trial("shm", n, {"num_workers": w}) for w in workers if w <= n)
        elif backend == "hybrid":  # the caller takes one share; workers for the other cores
            trials.extend(
                Trial("hybrid", n, {"num_workers": w}) for w in workers if w < n and w < cpus
            )
        elif backend == "async":
            for w, divisor in itertools.product(workers, (2, 4)):
                batch = n // divisor
                if w <= n and batch >= 1 and -(-n // w) <= 127:
                    trials.append(Trial("async", n, {"num_workers": w, "batch_size": batch}))
        elif backend == "action_server":
            for alternating in (False, True):
                if alternating and n % 2:
                    continue
                trials.append(Trial("action_server", n, {"alternating": alternating}))
        else:
            trials.append(Trial(backend, n))
    return trials


def measure(
    env_fns: Sequence[Callable], trial: Trial, seconds: float, policy_s: float = 0.0
) -> float:
    """Steps per second of ``trial``, with random actions and ``policy_s`` of simulated
    inference latency per step (a sleep, as a GPU forward costs the CPU little)."""
    if trial.backend != "action_server":
        return _measure(env_fns, trial, seconds, policy_s)
    import torch  # the action server's own dependency

    # no policy runs here (its latency is a sleep): torch's threads would only take the cores
    # the workers step on, and it would warn so
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(env_fns, trial, seconds, policy_s)
    finally:
        torch.set_num_threads(threads)


def _measure(env_fns: Sequence[Callable], trial: Trial, seconds: float, policy_s: float) -> float:
    envs = vecaccel.make_vec(
        list(env_fns[: trial.num_envs]), backend=trial.backend, **trial.options
    )
    try:
        obs, _ = envs.reset(seed=0)
        batch_space = envs.action_space
        batch_space.seed(0)
        samples = [batch_space.sample() for _ in range(16)]
        tensors = trial.backend == "action_server"
        if tensors:
            import torch

            samples = [torch.as_tensor(np.asarray(s)) for s in samples]
        batch = len(samples[0])
        for k in range(5):
            envs.step(samples[k % 16])
        steps, k, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            if policy_s:
                time.sleep(policy_s)
            envs.step(samples[k % 16])
            steps += batch
            k += 1
        return steps / (time.perf_counter() - start)
    finally:
        envs.close()


def autotune(
    env: str | Callable,
    num_envs_options: Sequence[int] = (8, 16, 32),
    backends: Iterable[str] | None = None,
    seconds: float = 2.0,
    policy_ms: float = 0.0,
    report: Callable[[Trial], None] | None = None,
) -> list[Trial]:
    """Measure every candidate configuration; return the trials, best first.

    Raises:
        ValueError: if ``seconds`` is not positive, ``policy_ms`` is negative, or a backend
            is not registered.

    Example:
        >>> trials = autotune("CartPole-v1", [2], backends=["serial"], seconds=0.05)
        >>> trials[0].backend, trials[0].steps_per_s > 0
        ('serial', True)
    """
    if not seconds > 0 or not policy_ms >= 0:
        raise ValueError(
            f"seconds must be positive and policy_ms not negative, got {seconds}, {policy_ms}"
        )
    registered = vecaccel.list_backends()
    if backends is None:
        defaults = ("auto", "serial", "shm", "hybrid", "async", "action_server")
        backends = [b for b in defaults if b in registered]
    backends = list(backends)
    unknown = [b for b in backends if b not in registered]
    if unknown:
        raise ValueError(f"unknown backends {unknown}; registered: {sorted(registered)}")
    env_fns = (
        _env_fns(env, max(num_envs_options), None)
        if not callable(env)
        else [env] * max(num_envs_options)
    )
    # the probe backend="auto" runs, once for every env count
    step_s = probe.probe_step_cost(env_fns[0]).step_s if "auto" in backends else None
    trials = candidate_configs(num_envs_options, backends, step_s=step_s)
    for trial in trials:
        try:
            trial.steps_per_s = measure(env_fns, trial, seconds, policy_ms / 1e3)
        except Exception as exc:  # noqa: BLE001 - a configuration that cannot run is reported, not fatal
            trial.error = f"{type(exc).__name__}: {exc}"
        if report is not None:
            report(trial)
    return sorted(trials, key=lambda t: -t.steps_per_s)


def main(args: Any) -> int:
    """The ``vecaccel tune`` command."""
    import gymnasium as gym

    try:
        num_envs = [int(x) for x in str(args.num_envs).split(",")]
    except ValueError:
        print(f"error: --num-envs takes integers, got {args.num_envs!r}", file=sys.stderr)
        return 2
    if min(num_envs) < 1:
        print(f"error: --num-envs must be positive, got {args.num_envs}", file=sys.stderr)
        return 2
    # as bench does: a zero budget measures nothing and a negative latency fails every trial
    if not args.seconds > 0:
        print(f"error: --seconds must be positive, got {args.seconds}", file=sys.stderr)
        return 2
    if not args.policy_ms >= 0:
        print(f"error: --policy-ms must not be negative, got {args.policy_ms}", file=sys.stderr)
        return 2
    backends = args.backends.split(",") if args.backends else None

    def report(trial: Trial) -> None:
        options = ", ".join(f"{k}={v}" for k, v in trial.options.items())
        result = (
            f"{trial.steps_per_s:>10.0f}" if trial.error is None else f"  failed: {trial.error}"
        )
        print(f"{trial.label:<14} n={trial.num_envs:<4} {options:<34} {result}", flush=True)

    try:
        trials = autotune(args.env, num_envs, backends, args.seconds, args.policy_ms, report)
    except (ValueError, gym.error.Error) as exc:  # an unknown backend or env
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ran = [trial for trial in trials if trial.error is None]
    if not ran:
        print(
            "error: no configuration ran"
            + (" (none to try for these env counts and backends)" if not trials else ""),
            file=sys.stderr,
        )
        return 1
    best = ran[0]
    print()
    for choice in (trial for trial in ran if trial.auto):
        others = [t for t in ran if t.num_envs == choice.num_envs and not t.auto]
        share = f", {choice.steps_per_s / others[0].steps_per_s:.2f} of the best" if others else ""
        print(
            f"auto with {choice.num_envs} envs: {choice.backend} {choice.options}, "
            f"{choice.steps_per_s:.0f} steps/s{share} ({choice.reason})"
        )
    print(
        f"best: {best.backend} with {best.num_envs} envs {best.options}: "
        f"{best.steps_per_s:.0f} steps/s"
    )
    print(f"reproduce with: {best.call(args.env)}")
    return 0


def add_parser(subparsers: Any) -> None:
    """Add ``vecaccel tune`` to the command line."""
    parser = subparsers.add_parser(
        "tune", help="find the fastest backend and settings for an env", description=__doc__
    )
    parser.add_argument("env", help="a Gymnasium id, e.g. CartPole-v1 or ALE/Pong-v5")
    parser.add_argument("--num-envs", default="8,16,32", help="comma-separated env counts to try")
    parser.add_argument("--backends", default=None, help="comma-separated backends (default: all)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per configuration")
    parser.add_argument(
        "--policy-ms",
        type=float,
        default=0.0,
        help="simulated policy latency per step (lets alternation show what it overlaps)",
    )
    parser.set_defaults(handler=main)
