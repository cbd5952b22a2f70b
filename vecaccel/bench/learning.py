"""What the learning benchmarks share: a run's curve of episode returns, the callback that feeds
it from a trainer, the median of runs that may stop short of a score, rliable's interval, and
the plot of every seed thin with their median bold.

A run's score is the mean return of its last :data:`WINDOW` training episodes (the MinAtar
paper's score, and CleanRL's). A learning benchmark runs each (arm, task, seed) in a child
process (:func:`~vecaccel.bench.seeds.run_in_child`), feeds a :class:`ReturnCurve` as episodes
end, writes the curve with :class:`~vecaccel.bench.record.RunRecord` and, in its report, reads
the run files back with :func:`load_runs`. rliable and matplotlib are imported only by the
functions that use them.

Example:
    >>> curve = ReturnCurve(total_steps=300, points=3, window=2)
    >>> curve.add(100, [1.0, 3.0]), curve.add(300, [5.0])
    (True, True)
    >>> [(point["step"], point["return"]) for point in curve.points]
    [(100, 2.0), (200, 4.0), (300, 4.0)]
    >>> reached = [{"reached": {"wall_s": 5.0}}, {"reached": None}, {"reached": {"wall_s": 3.0}}]
    >>> censored_median(reached, "wall_s")
    5.0
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "POINTS",
    "WINDOW",
    "CurveCallback",
    "ReturnCurve",
    "censored_median",
    "format_cell",
    "iqm_interval",
    "json_values",
    "learn_on_curve",
    "load_runs",
    "median",
    "pace_summary",
    "plot_seed_curves",
    "race_summary",
    "return_by",
    "run_race",
    "sb3_curve_callback",
    "steady_pace",
    "time_ratios",
    "up_to",
]

#: Episodes in a run's score: the mean return of the last 100 training episodes.
WINDOW = 100
#: Points a run's curve keeps, evenly spaced in env steps.
POINTS = 100


class ReturnCurve:
    """Episode returns as they end, kept as ``points`` points: at every ``total_steps /
    points`` env steps, the mean of the last ``window`` returns, the episodes so far and the
    seconds since the curve was made (make it just before the envs and the agent). With
    ``stop_at``, it notes the first step and second at which that mean, over a full window,
    reaches ``stop_at``.

    Args:
        total_steps: the run's budget in env steps.
        stop_at: the mean return that ends a race run, or ``None``.
        window: the episodes each mean is over.
        points: how many points the curve keeps.
    """

    def __init__(
        self,
        total_steps: int,
        stop_at: float | None = None,
        *,
        window: int = WINDOW,
        points: int = POINTS,
    ) -> None:
        self.every = max(1, total_steps // points)
        self.next_point = self.every
        self.window = window
        self.returns: list[float] = []
        self.points: list[dict[str, float]] = []
        self.stop_at = stop_at
        self.reached: dict[str, float] | None = None
        self.start = time.perf_counter()

    def add(self, step: int, returns: Iterable[float]) -> bool:
        """Record the episodes that ended by ``step``; False once ``stop_at`` is reached."""
        self.returns.extend(float(value) for value in returns)
        while step >= self.next_point:
            self.points.append(self._point(self.next_point))
            self.next_point += self.every
        if self.stop_at is None or self.reached is not None or len(self.returns) < self.window:
            return self.reached is None
        if self.score() >= self.stop_at:
            self.reached = {"step": int(step), "wall_s": time.perf_counter() - self.start}
        return self.reached is None

    def _point(self, step: int) -> dict[str, float]:
        recent = self.returns[-self.window :]
        return {
            "step": step,
            "wall_s": round(time.perf_counter() - self.start, 2),
            "episodes": len(self.returns),
            "return": round(statistics.fmean(recent), 3) if recent else math.nan,
        }

    def score(self) -> float:
        """The mean of the last ``window`` returns (NaN before any episode ended)."""
        recent = self.returns[-self.window :]
        return statistics.fmean(recent) if recent else math.nan

    def outcome(self, steps: int, config: dict[str, Any]) -> dict[str, Any]:
        """The run as its result file keeps it: the curve, the score, the episodes, the
        seconds, the steps trained, the score's step and second (``reached``) and ``config``."""
        return {
            "curve": self.points,
            "score": self.score(),
            "episodes": len(self.returns),
            "wall_s": time.perf_counter() - self.start,
            "steps": int(steps),
            "reached": self.reached,
            "config": config,
        }


