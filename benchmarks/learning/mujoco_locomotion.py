"""Gymnasium's MuJoCo locomotion tasks: vecaccel's PPO against CleanRL's and rl-zoo's published
returns at 1M env steps.

Every (setting, task, seed) is one run in a child process, and writes its own result file under
``--runs`` as soon as it ends: the return curve against env steps and against wall-clock
seconds, the score, the load average and the versions. ``run`` skips the runs whose file exists,
so it resumes where a stopped sitting left off; ``report`` builds the table, the rliable
aggregate and the curves from whatever run files exist.

The tasks are ``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``, ``Ant-v5`` and
``Humanoid-v5``, 1M env steps each, seeds 1, 2 and 3. ``--tasks Ant-v4 Humanoid-v4`` runs
those tasks' ``-v4`` versions too, the versions of the published returns, whose rows tell the
version's part in a score from the preset's (they stay out of the aggregate and the plot). The score is CleanRL's: the mean return
of the last 100 training episodes, in the env's own rewards (what ``RecordEpisodeStatistics``
sees under any normalisation).

The algorithm trains with one setting, named by ``--arm`` in the run files: PPO's preset
``--preset`` (:data:`PRESET`, the trainers' preset for MuJoCo; ``none`` for PPO's plain
defaults) with the settings ``--set KEY=VALUE`` give over it.

The published returns are at 1M steps on the ``-v4`` tasks: CleanRL's
``ppo_continuous_action.py``, 3 seeds (mean and standard deviation; it published no Ant row),
and rl-zoo's PPO (``normalize: true``, its tuned settings). ``HalfCheetah-v5`` keeps ``-v4``'s
dynamics and reward; on the others ``-v5`` pays the healthy reward only while the body is
healthy, Walker2d's feet share one friction, Ant always pays its contact cost and observes
contact forces, Humanoid pays a contact cost again: those comparisons are across versions. A task's reference is CleanRL's return, rl-zoo's for
Ant; the aggregate is rliable's interquartile mean of the scores over their references, with a
95 % stratified bootstrap interval, over the runs of the full budget.

Run (niced, in the background)::

    nice -n 19 python benchmarks/learning/mujoco_locomotion.py run --seeds 1 2 3
    python benchmarks/learning/mujoco_locomotion.py report

``pace`` times the preset on each task for ``--steps`` env steps (200k by default) and projects
a 1M-step run's wall-clock from its steady rate, against the goal of 5 minutes (HalfCheetah,
Hopper, Walker2d) or 10 (Ant, Humanoid) on 2 cores; beside it, the same projection for the run's
vector env stepped alone with random actions, the ceiling the envs leave. Run it on a quiet
machine::

    python benchmarks/learning/mujoco_locomotion.py pace --seeds 1 2

``--env-sources gymnasium envpool`` paces each task twice, alternating: from Gymnasium's envs (the
``ale`` source, the default) and from EnvPool's twins (``+envpool`` in the arm's name).

Run files go to ``benchmarks/results/mujoco_runs/``; the report to
``benchmarks/results/mujoco_locomotion.{json,md,png}``; the pace to
``benchmarks/results/mujoco_pace.json`` (its runs under ``mujoco_pace_runs/``). ``mujoco_race.py`` races the same
setting against CleanRL's script and SB3's PPO to a return.

The script is not ``mujoco.py``: Python searches a script's own folder first on import, where a
``mujoco.py`` would be imported in place of the ``mujoco`` package (and the child processes
import each benchmark script under its file's name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vecaccel.bench import RunRecord, command_line, run_in_child
from vecaccel.bench.learning import (
    WINDOW,
    ReturnCurve,
    format_cell,
    iqm_interval,
    learn_on_curve,
    load_runs,
    median,
    pace_summary,
    plot_seed_curves,
    run_race,
    steady_pace,
)
from vecaccel.bench.timing import measure
from vecaccel.trainers.config.settings import ENV_SOURCE_ALIASES, ENV_SOURCES

RESULTS = Path(__file__).resolve().parent.parent / "results"
RUNS = RESULTS / "mujoco_runs"
TASKS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
#: tasks run on request only (``--tasks``), to tell a version's part in a score from the preset's:
#: in the table, not in the aggregate or the plot
VERSION_CHECKS = ("Ant-v4", "Humanoid-v4")
STEPS = 1_000_000  # the published returns' budget
#: the PPO preset the benchmark trains with: the trainers' settings for MuJoCo
PRESET = "mujoco"
#: CleanRL's ppo_continuous_action.py at 1M steps, -v4 tasks, 3 seeds: (mean, std)
CLEANRL = {
    "HalfCheetah-v5": (1442.0, 46.0),
    "Hopper-v5": (2383.0, 272.0),
    "Walker2d-v5": (2288.0, 572.0),
    "Humanoid-v5": (716.0, 49.0),
    "Humanoid-v4": (716.0, 49.0),
}
#: rl-zoo's PPO at 1M steps, -v4 tasks
RL_ZOO = {
    "HalfCheetah-v5": 5819.0,
    "Hopper-v5": 2410.0,
    "Walker2d-v5": 3479.0,
    "Ant-v5": 1327.0,
    "Ant-v4": 1327.0,
}
#: each task's reference return, which its scores are normalised by: CleanRL's, rl-zoo's for Ant
REFERENCE = {
    task: CLEANRL[task][0] if task in CLEANRL else RL_ZOO[task] for task in TASKS + VERSION_CHECKS
}
#: the wall-clock a 1M-step run may take on 2 cores: the three lighter tasks, then Ant and Humanoid
WALL_GOAL_S = {
    "HalfCheetah-v5": 300.0,
    "Hopper-v5": 300.0,
    "Walker2d-v5": 300.0,
    "Ant-v5": 600.0,
    "Humanoid-v5": 600.0,
    "Ant-v4": 600.0,
    "Humanoid-v4": 600.0,
}


def run_file(runs: Path, arm: str, task: str, seed: int) -> Path:
    """Where the run's result lives."""
    return runs / f"{arm}-{task}-s{seed}.json"


