"""The CPUs a process may use, the load others put on them, and the torch-threads warning, which
points at the user's line wherever in vecaccel it is raised.

It is raised deep inside a backend's constructor (and, for the SB3 adapter, under SB3's own
``make_vec_env``); a warning that names ``vecaccel/make.py`` tells the user nothing about which
of their lines to change. The library's own tools set torch's threads and stay quiet.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from helpers import busy_loop_elsewhere

import vecaccel
from vecaccel.testing.leaks import wait_until
from vecaccel.worker import TorchThreadsWarning, usable_cpus
from vecaccel.worker.cpus import (
    CpuLoad,
    _autogroups,
    _scheduling,
    _yields,
    available_cpus,
    cpu_quota,
)


@pytest.fixture
def too_many_torch_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(usable_cpus() + 1)  # more than any worker count leaves free
    yield
    torch.set_num_threads(previous)


def _recorded(make) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = make()
        envs.close()
    return [w for w in caught if issubclass(w.category, TorchThreadsWarning)]


def test_the_action_server_warning_names_the_callers_line(too_many_torch_threads):
    line = inspect.currentframe().f_lineno + 2
    caught = _recorded(
        lambda: vecaccel.make_vec("CartPole-v1", 2, backend="action_server", num_workers=1)
    )
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert caught[0].filename == __file__
    assert caught[0].lineno == line
    assert issubclass(TorchThreadsWarning, RuntimeWarning)  # filters on RuntimeWarning still apply


def test_the_sb3_adapter_warning_names_the_line_that_called_sb3(too_many_torch_threads):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    import vecaccel.adapters.sb3

    line = inspect.currentframe().f_lineno + 2  # the line of the call
    caught = _recorded(
        lambda: make_vec_env(
            "CartPole-v1", n_envs=2, vec_env_cls=vecaccel.adapters.sb3.VecAccelEnv,
            vec_env_kwargs={"backend": "shm", "num_workers": 1},
        )
    )  # fmt: skip
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_tune_sets_torch_threads_for_the_action_server_and_says_nothing(too_many_torch_threads):
    from vecaccel.tune import Trial, measure_trial

    threads = torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchThreadsWarning)
        fns = [lambda: __import__("gymnasium").make("CartPole-v1")] * 2
        trial = Trial("action_server", 2, {"num_workers": 1})
        assert measure_trial(fns, trial, seconds=0.05) > 0
    assert torch.get_num_threads() == threads  # the caller's setting is back


# -- the machine's load -------------------------------------------------------------------------


@pytest.mark.skipif(usable_cpus() < 2, reason="needs two CPUs")
@pytest.mark.parametrize("setsid", [False, True])
def test_a_reading_counts_a_busy_loop_of_another_process(setsid):
    with busy_loop_elsewhere(setsid=setsid):
        assert CpuLoad.measure(0.3) >= 0.5


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("setsid", [False, True])
def test_a_niced_job_yields_unless_setsid_schedules_it_apart(setsid):
    # the other tests' processes share the machine: the verdict on the loop is read, not a total
    with busy_loop_elsewhere(nice=19, setsid=setsid) as pid:
        first = CpuLoad()

        def ticked() -> bool:
            return CpuLoad().others[pid][0] > first.others[pid][0]

        # a niced loop beside a busy suite may get no tick for a while: read until it has one
        assert wait_until(ticked, timeout=10, interval=0.3)  # the loop ran, and was seen
        yields = _yields(_scheduling(pid), _scheduling(os.getpid()))
    # under setsid a niced job's nice counts only within its own autogroup where the
    # kernel has autogroups: it takes a core from this process as any job does
    assert yields is not (setsid and _autogroups())


@pytest.mark.skipif(
    usable_cpus() < 2 or not _autogroups(), reason="needs two CPUs and the kernel's autogroups"
)
def test_a_reading_counts_a_niced_job_started_by_setsid():
    with busy_loop_elsewhere(nice=19, setsid=True):
        assert CpuLoad.measure(0.3) >= 0.5


def test_who_yields_to_whom():
    mine = ("/", "/autogroup-1", 0, 0)
    # one autogroup: by the processes' nice values
    assert _yields(("/", "/autogroup-1", 0, 15), mine)
    assert not _yields(("/", "/autogroup-1", 0, 10), mine)
    assert not _yields(("/", "/autogroup-1", 0, 19), ("/", "/autogroup-1", 0, 19))
    # another autogroup: by the groups' nice values, whatever the process's own
    assert not _yields(("/", "/autogroup-2", 0, 19), mine)
    assert _yields(("/", "/autogroup-2", 19, 0), mine)
    # outside every autogroup (init's group): by its own nice value against a group's
    assert _yields(("/", "", 19, 19), mine)
    assert not _yields(("/", "", 10, 10), mine)
    assert not _yields(("/", "/autogroup-2", 0, 19), ("/", "", 0, 0))
    assert _yields(("/", "/autogroup-2", 19, 0), ("/", "", 0, 0))
    assert _yields(("/", "", 19, 19), ("/", "", 0, 0))
    # another cgroup, or a process gone: counted
    assert not _yields(("/user.slice", "", 19, 19), mine)
    assert not _yields(None, mine)


def _outside_every_autogroup() -> int | None:
    """A live process in the root cgroup that no autogroup holds (init, or what a container's
    first process starts without setsid), if this machine shows one."""
    for name in os.listdir("/proc"):
        try:
            if (
                name.isdigit()
                and Path(f"/proc/{name}/cgroup").read_text().strip().endswith(":/")
                and Path(f"/proc/{name}/autogroup").read_text() == ""
            ):
                return int(name)
        except OSError:
            continue
    return None


@pytest.mark.skipif(
    not _autogroups() or _outside_every_autogroup() is None,
    reason="needs the kernel's autogroups and a process outside them",
)
def test_a_process_outside_every_autogroup_competes_by_its_own_nice():
    pid = _outside_every_autogroup()
    scheduling = _scheduling(pid)
    assert scheduling is not None
    _, group, group_nice, nice = scheduling
    assert group == ""
    assert group_nice == nice


def test_a_reading_leaves_out_this_process_and_its_children():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        first = CpuLoad()
        time.sleep(0.3)
        second = CpuLoad()
        assert second.own - first.own >= 5  # clock ticks of the child's loop
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(usable_cpus() < 2, reason="needs two CPUs")
def test_the_sb3_adapter_warning_counts_other_processes_busy_cores():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    import vecaccel.adapters.sb3

    previous = torch.get_num_threads()
    torch.set_num_threads(available_cpus())
    try:
        with busy_loop_elsewhere():
            caught = _recorded(
                lambda: make_vec_env(
                    "CartPole-v1", n_envs=2, vec_env_cls=vecaccel.adapters.sb3.VecAccelEnv,
                    vec_env_kwargs={"backend": "shm", "num_workers": 1},
                )
            )  # fmt: skip
    finally:
        torch.set_num_threads(previous)
    assert len(caught) == 1
    assert "while other processes keep" in str(caught[0].message)


def test_the_quota_and_the_available_cpus_agree_with_the_affinity():
    quota = cpu_quota()
    assert quota is None or quota > 0
    assert 1 <= available_cpus() <= usable_cpus()
