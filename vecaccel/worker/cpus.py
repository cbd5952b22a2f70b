"""CPU and thread helpers: which CPUs this process may use, which one a thread runs on, and the
native thread pools a worker caps so that it keeps one core busy."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Collection

__all__ = [
    "THREAD_ENV_VARS",
    "current_cpu",
    "limit_threads_after_envs",
    "limit_threads_before_envs",
    "usable_cpus",
    "TorchThreadsWarning",
    "user_stacklevel",
    "warn_if_torch_oversubscribes",
]

#: The variables that size OpenMP's, the BLAS libraries' and OpenCV's thread pools when they
#: start. OpenCV reads ``OPENCV_FOR_THREADS_NUM`` when it first builds its pool, not at import:
#: it also caps a ``cv2`` that a forked worker inherited, as long as nothing had used that pool.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "OPENCV_FOR_THREADS_NUM",
)


def limit_threads_before_envs(threads: int | None) -> None:
    """Cap native thread pools that start after this point, through their variables."""
    if threads is None:
        return
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(threads)


def limit_threads_after_envs(threads: int | None, inherited: Collection[str] = ()) -> None:
    """Cap the thread pools of OpenCV and torch, where the worker loaded them itself.

    A worker is meant to keep one core busy. OpenCV (which Gymnasium's ``AtariPreprocessing``
    uses to resize frames) and torch default to a thread per core, and their threads then
    fight the other workers: one worker stepping Pong ran 24% slower than the same envs in the
    parent until OpenCV was limited to one thread.

    ``inherited`` names the modules a forked worker came with. Their pools may have run in the
    parent, and a pool's threads do not survive a fork: resizing such a pool waits for threads
    that are not there (``cv2.setNumThreads`` in a worker forked after the parent had resized
    images hung the worker for good). Those are left alone; the variables of
    :func:`limit_threads_before_envs` still cap an inherited ``cv2`` whose pool never ran.
    """
    if threads is None:
        return
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and "cv2" not in inherited and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(threads)
    torch = sys.modules.get("torch")
    if torch is not None and "torch" not in inherited:
        try:
            torch.set_num_threads(threads)
        except RuntimeError:
            pass


def _cpu_getter() -> Callable[[], int]:
    """glibc's ``sched_getcpu`` where it works, else a function that answers -1."""
    try:
        import ctypes

        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
        getcpu.restype = ctypes.c_int
        getcpu.argtypes = []
        if getcpu() >= 0:
            return getcpu
    except (OSError, AttributeError, TypeError):
        pass
    return lambda: -1


#: The CPU the calling thread runs on (glibc's ``sched_getcpu``), or -1 where unknown.
current_cpu: Callable[[], int] = _cpu_getter()


def usable_cpus() -> int:
    """The CPUs this process may run on.

    Example:
        >>> usable_cpus() >= 1
        True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


#: Modules whose frames a warning skips, to point at the line of the user's code that made the
#: vector env (the SB3 adapter is made inside SB3's ``make_vec_env``).
_LIBRARY_MODULES = ("vecaccel", "stable_baselines3", "gymnasium")


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by the caller point at the user's code.

    Counts the frames of vecaccel (and of the libraries that call it: SB3, Gymnasium) above the
    function that calls this one, so a warning names the line of the user's script that led
    there, however deep in vecaccel it was raised.

    Example:
        >>> user_stacklevel() >= 2
        True
    """
    level, frame = 2, sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] not in _LIBRARY_MODULES:
            break
        frame, level = frame.f_back, level + 1
    return level


class TorchThreadsWarning(RuntimeWarning):
    """torch's threads and the env workers together want more cores than there are."""


def warn_if_torch_oversubscribes(num_workers: int, stacklevel: int | None = None) -> None:
    """Warn when torch's threads and the env workers together want more cores than there are.

    torch's OpenMP threads spin between the policy's forward passes; on cores that the env
    workers need, that made SB3 PPO on CartPole with ``shm`` about 30x slower on 2 cores
    (torch's default 2 threads, 2 workers), and the CPU action server on Pong 2.6x slower. One
    torch thread per free core avoids it. Nothing is said where torch is not imported.

    Args:
        num_workers: the env worker processes.
        stacklevel: as for ``warnings.warn``, counted from the caller; ``None``: the first
            frame outside vecaccel (and SB3 and Gymnasium), the user's line.
    """
    torch = sys.modules.get("torch")
    if torch is None or num_workers <= 0:
        return
    cpus = usable_cpus()
    threads = torch.get_num_threads()
    if threads > max(1, cpus - num_workers):
        warnings.warn(
            f"torch uses {threads} threads and vecaccel {num_workers} env workers on {cpus} "
            f"cores: torch's spinning threads will starve the workers. Call "
            f"torch.set_num_threads({max(1, cpus - num_workers)}) or pass fewer num_workers.",
            TorchThreadsWarning,
            stacklevel=user_stacklevel() if stacklevel is None else stacklevel + 1,
        )
