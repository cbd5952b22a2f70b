"""Fixtures shared by the test suite: the backends under contract, leak checks, the plugin manager."""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vecaccel import get_plugin_manager
from vecaccel.manager import _reset_plugin_manager

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))  # `import toy_envs`, also in
# spawned workers

from backend_matrix import contract_params, options_for, select

from vecaccel.testing.leaks import LeakBaseline, child_pids, shm_entries, wait_until

#: Start methods every fault is tested under.
CONTEXTS = ("fork", "spawn")


@pytest.fixture(params=contract_params())
def backend(request) -> str:
    """The name of a registered backend under the step-by-step contract."""
    if isinstance(request.param, Exception):
        raise request.param
    return request.param


@pytest.fixture
def backend_options(backend) -> dict:
    """The options ``backend`` runs with (``backend_matrix.SETUPS``)."""
    return options_for(backend)


def _selected(**wanted: bool) -> list:
    """``select(**wanted)``, or a param that fails the tests using it if the registry fails
    (rather than the collection of every test file)."""
    try:
        return select(**wanted)
    except Exception as exc:  # noqa: BLE001
        return [pytest.param(exc, id="list_backends-failed")]


@pytest.fixture(params=_selected(lockstep=True, envs_in_workers=True, tensors=False))
def process_backend(request) -> str:
    """A backend that steps every env in worker processes, in lockstep, as NumPy arrays: the
    fault and lifecycle tests of such a pool apply to it."""
    if isinstance(request.param, Exception):
        raise request.param
    return request.param


@pytest.fixture(params=CONTEXTS)
def context(request) -> str:
    return request.param


class LeakCheck:
    """Snapshots children and /dev/shm entries; ``check()`` fails on any new one still there."""

    def __init__(self) -> None:
        self.children = child_pids()
        self.shm = shm_entries()

    def new_children(self) -> set[int]:
        active = {p.pid for p in multiprocessing.active_children()}  # also reaps finished ones
        return (child_pids() | active) - self.children

    def check(self, timeout: float = 5.0) -> None:
        wait_until(lambda: not self.new_children(), timeout)
        leftover = self.new_children()
        assert not leftover, f"child processes left behind: {sorted(leftover)}"
        from vecaccel.testing.leaks import leaked_shm

        new_shm = leaked_shm(self.shm)
        assert not new_shm, f"/dev/shm entries left behind: {sorted(new_shm)}"


@pytest.fixture
def leak_check():
    """Fails the test if it leaves a child process or a /dev/shm entry behind."""
    checker = LeakCheck()
    yield checker
    checker.check()


@pytest.fixture
def no_leaks() -> Iterator[LeakBaseline]:
    """Fails the test if it leaves a child process or a ``/dev/shm`` entry behind (entries
    other jobs on the machine hold are theirs)."""
    baseline = LeakBaseline()
    yield baseline
    baseline.check()


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Two cores, and env workers on both: torch's spinning threads would starve them."""
    try:
        import torch
    except ImportError:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """A test that leaves SIGINT's or SIGTERM's handler, or the blocked signals, changed in this
    process would change how every later test here handles Ctrl-C and termination (a child
    inherits an ignored or blocked signal): put them back, and warn naming the test."""
    import signal
    import warnings

    watched = (signal.SIGINT, signal.SIGTERM)
    handlers = {signum: signal.getsignal(signum) for signum in watched}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    changed = [
        signal.Signals(signum).name
        for signum, handler in handlers.items()
        if signal.getsignal(signum) != handler
    ]
    if signal.pthread_sigmask(signal.SIG_BLOCK, []) != mask:
        changed.append("the blocked signals")
    for signum, handler in handlers.items():
        if handler is not None:  # None: a handler not set from Python, left as it is
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if changed:
        warnings.warn(f"the test left {', '.join(changed)} changed; restored", stacklevel=1)


@pytest.fixture
def fresh_plugin_manager() -> Iterator[None]:
    """Build the plugin manager anew for the test, and again for whatever runs next."""
    _reset_plugin_manager()
    yield
    _reset_plugin_manager()


@pytest.fixture
def trainers_plugin() -> Iterator[None]:
    """Register the trainers' commands unless ``DEFAULT_PLUGINS`` already does."""
    from vecaccel.trainers.cli import commands as trainers_cli

    pm = get_plugin_manager()
    registered_here = not pm.is_registered(trainers_cli)
    if registered_here:
        pm.register(trainers_cli, name="vecaccel.trainers.cli.commands")
    yield
    if registered_here:
        pm.unregister(trainers_cli)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """Untrained checkpoints (a run directory each) of PPO on CartPole, PPO on Pendulum and DQN
    on CartPole, written through the Python API."""
    import gymnasium as gym
    import numpy as np

    from vecaccel.trainers import DQN, PPO

    root = tmp_path_factory.mktemp("checkpoints")
    ppo = PPO(
        None,
        env_id="CartPole-v1",
        observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
        backend="serial",
        num_envs=2,
        num_steps=4,
        torch_threads=1,
    )
    ppo.save(root / "ppo" / "checkpoint.pt")
    pendulum = PPO(
        None,
        env_id="Pendulum-v1",
        observation_space=gym.spaces.Box(-8.0, 8.0, (3,), np.float32),
        action_space=gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
        backend="serial",
        num_envs=2,
        num_steps=4,
        torch_threads=1,
    )
    pendulum.save(root / "pendulum" / "checkpoint.pt")
    dqn = DQN("CartPole-v1", device="cpu", progress=False, tensorboard=False, torch_threads=1)
    dqn.save(root / "dqn" / "checkpoint.pt")
    dqn.close()
    return root


def _has_module_fixture(path: Path, cache: dict[Path, bool] = {}) -> bool:  # noqa: B006 - a cache
    """Whether the test file ``path`` defines a module-scoped fixture."""
    if path not in cache:
        try:
            text = path.read_text()
        except OSError:
            text = ""
        cache[path] = re.search(r"@pytest\.fixture\([^)]*scope=\"module\"", text) is not None
    return cache[path]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """How ``make test`` (pytest-xdist, ``-n``) spreads the tests over its workers: one test at a
    time, to whichever worker is free, except that the tests of a file that defines a
    module-scoped fixture (a Ray cluster, one torchrun launch, the GPU script's smoke run) go to
    one worker together, so that the set-up runs once. That also keeps the heaviest tests (the
    torchrun and Ray ones, which start several processes each) from running side by side on the
    machine's few cores: spread one by one they doubled each other's time."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetUpScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if _has_module_fixture(config.rootpath / path) else nodeid

    return SharedSetUpScheduling(config, log)
