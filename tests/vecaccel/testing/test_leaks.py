"""``vecaccel.testing.leaks``: what it counts as left behind, and what it leaves to others.

The leak checks run while other jobs on the machine (or other test workers) create and hold
``/dev/shm`` entries of their own; an entry another process holds is theirs.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import shared_memory

from vecaccel.testing.leaks import leaked_shm, shm_entries


def _hold_a_semaphore_and_a_segment(ready, done) -> None:
    lock = multiprocessing.get_context("spawn").Lock()  # a named semaphore: /dev/shm/sem.mp-*
    segment = shared_memory.SharedMemory(create=True, size=64)  # /dev/shm/psm_*
    ready.set()
    done.wait(60)
    segment.close()
    segment.unlink()
    del lock


def test_entries_another_process_holds_are_theirs_and_ours_are_leaks() -> None:
    ctx = multiprocessing.get_context("fork")  # fork: its events leave no named semaphore
    before = shm_entries()
    ready, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_a_semaphore_and_a_segment, args=(ready, done))
    other.start()
    try:
        assert ready.wait(30)
        theirs = shm_entries() - before
        assert {name.split("-")[0].split("_")[0] for name in theirs} == {"sem.mp", "psm"}
        # glibc maps a named semaphore under a temporary name: it is matched by its inode
        assert leaked_shm(before, settle=0) == set()
        # held by a process counted as ours: a leak
        assert leaked_shm(before, ours={os.getpid(), other.pid}, settle=0) == theirs
    finally:
        done.set()
        other.join(30)
    assert leaked_shm(before, settle=5) == set()
