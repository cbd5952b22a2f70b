"""The one interface a runner drives an algorithm through: each family's ``begin_run`` hands back
a complete :class:`TrainingLoop` with its horizon and resume step, and the synchronous runner
calls it in the order the interface documents, ``end`` once however the run ends."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from helpers import SMALL_DQN

from vecaccel.trainers import A2C, DQN
from vecaccel.trainers.algos.training_loop import TrainingLoop

torch.set_num_threads(1)

METHODS = [
    name
    for name, member in vars(TrainingLoop).items()
    if inspect.isfunction(member) and not name.startswith("_")
]


def make(cls: type, **extra: Any) -> Any:
    if cls is A2C:
        return A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=4, seed=0,
                   torch_threads=1, tensorboard=False, **extra)  # fmt: skip
    return DQN("CartPole-v1", backend="serial", num_envs=2, seed=0, torch_threads=1,
               **SMALL_DQN, **extra)  # fmt: skip


def recording(loop: TrainingLoop, calls: list[str]) -> TrainingLoop:
    """``loop`` behind a TrainingLoop that appends the name of every method called to ``calls``."""

    def method(name: str) -> Any:
        def call(self: Any, *args: Any) -> Any:
            calls.append(name)
            return getattr(loop, name)(*args)

        return call

    cls = type("Recording", (TrainingLoop,), {name: method(name) for name in METHODS})
    recorder = cls()
    recorder.horizon, recorder.resume_step = loop.horizon, loop.resume_step
    return recorder


@pytest.mark.parametrize("cls", [A2C, DQN], ids=["on-policy", "off-policy"])
def test_each_family_hands_back_a_whole_loop_with_its_horizon(cls: type) -> None:
    agent = make(cls)
    try:
        loop = agent.begin_run(16, True)
        assert isinstance(loop, TrainingLoop) and not inspect.isabstract(type(loop))
        assert (loop.horizon, loop.resume_step) == (16, None)
        loop.end()
        agent.learn(16)
        going_on = agent.begin_run(8, False)
        assert (going_on.horizon, going_on.resume_step) == (24, 16)
        going_on.end()
    finally:
        agent.close()


def test_the_runner_calls_the_loop_in_the_documented_order(tmp_path, monkeypatch) -> None:
    calls: list[str] = []
    agent = make(A2C, run_dir=tmp_path, checkpoint_every=2)
    begin_run = agent.begin_run
    monkeypatch.setattr(agent, "begin_run", lambda *args: recording(begin_run(*args), calls))
    try:
        agent.learn(24, callback=lambda agent, metrics: None)  # three updates of 8 steps
    finally:
        agent.close()
    iteration = ["collect", "update", "report", "callback_metrics", "restart_due"]
    assert calls == [
        "steps_per_iteration",  # to say where the run ends
        "start",
        *iteration,
        *iteration,
        "restart_point",  # the second update ends at a periodic checkpoint
        "write_checkpoint",
        *iteration,
        "write_checkpoint",
        "end",
    ]


def test_a_run_that_fails_ends_its_loop_once_and_writes_no_checkpoint(tmp_path, monkeypatch):
    calls: list[str] = []
    agent = make(A2C, run_dir=tmp_path, checkpoint_every=1)
    begin_run, update = agent.begin_run, agent.update

    def fail_second(batch: Any, progress_remaining: float) -> Any:
        if agent.num_updates == 1:
            raise FloatingPointError("update 1: the gradient norm is nan")
        return update(batch, progress_remaining)

    monkeypatch.setattr(agent, "begin_run", lambda *args: recording(begin_run(*args), calls))
    monkeypatch.setattr(agent, "update", fail_second)
    try:
        with pytest.raises(FloatingPointError):
            agent.learn(24)
    finally:
        agent.close()
    assert calls.count("end") == 1 and calls[-3:] == ["collect", "update", "end"]
