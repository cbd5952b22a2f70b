"""The two ends of an asynchronous run's collector process: the optimiser's handle starts it,
publishes weights it pulls, notices when it dies (with what it raised) and stops it; the waits
between them check on the other side and count their time."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers import TINY_ASYNC_DQN

from vecaccel.trainers import AsyncRunner
from vecaccel.trainers.algos.dqn import DQN
from vecaccel.trainers.runners.asynchronous.process import (
    ChildLink,
    CollectorError,
    CollectorHandle,
    CollectorOptions,
    Waits,
    leave_cores_to_collector,
)

FORK = CollectorOptions(context="fork")


def _model() -> torch.nn.Module:
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.arange(6.0).reshape(2, 3))
        model.bias.fill_(-1.0)
    return model


def _pull_weights(spec: dict[str, Any]) -> None:
    link = ChildLink(spec)
    params = [torch.zeros(2, 3), torch.zeros(2)]
    version = link.weights_for(0, params)
    spec["out"].put((version, [p.tolist() for p in params]))


def _fail(spec: dict[str, Any]) -> None:
    ChildLink(spec)
    raise ValueError("no env of that id")


def _wait_until_stopped(spec: dict[str, Any]) -> None:
    link = ChildLink(spec)
    link.acquire(link.channels.publishes)  # never released: only a stop ends the wait


def _finished(handle: CollectorHandle) -> None:
    handle.process.join(timeout=30)
    assert handle.process.exitcode is not None, "the collector process did not end"


def test_the_collector_pulls_the_weights_last_published() -> None:
    model = _model()
    handle = CollectorHandle(FORK, "sampler", model)
    out = handle.ctx.Queue()
    try:
        handle.publish(5)
        with torch.no_grad():
            model.bias.fill_(2.0)  # after the publish: not what the collector sees
        handle.start(_pull_weights, {"out": out})
        version, (weight, bias) = out.get(timeout=30)
        _finished(handle)
        handle.check()  # a clean exit is no error
    finally:
        handle.stop()
    assert version == 5
    assert weight == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and bias == [-1.0, -1.0]


def test_what_the_collector_raised_comes_back_with_its_exit_code() -> None:
    handle = CollectorHandle(FORK, "rollout", _model())
    try:
        handle.start(_fail, {})
        _finished(handle)
        with pytest.raises(CollectorError, match="asynchronous rollout process") as info:
            handle.check()
    finally:
        handle.stop()
    assert info.value.exitcode == 1
    assert "ValueError: no env of that id" in info.value.remote_traceback
    assert "no env of that id" in str(info.value)


def test_a_stop_ends_a_waiting_collector_whose_wait_was_counted() -> None:
    handle = CollectorHandle(FORK, "sampler", _model())
    try:
        handle.start(_wait_until_stopped, {})
        assert handle.process.is_alive()
    finally:
        began = time.monotonic()
        handle.stop()
    assert time.monotonic() - began < 10.0  # it left its wait, it was not killed
    assert handle.process.exitcode == 0 and handle.counters.sampler_wait > 0
    handle.check()  # asked to stop: no error


def test_a_wait_checks_on_the_other_side_until_the_item_comes_and_counts_its_time() -> None:
    channel: queue.Queue[str] = queue.Queue()
    checks: list[float] = []

    def check() -> None:
        checks.append(time.perf_counter())
        if len(checks) == 3:
            channel.put("chunk 0")

    waits = Waits(check)
    assert waits.take(channel) == "chunk 0"
    assert len(checks) == 3 and waits.seconds >= checks[-1] - checks[0]


def test_a_wait_ends_with_the_error_of_a_check() -> None:
    def collector_died() -> None:
        raise CollectorError("the asynchronous sampler process died", -signal.SIGKILL)

    waits = Waits(collector_died)
    with pytest.raises(CollectorError, match="died"):
        waits.take(queue.Queue())
    with pytest.raises(CollectorError, match="died"):
        waits.acquire(threading.Semaphore(0))


@pytest.mark.parametrize(
    ("config", "local_world_size", "expected"),
    [
        (dict(torch_threads=0, backend="serial", num_envs=4), "1", 7),
        (dict(torch_threads=0, backend="shm", num_envs=4, num_workers=2), "1", 5),
        (dict(torch_threads=0, backend="shm", num_envs=2, num_workers=0), "1", 5),
        (dict(torch_threads=0, backend="shm", num_envs=4, num_workers=2), "2", 1),
        (dict(torch_threads=3, backend="shm", num_envs=4, num_workers=2), "1", None),
    ],
    ids=["serial", "shm-workers", "shm-one-per-env", "two-ranks", "threads-set"],
)
def test_automatic_torch_threads_leave_the_collector_and_its_workers_their_cores(
    config: dict[str, Any], local_world_size: str, expected: int | None, monkeypatch
) -> None:
    from vecaccel.trainers.services import threads

    # an 8-CPU machine with nothing else running on it
    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    monkeypatch.setattr(threads.CpuLoad, "measure", staticmethod(lambda seconds=0.1: 0.0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        leave_cores_to_collector(SimpleNamespace(**config), collector_threads=1)
        assert torch.get_num_threads() == (1 if expected is None else expected)
    finally:
        torch.set_num_threads(previous)


def test_dead_sampler_is_reported_within_seconds() -> None:
    agent = DQN(env=None, env_id="CartPole-v1", **TINY_ASYNC_DQN)
    killed_at: list[float] = []

    def kill_sampler() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            children = [
                p for p in multiprocessing.active_children() if p.name == "vecaccel-async-sampler"
            ]
            if children and agent.num_updates > 5:
                time.sleep(0.2)
                os.kill(children[0].pid, signal.SIGKILL)
                killed_at.append(time.monotonic())
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_sampler, daemon=True)
    killer.start()
    with pytest.raises(CollectorError) as info:
        AsyncRunner(agent).run(10_000_000)
    reported_at = time.monotonic()
    killer.join(timeout=5)
    assert killed_at, "the sampler was never seen"
    assert reported_at - killed_at[0] < 10.0
    assert info.value.exitcode == -signal.SIGKILL
    assert "died" in str(info.value)
