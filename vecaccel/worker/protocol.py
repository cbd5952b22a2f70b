"""The wire protocol between the caller and its worker processes, and their shared layout.

Each worker owns a contiguous slice ``[start, stop)`` of the envs and three channels:

* ``cmd``: one byte from the parent per command (the hot path carries nothing else);
* ``done``: one status byte from the worker when a command has finished (or, for
  :attr:`Command.STEP_MASKED`, one byte per env: its slot in the slice, plus
  :data:`ENV_PAYLOAD_FLAG` when a payload follows on ``data``);
* ``data``: a pickled side channel, used only for payloads that are irregular or rare: reset
  arguments, infos that do not fit the info schema, ``call`` results, and error reports. A
  reply's payload that fits in :data:`PAYLOAD_SLAB_BYTES` travels in the worker's slab of
  shared memory instead.

Observations, actions, rewards and flags live in one shared buffer laid out from the spaces
(:class:`SharedLayout`), computed the same way in the parent and in every worker. A leaf with
no fixed size (``Text``, ``Graph``...) has no bytes there but an item column in each process's
views: a worker sends its envs' observation items with its reply (an :class:`ObsItems`
payload), and the parent sends a worker its envs' action items on ``data`` after the step's
command byte. A space without such leaves sends neither.

Step infos that fit the schema the parent announces (:mod:`vecaccel.worker.info_schema`) are
written into each env's block of the shared info area instead of being pickled.
"""

from __future__ import annotations

import os
import struct
import threading
import traceback
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from vecaccel.envs.unknown_ids import env_error_message
from vecaccel.spaces import nbytes_of, views_from_buffer
from vecaccel.spaces.payload import layout_specs
from vecaccel.worker.info_schema import INFO_BLOCK_BYTES

__all__ = [
    "ENV_PAYLOAD_FLAG",
    "PARENT_CHECK_INTERVAL",
    "PAYLOAD_SLAB_BYTES",
    "Command",
    "ErrorReport",
    "ObsItems",
    "SharedLayout",
    "SharedViews",
    "Status",
    "error_report",
    "read_startup",
    "send_startup",
]


class Command:
    """The command bytes the parent writes to a worker's ``cmd`` pipe."""

    STEP = 1  # step every env of the slice, one status byte at the end
    STEP_MASKED = 2  # step the envs flagged in the mask, one byte per env as each finishes
    RESET = 3
    CALL = 4
    SET_ATTR = 5
    CLOSE = 6
    INFO_SCHEMA = 7  # an InfoSchema follows on data; no reply (it applies to later steps)


class Status:
    """The status bytes a worker writes to its ``done`` pipe."""

    OK = 0
    OK_DATA = 1  # a payload follows on the data channel
    ERROR = 2  # an error report follows on the data channel
    READY = 3
    RESTARTED = 4  # (parent side only) the worker died and was started again


#: Set in a per-env ``done`` byte when a payload (the env's info or error) follows; the low
#: seven bits are the env's slot in its worker's slice, so a worker holds at most 127 envs under
#: per-env stepping.
ENV_PAYLOAD_FLAG = 128

#: How often an idle worker checks that its parent is still alive (seconds).
PARENT_CHECK_INTERVAL = 1.0


class ObsItems(NamedTuple):
    """A reply's payload together with the observation items of the envs it concerns.

    Sent only where the observation space has leaves with no fixed size; the parent stores
    ``items`` (see :func:`vecaccel.spaces.payload.take_items`) in its views' item columns and
    handles ``payload`` as it would have been sent alone.
    """

    payload: Any
    items: list


@dataclass
class SharedViews:
    obs: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    step_mask: np.ndarray  # which envs a STEP_MASKED command steps
    done_seq: np.ndarray  # per worker, bumped before each status byte (lets the parent spin)
    payload_len: np.ndarray  # per worker: bytes of its reply's payload in payload_slab, or -1
    payload_slab: np.ndarray  # [num_workers, PAYLOAD_SLAB_BYTES] pickled reply payloads
    last_cpu: np.ndarray  # per worker: the CPU of its last reply, or -1 (WorkerPool.send_all)
    info_area: np.ndarray  # [num_envs, INFO_BLOCK_BYTES] step infos that fit the info schema
    info_flags: np.ndarray  # per env: the schema generation its block holds, or 0
    env_busy_ns: np.ndarray  # per worker: nanoseconds its envs spent in step and reset so far
    gate_held: np.ndarray  # per worker: 1 while it holds the max_concurrency semaphore
    ready_at: np.ndarray  # per env: time.monotonic() when its last per-env step finished


