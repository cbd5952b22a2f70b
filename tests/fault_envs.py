"""A deterministic env that fails on demand: the fault-injection tool of the reliability tests.

:class:`FaultEnv` observes ``[value, t, last action]``, where ``value`` follows a recurrence
driven only by the env's seed and the actions it was given, so a twin stepped in this process
with the same seeds and actions must observe exactly the same thing (episodes end, and are
reset, along the way).

A fault is armed on one env and fires at that env's next *advance*: its next ``step()``, or the
``reset()`` a vector env's autoreset makes (called with neither seed nor options; explicit
resets in the tests always pass ``options``). Arm it either way:

* ``envs.set_attr("inject", "kill", indices=[i])`` (``set_attr_indices`` on vecaccel envs):
  goes through the vector env itself, between steps;
* :func:`arm` writes a control file ``<control_dir>/<env_id>`` that the env claims (by an
  atomic rename) at its next advance: it reaches the env without any command from the parent,
  e.g. while a step is in flight, or from another process.

Either way the fault fires once; an env rebuilt by the restart policy starts unarmed.

Everything here is module level, so env functions (``functools.partial`` of :class:`FaultEnv`)
pickle by reference under ``spawn``.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import os
import signal
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "FAULTS",
    "HARD_FAULTS",
    "InjectedFault",
    "FaultEnv",
    "fault_env_fns",
    "arm",
    "env_state",
    "env_pid",
    "leaked_shm",
    "LeakBaseline",
]

#: What ``inject`` accepts. ``slow`` and ``hang`` only sleep (``slow_seconds``, ``hang_seconds``)
#: and then step normally; the others end the step (``raise``) or the worker process.
FAULTS = ("raise", "exit", "kill", "segfault", "slow", "hang")

#: Faults that end the process the env runs in.
HARD_FAULTS = ("exit", "kill", "segfault")


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault raises inside the env."""


class FaultEnv(gym.Env):
    """A deterministic env whose observation depends only on its seed and its actions.

    Args:
        env_id: the env's index in its vector env (names its control file, shows in errors).
        horizon: steps after which an episode is truncated (episodes also terminate at random).
        safe_pid: a pid in which process-ending faults are refused (raised as
            :class:`InjectedFault` instead): the test process, where the serial backend and
            the parent's probe env run.
        control_dir: a directory watched for control files (see :func:`arm`), or ``None``.
        slow_seconds: how long a ``slow`` fault sleeps.
        hang_seconds: how long a ``hang`` fault sleeps (meant to exceed ``step_timeout``).

    Attributes set with ``set_attr``: ``inject`` (a fault of :data:`FAULTS`, or ``None``),
    ``reward_scale`` (multiplies rewards), ``slow_seconds``, ``hang_seconds``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        env_id: int = 0,
        horizon: int = 9,
        safe_pid: int | None = None,
        control_dir: str | None = None,
        slow_seconds: float = 0.3,
        hang_seconds: float = 60.0,
    ) -> None:
        self.env_id = env_id
        self.horizon = horizon
        self.safe_pid = safe_pid
        self.control_dir = control_dir
        self.slow_seconds = slow_seconds
        self.hang_seconds = hang_seconds
        self.inject: str | None = None
        self.reward_scale = 1.0
        self.observation_space = spaces.Box(-1.0, 1e6, shape=(3,), dtype=np.float64)
        self.action_space = spaces.Discrete(3)
        self.value = 0
        self.t = 0
        self.last_action = -1

    # -- faults -----------------------------------------------------------------------------

    def _claim_control_file(self) -> str | None:
        path = os.path.join(self.control_dir, str(self.env_id))
        if not os.path.exists(path):
            return None
        claimed = f"{path}.{os.getpid()}.claimed"
        try:
            os.rename(path, claimed)  # atomic: one advance claims it
        except OSError:
            return None
        with open(claimed) as file:
            kind = file.read().strip()
        os.unlink(claimed)
        return kind or None

    def _advance(self, where: str) -> None:
        """Fire the armed fault, if any (once)."""
        kind, self.inject = self.inject, None
        if kind is None and self.control_dir is not None:
            kind = self._claim_control_file()
        if kind is None:
            return
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; choose from {FAULTS}")
        if kind == "slow":
            time.sleep(self.slow_seconds)
            return
        if kind == "hang":
            time.sleep(self.hang_seconds)
            return
        if kind == "raise" or (kind in HARD_FAULTS and os.getpid() == self.safe_pid):
            raise InjectedFault(f"injected {kind} in env {self.env_id} ({where})")
        if kind == "exit":
            os._exit(3)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10)  # SIGKILL is delivered before this returns
        if kind == "segfault":
            faulthandler.disable()  # a forked worker inherits pytest's handler; keep logs quiet
            ctypes.string_at(0)  # reads address 0: SIGSEGV

    # -- the Env API ------------------------------------------------------------------------

    def _obs(self) -> np.ndarray:
        return np.array([self.value, self.t, self.last_action], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        if seed is None and options is None:  # an autoreset (explicit resets pass options)
            self._advance("autoreset")
        super().reset(seed=seed)
        self.value = int(self.np_random.integers(0, 1000))
        self.t = 0
        self.last_action = -1
        return self._obs(), {}

    def step(self, action):
        self._advance("step")
        action = int(action)
        noise = int(self.np_random.integers(0, 7))
        self.t += 1
        self.value = (self.value * 31 + action * 5 + noise) % 10007
        self.last_action = action
        reward = self.reward_scale * (action - 1 + noise / 8)
        terminated = self.value % 11 == 0
        truncated = self.t >= self.horizon
        return self._obs(), float(reward), terminated, truncated, {}

    # -- helpers for call() -----------------------------------------------------------------

    def get_state(self) -> tuple:
        """Everything the next observations depend on (compared with the twin's)."""
        return (
            self.value,
            self.t,
            self.last_action,
            self.reward_scale,
            self.np_random.bit_generator.state["state"]["state"],
        )


def fault_env_fns(num_envs: int, *, safe: bool = True, **kwargs) -> list[Callable[[], FaultEnv]]:
    """One env function per env; ``safe`` refuses hard faults in this (the calling) process."""
    if safe:
        kwargs.setdefault("safe_pid", os.getpid())
    return [functools.partial(FaultEnv, env_id=i, **kwargs) for i in range(num_envs)]


def arm(control_dir: str, env_id: int, kind: str) -> None:
    """Arm ``kind`` on env ``env_id`` through its control file (fires at its next advance)."""
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}; choose from {FAULTS}")
    path = os.path.join(control_dir, str(env_id))
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as file:
        file.write(kind)
    os.replace(temporary, path)  # the env never sees a half-written file


