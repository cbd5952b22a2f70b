"""The worker process's loop, driven through its channels as the parent drives it: one command
byte, one status byte back, payloads in the worker's slab or on its data channel. An env's own
error (or an info that cannot be pickled) is a report naming the env and the worker lives on
until ``CLOSE``. A worker does not take a fork server for a parent that died, nor end with the
thread that started it, and it runs none of its parent's signal handlers and finalises none of
its parent's garbage."""

from __future__ import annotations

import functools
import gc
import os
import signal
import threading
import time
from multiprocessing.reduction import ForkingPickler

import cloudpickle
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import vecaccel
from vecaccel.testing.envs import CounterEnv, env_pid, fault_env_fns
from vecaccel.testing.leaks import process_gone
from vecaccel.worker import (
    ENV_PAYLOAD_FLAG,
    PARENT_CHECK_INTERVAL,
    Command,
    SharedLayout,
    Status,
    get_context,
)
from vecaccel.worker.info_schema import InfoSchema, InfoSlots, info_fields
from vecaccel.worker.process import (
    FORK_BLOCKED_SIGNALS,
    _parent_alive,
    _pickled,
    fork_guarded,
    worker_main,
)
from vecaccel.worker.protocol import send_startup

CONTEXT = get_context("fork")
REPLY_TIMEOUT_S = 30.0


class InfoCounterEnv(CounterEnv):
    """A counter whose step info holds its step count."""

    def step(self, action):
        obs, rew, term, trunc, _ = super().step(action)
        return obs, rew, term, trunc, {"count": self.steps}


class Worker:
    """``worker_main`` in a forked child over envs ``start ..`` of a 4-env layout, driven
    through its channels as a worker pool drives it."""

    def __init__(self, env_fns, start: int = 1, restart_on_error: bool = False) -> None:
        space_env = CounterEnv()
        layout_args = (space_env.observation_space, space_env.action_space, 4, 1)
        self.layout = SharedLayout(*layout_args)
        self.buffer = CONTEXT.RawArray("b", self.layout.nbytes)
        self.views = self.layout.views(self.buffer)
        self.views.payload_len[0] = -1
        cmd_recv, self.cmd = CONTEXT.Pipe(duplex=False)
        self.done, done_send = CONTEXT.Pipe(duplex=False)
        self.data, data_child = CONTEXT.Pipe()
        self.process = CONTEXT.Process(
            target=worker_main,
            args=(0, start, self.buffer, AutoresetMode.NEXT_STEP, cmd_recv, done_send,
                  data_child, os.getpid(), None, restart_on_error),
            daemon=True,
        )  # fmt: skip
        self.process.start()
        for conn in (cmd_recv, done_send, data_child):
            conn.close()
        startup = cloudpickle.dumps((cloudpickle.dumps(list(env_fns)), layout_args))
        writer = send_startup(self.data, startup)
        if writer is not None:
            writer.join(REPLY_TIMEOUT_S)

    def send(self, command: int, payload=None) -> None:
        os.write(self.cmd.fileno(), bytes((command,)))
        if payload is not None:
            self.data.send_bytes(cloudpickle.dumps(payload))

    def byte(self) -> int:
        assert self.done.poll(REPLY_TIMEOUT_S), "no reply"
        return os.read(self.done.fileno(), 1)[0]

    def reply(self):
        """The next status, and its payload for a status that has one."""
        status = self.byte()
        if status not in (Status.OK_DATA, Status.ERROR):
            return status, None
        length = int(self.views.payload_len[0])
        if length >= 0:
            self.views.payload_len[0] = -1
            return status, ForkingPickler.loads(self.views.payload_slab[0, :length].tobytes())
        return status, ForkingPickler.loads(self.data.recv_bytes())

    def close(self) -> None:
        self.process.kill()
        self.process.join(5)
        for conn in (self.cmd, self.done, self.data):
            conn.close()
        self.views = None


@pytest.fixture
def start_worker(leak_check):
    workers: list[Worker] = []

    def start(env_fns, **kwargs) -> Worker:
        workers.append(Worker(env_fns, **kwargs))
        return workers[-1]

    yield start
    for worker in workers:
        worker.close()


def test_a_worker_serves_every_command_until_close(start_worker):
    worker = start_worker([CounterEnv, CounterEnv])
    views = worker.views
    assert worker.reply() == (Status.READY, None)
    worker.send(Command.RESET, ([5, 6], None, None, False))
    assert worker.reply() == (Status.OK_DATA, [(1, {}), (2, {})])
    seq = int(views.done_seq[0])
    for step in (1, 2):
        worker.send(Command.STEP)
        assert worker.reply() == (Status.OK, None)  # no infos: nothing but the status byte
        assert views.obs[:, 0].tolist() == [0, step, step, 0]
        assert views.rewards.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert int(views.done_seq[0]) == seq + 2
    worker.send(Command.SET_ATTR, ("tag", [(1, "b")]))
    assert worker.reply() == (Status.OK, None)
    worker.send(Command.CALL, ("steps", [0, 1], (), {}))
    status, payload = worker.reply()
    assert status == Status.OK_DATA and cloudpickle.loads(payload) == [2, 2]
    worker.send(Command.CALL, (lambda env: env.unwrapped.tag, [1], (), {}))
    assert cloudpickle.loads(worker.reply()[1]) == ["b"]
    worker.send(Command.CLOSE)
    assert worker.reply() == (Status.OK, None)
    worker.process.join(REPLY_TIMEOUT_S)
    assert worker.process.exitcode == 0