class CurveCallback:
    """A trainer callback (``callback(agent, metrics) -> bool``, as ``learn`` calls it once per
    iteration) that hands ``curve`` the episodes the iteration ended: an on-policy agent's
    ``last_episodes``, an off-policy agent's new ``episode_log`` entries. It answers False
    (stop) once the curve has reached its ``stop_at``.
    """

    def __init__(self, curve: ReturnCurve) -> None:
        self.curve = curve
        self.seen = 0

    def __call__(self, agent: Any, metrics: Any = None) -> bool:
        if hasattr(agent, "episode_log"):
            ended = agent.episode_log[self.seen :]
            self.seen = len(agent.episode_log)
            returns = [episode_return for _, episode_return, _ in ended]
        else:
            episodes = agent.last_episodes
            returns = list(episodes.returns) if episodes else []
        return self.curve.add(agent.global_step, returns)


def sb3_curve_callback(curve: ReturnCurve) -> Any:
    """A Stable-Baselines3 callback that hands ``curve`` the episodes its envs end (the
    ``info["episode"]`` of SB3's ``Monitor``: the env's own returns, under ``VecNormalize``
    too), and stops SB3's ``learn`` once the curve has reached its ``stop_at``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class FeedCurve(BaseCallback):
        def _on_step(self) -> bool:
            infos = self.locals["infos"]
            ended = [info["episode"]["r"] for info in infos if "episode" in info]
            return curve.add(self.num_timesteps, ended)

    return FeedCurve()


def json_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` a JSON file can hold as they are (a run's config, say).

    Example:
        >>> json_values({"lr": 3e-4, "device": object(), "sizes": (64, 64)})
        {'lr': 0.0003, 'sizes': (64, 64)}
    """
    kept = (str, int, float, bool, type(None), list, tuple, dict)
    return {key: value for key, value in values.items() if isinstance(value, kept)}


def learn_on_curve(agent: Any, steps: int, curve: ReturnCurve) -> dict[str, Any]:
    """Train a vecaccel ``agent`` for ``steps`` env steps (fewer once ``curve`` reaches its
    ``stop_at``), feeding ``curve``; return the curve's outcome with the agent's config. The
    agent is closed (its envs), and keeps its networks for the caller to read."""
    try:
        agent.learn(steps, callback=CurveCallback(curve))
        return curve.outcome(agent.global_step, json_values(vars(agent.config)))
    finally:
        agent.close()


def steady_pace(outcome: dict[str, Any], target_steps: int) -> dict[str, Any]:
    """A timed run's pace: ``outcome`` (a curve's outcome, its curve still in it) with
    ``steps_per_s``, ``steady_steps_per_s`` and ``projected_wall_s`` added.

    The steady rate is taken past the run's first fifth, where start-up (worker and torch
    start, a replay buffer's warm-up of steps collected and none trained) is over; a run of
    ``target_steps`` is projected from it. A run too short for two points past its first fifth
    keeps its overall rate.

    Example:
        >>> curve = [{"step": s, "wall_s": 5.0 + s / 100} for s in (200, 600, 1000)]
        >>> pace = steady_pace({"steps": 1000, "wall_s": 15.0, "curve": curve}, 2000)
        >>> pace["steady_steps_per_s"], pace["projected_wall_s"]
        (100.0, 25.0)
    """
    paced = dict(outcome)
    points = paced["curve"]
    paced["steps_per_s"] = paced["steps"] / paced["wall_s"]
    steady = [point for point in points if point["step"] >= paced["steps"] / 5]
    rate = paced["steps_per_s"]
    if len(steady) >= 2 and steady[-1]["wall_s"] > steady[0]["wall_s"]:
        first, last = steady[0], steady[-1]
        rate = (last["step"] - first["step"]) / (last["wall_s"] - first["wall_s"])
    paced["steady_steps_per_s"] = rate
    paced["projected_wall_s"] = paced["wall_s"] + (target_steps - paced["steps"]) / rate
    return paced


