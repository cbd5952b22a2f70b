"""CPU and thread helpers: which CPUs this process may use, which one a thread runs on, and the
native thread pools a worker caps so that it keeps one core busy."""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Collection
from pathlib import Path

__all__ = [
    "THREAD_ENV_VARS",
    "CpuLoad",
    "available_cpus",
    "cpu_quota",
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


def cpu_quota() -> float | None:
    """The CPUs this process's cgroup may use in time (``cpu.max`` in cgroup v2, the CFS quota in
    v1), or ``None`` where it sets no limit: a container started with ``--cpus 1.5`` answers
    1.5 however many CPUs its affinity lists.

    Example:
        >>> quota = cpu_quota()
        >>> quota is None or quota > 0
        True
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the process's group and every group above it
            group = Path("/sys/fs/cgroup") / path.lstrip("/")
            for folder in [group, *group.parents]:
                limits.append(_quota_of(folder / "cpu.max"))
                if folder == Path("/sys/fs/cgroup"):
                    break
        elif "cpu" in controllers.split(","):  # v1
            for root in ("cpu", "cpu,cpuacct"):
                folder = Path("/sys/fs/cgroup") / root / path.lstrip("/")
                limits.append(_quota_of(folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"))
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def _quota_of(quota_file: Path, period_file: Path | None = None) -> float | None:
    """One cgroup's CPU limit in CPUs (``None``: no limit, or no such file)."""
    try:
        fields = quota_file.read_text().split()
        if period_file is not None:
            fields.append(period_file.read_text().strip())
        quota, period = fields[0], float(fields[1])
    except (OSError, IndexError, ValueError):
        return None
    if quota in ("max", "-1") or period <= 0:
        return None
    return max(float(quota) / period, 0.01)


def available_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's quota (rounded, at
    least one).

    Example:
        >>> 1 <= available_cpus() <= usable_cpus()
        True
    """
    cpus = usable_cpus()
    quota = cpu_quota()
    return cpus if quota is None else max(1, min(cpus, round(quota)))


class CpuLoad:
    """A reading of how busy this process's CPUs are, to compare with a later one.

    ``others_since(earlier)`` is the CPU time that processes outside this one and its children
    took on those CPUs between the two readings, in cores: a busy loop beside the run counts
    about 1.0. Time a hypervisor gave to other machines (steal) counts as taken too. A process
    that yields to this one leaves its time out: one niced at least :data:`YIELDING_NICE` above
    this process in the same scheduling group, or one whose whole group is niced so far above
    this one's. The group is what Linux shares a CPU between first: a cgroup, and within the
    root cgroup the terminal's autogroup where the kernel has them (``setsid`` starts one), so a
    ``nice -n 19`` job started with ``setsid`` takes as much as any other process.
    Beside such a job a PPO update on 2 torch threads took 30 s where one thread took 0.3 s;
    beside the same job in this process's autogroup, both took 0.3 s (docs/benchmarks/learning.md). A
    reading costs a scan of ``/proc`` (a few milliseconds); where ``/proc`` is missing (not
    Linux) every reading says nothing is taken.

    Example:
        >>> import time
        >>> first = CpuLoad()
        >>> time.sleep(0.05)
        >>> CpuLoad().others_since(first) >= 0.0
        True
    """

    def __init__(self) -> None:
        self.time = time.monotonic()
        self.busy = _busy_ticks()
        self.own, self.others = _process_ticks()

    def others_since(self, earlier: CpuLoad) -> float:
        """Cores that other processes kept busy between ``earlier`` and this reading."""
        seconds = self.time - earlier.time
        if seconds <= 0 or self.busy is None or earlier.busy is None:
            return 0.0
        ticks = (self.busy - earlier.busy) - (self.own - earlier.own)
        mine = _scheduling(os.getpid())
        for pid, (used, nice) in self.others.items():
            spent = used - earlier.others.get(pid, (0, 0))[0]
            if spent > 0 and mine is not None and _yields(_scheduling(pid, nice), mine):
                ticks -= spent
        return max(0.0, ticks / _TICKS_PER_SECOND / seconds)

    @classmethod
    def measure(cls, seconds: float = 0.1) -> float:
        """The cores other processes keep busy, over ``seconds`` from now."""
        first = cls()
        time.sleep(seconds)
        return cls().others_since(first)


#: How far above this process's nice value another process's (or its scheduling group's) must be
#: for its CPU time not to count as taken from this one: at 15 above it gets about 3 % of a
#: contested core, and two torch threads beside a busy loop so niced updated as fast as one;
#: at 10 above, two were 1.6x slower than one.
YIELDING_NICE = 15

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_ticks() -> int | None:
    """Busy clock ticks of this process's CPUs since boot (``/proc/stat``), niced time
    included; ``None`` where unknown."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = (
        {f"cpu{cpu}" for cpu in os.sched_getaffinity(0)}
        if hasattr(os, "sched_getaffinity")
        else None
    )
    total = 0
    for line in lines[1:]:
        if not line.startswith("cpu"):
            break
        name, *values = line.split()
        if mine is not None and name not in mine:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in values[:8])
        total += user + nice + system + irq + softirq + steal
    return total