def env_state(env: gym.Env) -> tuple:
    """A function for ``call(fn)``: the env's :meth:`FaultEnv.get_state`."""
    return env.unwrapped.get_state()


def env_pid(env: gym.Env) -> int:
    """A function for ``call(fn)``: the pid of the process the env lives in."""
    return os.getpid()


# ---------------------------------------------------------------------------------------------
# leak checks on a machine shared with other jobs


def _shm_holders(names: set[str]) -> dict[str, set[int]]:
    """The processes that map or hold open each ``/dev/shm`` entry in ``names``."""
    paths = {f"/dev/shm/{name}": name for name in names}
    holders: dict[str, set[int]] = {name: set() for name in names}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/maps") as file:
                maps = file.read()
            targets = set()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    targets.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
        except OSError:
            continue
        for path, name in paths.items():
            if path in maps or path in targets:
                holders[name].add(pid)
    return holders


def leaked_shm(before: set[str], ours: set[int] | None = None, settle: float = 10.0) -> set[str]:
    """``/dev/shm`` entries that appeared since ``before`` and that no other job holds.

    Another job on the machine may create entries (``sem.mp-*`` semaphores...) while a test
    runs: an entry that a process outside ``ours`` (default: this process) maps or holds open is
    theirs, and one that nobody holds may be on its way out (a job that just ended, whose
    resource tracker removes it), so the check is repeated for up to ``settle`` seconds. What is
    left is a leak, ours most likely.
    """
    ours = {os.getpid()} if ours is None else ours
    deadline = time.monotonic() + settle
    while True:
        try:
            new = set(os.listdir("/dev/shm")) - before
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
        from helpers_envs import child_pids

        self._child_pids = child_pids
        self.children = child_pids()
        self.shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()

    def check(self, timeout: float = 10.0) -> None:
        import multiprocessing

        def new_children() -> set[int]:
            active = {p.pid for p in multiprocessing.active_children()}  # reaps finished ones
            return (self._child_pids() | active) - self.children

        deadline = time.monotonic() + timeout
        while new_children() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not new_children(), f"child processes left behind: {sorted(new_children())}"
        leaked = leaked_shm(self.shm)
        assert not leaked, f"/dev/shm entries left behind: {sorted(leaked)}"