def pace_summary(
    runs: Sequence[Mapping[str, Any]], arm_key: str, arms: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per arm (the runs' ``arm_key``), over the runs :func:`steady_pace` timed: how many, and
    the median steady rate and projected wall-clock.

    Example:
        >>> runs = [{"algo": "a", "steady_steps_per_s": r, "projected_wall_s": 1e6 / r}
        ...         for r in (100.0, 300.0, 200.0)]
        >>> pace_summary(runs, "algo", ["a"])["a"]["median_steady_steps_per_s"]
        200.0
    """
    summary = {}
    for arm in arms:
        mine = [run for run in runs if run[arm_key] == arm]
        summary[arm] = {
            "runs": len(mine),
            "median_steady_steps_per_s": median([run["steady_steps_per_s"] for run in mine]),
            "median_projected_wall_s": median([run["projected_wall_s"] for run in mine]),
        }
    return summary


def median(values: Sequence[float]) -> float:
    """The median of ``values``, NaN for none.

    Example:
        >>> median([3.0, 1.0, 2.0]), math.isnan(median([]))
        (2.0, True)
    """
    return statistics.median(values) if values else math.nan


def censored_median(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The median seconds (``key="wall_s"``) or steps (``"step"``) to a race's score, a run
    that stopped short of it (``reached`` is ``None``) counting as longer than any that reached
    it (its true time is past its budget). That median is exact while fewer than half the runs
    fall short, as the median of three with one short is the second of the two that reached;
    otherwise it is unknown (``None``)."""
    middle = median([run["reached"][key] if run["reached"] else math.inf for run in runs])
    return middle if math.isfinite(middle) else None  # nan for no runs


def run_race(
    script: str | os.PathLike[str],
    function: str,
    seeds: Sequence[int],
    arms: Sequence[str],
    run_path: Callable[[str, int], Path],
    *,
    benchmark: str,
    command: str,
    common: Mapping[str, Any] | None = None,
    arm_key: str = "arm",
    label: str = "",
) -> list[dict[str, Any]]:
    """Run a race: ``function(**common, <arm_key>=arm, seed=seed)`` of ``script`` in a child
    process for every seed and arm, seed by seed with the arms' order turning (each arm goes
    first in turn). Each run is written to its own file, ``run_path(arm, seed)``, as it ends;
    a run whose file exists is read instead of run again, so a stopped race resumes.

    Args:
        script: the benchmark script (see :func:`~vecaccel.bench.seeds.run_in_child`).
        function: its function of one run; it returns the run's record (a JSON object).
        seeds: the seeds, outer loop.
        arms: the arms' names.
        run_path: where the run of an arm and a seed is kept.
        benchmark: the benchmark's name in the run files (``learning/<script>``).
        command: the command line the run files record.
        common: keyword arguments of every run, recorded in each run file's ``meta``.
        arm_key: the keyword that names the arm to ``function`` and in the records.
        label: what the progress line says is raced (an env, a game).

    Returns:
        Every run's record, with its arm, ``seed`` and ``load_before``, in the order run.
    """
    from vecaccel.bench.record import RunRecord, load_result
    from vecaccel.bench.seeds import run_seeds

    def stored(arm: Mapping[str, Any], seed: int) -> dict[str, Any] | None:
        path = run_path(arm[arm_key], seed)
        if path.exists():
            return dict(load_result(path)["results"][0])
        print(f"race: {arm[arm_key]} {label} seed {seed} ...", flush=True)
        return None

    def keep(run: dict[str, Any]) -> None:
        path = run_path(run[arm_key], run["seed"])
        path.parent.mkdir(parents=True, exist_ok=True)
        RunRecord(command, benchmark=benchmark).write(path, [run], **dict(common or {}))

    return run_seeds(
        script,
        function,
        seeds,
        [{arm_key: arm} for arm in arms],
        common=common,
        alternate=True,
        stored=stored,
        on_run=keep,
    )


def race_summary(
    runs: Sequence[Mapping[str, Any]], arms: Sequence[str], arm_key: str = "arm"
) -> dict[str, Any]:
    """Per arm: how many of its runs reached the score, the censored medians of the seconds
    and env steps to it (:func:`censored_median`) and the median steps per second.

    Example:
        >>> runs = [{"arm": "a", "reached": {"wall_s": 4.0, "step": 80}, "steps_per_s": 20.0}]
        >>> race_summary(runs, ["a"])["a"]["median_time_to_score_s"]
        4.0
    """
    summary: dict[str, Any] = {}
    for arm in arms:
        mine = [run for run in runs if run[arm_key] == arm]
        reached = [run for run in mine if run["reached"]]
        summary[arm] = {
            "reached": f"{len(reached)} of {len(mine)}",
            "median_time_to_score_s": censored_median(mine, "wall_s"),
            "median_steps_to_score": censored_median(mine, "step"),
            "median_steps_per_s": median([run["steps_per_s"] for run in mine]),
        }
    return summary


def time_ratios(summary: Mapping[str, Any], baseline: str) -> dict[str, float | None]:
    """Each arm's median time to score over ``baseline``'s (:func:`race_summary`'s figures),
    ``None`` where either is unknown.

    Example:
        >>> summary = {"fast": {"median_time_to_score_s": 50.0},
        ...            "slow": {"median_time_to_score_s": 200.0}}
        >>> time_ratios(summary, "slow")
        {'fast': 0.25}
    """
    slow = summary.get(baseline, {}).get("median_time_to_score_s")
    ratios: dict[str, float | None] = {}
    for arm, figures in summary.items():
        if arm == baseline or not isinstance(figures, Mapping):
            continue
        fast = figures.get("median_time_to_score_s")
        ratios[arm] = fast / slow if fast and slow else None
    return ratios


def iqm_interval(
    matrix: Sequence[Sequence[float]], reps: int = 2000, seed: int = 0
) -> tuple[float, list[float]]:
    """rliable's interquartile mean of a (seeds x tasks) matrix of normalised scores, with its
    95 % stratified bootstrap interval (Agarwal et al., 2021): ``(iqm, [low, high])``.

    The bootstrap draws from ``seed`` alone, so an arm's interval depends on its own scores,
    not on which other arms a report holds (rliable draws some resamples from numpy's global
    generator whatever its ``random_state`` says; that generator is seeded too).
    """
    import numpy as np
    from rliable import library, metrics

    def iqm(scores: Any) -> Any:
        return np.array([metrics.aggregate_iqm(scores)])

    np.random.seed(seed)
    points, intervals = library.get_interval_estimates(
        {"arm": np.asarray(matrix, dtype=np.float64)},
        iqm,
        reps=reps,
        random_state=np.random.RandomState(seed),
    )
    return float(points["arm"][0]), [float(intervals["arm"][0][0]), float(intervals["arm"][1][0])]


def up_to(curve: Sequence[Mapping[str, float]], budget: int) -> list[Mapping[str, float]]:
    """The points of ``curve`` within ``budget`` env steps."""
    return [point for point in curve if point["step"] <= budget]


def return_by(curve: Sequence[Mapping[str, float]], wall_s: float) -> float:
    """The curve's return at its last point within ``wall_s`` seconds (NaN before any)."""
    within = [point["return"] for point in curve if point["wall_s"] <= wall_s]
    return within[-1] if within else math.nan


def plot_seed_curves(
    step_axis: Any,
    wall_axis: Any,
    curves: Sequence[Sequence[Mapping[str, float]]],
    colour: str,
    label: str,
) -> None:
    """Draw one arm's runs on two matplotlib axes, the return against env steps and against
    wall-clock seconds: every seed thin, and bold the median over the seeds, point by point
    (as far as the shortest curve goes)."""
    if not curves:
        return
    for axis, key in ((step_axis, "step"), (wall_axis, "wall_s")):
        for curve in curves:
            xs = [point[key] for point in curve]
            axis.plot(xs, [point["return"] for point in curve], color=colour, lw=0.6, alpha=0.45)
        length = min(len(curve) for curve in curves)
        xs = [median([curve[i][key] for curve in curves]) for i in range(length)]
        ys = [median([curve[i]["return"] for curve in curves]) for i in range(length)]
        axis.plot(xs, ys, color=colour, lw=2.2, label=label)


def load_runs(folder: Path, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Every run file in ``folder`` (``*.json``, sorted by name): the ``meta`` entries
    ``keys``, the summary, the curve (``curve``), the load averages, the date and the file's
    name (``file``), one dict each."""
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        meta = payload["meta"]
        found.append(
            {
                **{key: meta[key] for key in keys},
                **payload["summary"],
                "curve": payload["results"],
                "load_average": meta.get("load_average"),
                "load_average_after": meta.get("load_average_after"),
                "date": meta.get("date"),
                "file": path.name,
            }
        )
    return found


def format_cell(value: float | None, digits: int = 1) -> str:
    """A number for a Markdown table: ``-`` for ``None`` or NaN, else with thousands commas.

    Example:
        >>> format_cell(2383.25), format_cell(math.nan), format_cell(0.5, 2)
        ('2,383.2', '-', '0.50')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"
