"""torch's threads follow the cores the machine leaves free: at start, and while a run goes."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator

import pytest
import torch
from helpers import busy_loop_elsewhere

from vecaccel.trainers import PPO
from vecaccel.trainers.services.threads import (
    AdaptiveThreads,
    automatic_threads,
    configure_torch_threads,
    free_cores,
)
from vecaccel.worker import TorchThreadsWarning
from vecaccel.worker.cpus import available_cpus

needs_two_cpus = pytest.mark.skipif(available_cpus() < 2, reason="needs two CPUs")


@pytest.fixture
def two_threads() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def busy_loop() -> Iterator[None]:
    with busy_loop_elsewhere():
        yield


def test_free_cores_leave_what_others_keep_busy() -> None:
    cpus = available_cpus()
    assert free_cores(others=0.0) == cpus
    assert free_cores(others=0.3) == cpus  # a light background takes no core
    assert free_cores(others=1.0) == max(1, cpus - 1)
    assert free_cores(others=10.0) == 1


def test_automatic_threads_leave_the_workers_their_cores() -> None:
    cpus = available_cpus()
    assert automatic_threads("serial", num_envs=64, others=0.0) == cpus
    assert automatic_threads("shm", num_envs=64, others=0.0) == 1
    assert automatic_threads("shm", num_envs=64, num_workers=1, others=0.0) == max(1, cpus - 1)
    assert automatic_threads("serial", num_envs=8, reserved=1, others=0.0) == max(1, cpus - 1)


@needs_two_cpus
def test_a_run_starts_with_the_cores_a_busy_loop_leaves(busy_loop: None, two_threads: None) -> None:
    assert configure_torch_threads(0, "serial", num_envs=4) <= available_cpus() - 1
    assert configure_torch_threads(2, "serial", num_envs=4) == 2 == torch.get_num_threads()


@needs_two_cpus
def test_slow_updates_drop_a_thread_with_one_warning(two_threads: None) -> None:
    threads = AdaptiveThreads(0, "serial", num_envs=1, check_every=1e9, patience=3)
    assert threads.threads == 2
    with pytest.warns(TorchThreadsWarning, match=r"torch threads 2 -> 1: updates took 5\.0x"):
        for seconds in (0.01, 0.05, 0.05, 0.05):
            threads.observe(seconds)
    assert threads.threads == 1 == torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seconds in (0.01, 0.05, 0.05, 0.05):  # at one thread there is nothing to drop
            threads.observe(seconds)
    assert threads.changes == [(2, 1, "updates took 5.0x their best time")]


@needs_two_cpus
def test_a_slow_update_now_and_then_keeps_the_threads(two_threads: None) -> None:
    threads = AdaptiveThreads(0, "serial", num_envs=1, check_every=1e9, patience=3)
    for seconds in (0.01, 0.05, 0.011, 0.05, 0.05, 0.012, 0.05):
        threads.observe(seconds)
    threads.observe(0.5, updates=0)  # an iteration without updates says nothing
    assert threads.threads == 2 and threads.changes == []


@needs_two_cpus
def test_threads_follow_the_load_and_come_back_after_a_hold(two_threads: None) -> None:
    threads = AdaptiveThreads(0, "serial", num_envs=1, check_every=1.0)
    with pytest.warns(TorchThreadsWarning, match="other processes kept 1.0 cores busy"):
        threads.follow_load(1.0, now=100.0)
    assert threads.threads == 1
    threads.follow_load(0.0, now=101.0)  # within the hold
    assert threads.threads == 1
    threads.follow_load(0.0, now=103.0)
    assert threads.threads == 2 == torch.get_num_threads()
    threads.follow_load(1.2, now=104.0)
    threads.follow_load(0.0, now=107.0)  # dropped again after coming back: the hold doubled
    assert threads.threads == 1
    threads.follow_load(0.0, now=108.5)
    assert threads.threads == 2
    assert [change[:2] for change in threads.changes] == [(2, 1), (1, 2), (2, 1), (1, 2)]


@needs_two_cpus
def test_a_reading_sees_a_busy_loop_beside_the_run(busy_loop: None, two_threads: None) -> None:
    threads = AdaptiveThreads(0, "serial", num_envs=1, check_every=0.3)
    time.sleep(0.4)
    with pytest.warns(TorchThreadsWarning, match="other processes kept"):
        threads.check()
    assert threads.threads == 1


@needs_two_cpus
def test_threads_set_by_hand_stay_and_warn_once(two_threads: None) -> None:
    threads = AdaptiveThreads(2, "serial", num_envs=1, check_every=1e9)
    with pytest.warns(TorchThreadsWarning, match=r"torch_threads=2 is more than .* or 1"):
        threads.follow_load(1.0, now=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seconds in (0.01, 0.05, 0.05, 0.05):
            threads.observe(seconds)
    assert threads.threads == 2 == torch.get_num_threads() and threads.changes == []


def test_a_training_run_keeps_its_threads_on_a_quiet_update() -> None:
    agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=8, torch_threads=1,
                progress=False, tensorboard=False, seed=1)  # fmt: skip
    try:
        agent.learn(32)
        assert torch.get_num_threads() == 1
    finally:
        agent.close()


@needs_two_cpus
def test_a_synchronous_run_updates_on_the_cores_its_waiting_workers_leave(
    two_threads: None,
) -> None:
    cpus = available_cpus()
    sync = AdaptiveThreads(0, "shm", num_envs=8, num_workers=1, others=0.0, phases=True)
    sync.collect_phase()
    assert torch.get_num_threads() == sync.collect_threads == cpus - 1
    sync.update_phase()
    assert torch.get_num_threads() == sync.threads == cpus
    with pytest.warns(TorchThreadsWarning):  # another process takes a core: both give way
        sync.follow_load(1.0, now=1.0)
    assert (sync.threads, sync.collect_threads) == (cpus - 1, max(1, cpus - 2))
    overlapped = AdaptiveThreads(0, "shm", num_envs=8, num_workers=1, others=0.0)
    assert overlapped.threads == overlapped.collect_threads == cpus - 1
