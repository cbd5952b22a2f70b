"""``vecaccel tune``: try backends and their settings on an env for a few seconds each, keep the best.

PufferLib's autotuner varies workers and batch sizes; this one also chooses among backends
(``serial``, ``shm``, ``hybrid``, ``async``, ``action_server`` with and without alternation).
It also measures what ``backend="auto"`` would build: the same probe of one env's step cost
(:func:`vecaccel.backend_choice.probe_step_cost`) and the same rule
(:func:`vecaccel.backend_choice.choose_backend`), so its line shows how close the automatic choice
comes to the best one. Each setting is timed by ``vecaccel bench``'s clock
(:func:`vecaccel.bench.timing.measure`).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import vecaccel
from vecaccel.backend_choice import choose_backend, env_step_cost
from vecaccel.envs.source import EnvSource
from vecaccel.manager import unknown_backend_message
from vecaccel.worker import usable_cpus

if TYPE_CHECKING:
    from vecaccel.cli import Commands

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_NUM_ENVS",
    "DEFAULT_SECONDS",
    "Trial",
    "add_command",
    "autotune",
    "candidate_configs",
    "estimated_seconds",
    "format_call",
    "measure_trial",
]

#: The backends tried when none are named (those registered), ``auto`` for backend="auto"'s pick.
DEFAULT_BACKENDS = ("auto", "serial", "shm", "hybrid", "async", "action_server")
#: The env counts tried when none are named.
DEFAULT_NUM_ENVS = (8, 16, 32)
#: Timed seconds per setting when not told.
DEFAULT_SECONDS = 2.0
#: What one setting costs beside its timed seconds (start, warm-up, close), for the estimate.
_OVERHEAD_S = 0.5


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
    timing: str = ""
    """Where its steps spent their time (``envs.stats().summary()``), once measured."""

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

    ``"auto"`` stands for the configuration :func:`vecaccel.backend_choice.choose_backend` picks for
    one env's step cost ``step_s`` (which it then requires).

    The setting auto picks is tried once, labelled ``auto->...``, where it is one of the others.

    Example:
        >>> trials = candidate_configs([64], ["auto", "shm"], cpus=2, step_s=1e-3)
        >>> [(t.label, t.options) for t in trials]
        [('auto->shm', {'num_workers': 2}), ('shm', {'num_workers': 1}), ('shm', {'num_workers': 4})]
    """
    cpus = cpus or usable_cpus()
    workers = sorted({1, max(1, cpus // 2), cpus, 2 * cpus})
    trials: list[Trial] = []
    for backend, n in itertools.product(backends, num_envs_options):
        if backend == "auto":
            if step_s is None:
                raise ValueError("the auto candidate needs the step cost (step_s)")
            choice = choose_backend(step_s, n, cpus)
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
    # the setting auto picks is often one of the others: time it once, labelled as auto's
    merged: list[Trial] = []
    for trial in trials:
        key = (trial.backend, trial.num_envs, trial.options)
        twin = next((m for m in merged if (m.backend, m.num_envs, m.options) == key), None)
        if twin is None:
            merged.append(trial)
        elif trial.auto:
            twin.auto, twin.reason = True, trial.reason
    return merged


def estimated_seconds(trials: int, seconds: float) -> float:
    """About how long ``trials`` settings of ``seconds`` each take, start and close included.

    Example:
        >>> estimated_seconds(40, 2.0)
        100.0
    """
    return trials * (seconds + _OVERHEAD_S)


def measure_trial(
    env_fns: EnvSource | Sequence[Callable], trial: Trial, seconds: float, policy_s: float = 0.0
) -> float:
    """Steps per second of ``trial``, on ``vecaccel bench``'s clock: random actions sampled
    before timing, a short untimed warm-up, and ``policy_s`` of simulated inference latency
    before each step (a sleep, as a GPU forward costs the CPU little)."""
    from vecaccel.bench.timing import measure

    build = functools.partial(
        vecaccel.make_vec, env_fns[: trial.num_envs], backend=trial.backend, **trial.options
    )
    warmup = min(0.25, seconds / 8)
    threads = None
    if trial.backend == "action_server":
        # the action server runs torch in this process, and nothing here computes with it: one
        # thread leaves the cores to the env workers (as a training script is told to do)
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
    try:
        rate, _ = measure(
            f"vecaccel-{trial.backend}",
            build,
            trial.num_envs,
            seconds=seconds,
            warmup=warmup,
            seed=0,
            policy_s=policy_s,
            before_close=functools.partial(_note_timing, trial),
        )
    finally:
        if threads is not None:
            torch.set_num_threads(threads)
    return rate


def _note_timing(trial: Trial, envs: Any) -> None:
    stats = getattr(envs, "stats", None)
    if callable(stats):
        trial.timing = stats().summary()


def autotune(
    env: EnvSource | str | Callable,
    num_envs_options: Sequence[int] = DEFAULT_NUM_ENVS,
    backends: Iterable[str] | None = None,
    seconds: float = DEFAULT_SECONDS,
    policy_ms: float = 0.0,
    report: Callable[[Trial], None] | None = None,
    plan: Callable[[list[Trial]], None] | None = None,
) -> list[Trial]:
    """Measure every candidate configuration; return the trials, best first.

    ``plan`` (if given) is called with the trials before any is timed, ``report`` with each
    one once timed.

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
        backends = [b for b in DEFAULT_BACKENDS if b in registered]
    backends = list(backends)
    for name in backends:
        if name not in registered:
            raise ValueError(unknown_backend_message(name, registered))
    source = EnvSource.resolve(env, max(num_envs_options))
    try:
        # the probe backend="auto" runs, once for every env count
        step_s = env_step_cost.probe_step_cost(source[0]).step_s if "auto" in backends else None
        trials = candidate_configs(num_envs_options, backends, step_s=step_s)
        if plan is not None:
            plan(trials)
        for trial in trials:
            try:
                trial.steps_per_s = measure_trial(source, trial, seconds, policy_ms / 1e3)
            except Exception as exc:  # noqa: BLE001 - a configuration that cannot run is reported, not fatal
                trial.error = f"{type(exc).__name__}: {exc}"
            if report is not None:
                report(trial)
    finally:
        source.close_unused()
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

    def plan(trials: list[Trial]) -> None:
        total = estimated_seconds(len(trials), args.seconds)
        print(
            f"timing {len(trials)} settings, {args.seconds:g} s each: about {_duration(total)}",
            flush=True,
        )

    def report(trial: Trial) -> None:
        options = ", ".join(f"{k}={v}" for k, v in trial.options.items())
        result = (
            f"{trial.steps_per_s:>10.0f}" if trial.error is None else f"  failed: {trial.error}"
        )
        print(f"{trial.label:<14} n={trial.num_envs:<4} {options:<34} {result}", flush=True)
        if trial.timing:
            print(f"{'':<20} {trial.timing}", flush=True)

    try:
        trials = autotune(
            args.env, num_envs, backends, args.seconds, args.policy_ms, report, plan=plan
        )
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
        # the best at this env count, auto's own setting among them: a share never above 1
        peers = [t for t in ran if t.num_envs == choice.num_envs]
        fastest = max(peers, key=lambda t: t.steps_per_s)
        if fastest is choice:
            share = f", the fastest of the {len(peers)} settings tried"
        else:
            share = f", {choice.steps_per_s / fastest.steps_per_s:.2f} of the best"
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


def _duration(seconds: float) -> str:
    """``"40 s"`` or ``"2 minutes"``, for a time told to a person.

    Example:
        >>> _duration(40), _duration(100), _duration(170)
        ('40 s', 'a minute or two', '3 minutes')
    """
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 120:
        return "a minute or two"
    return f"{round(seconds / 60)} minutes"


def _default_count() -> int:
    """About how many settings a run with the defaults times on this machine."""
    defaults = [b for b in DEFAULT_BACKENDS if b != "auto"]
    # auto's pick is one more setting per env count at most
    return len(candidate_configs(DEFAULT_NUM_ENVS, defaults)) + len(DEFAULT_NUM_ENVS)


def _description(count: int) -> str:
    cpus = usable_cpus()
    counts = ", ".join(str(n) for n in DEFAULT_NUM_ENVS)
    text = (
        "Find the fastest way to step ENV on this machine. Each backend (serial, shm, hybrid, "
        "async, action_server) is tried with several worker counts and batch sizes, together "
        'with the setting backend="auto" would pick, at each env count, and each setting is '
        "timed for a few seconds with random actions. The fastest is printed with the "
        "vecaccel.make_vec(...) call that reproduces it.\n\n"
        f"With the defaults ({counts} envs, {DEFAULT_SECONDS:g} s per setting), this machine's "
        f"{cpus} CPUs give about {count} settings: about "
        f"{_duration(estimated_seconds(count, DEFAULT_SECONDS))}. Fewer env counts, fewer "
        "backends or fewer seconds make it shorter."
    )
    return "\n\n".join(textwrap.fill(paragraph, 79) for paragraph in text.split("\n\n"))


def add_command(commands: Commands) -> None:
    """Add ``vecaccel tune`` to the command line (through the ``vecaccel_add_commands`` hook)."""
    count = _default_count()
    duration = _duration(estimated_seconds(count, DEFAULT_SECONDS))
    parser = commands.add(
        "tune",
        main,
        help=f"find the fastest backend and settings for an env (with the defaults: {duration})",
        description=_description(count),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "env", metavar="ENV", help="a Gymnasium id, e.g. CartPole-v1 or ALE/Pong-v5"
    )
    parser.add_argument(
        "--num-envs",
        default=",".join(str(n) for n in DEFAULT_NUM_ENVS),
        metavar="N,N,...",
        help="comma-separated env counts to try (default: %(default)s)",
    )
    parser.add_argument(
        "--backends",
        default=None,
        metavar="NAME,NAME,...",
        help="comma-separated backends to try; 'auto' stands for the setting backend=\"auto\" "
        f"picks (default: those of {', '.join(DEFAULT_BACKENDS)} that are registered)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help="timed seconds per setting (default: %(default)g)",
    )
    parser.add_argument(
        "--policy-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="a policy's latency per step to simulate, in milliseconds, so that backends which "
        "step envs while the policy runs (action_server alternating) show it (default: 0)",
    )