def test_an_env_function_that_raises_is_reported_and_the_worker_ends(start_worker):
    worker = start_worker([CounterEnv, functools.partial(CounterEnv, fault_init=True)])
    status, [report] = worker.reply()
    assert status == Status.ERROR
    assert (report.env_index, report.type_name, report.what) == (2, "ValueError", "make")
    worker.process.join(REPLY_TIMEOUT_S)
    assert worker.process.exitcode == 0


def test_env_errors_and_unpicklable_infos_are_reported_and_the_worker_lives_on(start_worker):
    worker = start_worker(
        [
            functools.partial(CounterEnv, fault_step=1),
            functools.partial(CounterEnv, lock_info_step=2),
            functools.partial(CounterEnv, fault="sys_exit", fault_step=3),
        ]
    )
    assert worker.reply()[0] == Status.READY
    worker.send(Command.RESET, ([None] * 3, None, None, False))
    worker.reply()
    expected = [(1, "ValueError", "step"), (2, "TypeError", "step (sending its info)"),
                (3, "SystemExit", "step")]  # fmt: skip
    for want in expected:
        worker.send(Command.STEP)
        status, reports = worker.reply()
        assert status == Status.ERROR
        assert [(r.env_index, r.type_name, r.what) for r in reports] == [want]
    worker.send(Command.CALL, (lambda env: threading.Lock(), [0], (), {}))
    status, [report] = worker.reply()
    assert status == Status.ERROR and report.what.startswith("call(")
    worker.send(Command.STEP)
    assert worker.reply() == (Status.OK, None)
    assert worker.views.obs[1:, 0].tolist() == [4, 4, 4]


def test_masked_steps_answer_one_byte_per_env(start_worker):
    worker = start_worker([CounterEnv, InfoCounterEnv, CounterEnv], start=1)
    views = worker.views
    assert worker.reply()[0] == Status.READY
    worker.send(Command.RESET, ([None] * 3, None, None, False))
    worker.reply()
    views.step_mask[:] = [0, 1, 0, 1]  # envs 1 and 3: the slots 0 and 2 of the slice
    worker.send(Command.STEP_MASKED)
    assert worker.byte() == 0
    assert worker.byte() == 2
    assert views.obs[:, 0].tolist() == [0, 1, 0, 1]
    assert not views.step_mask.any()
    views.step_mask[2] = 1
    worker.send(Command.STEP_MASKED)
    assert worker.byte() == ENV_PAYLOAD_FLAG + 1  # env 2's info follows on the data channel
    assert ForkingPickler.loads(worker.data.recv_bytes()) == (Status.OK_DATA, {"count": 1})


def test_infos_of_an_announced_schema_go_into_the_info_area(start_worker):
    worker = start_worker([InfoCounterEnv] * 3)
    views = worker.views
    assert worker.reply()[0] == Status.READY
    worker.send(Command.RESET, ([None] * 3, None, None, False))
    worker.reply()
    worker.send(Command.STEP)
    assert worker.reply() == (Status.OK_DATA, [(i, {"count": 1}) for i in (1, 2, 3)])
    schema = InfoSchema(3, info_fields({"count": 1}))
    worker.send(Command.INFO_SCHEMA, schema)  # no reply: it governs the steps that follow
    worker.send(Command.STEP)
    assert worker.reply() == (Status.OK, None)
    assert views.info_flags.tolist() == [0, 3, 3, 3]
    slots = InfoSlots(schema, views.info_area, views.info_flags)
    assert slots.decode([1, 2, 3]) == [{"count": 2}] * 3


def test_an_unpicklable_payload_becomes_a_report_naming_the_env_at_fault():
    dumps = ForkingPickler.dumps
    assert _pickled(dumps, [(4, {"a": 1})], 4, "step") == (True, dumps([(4, {"a": 1})]))
    ok, data = _pickled(dumps, [(4, {}), (5, {"lock": threading.Lock()})], 4, "step")
    [report] = ForkingPickler.loads(data)
    assert not ok and (report.env_index, report.type_name, report.what) == (5, "TypeError", "step")
    ok, data = _pickled(dumps, threading.Lock(), 4, "call('x')")  # not per env: the first env's
    assert not ok and ForkingPickler.loads(data)[0].env_index == 4


