"""Small envs for testing a vector env: step counters, planted faults, heavy-tailed step times.

Everything here is module level, so env functions (``functools.partial`` of these classes) pickle
by reference under the ``spawn`` and ``forkserver`` start methods.

Example:
    >>> from vecaccel.testing.envs import CounterEnv
    >>> env = CounterEnv()
    >>> _ = env.reset(seed=0)
    >>> env.step(0)[0]
    array([1])
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, SupportsFloat, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces

# -- CounterEnv: counts its steps, and fails on the step, reset or construction asked for ----

#: Fault kinds that end the process; they never run in the process named by ``safe_pid``.
COUNTER_HARD_FAULTS = ("exit", "sigkill", "segfault")


def _fault(kind: str, where: str, exit_code: int, safe_pid: int | None) -> None:
    if kind in COUNTER_HARD_FAULTS and safe_pid is not None and os.getpid() == safe_pid:
        # the env runs in the test process itself (the parent's probe, or the serial backend)
        raise RuntimeError(f"refusing to {kind} the test process ({where})")
    if kind == "raise":
        raise ValueError(f"boom in {where}")
    if kind == "sys_exit":
        raise SystemExit(exit_code)
    if kind == "exit":
        os._exit(exit_code)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
    if kind == "segfault":
        faulthandler.disable()  # a forked worker inherits pytest's handler; keep the log quiet
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise AssertionError(f"unknown fault {kind!r}")


class CounterEnv(gym.Env):
    """An env whose observation is the number of ``step`` calls it has seen (never reset).

    That makes stale results visible: the ``k``-th step must return ``k``.

    Args:
        fault: what goes wrong: ``"raise"`` (a ``ValueError``), ``"sys_exit"``
            (``SystemExit``, as ``sys.exit`` raises), ``"exit"`` (``os._exit``),
            ``"sigkill"`` or ``"segfault"``.
        fault_step: the step call (1-based) at which ``fault`` happens, or ``None``.
        fault_reset: the reset call (1-based) at which ``fault`` happens, or ``None``.
        fault_init: ``fault`` happens in the constructor.
        exit_code: the code for ``fault="exit"``.
        sleep_step: the step call (1-based) that sleeps ``sleep_seconds``; ``0`` for every step.
        sleep_seconds: how long that step sleeps.
        safe_pid: a pid in which process-ending faults are refused (the test process).
        stamp_path: a file the env writes ``time.monotonic()`` into just before a fault.
        lock_info_step: the step call (1-based) whose info holds a lock (cannot be pickled).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        fault: str = "raise",
        fault_step: int | None = None,
        fault_reset: int | None = None,
        fault_init: bool = False,
        exit_code: int = 3,
        sleep_step: int | None = None,
        sleep_seconds: float = 0.0,
        safe_pid: int | None = None,
        stamp_path: str | None = None,
        lock_info_step: int | None = None,
    ) -> None:
        self.fault = fault
        self.fault_step = fault_step
        self.fault_reset = fault_reset
        self.exit_code = exit_code
        self.sleep_step = sleep_step
        self.sleep_seconds = sleep_seconds
        self.safe_pid = safe_pid
        self.stamp_path = stamp_path
        self.lock_info_step = lock_info_step
        self.observation_space = spaces.Box(0, 2**31, shape=(1,), dtype=np.int64)
        self.action_space = spaces.Discrete(2)
        self.steps = 0
        self.resets = 0
        if fault_init:
            self._do_fault("init")

    def _do_fault(self, where: str) -> None:
        if self.stamp_path is not None:
            with open(self.stamp_path, "w") as file:
                file.write(repr(time.monotonic()))
        _fault(self.fault, where, self.exit_code, self.safe_pid)

    def _obs(self) -> np.ndarray:
        return np.array([self.steps], dtype=np.int64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.resets += 1
        if self.fault_reset is not None and self.resets == self.fault_reset:
            self._do_fault(f"reset {self.resets}")
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        self.steps += 1
        if self.sleep_step is not None and self.sleep_step in (0, self.steps):
            time.sleep(self.sleep_seconds)
        if self.fault_step is not None and self.steps == self.fault_step:
            self._do_fault(f"step {self.steps}")
        info = {"lock": threading.Lock()} if self.steps == self.lock_info_step else {}
        return self._obs(), 1.0, False, False, info


class WideSpacesEnv(gym.Env):
    """Spaces whose pickles (~1.4 MB of bounds) are larger than a worker's socket buffer, so a
    worker's startup message needs the pool's writer thread."""

    observation_space = gym.spaces.Box(0, 255, (480, 480, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return np.full(self.observation_space.shape, 7, np.uint8), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        return np.full(self.observation_space.shape, int(action), np.uint8), 0.0, False, False, {}


def counter_fns(
    num_envs: int, faulty: dict[int, dict[str, Any]] | None = None
) -> list[Callable[[], CounterEnv]]:
    """One ``CounterEnv`` function per env; ``faulty`` maps env index to its fault kwargs."""
    faulty = faulty or {}
    safe: dict[str, Any] = {"safe_pid": os.getpid()}
    return [partial(CounterEnv, **safe, **faulty.get(i, {})) for i in range(num_envs)]


# -- HeavyTailEnv: steps of uneven cost, for the waits of lock-step and asynchronous stepping ---


class HeavyTailEnv(gym.Env):
    """Costs ``cpu_s`` of CPU per step; a fraction ``p_slow`` of steps also sleeps ``sleep_s``."""

    def __init__(self, cpu_s: float = 0.0002, p_slow: float = 0.02, sleep_s: float = 0.02):
        self.cpu_s, self.p_slow, self.sleep_s = cpu_s, p_slow, sleep_s
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        end = time.perf_counter() + self.cpu_s
        while time.perf_counter() < end:
            pass
        if self.np_random.random() < self.p_slow:
            time.sleep(self.sleep_s)
        self.t += 1
        return np.zeros(4, np.float32), 1.0, False, self.t >= 200, {}


class SleepEnv(gym.Env):
    """Sleeps ``step_s`` in every step (a remote simulator's latency, with no CPU used);
    observes its step count. The batch former's checks make one env slow with it.

    Example:
        >>> env = SleepEnv(0.0)
        >>> env.reset(seed=0)[0].tolist(), env.step(0)[0].tolist()
        ([0.0], [1.0])
    """

    def __init__(self, step_s: float = 0.0) -> None:
        self.step_s = step_s
        self.observation_space = spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.step_s:
            time.sleep(self.step_s)
        self.t += 1
        return np.array([self.t], np.float32), 1.0, False, False, {}


class IntervalEnv(gym.Env):
    """Sleeps ``step_s`` in each step and reset and reports when it was inside
    (``info["entered"]``, ``info["left"]``, ``time.monotonic()`` seconds, one clock for every
    process), so that a test can count how many envs were inside at once. With ``lock_path``
    it holds an exclusive ``flock`` on that file while inside, as an env that shares one
    licence, device or renderer with the others does.

    Example:
        >>> env = IntervalEnv(0.0)
        >>> _, info = env.reset(seed=0)
        >>> info["entered"] <= info["left"]
        True
    """

    def __init__(self, step_s: float = 0.005, lock_path: str | None = None) -> None:
        self.step_s = step_s
        self.lock_path = lock_path
        self.observation_space = spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def _inside(self) -> dict[str, Any]:
        lock = None
        if self.lock_path is not None:
            import fcntl

            lock = open(self.lock_path, "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entered = time.monotonic()
            if self.step_s:
                time.sleep(self.step_s)
            return {"entered": entered, "left": time.monotonic()}
        finally:
            if lock is not None:
                lock.close()  # releases the flock

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), self._inside()

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        info = self._inside()
        self.t += 1
        return np.array([self.t], np.float32), 1.0, False, False, info


def most_inside_at_once(intervals: Any) -> int:
    """The most ``(entered, left)`` intervals that overlap at one instant.

    Example:
        >>> most_inside_at_once([(0.0, 2.0), (1.0, 3.0), (2.5, 4.0)])
        2
    """
    intervals = list(intervals)  # read twice: an iterator would be empty the second time
    events = sorted([(float(a), 1) for a, _ in intervals] + [(float(b), -1) for _, b in intervals])
    inside = most = 0
    for _, change in events:  # at a tie a leave (-1) sorts before an enter
        inside += change
        most = max(most, inside)
    return most


# -- FaultEnv: fails on demand, the fault-injection tool of the reliability tests -------------
#
# FaultEnv observes ``[value, t, last action]``, where ``value`` follows a recurrence driven
# only by the env's seed and the actions it was given, so a twin stepped in the test process
# with the same seeds and actions must observe exactly the same thing (episodes end, and are
# reset, along the way).
#
# A fault is armed on one env and fires at that env's next *advance*: its next ``step()``, or
# the ``reset()`` a vector env's autoreset makes (called with neither seed nor options;
# explicit resets in the tests always pass ``options``). Arm it either way:
#
# * ``envs.set_attr("inject", "kill", indices=[i])`` (``set_attr_indices`` on vecaccel envs):
#   goes through the vector env itself, between steps;
# * ``arm`` writes a control file ``<control_dir>/<env_id>`` that the env claims (by an atomic
#   rename) at its next advance: it reaches the env without any command from the parent, e.g.
#   while a step is in flight, or from another process.
#
# Either way the fault fires once; an env rebuilt by the restart policy starts unarmed.

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
        path = os.path.join(cast(str, self.control_dir), str(self.env_id))  # armed envs have one
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

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is None and options is None:  # an autoreset (explicit resets pass options)
            self._advance("autoreset")
        super().reset(seed=seed)
        self.value = int(self.np_random.integers(0, 1000))
        self.t = 0
        self.last_action = -1
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
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

    def get_state(self) -> tuple[Any, ...]:
        """Everything the next observations depend on (compared with the twin's)."""
        return (
            self.value,
            self.t,
            self.last_action,
            self.reward_scale,
            self.np_random.bit_generator.state["state"]["state"],
        )


def fault_env_fns(
    num_envs: int, *, safe: bool = True, **kwargs: Any
) -> list[Callable[[], FaultEnv]]:
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


def env_state(env: gym.Env[Any, Any]) -> tuple[Any, ...]:
    """A function for ``call(fn)``: the env's :meth:`FaultEnv.get_state`."""
    return cast(FaultEnv, env.unwrapped).get_state()


def env_pid(env: gym.Env) -> int:
    """A function for ``call(fn)``: the pid of the process the env lives in."""
    return os.getpid()
