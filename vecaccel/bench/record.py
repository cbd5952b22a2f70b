"""The run record and the one result format of vecaccel's benchmarks.

Every script under ``benchmarks/`` records its run with a :class:`RunRecord` and writes one JSON
file:

.. code-block:: text

    {
      "meta": {
        "format": 1,                    # RESULT_FORMAT
        "benchmark": "learning/cartpole",  # benchmarks/<subject>/<name>.py, or "vecaccel bench"
        "date": "2026-12-03T08:00:00+0000",   # when the run started
        "command": "python benchmarks/learning/cartpole.py --seeds 1 2 3",
        "python": ..., "platform": ..., "processor": ..., "cpu_model": ...,
        "cpu_count": ..., "usable_cpus": ...,   # the machine (machine_info)
        "versions": {"vecaccel": ..., "gymnasium": ..., ...},
        "load_average": [1.2, 0.9, 0.8],        # 1, 5, 15 minutes, when the run started
        "load_average_after": [2.0, 1.1, 0.9],  # when the file was written
        "ceilings": [{"env": ..., "steps_per_s": ..., "processes": ...}, ...],
        ...                                     # the script's own settings
      },
      "results": [{...}, ...],   # one object per measured row (a configuration, a run, a seed)
      "summary": ...             # optional: what the script derives from the rows
    }

``meta`` holds how, where and when; ``results`` what was measured, one flat object per row;
``summary`` the headline figures (any JSON value), recomputable from ``results``. A ceiling is
one process per usable CPU, each stepping its own raw env, summed
(:func:`~vecaccel.bench.ceiling.measure_ceiling`): one entry per env (and trial) measured in the
run; benchmarks that measure none leave the list empty. Where a benchmark of batched simulators
measures one native vector env per process instead, its entries say so (``vector_env``) with
the envs they held (``num_envs``).

Files of format 0 have the same ``meta`` and ``results`` keys, their ceilings among the rows
only; :func:`load_result` reads both formats.

Example:
    >>> import pathlib, tempfile
    >>> record = RunRecord("python benchmarks/waiting/spin_vs_block.py --seconds 3")
    >>> record.add_ceiling("CartPole-v1", 250_000.0, 2)
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "result.json"
    >>> payload = record.write(path, [{"impl": "shm", "steps_per_s": 1000.0}], seconds=3)
    >>> loaded = load_result(path)
    >>> loaded["meta"]["command"], loaded["meta"]["seconds"], loaded["results"][0]["impl"]
    ('python benchmarks/waiting/spin_vs_block.py --seconds 3', 3, 'shm')
    >>> loaded["meta"]["ceilings"][0]["steps_per_s"]
    250000.0
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vecaccel.bench.report import machine_info
from vecaccel.worker.cpus import usable_cpus

__all__ = [
    "RESULT_FORMAT",
    "RunRecord",
    "check_output_path",
    "command_line",
    "load_average",
    "load_result",
]

#: The version of the result format that :meth:`RunRecord.write` writes.
RESULT_FORMAT = 1

#: Distributions whose versions a run record adds to :func:`~vecaccel.bench.machine_info`'s.
RECORDED_VERSIONS: tuple[str, ...] = ("torch", "pettingzoo", "supersuit", "mpe2", "ray", "mujoco")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded; ``None`` where there are none.

    Example:
        >>> average = load_average()
        >>> average is None or len(average) == 3
        True
    """
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):  # not on Unix
        return None


def _versions(distributions: Sequence[str]) -> dict[str, str | None]:
    """The installed version of each distribution (``None``: not installed), without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in distributions:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _script_path(script: str) -> str:
    """``script`` relative to the working folder when it lies under it, else as given."""
    relative = os.path.relpath(os.path.abspath(script))
    return script if relative.startswith("..") else relative


def command_line(
    argv: Sequence[str] | None = None, script: str | os.PathLike[str] | None = None
) -> str:
    """The command that reproduces this run: ``python SCRIPT ARGS`` (``nice -n N`` in front
    when the process runs niced).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``; a script's ``main(argv)`` passes its own).
        script: the script (default: ``sys.argv[0]``), written relative to the working folder.

    Example:
        >>> command = command_line(["--seconds", "3"], "benchmarks/waiting/spin_vs_block.py")
        >>> command.endswith("python benchmarks/waiting/spin_vs_block.py --seconds 3")
        True
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    path = _script_path(os.fspath(script if script is not None else sys.argv[0]))
    command = "python " + shlex.join([path, *arguments])
    try:
        niceness = os.nice(0)
    except (AttributeError, OSError):  # not on Unix
        niceness = 0
    return f"nice -n {niceness} {command}" if niceness else command


