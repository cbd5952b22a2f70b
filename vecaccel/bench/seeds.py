"""One child process per run: the harness of the learning benchmarks.

A learning run leaves state behind it (torch's thread pools, imported modules, the allocator's
heap, a library's global seeds), so each run of a benchmark gets a fresh interpreter:
:func:`run_in_child` loads a benchmark script by its path in a new Python process, calls one of
its functions with keyword arguments and returns what the function returned (a JSON value).
:func:`run_seeds` runs every arm (a library, an algorithm) once per seed, the arms side by side
seed by seed, so that a drift in the machine's load reaches all of them, and notes the 1-minute
load average before each run; with ``stored``, runs kept from an earlier sitting are read
instead of run again, so a stopped benchmark resumes.

Example:
    >>> import pathlib, tempfile
    >>> script = pathlib.Path(tempfile.mkdtemp()) / "toy.py"
    >>> _ = script.write_text(
    ...     "def run(arm, seed, scale=1):\\n    return {'value': seed * scale}\\n"
    ... )
    >>> run_in_child(script, "run", {"arm": "a", "seed": 3, "scale": 2})
    {'value': 6}
    >>> [(r["arm"], r["seed"], r["value"]) for r in run_seeds(
    ...     script, "run", [1, 2], [{"arm": "a"}, {"arm": "b", "scale": 10}], alternate=True
    ... )]
    [('a', 1, 1), ('b', 1, 10), ('b', 2, 20), ('a', 2, 2)]
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from vecaccel.bench.record import load_average

__all__ = ["ChildRunError", "run_in_child", "run_seeds", "start_elsewhere"]


def start_elsewhere(argv: Sequence[str], nice: int = 0, setsid: bool = False) -> int:
    """Start ``argv`` as a process that is not this one's descendant (the shell that starts it
    exits at once), as another user's job would be, at ``nice`` above this process's, its output
    dropped; return its pid. With ``setsid``, started by ``setsid``, as a job started from
    another terminal or with ``setsid nohup`` is: where the kernel groups each terminal's
    processes for the scheduler (autogroups), its nice value then counts within its own group
    only. Ending it is the caller's (``os.kill``)."""
    command = shlex.join(argv)
    if nice:
        command = f"nice -n {int(nice)} {command}"
    if setsid:
        command = f"setsid {command}"
    started = subprocess.run(
        ["sh", "-c", f"{command} >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(started.stdout.strip())


class ChildRunError(RuntimeError):
    """A run's child process failed; the message holds the call and the end of its stderr."""


def run_in_child(
    script: str | os.PathLike[str],
    function: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Any:
    """Call ``function(**kwargs)`` of the script at ``script`` in a new Python process.

    Args:
        script: the benchmark script's path. It is imported as a module under its file's name
            (not run as ``__main__``), so it must guard its command line with
            ``if __name__ == "__main__"``.
        function: the name of a module-level function of the script.
        kwargs: its keyword arguments, JSON values.
        timeout_s: seconds the child may take (default: no limit).
        env: the child's environment (default: this process's).

    Returns:
        What the function returned, through JSON.

    Raises:
        ChildRunError: if the child exits with an error or runs past ``timeout_s``.
    """
    call = f"{os.fspath(script)}:{function}({dict(kwargs or {})!r})"
    with tempfile.TemporaryDirectory(prefix="vecaccel-bench-") as folder:
        arguments = os.path.join(folder, "kwargs.json")
        output = os.path.join(folder, "result.json")
        with open(arguments, "w", encoding="utf-8") as handle:
            json.dump(dict(kwargs or {}), handle)
        command = [
            sys.executable,
            "-c",
            _CHILD_CODE,
            os.fspath(script),
            function,
            arguments,
            output,
        ]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=None if env is None else dict(env),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ChildRunError(f"{call} ran past {timeout_s} s") from exc
        if done.returncode != 0 or not os.path.exists(output):
            raise ChildRunError(
                f"{call} failed (exit code {done.returncode}):\n{done.stderr[-3000:]}"
            )
        with open(output, encoding="utf-8") as handle:
            return json.load(handle)


def run_seeds(
    script: str | os.PathLike[str],
    function: str,
    seeds: Sequence[int],
    arms: Sequence[Mapping[str, Any]],
    *,
    common: Mapping[str, Any] | None = None,
    alternate: bool = False,
    in_process: bool = False,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    timeout_s: float | None = None,
    stored: Callable[[Mapping[str, Any], int], dict[str, Any] | None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``function(**common, **arm, seed=seed)`` in a child process for every seed and arm.

    Args:
        script: the benchmark script's path (see :func:`run_in_child`).
        function: its function; it returns a JSON object, the run's record.
        seeds: the seeds, outer loop.
        arms: the keyword arguments of each arm, inner loop; they label its runs.
        common: keyword arguments of every run (the settings), not copied into the records.
        alternate: rotate the arms' order from seed to seed (two arms: reverse it on every
            other seed), so that none always runs first.
        in_process: call the function in this process instead (the script imported as in the
            child, its folder put on ``sys.path``): no interpreter start-up per run, for trial
            runs and tests; what one run leaves behind then reaches the next.
        on_run: called with each new run's record as it arrives (to print it, to write it to its
            own file, or to rewrite the results so far).
        timeout_s: seconds each child may take.
        stored: called with an arm and a seed before the run; a record it returns (kept by an
            earlier ``on_run``) stands for the run, which is not made again.

    Returns:
        Each run's record, updated with its arm's arguments, its ``seed`` and ``load_before``
        (the 1-minute load average when it started), in the order they ran.
    """
    runs: list[dict[str, Any]] = []
    for index, seed in enumerate(seeds):
        shift = index % len(arms) if alternate and arms else 0
        order = list(arms)[shift:] + list(arms)[:shift]
        for arm in order:
            kept = stored(arm, seed) if stored is not None else None
            if kept is not None:
                runs.append(kept)
                continue
            load = load_average()
            kwargs = {**(common or {}), **arm, "seed": seed}
            if in_process:
                record = getattr(_import_script(script), function)(**kwargs)
            else:
                record = run_in_child(script, function, kwargs, timeout_s=timeout_s)
            if not isinstance(record, dict):
                raise ChildRunError(f"{function} returned {type(record).__name__}, not an object")
            record.update(arm, seed=seed, load_before=load[0] if load else None)
            runs.append(record)
            if on_run is not None:
                on_run(record)
    return runs


def _import_script(script: str | os.PathLike[str]) -> ModuleType:
    """Import ``script`` under its file's name, its folder first on ``sys.path``, as Python does
    for a script and its neighbours: functions it defines then pickle by that name, and worker
    processes started with ``spawn`` or ``forkserver`` (which inherit the path) import them."""
    folder, name = os.path.split(os.path.abspath(script))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(os.path.splitext(name)[0])


def _child_main(script: str, function: str, arguments: str, output: str) -> None:
    """In the child: import ``script``, call ``function`` with the JSON keyword arguments in the
    file ``arguments``, write what it returns to ``output``."""
    module = _import_script(script)
    with open(arguments, encoding="utf-8") as handle:
        kwargs = json.load(handle)
    result = getattr(module, function)(**kwargs)
    with open(output, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


#: What the child runs (``python -c``), its arguments after it.
_CHILD_CODE = "import sys; from vecaccel.bench.seeds import _child_main; _child_main(*sys.argv[1:])"
