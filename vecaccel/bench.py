"""``vecaccel bench``: environment-steps per second of vecaccel backends beside their peers.

One run measures, for every ``num_envs`` of a sweep, each vecaccel backend beside Gymnasium's
``SyncVectorEnv`` and ``AsyncVectorEnv``, Stable-Baselines3's ``SubprocVecEnv`` and
``DummyVecEnv`` (when installed) and EnvPool (when installed and the env has an EnvPool twin),
plus the raw rate of one plain env stepped in a loop. Actions are random and sampled before the
clock starts, so only stepping is timed. The optional peers and matplotlib are imported lazily:
this module imports with only vecaccel's own dependencies installed.

Example:
    >>> from vecaccel.bench import format_table, run_benchmark
    >>> results = run_benchmark(
    ...     "CartPole-v1", [2], backends=["serial"], peers=["raw"], seconds=0.01, warmup=0.0
    ... )
    >>> [(r["impl"], r["num_envs"], r["status"]) for r in results]
    [('raw', 1, 'ok'), ('vecaccel-serial', 2, 'ok')]
    >>> print(format_table(results).splitlines()[0])
    | env | num_envs | implementation | steps/s | x raw | x gym-sync | x gym-async |
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from gymnasium.vector.utils import batch_space

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_NUM_ENVS",
    "PEERS",
    "BenchEnv",
    "default_backends",
    "format_table",
    "machine_info",
    "make_gym_env",
    "make_pong_env",
    "parse_backend_options",
    "plot_results",
    "resolve_env",
    "run_benchmark",
    "write_json",
]

#: vecaccel backends measured when ``--backends`` is not given (each only when registered).
DEFAULT_BACKENDS: tuple[str, ...] = ("serial", "shm", "hybrid", "async")

#: The ``--num-envs`` sweep when none is given.
DEFAULT_NUM_ENVS: tuple[int, ...] = (8, 16, 64, 256)

#: The implementations vecaccel is compared with, in the order they are measured.
PEERS: tuple[str, ...] = ("raw", "gym-sync", "gym-async", "sb3-subproc", "sb3-dummy", "envpool")

#: How many batches of random actions are sampled before timing; stepping cycles through them.
_ACTION_BATCHES = 64

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# environments


def make_gym_env(env_id: str) -> gym.Env:
    """``gym.make(env_id)``, registering installed packages' envs first only when needed.

    The peers' worker processes call this too. Gymnasium's built-in ids (CartPole) need no
    registration, so under ``spawn`` or ``forkserver`` those workers never import vecaccel's
    plugins: the peers are not charged for vecaccel's start-up.

    Example:
        >>> env = make_gym_env("CartPole-v1")
        >>> env.spec.id
        'CartPole-v1'
        >>> env.close()
    """
    if env_id not in gym.registry:
        from vecaccel.manager import register_envs

        register_envs()
    return gym.make(env_id)


def make_pong_env(noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84) -> gym.Env:
    """Build the ``pong`` preset: Gymnasium ``AtariPreprocessing`` over ``PongNoFrameskip-v4``.

    84x84 grayscale frames, a frame skip of 4 (max-pooled over the last two frames) and up to 30
    no-ops at reset. It is a module-level function, so it pickles by reference and works under
    the ``spawn`` and ``forkserver`` start methods; it registers the ALE ids itself, so worker
    processes need nothing else.

    Args:
        noop_max: most no-op actions taken at reset.
        frame_skip: frames per step.
        screen_size: side of the square grayscale observation.

    Returns:
        The wrapped env (observation ``Box(0, 255, (84, 84), uint8)``, 6 actions).

    Raises:
        ImportError: if ``ale-py`` is not installed (``pip install vecaccel[atari]``).

    Example:
        >>> env = make_pong_env()  # doctest: +SKIP
        >>> env.observation_space.shape  # doctest: +SKIP
        (84, 84)
    """
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    env = gym.make("PongNoFrameskip-v4")
    return AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        grayscale_obs=True,
    )


@dataclass(frozen=True)
class BenchEnv:
    """One environment to benchmark and how each implementation builds it.

    Attributes:
        label: the name shown in tables and plots.
        env_fn: a picklable zero-argument function returning one ``gymnasium.Env``.
        make_vec_arg: what ``vecaccel.make_vec`` receives (the Gymnasium id, or ``env_fn``).
        envpool_id: the EnvPool task with the same dynamics, or ``None`` when there is none.
        envpool_kwargs: keyword arguments that make the EnvPool task match ``env_fn``.
    """

    label: str
    env_fn: Callable[[], gym.Env]
    make_vec_arg: Any
    envpool_id: str | None = None
    envpool_kwargs: dict[str, Any] = field(default_factory=dict)


#: Gymnasium ids whose EnvPool task of the same name has the same dynamics and time limit.
_ENVPOOL_TWINS: dict[str, tuple[str, dict[str, Any]]] = {
    "CartPole-v1": ("CartPole-v1", {}),
}

#: EnvPool settings matching :func:`make_pong_env` (no life loss, raw rewards, no sticky actions).
_PONG_ENVPOOL_KWARGS: dict[str, Any] = {
    "episodic_life": False,
    "reward_clip": False,
    "stack_num": 1,
    "img_height": 84,
    "img_width": 84,
    "frame_skip": 4,
    "noop_max": 30,
    "repeat_action_probability": 0.0,
    "use_fire_reset": False,  # AtariPreprocessing does not press FIRE at reset
}


def resolve_env(name: str) -> BenchEnv:
    """Turn ``--env`` into a :class:`BenchEnv`: the ``pong`` preset or a Gymnasium id.

    Args:
        name: ``"pong"`` (case-insensitive) or any registered Gymnasium id.

    Returns:
        The environment description.

    Raises:
        ValueError: if ``name`` is neither the preset nor a registered id.

    Example:
        >>> target = resolve_env("CartPole-v1")
        >>> target.label, target.envpool_id
        ('CartPole-v1', 'CartPole-v1')
        >>> resolve_env("pong").envpool_id
        'Pong-v5'
    """
    if name.lower() == "pong":
        return BenchEnv(
            label="pong",
            env_fn=make_pong_env,
            make_vec_arg=make_pong_env,
            envpool_id="Pong-v5",
            envpool_kwargs=dict(_PONG_ENVPOOL_KWARGS),
        )
    from vecaccel.manager import register_envs

    register_envs()
    if name not in gym.registry:
        raise ValueError(f"unknown environment {name!r}: use 'pong' or a registered Gymnasium id")
    twin_id, twin_kwargs = _ENVPOOL_TWINS.get(name, (None, {}))
    return BenchEnv(
        label=name,
        env_fn=functools.partial(make_gym_env, name),
        make_vec_arg=name,
        envpool_id=twin_id,
        envpool_kwargs=dict(twin_kwargs),
    )


# ---------------------------------------------------------------------------------------------
# measuring


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def default_backends() -> list[str]:
    """Return the :data:`DEFAULT_BACKENDS` that are registered now.

    Example:
        >>> "serial" in default_backends()
        True
    """
    from vecaccel.manager import list_backends

    registered = list_backends()
    return [name for name in DEFAULT_BACKENDS if name in registered]


def _sample_actions(space: gym.Space, count: int, seed: int) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(count)]


def _time_vector(
    envs: Any, actions: Sequence[Any], seconds: float, warmup: float
) -> tuple[int, float]:
    """Step ``envs`` for ``warmup`` then ``seconds``; return (batches stepped, elapsed s)."""
    count = len(actions)
    step = envs.step
    i = 0
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step(actions[i % count])
        i += 1
    start = time.perf_counter()
    deadline = start + seconds
    batches = 0
    while True:
        step(actions[i % count])
        i += 1
        batches += 1
        now = time.perf_counter()
        if now >= deadline:
            return batches, now - start


def _time_raw(env: gym.Env, actions: Sequence[Any], seconds: float, warmup: float):
    """Step one plain env, resetting it when an episode ends; return (steps, elapsed s)."""
    count = len(actions)
    step, reset = env.step, env.reset
    i = 0
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        _, _, terminated, truncated, _ = step(actions[i % count])
        if terminated or truncated:
            reset()
        i += 1
    start = time.perf_counter()
    deadline = start + seconds
    steps = 0
    while True:
        # the clock is read every 16 steps so it costs nothing next to a fast env's step
        for _ in range(16):
            _, _, terminated, truncated, _ = step(actions[i % count])
            if terminated or truncated:
                reset()
            i += 1
        steps += 16
        now = time.perf_counter()
        if now >= deadline:
            return steps, now - start


def _peer_unavailable(peer: str, target: BenchEnv) -> str | None:
    """Why ``peer`` cannot run here, or ``None`` when it can."""
    if peer in ("sb3-subproc", "sb3-dummy") and not _installed("stable_baselines3"):
        return "stable-baselines3 is not installed"
    if peer == "envpool":
        if not _installed("envpool"):
            return "envpool is not installed"
        if target.envpool_id is None:
            return f"envpool has no equivalent of {target.label}"
    return None


def _build_peer(peer: str, target: BenchEnv, num_envs: int, seed: int) -> Any:
    """Build the vector env of a peer implementation."""
    env_fns = [target.env_fn] * num_envs
    if peer == "gym-sync":
        return gym.vector.SyncVectorEnv(env_fns)
    if peer == "gym-async":
        return gym.vector.AsyncVectorEnv(env_fns)
    if peer == "sb3-subproc":
        import multiprocessing

        from stable_baselines3.common.vec_env import SubprocVecEnv

        # SB3's default, forkserver, makes every worker import torch afresh (SB3 imports it
        # everywhere): some 170 MB and seconds of CPU per worker, ~40 GB at 256 envs. The start
        # method changes start-up and memory, not stepping, so fork it like Gymnasium's Async.
        fork = "fork" in multiprocessing.get_all_start_methods()
        return SubprocVecEnv(env_fns, start_method="fork" if fork else None)
    if peer == "sb3-dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        return DummyVecEnv(env_fns)
    if peer == "envpool":
        import envpool

        return envpool.make_gymnasium(
            target.envpool_id,
            num_envs=num_envs,
            batch_size=num_envs,
            seed=seed,
            **target.envpool_kwargs,
        )
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")


def _reset(envs: Any, impl: str, seed: int) -> None:
    if impl.startswith("sb3-"):
        envs.seed(seed)
        envs.reset()
    elif impl == "envpool":
        envs.reset()  # EnvPool takes its seed when it is made
    else:
        envs.reset(seed=seed)


def _measure(
    impl: str,
    build: Callable[[], Any],
    num_envs: int,
    seconds: float,
    warmup: float,
    seed: int,
) -> tuple[float, float]:
    """Build, reset, time and close one vector env; return (steps/s, set-up seconds)."""
    started = time.perf_counter()
    envs = build()
    try:
        setup = time.perf_counter() - started
        with warnings.catch_warnings():
            if impl == "envpool":
                # EnvPool rebuilds its spaces on each access, and its CartPole declares float64
                # bounds that Gymnasium warns about every time
                warnings.simplefilter("ignore", UserWarning)
            _reset(envs, impl, seed)
            single_action_space = getattr(envs, "single_action_space", None)
            if single_action_space is None:  # SB3 and EnvPool expose the per-env space
                single_action_space = envs.action_space
        # backends that return part of the envs each step (async batch_size, alternating
        # action server) take and return that many
        per_step = int(getattr(envs, "batch_size", None) or num_envs)
        batched = batch_space(single_action_space, per_step)
        actions = _sample_actions(batched, _ACTION_BATCHES, seed)
        batches, elapsed = _time_vector(envs, actions, seconds, warmup)
        return batches * per_step / elapsed, setup
    finally:
        envs.close()


def _measure_raw(target: BenchEnv, seconds: float, warmup: float, seed: int) -> float:
    env = target.env_fn()
    try:
        env.reset(seed=seed)
        actions = _sample_actions(env.action_space, _ACTION_BATCHES, seed)
        steps, elapsed = _time_raw(env, actions, seconds, warmup)
        return steps / elapsed
    finally:
        env.close()


def _parse_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return list(value)


def run_benchmark(
    env: str | BenchEnv,
    num_envs_list: Sequence[int] = DEFAULT_NUM_ENVS,
    backends: Sequence[str] | None = None,
    peers: Sequence[str] | None = None,
    seconds: float = 2.0,
    *,
    warmup: float | None = None,
    repeat: int = 1,
    seed: int = 0,
    backend_options: dict[str, dict[str, Any]] | None = None,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Measure steps/s of vecaccel backends and their peers on one env over a num_envs sweep.

    Each measurement builds the vector env, resets it, steps it with random pre-sampled actions
    for ``warmup`` seconds untimed and then ``seconds`` timed, and closes it. With ``repeat``
    above one the whole sweep runs again, so that every implementation sees the same drift of
    the machine's load, and the median is reported.

    Args:
        env: ``"pong"``, a Gymnasium id, or a :class:`BenchEnv`.
        num_envs_list: the numbers of sub-environments to sweep over.
        backends: vecaccel backends to measure (default: :func:`default_backends`).
        peers: names from :data:`PEERS` (default: all of them; those that cannot run here are
            reported as skipped).
        seconds: timed seconds per measurement.
        warmup: untimed seconds before each measurement (default ``min(1, seconds / 4)``).
        repeat: how many times to run the sweep.
        seed: seed of the resets and of the action sampling.
        backend_options: keyword options per backend for ``vecaccel.make_vec``, e.g.
            ``{"shm": {"num_workers": 2}}``.
        progress: called with a line of text before each measurement.

    Returns:
        One dict per (implementation, num_envs): ``env``, ``impl``, ``kind`` (``vecaccel``,
        ``raw`` or ``peer``), ``num_envs`` (1 for raw), ``status`` (``ok``, ``skipped`` or
        ``error``), ``reason``, ``steps_per_s`` (median, ``None`` unless ok), ``samples``,
        ``setup_s``, ``seconds``, and the ratios ``vs_raw``, ``vs_gym_sync``, ``vs_gym_async``
        (``None`` where the baseline was not measured).

    Raises:
        ValueError: for an unknown backend, peer or env, or a bad num_envs.

    Example:
        >>> results = run_benchmark(
        ...     "CartPole-v1", [2], backends=["serial"], peers=["raw", "gym-sync"],
        ...     seconds=0.01, warmup=0.0,
        ... )
        >>> sorted(r["impl"] for r in results)
        ['gym-sync', 'raw', 'vecaccel-serial']
        >>> all(r["steps_per_s"] > 0 for r in results)
        True
    """
    from vecaccel.make import make_vec
    from vecaccel.manager import list_backends

    target = env if isinstance(env, BenchEnv) else resolve_env(env)
    num_envs_list = [int(n) for n in num_envs_list]
    if not num_envs_list or any(n < 1 for n in num_envs_list):
        raise ValueError(f"num_envs must be positive integers, got {num_envs_list}")
    backends = default_backends() if backends is None else _parse_list(backends)
    peers = list(PEERS) if peers is None else _parse_list(peers)
    registered = list_backends()
    unknown = [name for name in backends if name not in registered]
    if unknown:
        raise ValueError(
            f"unknown backend(s) {', '.join(unknown)}; registered: {', '.join(sorted(registered))}"
        )
    unknown = [name for name in peers if name not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    if seconds <= 0 or (warmup is not None and warmup < 0):
        raise ValueError(
            f"seconds must be positive and warmup not negative, got {seconds}, {warmup}"
        )
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if warmup is None:
        warmup = min(1.0, seconds / 4)
    backend_options = backend_options or {}
    say = progress or (lambda line: None)

    # (impl, num_envs) -> record; samples are appended over the repeats
    records: dict[tuple[str, int], dict[str, Any]] = {}

    def record(impl: str, kind: str, n: int) -> dict[str, Any]:
        key = (impl, n)
        if key not in records:
            records[key] = {
                "env": target.label,
                "impl": impl,
                "kind": kind,
                "num_envs": n,
                "status": "ok",
                "reason": "",
                "steps_per_s": None,
                "samples": [],
                "setup_s": [],
                "seconds": seconds,
            }
        return records[key]

    def run_one(impl: str, kind: str, n: int, build: Callable[[], Any]) -> None:
        entry = record(impl, kind, n)
        if entry["status"] != "ok":
            return  # skipped or failed in an earlier repeat
        say(f"{target.label}: {impl} num_envs={n}")
        try:
            rate, setup = _measure(impl, build, n, seconds, warmup, seed)
        except Exception as exc:  # one failing implementation must not end the whole run
            entry["status"], entry["reason"] = "error", f"{type(exc).__name__}: {exc}"
            say(f"  error: {entry['reason']}")
            return
        entry["samples"].append(rate)
        entry["setup_s"].append(setup)

    def skip(impl: str, kind: str, n: int, reason: str) -> None:
        entry = record(impl, kind, n)
        entry["status"], entry["reason"] = "skipped", reason

    for _ in range(repeat):
        if "raw" in peers:
            entry = record("raw", "raw", 1)
            if entry["status"] == "ok":
                say(f"{target.label}: raw single env")
                try:
                    entry["samples"].append(_measure_raw(target, seconds, warmup, seed))
                except Exception as exc:
                    entry["status"], entry["reason"] = "error", f"{type(exc).__name__}: {exc}"
                    say(f"  error: {entry['reason']}")
        for n in num_envs_list:
            for name in backends:
                options = dict(backend_options.get(name, {}))
                run_one(
                    f"vecaccel-{name}",
                    "vecaccel",
                    n,
                    functools.partial(make_vec, target.make_vec_arg, n, backend=name, **options),
                )
            for peer in peers:
                if peer == "raw":
                    continue
                reason = _peer_unavailable(peer, target)
                if reason is not None:
                    skip(peer, "peer", n, reason)
                    continue
                run_one(peer, "peer", n, functools.partial(_build_peer, peer, target, n, seed))

    results = list(records.values())
    for entry in results:
        if entry["status"] == "ok":
            if entry["samples"]:
                entry["steps_per_s"] = statistics.median(entry["samples"])
            else:
                entry["status"] = "skipped"
    _add_ratios(results)
    return results


def _add_ratios(results: list[dict[str, Any]]) -> None:
    def rate(impl: str, n: int | None = None) -> float | None:
        for entry in results:
            if entry["impl"] == impl and (n is None or entry["num_envs"] == n):
                return entry["steps_per_s"]
        return None

    raw = rate("raw")
    for entry in results:
        value, n = entry["steps_per_s"], entry["num_envs"]
        for key, base in (
            ("vs_raw", raw),
            ("vs_gym_sync", rate("gym-sync", n) if entry["kind"] != "raw" else None),
            ("vs_gym_async", rate("gym-async", n) if entry["kind"] != "raw" else None),
        ):
            entry[key] = value / base if value and base else None


# ---------------------------------------------------------------------------------------------
# reporting


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Render results as a Markdown table of steps/s and ratios, skipped and failed ones last.

    Args:
        results: records from :func:`run_benchmark` (several envs may be mixed).

    Returns:
        The table text (ready to paste into a README).

    Example:
        >>> row = {"env": "e", "impl": "raw", "kind": "raw", "num_envs": 1, "status": "ok",
        ...        "reason": "", "steps_per_s": 1000.0, "vs_raw": 1.0, "vs_gym_sync": None,
        ...        "vs_gym_async": None}
        >>> print(format_table([row]).splitlines()[2])
        | e | 1 | raw | 1,000 | 1.00 |  |  |
    """
    lines = [
        "| env | num_envs | implementation | steps/s | x raw | x gym-sync | x gym-async |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for entry in results:
        if entry["status"] != "ok":
            notes.append(
                f"- {entry['env']} {entry['impl']} num_envs={entry['num_envs']}: "
                f"{entry['status']} ({entry['reason']})"
            )
            continue
        lines.append(
            f"| {entry['env']} | {entry['num_envs']} | {entry['impl']} | "
            f"{entry['steps_per_s']:,.0f} | {_ratio(entry.get('vs_raw'))} | "
            f"{_ratio(entry.get('vs_gym_sync'))} | {_ratio(entry.get('vs_gym_async'))} |"
        )
    if notes:
        lines.append("")
        lines.extend(notes)
    return "\n".join(lines)


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in ("vecaccel", "gymnasium", "numpy", "ale-py", "stable-baselines3", "envpool"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def machine_info() -> dict[str, Any]:
    """Describe where the numbers were measured (Python, CPUs, package versions).

    Example:
        >>> machine_info()["usable_cpus"] >= 1
        True
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):  # not on Unix
        load = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "load_average": load,
        "versions": _versions(),
    }


