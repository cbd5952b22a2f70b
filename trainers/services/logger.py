"""The run logger: metrics to a CSV, TensorBoard and a progress bar, and the learning curve.

TensorBoard, tqdm and matplotlib are optional (``pip install vecaccel[train]`` brings them):
without one, the run goes on without its event files, bar or plot, and says so once. The run's
config goes to TensorBoard as hyperparameters (:meth:`RunLogger.log_hparams`), and with
tracking on (:meth:`RunLogger.start_tracking`, :mod:`vecaccel.trainers.services.tracking`)
every row, the curve and the run's videos go to Weights & Biases as well.

A run directory is never overwritten by accident: a new run refuses a directory that holds
another run (:func:`check_run_dir`), as CleanRL's and SB3's logs get a new directory per run.
A resumed run continues its own files.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vecaccel.trainers.services.env_timing import verdict_of
from vecaccel.trainers.services.tracking import WandbTracker, hparam_value

__all__ = [
    "RUN_FILES",
    "RunDirInUseError",
    "RunLogger",
    "check_run_dir",
    "draw_learning_curve",
    "is_interactive",
    "mean_or_none",
    "plot_learning_curve",
    "refuse_used_run_dir",
    "unused_run_dir",
]

#: What a run writes in its directory (the checkpoint, the CSV, the curve, TensorBoard's
#: folder): a directory holding any of them holds a run.
RUN_FILES = (
    "checkpoint.pt",
    "metrics.csv",
    "learning_curve.png",
    "tb",
    "config.json",
    "best.pt",
)

#: The replay buffers a DQN-family checkpoint names (``checkpoint.replay-<step>-<id>.npz``),
#: removed with the run they belong to.
_REPLAY_FILES = "checkpoint.replay-*.npz"

#: The video files a tracked run sends when it ends, found under its run directory.
VIDEO_SUFFIXES = (".mp4", ".gif", ".webm")

#: The metrics TensorBoard's HPARAMS tab shows beside a run's hyperparameters (scalars the
#: run writes under these tags).
HPARAM_METRICS = ("charts/episodic_return", "charts/SPS")

#: The run directories this process's runs wrote: a later run of the same process (a second
#: ``learn()``) goes on writing there.
_RUN_DIRS_OF_THIS_PROCESS: set[Path] = set()


def is_interactive() -> bool:
    """Whether a person is watching this process: its stderr is a terminal, or it runs in a
    Jupyter (IPython) kernel. Where it is not (a pipe, a CI log, a test), a progress bar would
    only fill the log.

    Example:
        >>> isinstance(is_interactive(), bool)
        True
    """
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # a replaced or closed stream
        pass
    shell = sys.modules.get("IPython")
    get_ipython = getattr(shell, "get_ipython", None)
    kernel = get_ipython() if get_ipython is not None else None
    return kernel is not None and "IPKernelApp" in getattr(kernel, "config", {})


class RunDirInUseError(FileExistsError):
    """A new run was given a directory that already holds another run.

    Attributes:
        run_dir: the directory.
        files: the run's files found there (names, ``tb/`` for TensorBoard's folder).
    """

    def __init__(self, run_dir: Path, files: list[str]) -> None:
        self.run_dir, self.files = run_dir, files
        checkpoint = str(run_dir / "checkpoint.pt")
        super().__init__(
            f"{run_dir} already holds a run ({', '.join(files)}): a new run there would "
            f"overwrite it. Pass another run_dir, continue that run with ALGO.load("
            f"{checkpoint!r}, run_dir={str(run_dir)!r}).learn(steps), or remove its files"
        )


def _run_files(run_dir: Path) -> list[str]:
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    return [f"{name}/" if (run_dir / name).is_dir() else name for name in found]


def check_run_dir(run_dir: str | os.PathLike[str], overwrite: bool = False) -> None:
    """Make sure a new run may write to ``run_dir``.

    A directory that does not exist, is empty or holds other files is free. One that holds a
    run's files (:data:`RUN_FILES`) is refused, or, with ``overwrite``, emptied of them and of
    the replay buffers its checkpoint named (other files stay), so the new run's TensorBoard
    curves do not mix with the old ones.

    Raises:
        RunDirInUseError: if ``run_dir`` holds another run and ``overwrite`` is false.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = (Path(folder) / "metrics.csv").write_text("step,time\\n")
        ...     try:
        ...         check_run_dir(folder)
        ...     except RunDirInUseError as error:
        ...         print(error.files)
        ...     check_run_dir(folder, overwrite=True)
        ...     sorted(Path(folder).iterdir())
        ['metrics.csv']
        []
    """
    path = Path(run_dir)
    if not path.is_dir():
        return
    files = _run_files(path)
    if not files:
        return
    if not overwrite:
        raise RunDirInUseError(path, files)
    for target in [*(path / name for name in RUN_FILES), *path.glob(_REPLAY_FILES)]:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def refuse_used_run_dir(run_dir: str | os.PathLike[str], overwrite: bool = False) -> str | None:
    """``vecaccel train``'s ``error:`` line for a new run into a directory holding a run.

    :func:`check_run_dir` for the command line: ``None`` when the run may go on (with
    ``overwrite``, once the earlier run's files are removed), else the line naming the ways on.
    Under ``torchrun`` only rank 0 looks (the other ranks write nothing).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = (Path(folder) / "checkpoint.pt").write_bytes(b"")
        ...     print(refuse_used_run_dir(folder).replace(folder, "runs/a"))
        error: runs/a already holds a run (checkpoint.pt); continue it with --resume runs/a, give a new --run-dir, or pass --overwrite to replace it
    """
    if os.environ.get("RANK", "0") != "0":
        return None
    try:
        check_run_dir(run_dir, overwrite=overwrite)
    except RunDirInUseError as error:
        return (
            f"error: {run_dir} already holds a run ({', '.join(error.files)}); continue it "
            f"with --resume {run_dir}, give a new --run-dir, or pass --overwrite to replace it"
        )
    return None


def unused_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``run_dir``, or ``run_dir-2``, ``run_dir-3``... the first that holds no run.

    For run directories named after the time: two runs started in the same second get two.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     run = Path(folder) / "ppo-CartPole-v1-1-20260101-120000"
        ...     run.mkdir()
        ...     _ = (run / "checkpoint.pt").write_bytes(b"")
        ...     unused_run_dir(run).name
        'ppo-CartPole-v1-1-20260101-120000-2'
    """
    path = Path(run_dir)
    candidate, k = path, 1
    while candidate.is_dir() and _run_files(candidate):
        k += 1
        candidate = path.with_name(f"{path.name}-{k}")
    return candidate


#: what each optional package adds to a run, for the line said when it is missing
_OPTIONAL = {
    "tensorboard": "TensorBoard event files",
    "tqdm": "progress bar",
    "matplotlib": "learning_curve.png",
}
_missing_said: set[str] = set()


def _say_missing(package: str) -> None:
    """Say, once per process, that ``package`` is not installed and what the run goes without."""
    if package in _missing_said:
        return
    _missing_said.add(package)
    print(
        f"{package} is not installed: no {_OPTIONAL[package]} (pip install {package}, or "
        "pip install 'vecaccel[train]' for every training extra)",
        file=sys.stderr,
    )


class RunLogger:
    """Metrics to TensorBoard, a ``metrics.csv`` and a live progress bar; a PNG curve at the end.

    Every :meth:`log` call writes one CSV row (a ``step`` and ``time`` column plus the metrics;
    a new metric key rewrites the header) and one scalar per metric to TensorBoard. The tqdm bar
    shows steps, steps/s, the recent episodic return and the ETA.

    Args:
        run_dir: directory for ``metrics.csv``, ``tb/`` and ``learning_curve.png``; ``None``
            keeps metrics in memory only (:attr:`history`) and writes no files.
        total_timesteps: the step budget, for the bar and the ETA.
        use_tensorboard: write TensorBoard event files under ``run_dir/tb``.
        progress: show a tqdm progress bar (on stderr).
        resume_step: when resuming, keep only the CSV rows up to this step (rows a crashed run
            wrote after its last checkpoint are dropped, and TensorBoard purges them too).
            ``None``: a new run, which refuses a ``run_dir`` that holds another run.

    Raises:
        RunDirInUseError: for a new run in a directory that holds a run this process did not
            write, before anything is written there.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as run_dir:
        ...     logger = RunLogger(run_dir, 100, use_tensorboard=False, progress=False)
        ...     logger.log(50, {"charts/episodic_return": 10.0})
        ...     _ = logger.close()
        ...     sorted(p.name for p in Path(run_dir).iterdir())
        ['learning_curve.png', 'metrics.csv']
    """

    RETURN_KEY = "charts/episodic_return"

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None,
        total_timesteps: int,
        use_tensorboard: bool = True,
        progress: bool = True,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.total_timesteps = int(total_timesteps)
        self.resume_step = resume_step
        #: the W&B run this logger feeds (:meth:`start_tracking`), if any
        self.tracker: WandbTracker | None = None
        # videos written after this moment are the run's own
        self._opened_at = time.time()
        self.csv_path: Path | None = None
        self.curve_path: Path | None = None
        if self.run_dir is not None:
            # a later learn() of this process's run (an off-policy one counting from zero
            # again, say) goes on writing where it wrote
            if resume_step is None and self.run_dir.resolve() not in _RUN_DIRS_OF_THIS_PROCESS:
                check_run_dir(self.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            _RUN_DIRS_OF_THIS_PROCESS.add(self.run_dir.resolve())
            self.csv_path = self.run_dir / "metrics.csv"
            self.curve_path = self.run_dir / "learning_curve.png"
        self._rows: list[dict[str, Any]] = []
        self._recorded: dict[str, Any] = {}
        self._keys: list[str] = ["step", "time"]
        self._time_offset = 0.0
        self._start_step = 0
        if resume_step is not None and self.csv_path is not None and self.csv_path.exists():
            self._load_rows(resume_step)
        self._recent_returns: deque[float] = deque(maxlen=20)
        self._last_step = self._start_step
        self._closed = False
        self._csv_file = None
        self._csv_writer: csv.DictWriter | None = None
        self._rewrite_csv()
        self._writer = None
        if use_tensorboard and self.run_dir is not None:
            try:  # ImportError, not only ModuleNotFoundError: torch's module checks the version
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                _say_missing("tensorboard")
            else:
                self._writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step)
        # wall-clock starts after the slow TensorBoard import
        self._start_time = time.perf_counter()
        self._bar = None
        tqdm = None
        if progress:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                _say_missing("tqdm")
        if tqdm is not None:
            self._bar = tqdm(
                total=self.total_timesteps,
                initial=min(self._start_step, self.total_timesteps),
                unit="step",
                unit_scale=True,
                dynamic_ncols=True,
                smoothing=0.05,
            )

    def _load_rows(self, resume_step: int) -> None:
        with open(self.csv_path, newline="") as file:
            reader = csv.DictReader(file)
            for name in reader.fieldnames or []:
                if name not in self._keys:
                    self._keys.append(name)
            for row in reader:
                try:
                    step = int(float(row["step"]))
                except (KeyError, TypeError, ValueError):
                    continue
                if step > resume_step:
                    continue
                self._rows.append({k: v for k, v in row.items() if v not in ("", None)})
                self._time_offset = float(row.get("time") or self._time_offset)
                self._start_step = step

    def _rewrite_csv(self) -> None:
        if self.csv_path is None:
            return
        if self._csv_file is not None:
            self._csv_file.close()
        self._csv_file = open(self.csv_path, "w", newline="")
        self._csv_writer = csv.DictWriter(self._csv_file, fieldnames=self._keys)
        self._csv_writer.writeheader()
        self._csv_writer.writerows(self._rows)
        self._csv_file.flush()

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every row logged so far (and kept from before a resume), oldest first."""
        return self._rows

    @property
    def elapsed(self) -> float:
        """Seconds of training so far, including the time before a resume."""
        return self._time_offset + time.perf_counter() - self._start_time

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at environment step ``step``.

        Args:
            step: the global environment-step count.
            metrics: metric name to number (``charts/...``, ``losses/...``); ``None`` values
                and NaNs are skipped.
        """
        if self._recorded:
            metrics = {**self._recorded, **metrics}
            self._recorded = {}
        clean = {}
        for key, value in metrics.items():
            if value is None:
                continue
            value = float(value)
            if math.isnan(value):
                continue
            clean[key] = value
        row: dict[str, Any] = {"step": int(step), "time": round(self.elapsed, 3), **clean}
        self._rows.append(row)
        if any(key not in self._keys for key in clean):
            self._keys.extend(key for key in clean if key not in self._keys)
            self._rewrite_csv()
        elif self._csv_writer is not None and self._csv_file is not None:
            self._csv_writer.writerow(row)
            self._csv_file.flush()
        if self._writer is not None:
            for key, value in clean.items():
                self._writer.add_scalar(key, value, int(step))
        if self.tracker is not None:
            self.tracker.log(int(step), clean)
        if self.RETURN_KEY in clean:
            self._recent_returns.append(clean[self.RETURN_KEY])
        if self._bar is not None:
            self._bar.update(max(0, min(int(step), self.total_timesteps) - self._bar.n))
            postfix = {}
            if "charts/SPS" in clean:
                postfix["SPS"] = f"{clean['charts/SPS']:.0f}"
            if self._recent_returns:
                postfix["return"] = f"{np.mean(self._recent_returns):.1f}"
            bound = verdict_of(clean)
            if bound is not None:  # what the run waits on: env, policy or transport
                postfix["bound"] = bound
            self._bar.set_postfix(postfix, refresh=False)
        self._last_step = int(step)

    def log_hparams(self, config: Mapping[str, Any]) -> None:
        """Write the run's settings to TensorBoard as hyperparameters (its HPARAMS tab).

        They go into the run's own event file (``run_dir/tb``), beside its scalars, which
        ``SummaryWriter.add_hparams`` would put in a second run folder of their own. Values
        that are no number or string are written as their ``repr``
        (:func:`~vecaccel.trainers.services.tracking.hparam_value`). Without TensorBoard this
        does nothing.

        Args:
            config: setting name to value (the algorithm's config, its name, the step budget).
        """
        if self._writer is None:
            return
        from torch.utils.tensorboard.summary import hparams

        values = {key: hparam_value(value) for key, value in config.items()}
        # the metrics are named, not given values: the HPARAMS tab reads the run's own scalars
        summaries = hparams(values, {key: 0.0 for key in HPARAM_METRICS})
        step = self.resume_step or 0
        for summary in summaries:
            self._writer.file_writer.add_summary(summary, step)
        self._writer.flush()

    def start_tracking(
        self, config: Mapping[str, Any], project: str, entity: str | None = None
    ) -> WandbTracker:
        """Open a Weights & Biases run with ``config`` that every later row goes to, and the
        learning curve and the run's videos when the logger closes.

        Call it on the rank that logs (rank 0). A resumed logger (``resume_step``) continues
        the W&B run its run directory recorded.

        Args:
            config: the run's resolved settings, for ``wandb.init(config=...)``.
            project: the W&B project.
            entity: the W&B team or user (``None``: the login's default).

        Returns:
            The tracker, also :attr:`tracker`.

        Raises:
            ModuleNotFoundError: wandb is not installed; the message names
                ``pip install 'vecaccel[track]'``.
        """
        if self.tracker is None:
            self.tracker = WandbTracker(
                config,
                project=project,
                entity=entity,
                run_dir=self.run_dir,
                resume=self.resume_step is not None,
            )
        return self.tracker

    def log_video(
        self, path: str | os.PathLike[str], step: int | None = None, key: str = "videos"
    ) -> None:
        """Send the video file at ``path`` to the tracker under ``key`` at env step ``step``
        (``None``: the last step logged); without tracking this does nothing. Videos the run
        writes under its run directory are sent when it ends without this call."""
        if self.tracker is not None:
            self.tracker.log_video(key, path, self._last_step if step is None else int(step))

    def _run_videos(self) -> list[Path]:
        """The video files written under the run directory since this logger opened (W&B's
        own folder aside), oldest first."""
        if self.run_dir is None:
            return []
        found = []
        for path in self.run_dir.rglob("*"):
            inside_wandb = "wandb" in path.relative_to(self.run_dir).parts[:-1]
            if path.suffix.lower() not in VIDEO_SUFFIXES or inside_wandb or not path.is_file():
                continue
            try:
                written = path.stat().st_mtime
            except OSError:  # removed since it was listed
                continue
            if written >= self._opened_at:
                found.append((written, path))
        return [path for _, path in sorted(found)]

    def record(self, key: str, value: Any, exclude: Any = None) -> None:
        """Add ``key`` to the next row written (SB3's ``Logger.record``, which SB3 callbacks
        such as ``EvalCallback`` call); a value that is no number is left out."""
        if isinstance(value, (int, float, np.integer, np.floating)):
            self._recorded[key] = float(value)

    def dump(self, step: int = 0) -> None:
        """Write the values :meth:`record` holds as a row at ``step`` (SB3's ``Logger.dump``)."""
        if self._recorded:
            self.log(step, {})

    def write(self, message: str) -> None:
        """Print a line without breaking the progress bar."""
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message)

    def close(self) -> Path | None:
        """Flush everything, close the bar, and draw ``learning_curve.png`` from the CSV.

        Returns:
            The path of the PNG, or ``None`` if no episodic return was logged.
        """
        if self._closed:
            return self.curve_path if self.curve_path and self.curve_path.exists() else None
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
        if self._csv_file is not None:
            self._csv_file.close()
        # in a finally block while an exception propagates: the tracked run is marked failed
        failed = sys.exc_info()[0] is not None
        curve = None
        try:
            if self.csv_path is not None and self.curve_path is not None:
                curve = plot_learning_curve(self.csv_path, self.curve_path)
            if self.tracker is not None:
                if curve is not None:
                    self.tracker.log_image("charts/learning_curve", curve, self._last_step)
                for video in self._run_videos():
                    self.tracker.log_video("videos", video, self._last_step)
        finally:
            if self.tracker is not None:
                self.tracker.finish(failed=failed)
        return curve

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def plot_learning_curve(
    csv_path: str | os.PathLike[str],
    png_path: str | os.PathLike[str],
    key: str = RunLogger.RETURN_KEY,
    title: str | None = None,
) -> Path | None:
    """Draw ``key`` against environment steps and against wall-clock time from a metrics CSV.

    Returns:
        ``png_path``, or ``None`` (and no file) if the CSV holds no value for ``key`` or
        matplotlib is not installed.
    """
    steps, times, values = [], [], []
    with open(csv_path, newline="") as file:
        for row in csv.DictReader(file):
            if row.get(key) not in (None, ""):
                steps.append(float(row["step"]))
                times.append(float(row.get("time") or 0.0))
                values.append(float(row[key]))
    if not values:
        return None
    try:
        import matplotlib
    except ImportError:
        _say_missing("matplotlib")
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = draw_learning_curve(steps, times, values, key.split("/")[-1].replace("_", " "))
    figure.suptitle(title or Path(csv_path).parent.name)
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return Path(png_path)


