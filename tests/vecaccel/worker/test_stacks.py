"""A stuck worker's Python stack: real child processes arm their dump (or do not), and the parent
asks for their stacks as it does for a worker past its timeout. Each gets the stack it was
stuck in, or a sentence saying why none came; a child that has not armed its dump is never sent
the signal, which would end it."""

from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import signal
import time

import pytest

from vecaccel.testing.leaks import wait_until
from vecaccel.worker import WorkerHandle
from vecaccel.worker.stacks import (
    _ENTRY_FRAME,
    STACK_SIGNAL,
    _trimmed,
    arm_stack_dump,
    describe_stacks,
    reached_worker_code,
    request_stacks,
)

CONTEXT = mp.get_context("fork")


def wait_in_a_step(stack_conn) -> None:
    arm_stack_dump(stack_conn)
    time.sleep(60)  # where the stack must point


def never_arms(stack_conn) -> None:
    time.sleep(60)


def arms_then_exits(stack_conn) -> None:
    arm_stack_dump(stack_conn)


def arms_then_takes_the_signal(stack_conn, ready) -> None:
    arm_stack_dump(stack_conn)
    signal.signal(STACK_SIGNAL, lambda signum, frame: None)  # as an env of its own might
    ready.set()
    time.sleep(60)


@pytest.fixture
def start_child(leak_check):
    """Starts a forked child running ``target(stack_conn, *args)``; returns its handle (envs
    ``2 * index`` and ``2 * index + 1``). Every child is killed and every channel closed after."""
    handles: list[WorkerHandle] = []
    connections = []

    def start(target, *args, index: int = 0, stack_pipe: bool = True) -> WorkerHandle:
        stack_recv, stack_send = CONTEXT.Pipe(duplex=False)
        done_recv, done_send = CONTEXT.Pipe(duplex=False)
        process = CONTEXT.Process(target=target, args=(stack_send, *args), daemon=True)
        process.start()
        stack_send.close()
        connections.extend((stack_recv, done_recv, done_send))
        handle = WorkerHandle(
            index, 2 * index, 2 * index + 2, process, None, done_recv, None,
            stack_recv if stack_pipe else None,
        )  # fmt: skip
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.process.kill()
        handle.process.join(5)
    for conn in connections:
        conn.close()


def _line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_each_armed_worker_answers_with_the_stack_it_is_stuck_in(start_child):
    workers = [start_child(wait_in_a_step, index=index) for index in range(2)]
    assert wait_until(lambda: all(reached_worker_code(w) for w in workers))
    request_stacks(workers)
    line = _line_of(wait_in_a_step, "time.sleep(60)")
    for worker in workers:
        assert worker.process.is_alive()  # the dump is all the signal does
        assert f'test_stacks.py", line {line} in wait_in_a_step' in worker.stack, worker.stack
        assert "(most recent call first)" in worker.stack
    first, second = describe_stacks(workers).split("\n\n", 1)
    assert first.startswith(f"worker 0 (pid {workers[0].process.pid}, envs [0, 1]):\n")
    assert second.startswith(f"worker 1 (pid {workers[1].process.pid}, envs [2, 3]):\n")
    request_stacks(workers[:1])  # asked again: a fresh dump, the last one's bytes are gone
    assert workers[0].stack.count("in wait_in_a_step") == 1


def test_a_worker_that_has_not_armed_its_dump_is_not_signalled(start_child):
    worker = start_child(never_arms)
    assert not reached_worker_code(worker)
    request_stacks([worker], timeout=0.2)
    assert "had not reached vecaccel's worker code yet" in worker.stack
    assert worker.process.is_alive()  # SIGUSR1's default action would have ended it


def test_a_worker_that_exited_has_no_stack(start_child):
    worker = start_child(arms_then_exits)
    worker.process.join(5)
    assert reached_worker_code(worker)
    request_stacks([worker], timeout=0.2)
    assert worker.stack == "(no stack: the worker had already exited)"


def test_a_worker_whose_env_took_the_signal_is_said_to_have_sent_none(start_child):
    ready = CONTEXT.Event()
    worker = start_child(arms_then_takes_the_signal, ready)
    assert ready.wait(10)
    request_stacks([worker], timeout=0.3)
    assert worker.stack == (
        f"(no stack: the worker did not answer {STACK_SIGNAL.name} within 0.3 s; an env may "
        f"have installed its own {STACK_SIGNAL.name} handler)"
    )
    assert worker.process.is_alive()


def test_a_handle_without_a_stack_pipe_is_left_out(start_child):
    worker = start_child(never_arms, stack_pipe=False)
    request_stacks([worker], timeout=0.2)
    assert worker.stack is None and describe_stacks([worker]) == ""
    assert not reached_worker_code(worker)


def test_frames_below_the_workers_entry_point_are_left_out():
    entry = f"  {_ENTRY_FRAME[0]}, line 190{_ENTRY_FRAME[1]}"
    dump = "\n".join(
        [
            "Thread 0x00007f01 (most recent call first):",
            '  File "/envs/slow.py", line 12 in step',
            entry,
            '  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run',
            '  File "/usr/lib/python3.11/multiprocessing/popen_fork.py", line 71 in _launch',
            '  File "/home/user/train.py", line 40 in <module>',
            "",
            "Current thread 0x00007f02 (most recent call first):",
            '  File "/envs/slow.py", line 30 in watch',
        ]
    )
    assert _trimmed(dump).splitlines() == [
        "Thread 0x00007f01 (most recent call first):",
        '  File "/envs/slow.py", line 12 in step',
        entry,
        "",
        "Current thread 0x00007f02 (most recent call first):",
        '  File "/envs/slow.py", line 30 in watch',
    ]
    assert os.path.basename(_ENTRY_FRAME[0].split('"')[1]) == "process.py"
