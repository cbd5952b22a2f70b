"""One benchmark run: every vecaccel backend and peer over a ``num_envs`` sweep, with ratios and
each one's share of the machine's ceiling."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from gymnasium.vector import AutoresetMode

from vecaccel.bench.ceiling import measure_ceiling, measure_vector_ceiling
from vecaccel.bench.peers import PEERS, build_peer, unavailable_reason
from vecaccel.bench.timing import measure, measure_raw
from vecaccel.bench.workloads import BenchEnv, resolve_env
from vecaccel.envs.source import EnvSource
from vecaccel.envs.vectorized_slices import VectorEnvFn
from vecaccel.worker import usable_cpus

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_NUM_ENVS",
    "default_backends",
    "parse_list",
    "run_benchmark",
]

#: vecaccel backends measured when ``--backends`` is not given (each only when registered).
DEFAULT_BACKENDS: tuple[str, ...] = ("serial", "shm", "hybrid", "async", "auto")

#: The ``--num-envs`` sweep when none is given.
DEFAULT_NUM_ENVS: tuple[int, ...] = (8, 16, 64, 256)

Progress = Callable[[str], None]


def default_backends() -> list[str]:
    """Return the :data:`DEFAULT_BACKENDS` that are registered now.

    Example:
        >>> "serial" in default_backends()
        True
    """
    from vecaccel.manager import list_backends

    registered = list_backends()
    return [name for name in DEFAULT_BACKENDS if name in registered]


def parse_workloads(
    items: Sequence[str] | None, default: dict[str, list[int]]
) -> dict[str, list[int]]:
    """``ENV=N1,N2`` items (a script's repeatable ``--workload``) as ``{env: [counts]}``;
    ``default`` when there are none.

    Example:
        >>> parse_workloads(["pong=8,16", "CartPole-v1=64"], {})
        {'pong': [8, 16], 'CartPole-v1': [64]}
        >>> parse_workloads(None, {"pong": [8]})
        {'pong': [8]}
    """
    if not items:
        return dict(default)
    workloads: dict[str, list[int]] = {}
    for item in items:
        name, sep, counts = item.partition("=")
        try:
            workloads[name] = [int(n) for n in counts.split(",")]
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ValueError(f"a workload is ENV=N1,N2 (env counts), got {item!r}")
    return workloads


def parse_list(value: str | Sequence[str] | None) -> list[str] | None:
    """A comma-separated string (or a sequence) as a list of names; ``None`` stays ``None``.

    Example:
        >>> parse_list("shm, async,")
        ['shm', 'async']
    """
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
    vectorized: bool = False,
) -> list[dict[str, Any]]:
    """Measure steps/s of vecaccel backends and their peers on one env over a num_envs sweep.

    Each measurement builds the vector env, resets it, steps it with random pre-sampled actions
    for ``warmup`` seconds untimed and then ``seconds`` timed, and closes it. The ``ceiling``
    peer is one process per usable CPU each stepping its own raw env, summed
    (:func:`~vecaccel.bench.ceiling.measure_ceiling`); every rate is also given as its share of
    it. With ``repeat`` above one the whole sweep runs again, so that every implementation sees
    the same drift of the machine's load, and the median is reported.

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
        vectorized: measure a batched simulator (the env id's ``vector_entry_point``): every
            backend with ``vectorized=True``, the native vector env alone in this process
            (``native``), and per ``num_envs`` the ceiling of one native vector env per usable
            CPU (:func:`~vecaccel.bench.ceiling.measure_vector_ceiling`) instead of raw envs.

    Returns:
        One dict per (implementation, num_envs): ``env``, ``impl``, ``kind`` (``vecaccel``,
        ``raw``, ``ceiling`` or ``peer``), ``num_envs`` (1 for raw, the processes for the
        ceiling), ``status`` (``ok``, ``skipped`` or ``error``), ``reason``, ``steps_per_s``
        (median, ``None`` unless ok), ``samples``, ``setup_s``, ``seconds``, the ratios
        ``vs_raw``, ``vs_gym_sync``, ``vs_gym_async``, and ``ceiling_steps_per_s`` with
        ``share_of_ceiling`` (``None`` where the baseline was not measured).

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
    from vecaccel.manager import list_backends, unknown_backend_message

    target = env if isinstance(env, BenchEnv) else resolve_env(env)
    num_envs_list = [int(n) for n in num_envs_list]
    if not num_envs_list or any(n < 1 for n in num_envs_list):
        raise ValueError(f"num_envs must be positive integers, got {num_envs_list}")
    backends = default_backends() if backends is None else parse_list(backends)
    peers = list(PEERS) if peers is None else parse_list(peers)
    registered = list_backends()
    for name in backends:
        if name not in registered:
            raise ValueError(unknown_backend_message(name, registered))
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
            rate, setup = measure(impl, build, n, seconds, warmup, seed)
        except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the whole run
            entry["status"], entry["reason"] = "error", f"{type(exc).__name__}: {exc}"
            say(f"  error: {entry['reason']}")
            return
        entry["samples"].append(rate)
        entry["setup_s"].append(setup)

    def skip(impl: str, kind: str, n: int, reason: str) -> None:
        entry = record(impl, kind, n)
        entry["status"], entry["reason"] = "skipped", reason

    def run_baseline(impl: str, n: int, label: str, rate: Callable[[], float]) -> None:
        entry = record(impl, impl, n)
        if entry["status"] != "ok":
            return
        say(f"{target.label}: {label}")
        try:
            entry["samples"].append(rate())
        except Exception as exc:  # noqa: BLE001 - reported in the result, as above
            entry["status"], entry["reason"] = "error", f"{type(exc).__name__}: {exc}"
            say(f"  error: {entry['reason']}")

    processes = usable_cpus()
    vector_fn = None
    if vectorized:
        env_id = EnvSource.id_of(target.make_vec_arg)
        if env_id is None:
            raise ValueError(f"vectorized needs an env id with a vector_entry_point, not {env!r}")
        vector_fn = VectorEnvFn(env_id, AutoresetMode.NEXT_STEP)
        backend_options = {
            name: {**backend_options.get(name, {}), "vectorized": True} for name in backends
        }
    # resolved once for the largest count; each count builds from its first envs
    source = EnvSource.resolve(target.make_vec_arg, max(num_envs_list), vectorized=vectorized)
    try:
        for _ in range(repeat):
            if vector_fn is not None:
                for n in num_envs_list:
                    run_baseline(
                        "ceiling",
                        n,
                        f"ceiling, {processes} processes each stepping a native vector env",
                        functools.partial(_vector_ceiling, vector_fn, n, seconds, warmup, seed),
                    )
                    run_one("native", "peer", n, functools.partial(vector_fn, n))
            if "raw" in peers:
                run_baseline(
                    "raw", 1, "raw single env", lambda: measure_raw(target, seconds, warmup, seed)
                )
            if "ceiling" in peers and vector_fn is None:
                run_baseline(
                    "ceiling",
                    processes,
                    f"ceiling, {processes} processes each stepping a raw env",
                    lambda: measure_ceiling(target, seconds, warmup, seed, processes)[0],
                )
            for n in num_envs_list:
                for name in backends:
                    options = dict(backend_options.get(name, {}))
                    run_one(
                        f"vecaccel-{name}",
                        "vecaccel",
                        n,
                        functools.partial(make_vec, source[:n], backend=name, **options),
                    )
                for peer in peers:
                    if peer in ("raw", "ceiling"):
                        continue
                    reason = unavailable_reason(peer, target)
                    if reason is not None:
                        skip(peer, "peer", n, reason)
                        continue
                    run_one(peer, "peer", n, functools.partial(build_peer, peer, target, n, seed))
    finally:
        source.close_unused()

    results = list(records.values())
    for entry in results:
        if entry["status"] == "ok":
            if entry["samples"]:
                entry["steps_per_s"] = statistics.median(entry["samples"])
            else:
                entry["status"] = "skipped"
    _add_ratios(results)
    return results


def _vector_ceiling(
    vector_fn: Callable[[int], Any], n: int, seconds: float, warmup: float, seed: int
) -> float:
    return measure_vector_ceiling(vector_fn, n, seconds, warmup, seed)[0]


def _add_ratios(results: list[dict[str, Any]]) -> None:
    def rate(impl: str, n: int | None = None) -> float | None:
        for entry in results:
            if entry["impl"] == impl and (n is None or entry["num_envs"] == n):
                return entry["steps_per_s"]
        return None

    raw = rate("raw")
    for entry in results:
        value, n = entry["steps_per_s"], entry["num_envs"]
        # one ceiling per run, or one per num_envs (batched simulators)
        ceiling = rate("ceiling", n) or rate("ceiling")
        entry["ceiling_steps_per_s"] = ceiling
        single = entry["kind"] in ("raw", "ceiling")
        for key, base in (
            ("share_of_ceiling", ceiling),
            ("vs_raw", raw),
            ("vs_gym_sync", rate("gym-sync", n) if not single else None),
            ("vs_gym_async", rate("gym-async", n) if not single else None),
        ):
            entry[key] = value / base if value and base else None
