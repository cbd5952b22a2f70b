"""The parent's handle on a worker process, and the start methods workers run under."""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = [
    "MAIN_GUARD_EXIT_CODE",
    "MAIN_GUARD_HINT",
    "WorkerHandle",
    "describe_exit",
    "get_context",
    "refuse_start_while_importing_main",
]

#: The exit code of a worker ended by :func:`refuse_start_while_importing_main`.
MAIN_GUARD_EXIT_CODE = 3

#: What to do when a worker's import of the main script starts workers of its own.
MAIN_GUARD_HINT = (
    'put the code that makes vector envs under `if __name__ == "__main__":` (under the spawn '
    "and forkserver start methods every worker first imports the main script)"
)


def get_context(context: str | None) -> Any:
    """The ``multiprocessing`` context for start method ``context`` (``None``: the default).

    ``"multiprocess"`` is the ``multiprocess`` package's spawn context, whose pickler (dill)
    handles closures the standard library's cannot.

    Raises:
        ValueError: for a start method this platform does not have.
    """
    if context == "multiprocess":
        import multiprocess

        return multiprocess.get_context("spawn")
    if context is None:
        return mp.get_context()
    if context not in mp.get_all_start_methods():
        raise ValueError(
            f"unknown start method context={context!r}; choose from "
            f"{mp.get_all_start_methods() + ['multiprocess']}"
        )
    return mp.get_context(context)


def refuse_start_while_importing_main() -> None:
    """In a worker still importing the main script, end it at once, silently, with exit code
    :data:`MAIN_GUARD_EXIT_CODE`.

    Under spawn (and forkserver) a worker imports the caller's main script before it runs
    anything else; a script that makes a vector env at import time, without the ``__main__``
    guard, would make one in every worker. ``multiprocessing`` refuses that with a long
    ``RuntimeError`` per worker. Ending the worker first is shorter, and only the caller
    reports it: its :class:`vecaccel.WorkerError` reads the exit code and says what to do
    (:data:`MAIN_GUARD_HINT`), once. Each worker printing it too would print it once per
    worker, the copies interleaved on the shared stderr (unbuffered when it is not a
    terminal, so a line and its newline are separate writes).

    Raises:
        SystemExit: only in a process that is still importing its parent's main script.
    """
    # the multiprocess package (dill) keeps its own copy of multiprocessing's process state
    packages = [mp, sys.modules.get("multiprocess")]
    if any(getattr(p.process.current_process(), "_inheriting", False) for p in packages if p):
        raise SystemExit(MAIN_GUARD_EXIT_CODE)


def describe_exit(exitcode: int | None) -> str:
    """How a worker ended, for an error message."""
    if exitcode is None:
        return "is unresponsive"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}"
    return f"exited with code {exitcode}"


class WorkerHandle:
    """The parent's handle on one worker process: its slice of envs and its channels.

    Attributes:
        index: the worker's index in the pool.
        start: the first env of its slice.
        stop: one past the last env of its slice.
        process: the ``multiprocessing`` process.
        cmd: the write end of its ``cmd`` pipe.
        done: the read end of its ``done`` pipe.
        data: the parent's end of its ``data`` channel.
        killed_for: why the pool killed it (a ``step_timeout_s`` overrun), or ``None``.
        stack_conn: the read end of its stack pipe (:mod:`vecaccel.worker.stacks`), or ``None``.
        stack: its Python stack when the pool last asked for it, or ``None``.
    """

    __slots__ = (
        "index",
        "start",
        "stop",
        "process",
        "cmd",
        "done",
        "data",
        "done_fd",
        "killed_for",
        "loads",
        "nudged",
        "stack_conn",
        "stack_fd",
        "stack_armed",
        "stack",
    )

    def __init__(
        self,
        index: int,
        start: int,
        stop: int,
        process: Any,
        cmd: Any,
        done: Any,
        data: Any,
        stack_conn: Any = None,
    ) -> None:
        self.index, self.start, self.stop = index, start, stop
        self.process, self.cmd, self.done, self.data = process, cmd, done, data
        self.done_fd = done.fileno()
        self.killed_for: str | None = None
        self.stack_conn = stack_conn
        self.stack_fd: int | None = None if stack_conn is None else stack_conn.fileno()
        self.stack_armed = False  # its faulthandler answers STACK_SIGNAL (it said so)
        self.stack: str | None = None
        self.nudged = False  # its CPU affinity was narrowed for one step (WorkerPool.send_all)
        # the unpickler of payloads in shared memory: the one the data pipe's own recv()
        # uses (the standard library's, or multiprocess's dill), as the worker pickles with it
        module = sys.modules.get(type(data).__module__)
        self.loads = getattr(module, "_ForkingPickler", ForkingPickler).loads

    @property
    def env_indices(self) -> range:
        """The indices of its envs in the vector env."""
        return range(self.start, self.stop)