#: Shared memory per worker for the pickled payload of a reply (step infos, reset infos...):
#: one that fits travels there instead of through the data pipe, which saves the worker a send
#: and the parent a poll and two reads. Bigger payloads still take the pipe.
PAYLOAD_SLAB_BYTES = 1 << 16


class SharedLayout:
    """The shared-memory layout of one vector env, computed the same way in parent and workers."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        num_envs: int,
        num_workers: int,
    ) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_envs = num_envs
        self.num_workers = num_workers
        f64, boolean = np.dtype(np.float64), np.dtype(np.bool_)
        self.specs = (
            layout_specs(observation_space, num_envs),
            layout_specs(action_space, num_envs),
            ((num_envs,), f64),
            ((num_envs,), boolean),
            ((num_envs,), boolean),
            ((num_envs,), np.dtype(np.uint8)),
            ((num_workers * 8,), np.dtype(np.int64)),  # one cache line per worker
            ((num_workers, PAYLOAD_SLAB_BYTES), np.dtype(np.uint8)),
            ((num_envs, INFO_BLOCK_BYTES), np.dtype(np.uint8)),
            ((num_envs,), np.dtype(np.uint8)),
            ((num_envs,), f64),
        )
        self.nbytes = nbytes_of(self.specs) + 64

    def views(self, buffer: Any) -> SharedViews:
        out = []
        offset = 0
        for spec in self.specs:
            view, offset = views_from_buffer(spec, buffer, offset)
            out.append(view)
        obs, actions, rewards, terms, truncs, mask, seq, slab, info_area, info_flags, ready = out
        return SharedViews(
            obs,
            actions,
            rewards,
            terms,
            truncs,
            mask,
            seq[::8],
            seq[1::8],
            slab,
            seq[2::8],
            info_area,
            info_flags,
            seq[3::8],
            seq[4::8],
            ready,
        )


# ---------------------------------------------------------------------------------------------
# the worker process


#: what an env's own code may raise and a worker reports, naming the env, instead of dying:


class ErrorReport(NamedTuple):
    """What a worker (or the caller's inline envs) reports about an env that raised.

    Reports sort by env index; :meth:`vecaccel.worker.WorkerPool.error_from_reports` turns a
    list of them into one :class:`vecaccel.WorkerError`.
    """

    env_index: int
    type_name: str
    message: str
    traceback: str
    what: str
    """The operation that failed: ``"step"``, ``"reset"``, ``"make"``, ``"call('name')"``..."""


def error_report(index: int, exc: BaseException, what: str) -> ErrorReport:
    """The report on exception ``exc`` raised by env ``index`` during ``what``.

    Example:
        >>> report = error_report(3, ValueError("bad action"), "step")
        >>> report.env_index, report.type_name, report.message
        (3, 'ValueError', 'bad action')
    """
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ErrorReport(index, type(exc).__name__, env_error_message(exc), text, what)


# -- the startup message: a worker's env functions and the buffer's layout ---------------------


def send_startup(conn: Any, startup: bytes) -> threading.Thread | None:
    """Hand a started worker its startup message (a length, then the bytes) on ``conn``.

    It is not the process's arguments: under spawn those go down a pipe whose read end the
    parent holds open until it has written them all, so a child that died before reading them
    (a script without the ``__main__`` guard, with arguments larger than the pipe, as Pong's
    spaces are) hung ``process.start()`` for good. Here a dead child's socket fails the write,
    and what the socket cannot take at once is written by a thread on a duplicate of the
    socket, so the start timeout still governs the wait.

    Returns:
        The writer thread, or ``None`` when everything was written (or the worker is dead).
    """
    data = memoryview(struct.pack("!Q", len(startup)) + startup)
    fd = conn.fileno()
    os.set_blocking(fd, False)
    try:
        data = data[os.write(fd, data) :]
    except BlockingIOError:
        pass
    except OSError:
        return None  # the worker died already: waiting for it reports that
    finally:
        os.set_blocking(fd, True)
    if not data:
        return None
    writer = threading.Thread(
        target=_write_rest, args=(os.dup(fd), data), name="vecaccel-startup", daemon=True
    )
    writer.start()
    return writer


def read_startup(fd: int) -> bytes:
    """The startup message :func:`send_startup` wrote: a length, then the bytes."""
    (size,) = struct.unpack("!Q", _read_exact(fd, 8))
    return _read_exact(fd, size)


def _read_exact(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_rest(fd: int, data: memoryview) -> None:
    """Write what the socket could not take at once; ``fd`` is this thread's own duplicate."""
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the worker died or was stopped: the pool sees that through its sentinel
    finally:
        os.close(fd)
