"""Leak probes: the processes, ``/dev/shm`` entries and descriptors a vector env leaves behind.

They read ``/proc`` (Linux). A test or a benchmark takes a :class:`LeakBaseline` before it
builds a vector env and calls :meth:`LeakBaseline.check` after ``close()``.

Example:
    >>> import vecaccel
    >>> from vecaccel.testing.leaks import LeakBaseline
    >>> baseline = LeakBaseline()
    >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="shm")
    >>> envs.close()
    >>> baseline.check()
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any, cast


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])  # state, ppid


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


#: Long-lived helper processes multiprocessing starts once per interpreter; not leaks.
_MP_HELPERS = ("resource_tracker", "forkserver")


def child_pids(pid: int | None = None) -> set[int]:
    """Children of ``pid`` (default: this process), zombies included, multiprocessing's own
    resource tracker and fork server left out."""
    pid = os.getpid() if pid is None else pid
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _proc_stat(int(name))
        if stat is not None and stat[1] == pid:
            if not any(helper in _cmdline(int(name)) for helper in _MP_HELPERS):
                out.add(int(name))
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, grandchildren...)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(name)] = int(fields[1])
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child, parent in parents.items():
            if parent == current and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def process_gone(pid: int) -> bool:
    """``True`` once ``pid`` no longer runs (absent, or a zombie waiting for its reaper)."""
    stat = _proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def shm_entries() -> set[str]:
    """The names in ``/dev/shm`` now (none where the folder does not exist)."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def open_fds() -> set[int]:
    """This process's open file descriptors, less multiprocessing's heap arenas.

    Multiprocessing's heap (which holds ``RawArray`` buffers, such as a worker pool's shared
    memory) keeps a small arena (``/dev/shm/pym-*``, unlinked at once) for the life of the
    process once a buffer of its size was made, and reuses it: it appears the first time a
    vector env of a new size is built, and is no leak. A descriptor gone by now (the one that
    lists the folder) is left out too.
    """
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not target.startswith("/dev/shm/pym-"):
            found.add(int(name))
    return found


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(interval)


def _shm_holders(names: set[str]) -> dict[str, set[int]]:
    """The processes that map or hold open each ``/dev/shm`` entry in ``names``.

    An entry is matched by its file (device and inode), not by its path: glibc's ``sem_open``
    builds a named semaphore under a temporary name, maps it and then links it to its real
    name, so ``/proc/PID/maps`` shows a process's semaphores under the temporary name, as
    ``/dev/shm/sem.<random> (deleted)``.
    """
    holders: dict[str, set[int]] = {name: set() for name in names}
    files: dict[tuple[int, int, int], str] = {}
    for name in names:
        try:
            info = os.stat(f"/dev/shm/{name}")
        except OSError:  # gone already
            continue
        files[(os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)] = name
    if not files:
        return holders
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        held: set[str] = set()
        try:
            with open(f"/proc/{pid}/maps") as file:
                for line in file:
                    fields = line.split(maxsplit=5)
                    if len(fields) < 5 or fields[4] == "0":
                        continue
                    major, minor = fields[3].split(":")
                    mapped = files.get((int(major, 16), int(minor, 16), int(fields[4])))
                    if mapped is not None:
                        held.add(mapped)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    info = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                opened = files.get((os.major(info.st_dev), os.minor(info.st_dev), info.st_ino))
                if opened is not None:
                    held.add(opened)
        except OSError:
            continue
        for name in held:
            holders[name].add(pid)
    return holders


def leaked_shm(before: set[str], ours: set[int] | None = None, settle: float = 10.0) -> set[str]:
    """``/dev/shm`` entries that appeared since ``before`` and that no other job holds.

    Another job on the machine may create entries (``sem.mp-*`` semaphores...) while a test
    runs: an entry that a process outside ``ours`` (default: this process) maps or holds open is
    theirs, and one that nobody holds may be on its way out (a job that just ended, whose
    resource tracker removes it), so the check is repeated for up to ``settle`` seconds. What is
    left is a leak, ours most likely.

    Multiprocessing's heap arenas (``pym-<pid>-*``) are left out: multiprocessing creates each
    one and unlinks it at once, so one that stays was left by a process killed between the two
    (tests and users kill processes), not by a backend.
    """
    ours = {os.getpid()} if ours is None else ours
    deadline = time.monotonic() + settle
    while True:
        try:
            new = {n for n in os.listdir("/dev/shm") if not n.startswith("pym-")} - before
        except FileNotFoundError:
            return set()
        if new:
            holders = _shm_holders(new)
            new = {name for name in new if not holders[name] - ours}
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


class LeakBaseline:
    """What this process holds now (children, ``/dev/shm`` entries); ``check()`` fails on what
    is new since, once children have had ``timeout`` seconds to exit."""

    def __init__(self) -> None:
        self.children = child_pids()
        self.shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()

    def check(self, timeout: float = 10.0) -> None:
        """Fail (``AssertionError``) on child processes still running after ``timeout``
        seconds, or ``/dev/shm`` entries, that were not there at the baseline."""

        def new_children() -> set[int]:
            # reaps finished ones; a started child has a pid
            active = {cast(int, p.pid) for p in multiprocessing.active_children()}
            return (child_pids() | active) - self.children

        deadline = time.monotonic() + timeout
        while new_children() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not new_children(), f"child processes left behind: {sorted(new_children())}"
        leaked = leaked_shm(self.shm)
        assert not leaked, f"/dev/shm entries left behind: {sorted(leaked)}"