def _process_ticks() -> tuple[int, dict[int, tuple[int, int]]]:
    """CPU clock ticks that this process and its live descendants have used, and the ticks and
    nice value of every other live process, by pid."""
    parents: dict[int, int] = {}
    ticks: dict[int, tuple[int, int]] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return 0, {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        # the command name is in parentheses and may hold spaces: split after it
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[pid] = int(fields[1])
        ticks[pid] = (int(fields[11]) + int(fields[12]), int(fields[16]))
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += ticks.pop(pid, (0, 0))[0]
        todo.extend(children.get(pid, ()))
    return total, ticks


def _scheduling(pid: int, nice: int | None = None) -> tuple[str, str, int, int] | None:
    """Where Linux shares a CPU out to process ``pid``: its CPU cgroup; its autogroup, ``""`` where
    it has none; the nice value its group, or the process itself where it has no autogroup,
    competes with against the other autogroups; and the process's own nice value. ``None`` for a
    process gone or unreadable."""
    try:
        if nice is None:
            stat = Path(f"/proc/{pid}/stat").read_text()
            nice = int(stat[stat.rfind(")") + 2 :].split()[16])
        cgroup = ""
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if not controllers or "cpu" in controllers.split(","):
                cgroup = path
                if controllers:
                    break
        group, group_nice = "", nice
        if cgroup == "/" and _autogroups():
            # "/autogroup-25 nice 0"; empty for a process that no setsid has moved out of init's
            # group (what a service manager or a container's first process starts): the kernel
            # schedules it beside the autogroups by its own nice value
            fields = Path(f"/proc/{pid}/autogroup").read_text().split()
            if fields:
                name, _, value = fields
                group, group_nice = name, int(value)
    except (OSError, ValueError, IndexError):
        return None
    return cgroup, group, group_nice, nice


def _autogroups() -> bool:
    """Whether the kernel groups each terminal's processes for the scheduler (autogroups)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def _yields(theirs: tuple[str, str, int, int] | None, mine: tuple[str, str, int, int]) -> bool:
    """Whether a process scheduled as ``theirs`` leaves a core to one scheduled as ``mine``
    (see :func:`_scheduling`): within one group, by its own nice value; between two groups of
    one cgroup, by the nice values the groups compete with; between two cgroups, never (their
    weights are not read)."""
    if theirs is None or theirs[0] != mine[0]:
        return False
    if theirs[1] != mine[1]:
        return theirs[2] - mine[2] >= YIELDING_NICE
    return theirs[3] - mine[3] >= YIELDING_NICE


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
    threads = torch.get_num_threads()
    if threads <= 1:
        return
    cpus = available_cpus()
    # other processes' busy cores count as the workers' do: torch's threads wait on them too
    others = int(CpuLoad.measure(0.05) + 0.5)
    fits = max(1, cpus - num_workers - others)
    if threads > fits:
        busy = f" while other processes keep {others} busy" if others else ""
        warnings.warn(
            f"torch uses {threads} threads and vecaccel {num_workers} env workers on {cpus} "
            f"cores{busy}: torch's spinning threads will starve the workers. Call "
            f"torch.set_num_threads({fits}) or pass fewer num_workers.",
            TorchThreadsWarning,
            stacklevel=user_stacklevel() if stacklevel is None else stacklevel + 1,
        )