def draw_learning_curve(
    steps: Sequence[float], times: Sequence[float], values: Sequence[float], label: str
) -> Any:
    """The figure :func:`plot_learning_curve` saves: ``values`` (raw, thin, and a moving
    average) against environment steps and against seconds; the caller closes it.

    The step axis reads in engineering notation (``75k``, ``1.2M``) with at most 7 ticks:
    matplotlib's default writes every digit (``125000``) and picks how many ticks from the
    font size alone, so six-digit labels ran into each other.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, MaxNLocator

    smooth = _moving_average(list(values), max(1, len(values) // 50))
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    for axis, xs, name in ((axes[0], steps, "environment steps"), (axes[1], times, "seconds")):
        axis.plot(xs, values, alpha=0.3, linewidth=0.8, color="tab:blue")
        axis.plot(xs, smooth, linewidth=1.6, color="tab:blue")
        axis.xaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        axis.set_xlabel(name)
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0].xaxis.set_major_formatter(EngFormatter(sep=""))
    return figure


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total, queue = [], 0.0, deque()
    for value in values:
        queue.append(value)
        total += value
        if len(queue) > window:
            total -= queue.popleft()
        out.append(total / len(queue))
    return out


def mean_or_none(values: Iterable[float]) -> float | None:
    """Mean of ``values``, or ``None`` when there are none."""
    values = list(values)
    return float(np.mean(values)) if values else None