def ppo_agent(
    env_id: str,
    preset: str,
    changes: dict[str, Any],
    seed: int,
) -> Any:
    """vecaccel's PPO on ``env_id`` with ``preset`` and ``changes`` over it, quiet."""
    from vecaccel.trainers import PPO

    return PPO(env_id, preset=preset, seed=seed, progress=False, tensorboard=False, **changes)


def check_preset(preset: str) -> str | None:
    """Why PPO cannot train with ``preset``, or ``None`` where it can (read without torch)."""
    from vecaccel.trainers.config import registry

    known = registry.get("ppo").load_presets()
    if preset == "none" or preset in known:
        return None
    return f"PPO has no preset {preset!r} (its presets: {', '.join(sorted(known))}, none)"


def one(
    arm: str,
    task: str,
    preset: str,
    changes: dict[str, Any],
    seed: int,
    steps: int,
    runs: str,
    command: str,
) -> str:
    """One run, written to its file; returns the file's path (called in a child process)."""
    curve = ReturnCurve(steps)
    outcome = learn_on_curve(ppo_agent(task, preset, changes, seed), steps, curve)
    path = run_file(Path(runs), arm, task, seed)
    summary = {key: outcome[key] for key in ("score", "episodes", "wall_s", "steps")}
    summary["steps_per_s"] = summary["steps"] / summary["wall_s"]
    RunRecord(command, benchmark="learning/mujoco_locomotion").write(
        path,
        outcome["curve"],
        summary=summary,
        arm=arm,
        task=task,
        seed=seed,
        total_steps=steps,
        preset=preset,
        changes=changes,
        config=outcome["config"],
    )
    return str(path)