def check_output_path(path: str | os.PathLike[str], flag: str = "--json") -> None:
    """Raise before measuring when ``path`` cannot be written, so that a typo in a folder does
    not throw a whole run away.

    Raises:
        ValueError: naming the flag, the path and what is wrong with it.

    Example:
        >>> check_output_path("/no/such/folder/out.json")
        Traceback (most recent call last):
        ...
        ValueError: --json /no/such/folder/out.json: folder /no/such/folder does not exist
    """
    text = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise ValueError(f"{flag} {text}: is a folder, not a file")
    if not os.path.isdir(folder):
        raise ValueError(f"{flag} {text}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {text}: folder {folder} is not writable")


class RunRecord:
    """How, where and when a benchmark ran: created when it starts, written with its results.

    It notes the command, the date, the load average and the usable CPUs at creation (before
    a benchmark pins its own process to some of them); :meth:`write` adds the rest of the
    machine, the package versions, the load average at the end and the ceilings it was given.

    Args:
        command: the command line (default: :func:`command_line` of this process).
        benchmark: the benchmark's name (default: the script's path under ``benchmarks/``
            without ``.py``, when the command runs one).

    Example:
        >>> record = RunRecord("python benchmarks/throughput/async_heavy_tail.py")
        >>> record.benchmark
        'throughput/async_heavy_tail'
        >>> sorted(record.meta(seconds=8))[:4]
        ['benchmark', 'ceilings', 'command', 'cpu_count']
    """

    def __init__(self, command: str | None = None, benchmark: str | None = None) -> None:
        self.command = command if command is not None else command_line()
        self.benchmark = benchmark if benchmark is not None else self._name(self.command)
        self.date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.load_average = load_average()
        self.usable_cpus = usable_cpus()
        self.ceilings: list[dict[str, Any]] = []

    @staticmethod
    def _name(command: str) -> str | None:
        for token in command.split():
            if token.endswith(".py") and "benchmarks/" in token:
                return token.rsplit("benchmarks/", 1)[1][: -len(".py")]
        return None

    def add_ceiling(self, env: str, steps_per_s: float, processes: int, **extra: Any) -> None:
        """Note a ceiling measured in this run: ``processes`` processes, one per usable CPU,
        each stepping its own raw ``env``, ``steps_per_s`` summed (``extra``: a trial number,
        the seconds timed)."""
        self.ceilings.append(
            {"env": env, "steps_per_s": steps_per_s, "processes": processes, **extra}
        )

    def meta(self, **settings: Any) -> dict[str, Any]:
        """The ``meta`` object of the result file, with the script's ``settings`` last."""
        info = machine_info()
        info.pop("load_average", None)
        info["usable_cpus"] = self.usable_cpus
        info["versions"] = {**info["versions"], **_versions(RECORDED_VERSIONS)}
        return {
            "format": RESULT_FORMAT,
            "benchmark": self.benchmark,
            "date": self.date,
            "command": self.command,
            **info,
            "load_average": self.load_average,
            "load_average_after": load_average(),
            "ceilings": list(self.ceilings),
            **settings,
        }

    def write(
        self,
        path: str | os.PathLike[str],
        results: Sequence[Mapping[str, Any]],
        summary: Any = None,
        **settings: Any,
    ) -> dict[str, Any]:
        """Write the result file (folders made as needed) and return what was written.

        Args:
            path: the JSON file.
            results: one object per measured row.
            summary: the figures derived from the rows (left out when ``None``).
            **settings: the script's own fields of ``meta`` (its options, derived constants).
        """
        payload: dict[str, Any] = {
            "meta": self.meta(**settings),
            "results": [dict(row) for row in results],
        }
        if summary is not None:
            payload["summary"] = summary
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        return payload


def load_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a result file of the one format (``meta``, ``results``, an optional ``summary``).

    Raises:
        ValueError: if the file holds no JSON object, or one without a ``meta`` object naming
            its format or without a list of rows under ``results``.

    Example:
        >>> import json, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "result.json"
        >>> _ = path.write_text(json.dumps({"meta": {"format": 1}, "results": [{"seed": 1}]}))
        >>> load_result(path)["results"]
        [{'seed': 1}]
    """
    with open(path, encoding="utf-8") as handle:
        payload = json.load(handle)
    if not isinstance(payload, dict):
        raise ValueError(f"{os.fspath(path)}: a result file holds a JSON object")
    meta = payload.get("meta")
    if not isinstance(meta, dict) or not isinstance(meta.get("format"), int):
        raise ValueError(f"{os.fspath(path)}: no meta object with the result format's version")
    if not isinstance(payload.get("results"), list):
        raise ValueError(f"{os.fspath(path)}: no rows (a list under results)")
    return payload
