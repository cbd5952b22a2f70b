"""Environments and checks shared by the core test suite.

Everything here is module level so that env functions (``functools.partial`` of these classes
and functions) pickle by reference under the ``spawn`` start method.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import threading
import time
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "CounterEnv",
    "DictTupleEnv",
    "EchoEnv",
    "InfoWrapper",
    "counter_fns",
    "make_cartpole",
    "make_dict_tuple",
    "env_value",
    "worker_pid",
    "exit_worker",
    "assert_same",
    "child_pids",
    "shm_entries",
    "open_fds",
    "process_gone",
    "wait_until",
]

#: Fault kinds that end the process; they never run in the process named by ``safe_pid``.
HARD_FAULTS = ("exit", "sigkill", "segfault")


def _fault(kind: str, where: str, exit_code: int, safe_pid: int | None) -> None:
    if kind in HARD_FAULTS and safe_pid is not None and os.getpid() == safe_pid:
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

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        if self.fault_reset is not None and self.resets == self.fault_reset:
            self._do_fault(f"reset {self.resets}")
        return self._obs(), {}

    def step(self, action):
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

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(self.observation_space.shape, 7, np.uint8), {}

    def step(self, action):
        return np.full(self.observation_space.shape, int(action), np.uint8), 0.0, False, False, {}


def counter_fns(num_envs: int, faulty: dict[int, dict[str, Any]] | None = None) -> list:
    """One ``CounterEnv`` function per env; ``faulty`` maps env index to its fault kwargs."""
    faulty = faulty or {}
    safe = {"safe_pid": os.getpid()}
    return [partial(CounterEnv, **safe, **faulty.get(i, {})) for i in range(num_envs)]


class DictTupleEnv(gym.Env):
    """A seeded env with nested Dict/Tuple spaces, irregular infos and an ``rgb_array`` render.

    Episodes end at random (terminated) and, through ``make_dict_tuple``, at a time limit.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-100.0, 100.0, shape=(2,), dtype=np.float32),
                "mode": spaces.Discrete(4, start=-1),
                "flags": spaces.MultiBinary(3),
                "pair": spaces.Tuple(
                    (
                        spaces.MultiDiscrete([3, 5]),
                        spaces.Box(0, 255, shape=(2, 2), dtype=np.uint8),
                    )
                ),
            }
        )
        self.action_space = spaces.Tuple(
            (
                spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
                spaces.Dict({"choice": spaces.Discrete(3), "bits": spaces.MultiBinary(2)}),
            )
        )
        self.value = 0  # read and written by get_attr/set_attr tests
        self.t = 0
        self.position = np.zeros(2, dtype=np.float32)

    def add(self, x: int) -> int:
        return self.value + x

    def _obs(self) -> dict:
        rng = self.np_random
        return {
            "position": self.position.copy(),
            "mode": np.int64(self.t % 4 - 1),
            "flags": rng.integers(0, 2, size=3, dtype=np.int8),
            "pair": (
                np.array([self.t % 3, int(rng.integers(0, 5))], dtype=np.int64),
                rng.integers(0, 256, size=(2, 2), dtype=np.uint8),
            ),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.position = self.np_random.uniform(-1, 1, size=2).astype(np.float32)
        info: dict[str, Any] = {"start": self.position.copy()}
        if options and "tag" in options:
            info["tag"] = options["tag"]
        return self._obs(), info

    def step(self, action):
        move, discrete = action
        self.t += 1
        self.position = np.clip(self.position + move, -100, 100).astype(np.float32)
        reward = float(discrete["choice"]) - float(np.sum(discrete["bits"])) * 0.5
        terminated = bool(self.np_random.random() < 0.15)
        info: dict[str, Any] = {"t": self.t}
        if self.t % 2 == 0:
            info["even"] = np.array([self.t, -self.t], dtype=np.int32)
        if self.t % 3 == 0:
            info["nested"] = {"third": float(self.t) / 3, "label": f"t{self.t}"}
        return self._obs(), reward, terminated, False, info

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        frame = np.zeros((6, 4, 3), dtype=np.uint8)
        frame[..., 0] = self.t % 256
        frame[0, 0] = (np.abs(self.position[0]) * 10) % 256
        return frame


def make_dict_tuple(max_episode_steps: int = 7, render_mode: str | None = None) -> gym.Env:
    env = DictTupleEnv(render_mode=render_mode)
    return gym.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)


class InfoWrapper(gym.Wrapper):
    """Adds irregular infos of several types to an env (ints, floats, arrays, objects)."""

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.count = 0
        return obs, {**info, "reset_count": np.int32(7)}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.count += 1
        info = dict(info)
        info["count"] = self.count
        if self.count % 2:
            info["odd"] = np.float32(self.count) / 2
            info["label"] = f"step-{self.count}"
        return obs, reward, terminated, truncated, info


def make_cartpole(max_episode_steps: int = 10, infos: bool = True) -> gym.Env:
    env = gym.make("CartPole-v1", max_episode_steps=max_episode_steps)
    return InfoWrapper(env) if infos else env


class EchoEnv(gym.Env):
    """Observation and action spaces are one space; each step observes the action it was given."""

    def __init__(self, space: spaces.Space) -> None:
        self.observation_space = space
        self.action_space = space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(0 if seed is None else seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return action, 0.0, False, False, {}


def env_value(env: gym.Env, offset: int = 0) -> int:
    """A function for ``call_indices(fn, ...)``: reads ``value`` through the wrappers."""
    return env.get_wrapper_attr("value") + offset


# ---------------------------------------------------------------------------------------------
# checks


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Assert two results are identical: same tree, keys, types, dtypes, shapes and values.

    Object arrays (``final_obs``, infos of unknown types) are compared element by element.
    """
    where = path or "<root>"
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), f"{where}: {type(a)} vs {type(b)}"
        assert sorted(a) == sorted(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), (
            f"{where}: {type(a)} vs {type(b)}"
        )
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} vs {b.shape}"
        if a.dtype == object:
            for index in np.ndindex(a.shape):
                assert_same(a[index], b[index], f"{path}[{index}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=where, strict=True)
    else:
        assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)} ({a!r} vs {b!r})"
        assert a == b, f"{where}: {a!r} vs {b!r}"


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


def process_gone(pid: int) -> bool:
    """``True`` once ``pid`` no longer runs (absent, or a zombie waiting for its reaper)."""
    stat = _proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(interval)


def worker_pid(env: gym.Env) -> int:
    """A function for ``call(fn)``: the pid of the process the env lives in."""
    return os.getpid()


def exit_worker(env: gym.Env, code: int = 4) -> None:
    """A function for ``call(fn)`` that ends the worker process at once."""
    os._exit(code)


def broken_plugin_site(root, dist: str, entry_point: str, module: str):
    """A folder to put on ``PYTHONPATH``: an installed distribution ``dist`` whose ``vecaccel``
    entry point ``entry_point`` names ``module``, which raises at import."""
    site = root / "site"
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[vecaccel]\n{entry_point} = {module}\n")
    (site / f"{module}.py").write_text('raise RuntimeError("boom at import")\n')
    return site