def test_whether_the_parent_is_alive():
    launcher = os.getppid()
    assert _parent_alive(launcher, launcher)  # this process's parent started it
    assert not _parent_alive(launcher, launcher + 1)  # another process started it: orphaned
    assert _parent_alive(os.getpid(), launcher)  # a fork server started it; the parent runs
    gone = CONTEXT.Process(target=time.sleep, args=(0,))
    gone.start()
    gone.join()
    assert not _parent_alive(gone.pid, launcher)


def test_signals_blocked_for_a_fork_are_held_until_the_block_ends():
    """A SIGINT that arrives while a worker is being forked waits, and reaches the parent once
    the mask is restored."""
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        with fork_guarded(False):
            assert not FORK_BLOCKED_SIGNALS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
        with fork_guarded(True):
            assert FORK_BLOCKED_SIGNALS <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
            # to this thread: a signal sent to the process may go to another thread that does
            # not block it (pytest-xdist's I/O thread), whose handler flag this thread then runs
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            assert received == []
        assert not FORK_BLOCKED_SIGNALS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
        for _ in range(1000):  # the handler runs between two bytecodes of this thread
            if received:
                break
        assert received == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


# -- with a parent: signals, a fork server, a thread ------------------------------------------


class SignalReportingEnv(CounterEnv):
    """Reports, through ``call``, how its worker handles SIGTERM and which signals it blocks."""

    def signal_state(self) -> tuple[bool, list[str]]:
        import signal

        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, sorted(s.name for s in blocked)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_worker_runs_none_of_the_parents_signal_handlers(context, no_leaks):
    """A handler the caller installed in Python (Ray's, a trainer's) is not run in a worker:
    forked with SIGTERM and SIGINT blocked until it has its own, a worker takes SIGTERM's
    default, and the caller's handler and signal mask are as they were."""
    import signal

    def raising(signum, frame):
        raise RuntimeError("the caller's handler ran")

    previous = signal.signal(signal.SIGTERM, raising)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        envs = vecaccel.make_vec([SignalReportingEnv] * 2, backend="shm", num_workers=2,
                                 context=context)  # fmt: skip
        try:
            assert envs.call("signal_state") == ((True, []), (True, []))
        finally:
            envs.close()
        assert signal.getsignal(signal.SIGTERM) is raising
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_forkserver_workers_stay_while_idle(no_leaks):
    """Under forkserver a worker's parent is the fork server, not the vector env's process:
    the idle check must not mistake that for the parent having died."""
    envs = vecaccel.make_vec(fault_env_fns(2), backend="shm", num_workers=2, context="forkserver")
    try:
        envs.reset(seed=0, options={})
        time.sleep(2.5 * PARENT_CHECK_INTERVAL)
        obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 3)
    finally:
        envs.close()


def test_workers_started_from_a_thread_outlive_the_thread(no_leaks):
    """Linux's parent-death signal follows the *thread* that forked; workers a short-lived
    thread started must not die with it."""
    made = []
    thread = threading.Thread(
        target=lambda: made.append(
            vecaccel.make_vec(fault_env_fns(2), backend="shm", num_workers=2, context="fork")
        )
    )
    thread.start()
    thread.join()
    envs = made[0]
    try:
        pids = set(envs.call(env_pid))
        time.sleep(0.5)
        assert all(not process_gone(pid) for pid in pids)
        envs.reset(seed=0, options={})
        envs.step(np.zeros(2, dtype=np.int64))
    finally:
        envs.close()


def _cartpole_after_a_collection(parent: int):
    if os.getpid() != parent:  # in the worker (the parent makes one too, for the spaces)
        gc.collect()  # whatever the worker may collect, it collects here
    return __import__("gymnasium").make("CartPole-v1")


@pytest.mark.parametrize("frozen_by_caller", [False, True])
def test_a_forked_worker_never_finalises_its_parent_s_garbage(tmp_path, frozen_by_caller):
    """A cycle the parent dropped but had not collected when it forked (an EnvPool closed a moment
    earlier, whose finaliser joins threads only the parent has) is finalised in the parent, never
    in a worker; and a caller's own frozen objects stay frozen."""
    finalised = tmp_path / "finalised"

    class Cycle:
        def __del__(self):
            with open(finalised, "a") as out:
                out.write(f"{os.getpid()}\n")

    if frozen_by_caller:
        gc.freeze()
    gc.disable()
    try:
        cycle = Cycle()
        cycle.itself = cycle
        del cycle
        envs = vecaccel.make_vec(
            functools.partial(_cartpole_after_a_collection, os.getpid()),
            2,
            backend="shm",
            num_workers=1,
            context="fork",
        )
        try:
            envs.reset(seed=0)
            if frozen_by_caller:
                assert gc.get_freeze_count() > 0
        finally:
            envs.close()
    finally:
        gc.enable()
        if frozen_by_caller:
            gc.unfreeze()
    gc.collect()
    assert finalised.read_text().split() == [str(os.getpid())]