def run(args: argparse.Namespace) -> int:
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    changes = dict(args.changes or [])
    for seed in args.seeds:  # seeds outermost: every task gets its first seed before any a second
        for task in args.tasks:
            path = run_file(runs, args.arm, task, seed)
            if path.exists():
                continue
            print(f"{args.arm} {task} seed {seed} ...", flush=True)
            started = time.perf_counter()
            kwargs = dict(
                arm=args.arm,
                task=task,
                preset=args.preset,
                changes=changes,
                seed=seed,
                steps=args.steps,
                runs=str(runs),
                command=command_line(),
            )
            run_in_child(__file__, "one", kwargs)
            print(f"  {path.name} in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


# -- the pace -------------------------------------------------------------------------------------


def pace_arm(task: str, env_source: str) -> str:
    """The name of a pace arm: the task, with the env source where it is not Gymnasium's envs
    one by one (``Hopper-v5``, ``Hopper-v5+envpool``)."""
    return task if env_source == "gymnasium" else f"{task}+{env_source}"


def pace_one(task: str, seed: int, steps: int, ceiling_s: float) -> dict[str, Any]:
    """One run of ``pace`` (called in a child process) of the arm ``task`` (see
    :func:`pace_arm`): the preset's vector env stepped alone with random actions for
    ``ceiling_s`` seconds (the run's ceiling), then the preset trained for ``steps`` env steps,
    timed, with the wall-clock of a full run projected from its steady rate."""
    task, _, env_source = task.partition("+")
    changes = {"env_source": env_source} if env_source else {}
    probe = ppo_agent(task, PRESET, changes, seed)
    try:
        envs = probe.env
        ceiling, _ = measure(
            "vecaccel", lambda: envs, envs.num_envs, ceiling_s, warmup=ceiling_s / 10, seed=seed
        )
    finally:
        probe.close()
    outcome = learn_on_curve(ppo_agent(task, PRESET, changes, seed), steps, ReturnCurve(steps))
    outcome.pop("config")
    paced = steady_pace(outcome, STEPS)
    paced.pop("curve")
    paced["env_steps_per_s"] = ceiling
    paced["env_source"] = env_source or "gymnasium"
    return paced


def pace(args: argparse.Namespace) -> dict[str, Any]:
    """The preset on each task from each env source (``--env-sources``) for ``--steps`` env
    steps, seed by seed with the arms' order turning; per arm, the median steady rate, the
    wall-clock of a 1M-step run projected from it against the task's goal, and the same
    projection for the vector env alone."""
    record = RunRecord(command_line(), benchmark="learning/mujoco_locomotion")
    folder = Path(args.out) / "mujoco_pace_runs"
    common = dict(steps=args.steps, ceiling_s=args.ceiling_s)
    arms = [pace_arm(task, source) for task in args.tasks for source in args.env_sources]
    runs = run_race(
        __file__,
        "pace_one",
        args.seeds,
        arms,
        lambda task, seed: folder / f"{task}-steps{args.steps}-s{seed}.json",
        benchmark="learning/mujoco_locomotion",
        command=command_line(),
        common=common,
        arm_key="task",
        label="pace",
    )
    summary = pace_summary(runs, "task", arms)
    for arm, row in summary.items():
        env_only = [STEPS / run["env_steps_per_s"] for run in runs if run["task"] == arm]
        row["median_env_only_wall_s"] = median(env_only)
        row["goal_wall_s"] = WALL_GOAL_S[arm.partition("+")[0]]
        row["goal_met"] = row["median_projected_wall_s"] <= row["goal_wall_s"]
    return record.write(Path(args.out) / "mujoco_pace.json", runs, summary=summary, **common)


# -- the report -----------------------------------------------------------------------------------


def _by_arm(found: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The runs grouped by (arm, task), in the tasks' order."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    order = {task: index for index, task in enumerate(TASKS + VERSION_CHECKS)}
    for entry in sorted(found, key=lambda e: (e["arm"], order.get(e["task"], 99), e["seed"])):
        groups.setdefault((entry["arm"], entry["task"]), []).append(entry)
    return groups


def score_table(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (arm, task): the seeds' scores, their mean, standard deviation and median,
    and the published returns."""
    rows = []
    for (arm, task), entries in _by_arm(found).items():
        scores = [entry["score"] for entry in entries]
        rows.append(
            {
                "arm": arm,
                "task": task,
                "seeds": [entry["seed"] for entry in entries],
                "scores": scores,
                "mean": statistics.fmean(scores),
                "std": statistics.pstdev(scores),
                "median": median(scores),
                "cleanrl": CLEANRL.get(task, (None, None))[0],
                "cleanrl_std": CLEANRL.get(task, (None, None))[1],
                "rl_zoo": RL_ZOO.get(task),
                "steps": min(entry["steps"] for entry in entries),
                "wall_s": median([entry["wall_s"] for entry in entries]),
                "steps_per_s": median([entry["steps_per_s"] for entry in entries]),
            }
        )
    return rows


def aggregate(found: list[dict[str, Any]], reps: int = 2000, budget: int = STEPS) -> dict[str, Any]:
    """Per arm, rliable's IQM of its scores over each task's :data:`REFERENCE`, with a 95 %
    stratified bootstrap interval, over the seeds every one of its tasks has; only runs of
    ``budget`` steps count (a score at 100k steps says nothing against one at 1M)."""
    arms: dict[str, dict[str, dict[int, float]]] = {}
    for entry in found:
        if entry["steps"] >= budget and entry["task"] in TASKS:
            tasks = arms.setdefault(entry["arm"], {})
            tasks.setdefault(entry["task"], {})[entry["seed"]] = entry["score"]
    summary = {}
    for arm, tasks in arms.items():
        seeds = sorted(set.intersection(*(set(by_seed) for by_seed in tasks.values())))
        if not seeds:
            continue
        names = [task for task in TASKS if task in tasks]
        matrix = [[tasks[task][seed] / REFERENCE[task] for task in names] for seed in seeds]
        iqm, ci95 = iqm_interval(matrix, reps)
        summary[arm] = {"tasks": names, "seeds": seeds, "iqm": iqm, "ci95": ci95}
    return summary


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], found: Sequence[Any]) -> str:
    """The report as Markdown: which runs it holds, the scores table, then the aggregate."""
    lines = [f"{len(found)} run files."]
    for index, arm in enumerate(sorted({entry["arm"] for entry in found})):
        seeds = {task: sorted(e["seed"] for e in found if (e["arm"], e["task"]) == (arm, task))
                 for task in TASKS + VERSION_CHECKS}  # fmt: skip
        ran = [f"{task} seed{'s' * (len(of) > 1)} {', '.join(map(str, of))}"
               for task, of in seeds.items() if of]  # fmt: skip
        missing = [task for task, of in seeds.items() if not of and task in TASKS]
        lines += [""] if index == 0 else []
        lines.append(
            f"- {arm}: {'; '.join(ran)}" + (f"; no run of {', '.join(missing)}" if missing else "")
        )
    lines += [
        "",
        "| setting | task | seeds | score per seed | mean ± std | CleanRL (v4) | rl-zoo (v4) | "
        "steps | wall-clock (median) | steps/s |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        cleanrl = (
            "-"
            if row["cleanrl"] is None
            else f"{format_cell(row['cleanrl'], 0)} ± {format_cell(row['cleanrl_std'], 0)}"
        )
        lines.append(
            f"| {row['arm']} | {row['task']} | {len(row['seeds'])} | "
            f"{', '.join(format_cell(score, 0) for score in row['scores'])} | "
            f"{format_cell(row['mean'], 0)} ± {format_cell(row['std'], 0)} | {cleanrl} | "
            f"{format_cell(row['rl_zoo'], 0)} | {row['steps'] / 1e6:.2f}M | "
            f"{format_cell(row['wall_s'] / 60)} min | {format_cell(row['steps_per_s'], 0)} |"
        )
    lines += [
        "",
        "| setting | tasks | seeds | IQM of score / reference | 95 % CI |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for arm, figures in summary.items():
        low, high = figures["ci95"]
        lines.append(
            f"| {arm} | {', '.join(figures['tasks'])} | {', '.join(map(str, figures['seeds']))} | "
            f"{figures['iqm']:.2f} | {low:.2f} - {high:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(found: list[dict[str, Any]], path: Path) -> None:
    """The return against env steps (top) and wall-clock seconds (bottom), one column per task:
    every seed thin, each setting's median bold, the published returns as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    figure, axes = plt.subplots(2, len(TASKS), figsize=(4.2 * len(TASKS), 7), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    arms = sorted({entry["arm"] for entry in found})
    groups = _by_arm(found)
    budget = max(entry["total_steps"] for entry in found)
    for column, task in enumerate(TASKS):
        step_axis, wall_axis = axes[0][column], axes[1][column]
        for colour, arm in zip(colours, arms):
            entries = groups.get((arm, task), [])
            label = f"{arm} ({len(entries)} seeds)"
            plot_seed_curves(step_axis, wall_axis, [e["curve"] for e in entries], colour, label)
        for axis in (step_axis, wall_axis):
            if task in CLEANRL:
                axis.axhline(CLEANRL[task][0], color="black", ls="--", lw=1, label="CleanRL (v4)")
            if task in RL_ZOO:
                axis.axhline(RL_ZOO[task], color="black", ls=":", lw=1, label="rl-zoo (v4)")
            axis.xaxis.set_major_locator(MaxNLocator(nbins=5))
            axis.grid(alpha=0.3)
        step_axis.set_xlim(0, budget)
        step_axis.xaxis.set_major_formatter(EngFormatter(sep=""))
        step_axis.set_title(task)
        step_axis.set_xlabel("env steps")
        wall_axis.set_xlabel("wall-clock seconds")
    for row in range(2):
        axes[row][0].set_ylabel(f"mean return, last {WINDOW} episodes")
    # one legend for the figure: a setting may have runs on some tasks only
    labelled = {}
    for axis in axes.flat:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            labelled.setdefault(label, handle)
    figure.legend(labelled.values(), labelled.keys(), loc="lower center", ncol=len(labelled))
    figure.suptitle(
        "MuJoCo -v5: return against env steps and wall-clock (thin: seeds, bold: median)"
    )
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(path, dpi=90)
    plt.close(figure)


def write_report(
    runs: Path, out: Path, command: str, budget: int = STEPS, reps: int = 2000
) -> dict[str, Any]:
    """``mujoco_locomotion.md``, ``.json`` and ``.png`` in ``out`` from the run files in
    ``runs`` (the Markdown alone where there are none); ``budget`` is the published one, which
    the aggregate needs, and ``reps`` its bootstrap's resamples."""
    found = load_runs(runs, ("arm", "task", "seed", "total_steps")) if runs.exists() else []
    rows = score_table(found)
    summary = aggregate(found, reps, budget)
    (out / "mujoco_locomotion.md").write_text(markdown(rows, summary, found), encoding="utf-8")
    record = RunRecord(command, benchmark="learning/mujoco_locomotion")
    if not found:
        # the Markdown says so; a result file holds measured rows only
        return {"meta": record.meta(), "results": []}
    payload = record.write(
        out / "mujoco_locomotion.json",
        rows,
        summary={"iqm": summary} if summary else None,
        runs=[entry["file"] for entry in found],
        cleanrl=CLEANRL,
        rl_zoo=RL_ZOO,
        reference=REFERENCE,
        published_steps=budget,
        window=WINDOW,
    )
    plot(found, out / "mujoco_locomotion.png")
    return payload


def main(argv: Sequence[str] | None = None) -> int:
    from vecaccel.trainers.cli.flags import parse_backend_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="train the runs whose result file is missing")
    runner.add_argument(
        "--tasks",
        nargs="+",
        choices=TASKS + VERSION_CHECKS,
        default=list(TASKS),
        help="the tasks (default: the five -v5 ones; the -v4 checks on request)",
    )
    runner.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    runner.add_argument("--steps", type=int, default=STEPS, help="env steps a run")
    runner.add_argument(
        "--preset", default=PRESET, help="PPO's preset (default: %(default)s; none: PPO's defaults)"
    )
    runner.add_argument(
        "--set",
        dest="changes",
        action="append",
        type=parse_backend_option,
        metavar="KEY=VALUE",
        help="a PPO setting over the preset, repeatable (num_envs=16); VALUE a Python literal",
    )
    runner.add_argument(
        "--arm", help="the setting's name in the run files (default: the preset's name)"
    )
    runner.add_argument("--runs", default=str(RUNS), help="folder of the run files")
    pacer = commands.add_parser(
        "pace", help="time the preset on each task and project a 1M-step run's wall-clock"
    )
    pacer.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    pacer.add_argument("--seeds", nargs="+", type=int, default=[1])
    pacer.add_argument("--steps", type=int, default=200_000, help="env steps a run")
    pacer.add_argument(
        "--ceiling-s", type=float, default=10.0, help="seconds the vector env steps alone"
    )
    pacer.add_argument(
        "--env-sources",
        nargs="+",
        type=lambda name: ENV_SOURCE_ALIASES.get(name, name),
        choices=ENV_SOURCES,
        default=["gymnasium"],
        help="where the envs come from: gymnasium, Gymnasium's envs one by one (the default); "
        "envpool, EnvPool's twins (pip install 'vecaccel[envpool]')",
    )
    pacer.add_argument("--out", default=str(RESULTS), help="folder of mujoco_pace.json")
    reporter = commands.add_parser("report", help="table, rliable aggregate and curves")
    reporter.add_argument("--runs", default=str(RUNS), help="folder of the run files")
    reporter.add_argument("--out", default=str(RESULTS), help="folder of the report")
    args = parser.parse_args(argv)
    if args.command == "run":
        refused = check_preset(args.preset)
        if refused:
            parser.error(refused)
        args.arm = args.arm or args.preset
        return run(args)
    if args.command == "pace":
        print(json.dumps(pace(args)["summary"], indent=1))
        return 0
    write_report(Path(args.runs), Path(args.out), command_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
