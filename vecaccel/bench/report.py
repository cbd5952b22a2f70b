"""The report of a benchmark run: a Markdown table, the machine it ran on, a plot.

The table gives the ceiling (one process per usable CPU stepping its own raw env, summed) as a
column, and each row's share of it, beside the ratios to the peers.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from typing import Any

from vecaccel.worker.cpus import usable_cpus

__all__ = ["format_table", "machine_info", "plot_results", "shares_of_ceiling"]


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _ceilings(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The measured ceiling of each env, by label."""
    return {
        entry["env"]: entry["steps_per_s"]
        for entry in results
        if entry["kind"] == "ceiling" and entry["status"] == "ok" and entry["steps_per_s"]
    }


def shares_of_ceiling(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str, int], float]:
    """Each ok record's steps/s over its env's measured ceiling, by ``(env, impl, num_envs)``.

    Computed from the rates themselves, so a table built from records of several runs (or
    edited by hand) still shows shares that match its figures.

    Example:
        >>> rows = [{"env": "e", "impl": "ceiling", "kind": "ceiling", "num_envs": 2,
        ...          "status": "ok", "steps_per_s": 2000.0},
        ...         {"env": "e", "impl": "vecaccel-shm", "kind": "vecaccel", "num_envs": 8,
        ...          "status": "ok", "steps_per_s": 1500.0}]
        >>> shares_of_ceiling(rows)[("e", "vecaccel-shm", 8)]
        0.75
    """
    ceilings = _ceilings(results)
    return {
        (entry["env"], entry["impl"], entry["num_envs"]): entry["steps_per_s"]
        / ceilings[entry["env"]]
        for entry in results
        if entry["status"] == "ok" and entry["steps_per_s"] and entry["env"] in ceilings
    }


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """Render results as a Markdown table of steps/s, the ceiling, each row's share of it and
    the ratios to the peers; skipped and failed ones last.

    Args:
        results: records from :func:`run_benchmark` (several envs may be mixed).

    Returns:
        The table text (ready to paste into a README).

    Example:
        >>> rows = [{"env": "e", "impl": "raw", "kind": "raw", "num_envs": 1, "status": "ok",
        ...          "reason": "", "steps_per_s": 1000.0, "vs_raw": 1.0, "vs_gym_sync": None,
        ...          "vs_gym_async": None},
        ...         {"env": "e", "impl": "ceiling", "kind": "ceiling", "num_envs": 2,
        ...          "status": "ok", "reason": "", "steps_per_s": 1950.0, "vs_raw": 1.95,
        ...          "vs_gym_sync": None, "vs_gym_async": None}]
        >>> print(format_table(rows).splitlines()[2])
        | e | 1 | raw | 1,000 | 1,950 | 0.51 | 1.00 |  |  |
    """
    shares = shares_of_ceiling(results)
    ceilings = _ceilings(results)
    lines = [
        "| env | num_envs | implementation | steps/s | ceiling | share of ceiling | x raw "
        "| x gym-sync | x gym-async |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for entry in results:
        if entry["status"] != "ok":
            notes.append(
                f"- {entry['env']} {entry['impl']} num_envs={entry['num_envs']}: "
                f"{entry['status']} ({entry['reason']})"
            )
            continue
        share = shares.get((entry["env"], entry["impl"], entry["num_envs"]))
        lines.append(
            f"| {entry['env']} | {entry['num_envs']} | {entry['impl']} | "
            f"{entry['steps_per_s']:,.0f} | {_rate(ceilings.get(entry['env']))} | "
            f"{_ratio(share)} | {_ratio(entry.get('vs_raw'))} | "
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


def _cpu_model() -> str | None:
    """The CPU's model name from ``/proc/cpuinfo``, or ``None`` where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """Describe where the numbers were measured (Python, CPU model and count, package versions).

    The benchmark pages quote the hardware from these fields, so a result file is enough to
    tell which machine produced it.

    Example:
        >>> machine_info()["usable_cpus"] >= 1
        True
    """
    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):  # not on Unix
        load = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "load_average": load,
        "versions": _versions(),
    }


def plot_results(results: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Draw steps/s against num_envs (log-log), one panel per env, one line per implementation.

    The raw single-env rate and the ceiling are horizontal lines. Uses matplotlib's Agg backend,
    so no display is needed.

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
        flat = ("raw", "ceiling")  # drawn as horizontal lines
        impls = list(dict.fromkeys(r["impl"] for r in rows if r["kind"] not in flat))
        for impl in impls:
            points = sorted((r["num_envs"], r["steps_per_s"]) for r in rows if r["impl"] == impl)
            xs, ys = zip(*points)
            style = "-" if impl.startswith("vecaccel-") else "--"
            ax.plot(xs, ys, style, marker="o", label=impl)
        for r in rows:
            if r["kind"] == "raw":
                ax.axhline(r["steps_per_s"], color="gray", linestyle=":", label="raw (1 env)")
            elif r["kind"] == "ceiling":
                label = f"ceiling ({r['num_envs']} processes)"
                ax.axhline(r["steps_per_s"], color="black", linestyle="-.", label=label)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["num_envs"] for r in rows if r["kind"] not in flat})
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
