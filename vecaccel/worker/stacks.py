"""A stuck worker's Python stack, for the error that reports it.

Each worker registers :mod:`faulthandler` on :data:`STACK_SIGNAL` early in its start, writing to
a pipe of its own, and writes one NUL byte there once it has. When a worker overruns the start
timeout or ``step_timeout_s``, the parent sends it the signal and reads what faulthandler wrote:
the stack of every thread of the worker, most recent call first, taken in the signal handler,
so it shows the line an env's constructor or ``step`` is stuck on even inside C code (a lock, a
``sleep``, a native thread pool). The error then carries it.

``chain=False``: the dump is all the signal does, so a worker forked from a process with a
SIGUSR1 handler of its own does not run that handler when asked for its stack. An env that
installs a SIGUSR1 handler itself replaces the dump; the error then says that no stack came.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vecaccel.worker.handle import WorkerHandle

__all__ = [
    "STACK_SIGNAL",
    "STACK_WAIT_S",
    "arm_stack_dump",
    "describe_stacks",
    "reached_worker_code",
    "request_stacks",
]

#: The signal that asks a worker for its stack.
STACK_SIGNAL = signal.SIGUSR1

#: How long the parent waits for the stacks it asked for (they come in milliseconds).
STACK_WAIT_S = 1.0

#: Once a worker's dump has started to arrive, this much silence ends it.
_QUIET_S = 0.05

#: The worker's entry point: frames below it (multiprocessing's, and under fork the parent's
#: frames at the moment it forked) say nothing about where the worker is stuck.
_ENTRY_FRAME = (
    f'File "{os.path.join(os.path.dirname(__file__), "process.py")}"',
    " in worker_main",
)

#: What a worker writes once its dump is armed (faulthandler writes text only).
_ARMED = b"\0"

_armed_conn: Any = None  # the worker's end of its stack pipe, kept open for faulthandler


def arm_stack_dump(conn: Any) -> None:
    """In the worker: dump every thread's stack to ``conn`` on :data:`STACK_SIGNAL`."""
    global _armed_conn
    if conn is None:
        return
    _armed_conn = conn  # faulthandler holds the descriptor only, not the connection
    faulthandler.register(STACK_SIGNAL, file=conn.fileno(), all_threads=True, chain=False)
    os.write(conn.fileno(), _ARMED)


def _read_available(worker: WorkerHandle) -> bytes:
    """What the worker's stack pipe holds now, noting the armed byte."""
    chunks = []
    fd = worker.stack_fd
    if fd is None:
        return b""
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 1 << 16):  # b"": the worker is gone
            chunks.append(chunk)
    except OSError:  # BlockingIOError: nothing more for now
        pass
    finally:
        os.set_blocking(fd, True)
    data = b"".join(chunks)
    if _ARMED in data:
        worker.stack_armed = True
        data = data.replace(_ARMED, b"")
    return data


def reached_worker_code(worker: WorkerHandle) -> bool:
    """Whether ``worker`` got as far as vecaccel's worker code (it armed its stack dump).

    A worker that died before that was still starting its interpreter, importing the main
    module (spawn, forkserver) or unpickling its arguments.
    """
    _read_available(worker)
    return worker.stack_armed


def request_stacks(workers: Sequence[WorkerHandle], timeout: float = STACK_WAIT_S) -> None:
    """Ask each of ``workers`` for its stack and wait (at most ``timeout`` s) for them.

    Each worker's ``stack`` is set to the text its faulthandler wrote, or to a sentence saying
    why none came. A worker that has not armed its dump yet is not signalled: the signal's
    default action would end it.
    """
    asked: dict[int, WorkerHandle] = {}
    for worker in workers:
        _read_available(worker)  # an older dump (someone else's signal) is stale
        worker.stack = None
        if worker.stack_fd is None:
            continue  # a handle made without a stack pipe
        if not worker.stack_armed:
            worker.stack = (
                "(no stack: the worker had not reached vecaccel's worker code yet; it was still "
                "starting its interpreter, importing the main module (spawn) or unpickling its "
                "arguments)"
            )
            continue
        try:
            os.kill(worker.process.pid, STACK_SIGNAL)
        except (OSError, TypeError):
            worker.stack = "(no stack: the worker had already exited)"
            continue
        asked[worker.stack_fd] = worker
    by_fd = dict(asked)
    received = {fd: b"" for fd in asked}
    last_data = dict.fromkeys(asked, 0.0)
    poller = select.poll()  # not select(): a pool of many workers has descriptors past 1024
    for fd in asked:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    while asked:
        now = time.monotonic()
        for fd in [fd for fd in asked if received[fd] and now - last_data[fd] >= _QUIET_S]:
            poller.unregister(fd)
            del asked[fd]
        if not asked or now >= deadline:
            break
        for fd, _ in poller.poll(min(_QUIET_S, deadline - now) * 1000):
            if fd not in asked:
                continue
            data = _read_available(asked[fd])
            if data:
                received[fd] += data
                last_data[fd] = time.monotonic()
            else:  # the pipe's end: the worker is gone
                poller.unregister(fd)
                del asked[fd]
    for fd, data in received.items():
        worker = by_fd[fd]
        text = _trimmed(data.decode(errors="replace").rstrip())
        worker.stack = text or (
            f"(no stack: the worker did not answer {STACK_SIGNAL.name} within {timeout} s; an "
            f"env may have installed its own {STACK_SIGNAL.name} handler)"
        )


def _trimmed(dump: str) -> str:
    """``dump`` without the frames below the worker's entry point."""
    lines, below_entry = [], False
    for line in dump.splitlines():
        if not line.startswith("  "):  # a thread's header, or the blank line between threads
            below_entry = False
        elif below_entry:
            continue
        lines.append(line)
        if _ENTRY_FRAME[0] in line and line.endswith(_ENTRY_FRAME[1]):
            below_entry = True
    return "\n".join(lines)


def describe_stacks(workers: Sequence[WorkerHandle]) -> str:
    """The stacks :func:`request_stacks` collected, one block per worker."""
    blocks = []
    for worker in workers:
        if worker.stack is not None:
            blocks.append(
                f"worker {worker.index} (pid {worker.process.pid}, envs "
                f"{list(worker.env_indices)}):\n{worker.stack}"
            )
    return "\n\n".join(blocks)