def write_json(
    path: str | os.PathLike[str], results: Sequence[dict[str, Any]], **meta: Any
) -> None:
    """Write ``{"meta": ..., "results": [...]}`` to ``path``.

    Args:
        path: the output file.
        results: records from :func:`run_benchmark`.
        **meta: extra fields for ``meta`` (the command line, the options...).

    Example:
        >>> import json, tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "bench.json"
        >>> write_json(path, [], command="vecaccel bench")
        >>> json.loads(path.read_text())["meta"]["command"]
        'vecaccel bench'
    """
    payload = {
        "meta": {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **machine_info(),
            **meta,
        },
        "results": list(results),
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2)
        handle.write("\n")


def plot_results(results: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Draw steps/s against num_envs (log-log), one panel per env, one line per implementation.

    The raw single-env rate is a dashed horizontal line. Uses matplotlib's Agg backend, so no
    display is needed.

    Args:
        results: records from :func:`run_benchmark`.
        path: the PNG file to write.

    Raises:
        ImportError: if matplotlib is not installed.

    Example:
        >>> import pathlib, tempfile
        >>> row = {"env": "e", "impl": "raw", "kind": "raw", "num_envs": 1, "status": "ok",
        ...        "steps_per_s": 1000.0}
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "bench.png"
        >>> plot_results([row], path)  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ok = [r for r in results if r["status"] == "ok"]
    envs = list(dict.fromkeys(r["env"] for r in ok)) or ["(no results)"]
    fig, axes = plt.subplots(1, len(envs), figsize=(8.5 * len(envs), 4.5), squeeze=False)
    for ax, env in zip(axes[0], envs):
        rows = [r for r in ok if r["env"] == env]
        impls = list(dict.fromkeys(r["impl"] for r in rows if r["kind"] != "raw"))
        for impl in impls:
            points = sorted((r["num_envs"], r["steps_per_s"]) for r in rows if r["impl"] == impl)
            xs, ys = zip(*points)
            style = "-" if impl.startswith("vecaccel-") else "--"
            ax.plot(xs, ys, style, marker="o", label=impl)
        for r in rows:
            if r["kind"] == "raw":
                ax.axhline(r["steps_per_s"], color="gray", linestyle=":", label="raw (1 env)")
        ax.set_xscale("log", base=2)
        ticks = sorted({r["num_envs"] for r in rows if r["kind"] != "raw"})
        if ticks:
            ax.set_xticks(ticks, [str(n) for n in ticks])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_yscale("log")
        ax.set_xlabel("num_envs")
        ax.set_ylabel("env steps / s")
        ax.set_title(env)
        ax.grid(True, which="both", alpha=0.3)
        if rows:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_backend_options(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Parse ``BACKEND.KEY=VALUE`` items (``-o shm.num_workers=2``) into per-backend options.

    Values are Python literals when they parse as one, else strings.

    Example:
        >>> parse_backend_options(["shm.num_workers=2", "shm.context=spawn"])
        {'shm': {'num_workers': 2, 'context': 'spawn'}}
    """
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        backend, dot, name = key.partition(".")
        if not sep or not dot or not backend or not name:
            raise ValueError(f"backend option {item!r} is not of the form BACKEND.KEY=VALUE")
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        options.setdefault(backend, {})[name] = value
    return options


def _output_path_problem(flag: str, path: str) -> str | None:
    """Why ``path`` cannot be written, or None; checked before measuring so that a typo in the
    folder does not throw away a whole benchmark's results."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{flag} {path}: is a folder, not a file"
    if not os.path.isdir(folder):
        return f"{flag} {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"{flag} {path}: folder {folder} is not writable"
    return None


def bench_command(args: Any) -> int:
    """Handler of ``vecaccel bench`` (see ``vecaccel bench --help``)."""
    try:
        num_envs_list = [int(part) for part in _parse_list(args.num_envs) or []]
        backend_options = parse_backend_options(args.option or [])
    except ValueError as exc:
        print(f"vecaccel bench: {exc}", file=sys.stderr)
        return 2
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        problem = path and _output_path_problem(flag, path)
        if problem:
            print(f"vecaccel bench: error: {problem}", file=sys.stderr)
            return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            "vecaccel bench: error: --plot needs matplotlib (pip install vecaccel[bench])",
            file=sys.stderr,
        )
        return 2
    peers = _parse_list(args.peers)
    if peers is not None and peers in (["none"], ["-"]):
        peers = []

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    results: list[dict[str, Any]] = []
    try:
        targets = [resolve_env(env) for env in _parse_list(args.env) or []]
        for target in targets:
            results += run_benchmark(
                target,
                num_envs_list,
                backends=_parse_list(args.backends),
                peers=peers,
                seconds=args.seconds,
                warmup=args.warmup,
                repeat=args.repeat,
                seed=args.seed,
                backend_options=backend_options,
                progress=progress,
            )
    except ValueError as exc:
        print(f"vecaccel bench: {exc}", file=sys.stderr)
        return 2
    info = machine_info()
    print(
        f"\n{info['usable_cpus']} usable CPUs (load average {info['load_average']}), "
        f"Python {info['python']}, {args.seconds} s per measurement, median of {args.repeat}"
    )
    print(format_table(results))
    if args.json:
        try:
            write_json(
                args.json,
                results,
                command=shlex.join(["vecaccel", *getattr(args, "argv", sys.argv[1:])]),
                options={
                    "seconds": args.seconds,
                    "warmup": args.warmup,
                    "repeat": args.repeat,
                    "seed": args.seed,
                    "backend_options": backend_options,
                },
            )
        except OSError as exc:  # the table above still holds the results
            print(f"vecaccel bench: error: cannot write --json {args.json}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.json}")
    if args.plot:
        try:
            plot_results(results, args.plot)
        except ImportError:
            print(
                "vecaccel bench: error: --plot needs matplotlib (pip install vecaccel[bench])",
                file=sys.stderr,
            )
            return 1
        except OSError as exc:
            print(f"vecaccel bench: error: cannot write --plot {args.plot}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}")
    return 1 if any(r["status"] == "error" for r in results) else 0
