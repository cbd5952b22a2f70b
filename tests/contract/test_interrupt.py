"""Interruption: SIGINT or SIGTERM to the parent leaves nothing behind, and a caught
``KeyboardInterrupt`` in a step or call leaves the env usable or closable.

A child process makes a vector env and either steps it in a loop or blocks in ``step_wait``
on envs that hang; the test signals it and checks that every process it started is gone (workers,
the fork server, the resource tracker), that no ``/dev/shm`` entry is left, and that stderr holds
no worker traceback (an unhandled Ctrl-C prints the parent's own ``KeyboardInterrupt``, nothing
else).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from backend_matrix import DEFAULT_BACKEND, options_for, select, spread_start_methods
from helpers import NUM_ENVS, as_numpy, close_promptly, last_json, make_backend, run_child, zeros

from vecaccel.testing.envs import counter_fns, fault_env_fns
from vecaccel.testing.leaks import descendants, leaked_shm, process_gone, shm_entries, wait_until

#: Backends whose steps return envs as they come (``info["env_id"]``), each env in a worker.
POOLED = select(partial_batches=True, envs_in_workers=True)

#: Bounds for things that must happen "at once"; generous, as the machine is shared. They catch
#: hangs and orphans (a worker stuck in a 300 s step), not slowness.
START_TIMEOUT = 120.0

EXIT_TIMEOUT = 30.0

CHILD_SCRIPT = textwrap.dedent(
    """
    import json, signal, sys
    # Ctrl-C as in an interactive program: a shell that starts a job in the background without
    # job control (`cmd &` in a script, nohup) makes it inherit SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import vecaccel
    from vecaccel.testing.envs import env_pid, fault_env_fns
    from vecaccel.testing.leaks import leaked_shm

    def make(backend, options):
        return vecaccel.make_vec(fault_env_fns(4, hang_seconds=300.0), backend=backend,
                                 **options)

    def zeros(envs):
        actions = np.zeros(4, dtype=np.int64)
        if getattr(envs, "device", None) is not None:
            import torch
            return torch.as_tensor(actions)
        return actions

    def main():
        backend, options, mode, handling = sys.argv[2:6]
        options = json.loads(options)
        if handling == "sigterm_exits":
            # how a program makes SIGTERM run its clean-up (finally, atexit) as Ctrl-C does
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        envs = make(backend, options)
        envs.reset(seed=0, options={})
        print(" ".join(str(pid) for pid in sorted(set(envs.call(env_pid)))), flush=True)
        actions = zeros(envs)
        try:
            if mode == "block":
                envs.set_attr("inject", "hang")  # every env sleeps 300 s in its next step
                envs.step_async(actions)
                print("ready", flush=True)
                envs.step_wait()
            else:
                envs.step(actions)
                print("ready", flush=True)
                while True:
                    envs.step(actions)
        except KeyboardInterrupt:
            if handling != "catch":
                raise
            envs.close()
            envs = make(backend, options)  # a new vector env works after the interruption
            envs.reset(seed=1, options={})
            envs.step(zeros(envs))
            envs.close()
            print("recovered", flush=True)

    if __name__ == "__main__":
        main()
    """
)


class LineReader:
    """Reads the child's stdout in a thread, so a wait for a line can be bounded."""

    def __init__(self, child: subprocess.Popen) -> None:
        self.child = child
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.rest: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        with self.child.stdout:
            for line in self.child.stdout:
                self.lines.put(line.strip())
        self.lines.put(None)

    def line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            os.killpg(self.child.pid, signal.SIGKILL)
            raise AssertionError(f"the child printed nothing in {timeout} s") from None
        if line is None:
            self.child.wait(EXIT_TIMEOUT)
            raise AssertionError(
                f"the child exited early ({self.child.returncode}): {self.child.stderr.read()}"
            )
        return line

    def remaining(self) -> list[str]:
        """The lines printed after those read, up to the end of the output."""
        lines = []
        while (line := self.lines.get(timeout=EXIT_TIMEOUT)) is not None:
            lines.append(line)
        return lines


def assert_clean_stderr(err: str, keyboard_interrupt: bool) -> None:
    assert "vecaccel-worker" not in err, err  # multiprocessing names a failing worker
    assert "Exception ignored" not in err, err
    assert "resource_tracker" not in err, err  # leaked semaphore or segment warnings
    tracebacks = err.count("Traceback (most recent call last)")
    if keyboard_interrupt:  # the parent's own, and only that
        assert tracebacks == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
    else:
        assert tracebacks == 0, err


def interrupt(
    tmp_path,
    backend: str,
    context: str,
    mode: str,
    signum: int,
    *,
    group: bool = False,
    handling: str = "plain",
) -> tuple[int, str, str]:
    """Start the child, signal it once it is stepping (or blocked), check it left nothing."""
    options = json.dumps(options_for(backend, num_workers=2, context=context))
    script = tmp_path / "child.py"
    script.write_text(CHILD_SCRIPT)
    tests_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
    shm_before = shm_entries()
    child = subprocess.Popen(
        [sys.executable, str(script), tests_dir, backend, options, mode, handling],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a program run from a shell
    )
    tree: set[int] = set()
    reader = LineReader(child)
    try:
        workers = [int(pid) for pid in reader.line(START_TIMEOUT).split()]
        assert len(workers) == 2
        assert reader.line(START_TIMEOUT) == "ready"
        time.sleep(0.2)  # into the stepping loop, or into the blocking wait
        tree = descendants(child.pid)
        assert set(workers) <= tree
        if group:  # what Ctrl-C in a terminal does: the whole foreground process group
            os.killpg(child.pid, signum)
        else:
            os.kill(child.pid, signum)
        child.wait(EXIT_TIMEOUT)
        out, err = "\n".join(reader.remaining()), child.stderr.read()
        left = lambda: [pid for pid in tree if not process_gone(pid)]  # noqa: E731
        assert wait_until(lambda: not left(), timeout=EXIT_TIMEOUT), f"orphans: {left()}"
        assert leaked_shm(shm_before) == set()
        return child.returncode, out, err
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        for pid in tree:
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
        child.stderr.close()


# ---------------------------------------------------------------------------------------------
# an unhandled SIGINT (KeyboardInterrupt) or SIGTERM (no clean-up at all) in the parent


#: (signal, where the parent is, start method): each pair of values of any two of the three
#: that the full product of the signals and the five (mode, start method) cases holds, so each
#: start method with both signals, in 6 cases of its 10.
SHM_CASES = [
    (signal.SIGINT, "loop", "fork"),
    (signal.SIGTERM, "loop", "spawn"),
    (signal.SIGTERM, "block", "fork"),
    (signal.SIGINT, "block", "spawn"),
    (signal.SIGINT, "block", "forkserver"),
    (signal.SIGTERM, "block", "forkserver"),
]


@pytest.mark.parametrize(
    "signum, mode, context",
    [pytest.param(*case, id=f"{case[0].name}-{case[1]}-{case[2]}") for case in SHM_CASES],
)
def test_signal_to_parent_leaves_nothing(tmp_path, signum, mode, context):
    code, _, err = interrupt(tmp_path, DEFAULT_BACKEND, context, mode, signum)
    assert code == -signum
    assert_clean_stderr(err, keyboard_interrupt=signum == signal.SIGINT)


@pytest.mark.parametrize("backend", POOLED)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_parent_of_pooled_backends(tmp_path, backend, signum):
    code, _, err = interrupt(tmp_path, backend, "fork", "block", signum)
    assert code == -signum
    assert_clean_stderr(err, keyboard_interrupt=signum == signal.SIGINT)


@pytest.mark.parametrize(
    "signum, context",
    [(signal.SIGINT, "fork"), (signal.SIGINT, "spawn"), (signal.SIGTERM, "fork")],
    ids=["SIGINT-fork", "SIGINT-spawn", "SIGTERM-fork"],
)
def test_signal_to_process_group(tmp_path, signum, context):
    """Ctrl-C in a terminal signals the workers too: they ignore SIGINT and leave it to the
    parent (no KeyboardInterrupt traceback from each worker)."""
    code, _, err = interrupt(tmp_path, DEFAULT_BACKEND, context, "loop", signum, group=True)
    assert code == -signum
    assert_clean_stderr(err, keyboard_interrupt=signum == signal.SIGINT)


# ---------------------------------------------------------------------------------------------
# a parent that handles the signal


def test_sigterm_handled_as_exit_runs_clean_up(tmp_path):
    code, _, err = interrupt(
        tmp_path, DEFAULT_BACKEND, "fork", "block", signal.SIGTERM, handling="sigterm_exits"
    )
    assert code == 128 + signal.SIGTERM
    assert_clean_stderr(err, keyboard_interrupt=False)


@pytest.mark.parametrize("mode", ["loop", "block"])
def test_caught_keyboard_interrupt_then_close_and_go_on(tmp_path, mode):
    code, out, err = interrupt(
        tmp_path, DEFAULT_BACKEND, "fork", mode, signal.SIGINT, handling="catch"
    )
    assert code == 0, err
    assert out.split()[-1] == "recovered"
    assert_clean_stderr(err, keyboard_interrupt=False)


def nap(env, seconds: float) -> str:
    time.sleep(seconds)
    return "napped"


def slow_env_id(env, seconds: float) -> int:
    time.sleep(seconds)
    return env.unwrapped.env_id


def _attempt(fn):
    try:
        return list(fn())
    except Exception as exc:  # noqa: BLE001 - the outcome is checked below
        return {"type": type(exc).__name__, "message": str(exc)}


@pytest.mark.parametrize("backend", select(envs_in_workers=True))
def test_call_after_an_interrupted_call_gets_its_own_result(backend, leak_check):
    """Ctrl-C during ``call`` (then carrying on, as in a notebook): the interrupted call's late
    reply must never be returned as the result of a later call. Either the later calls return
    their own results, or they raise a clear error (``WorkerError``/``RuntimeError``). SIGINT
    comes to this process while it waits for the reply, and its handler raises
    ``KeyboardInterrupt`` as Python's own does."""

    window = threading.Event()  # Ctrl-C lands while the first call waits, and nowhere else

    def ctrl_c(signum, frame):
        if window.is_set():
            raise KeyboardInterrupt

    envs = make_backend(backend, fault_env_fns(NUM_ENVS))
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        envs.reset(seed=0, options={})
        interrupted = False
        window.set()
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        try:
            timer.start()
            envs.call_indices(nap, [3], 0.8)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            window.clear()
            timer.cancel()
        time.sleep(1.0)  # the interrupted call has finished in its worker by now
        outcomes = {
            "first": _attempt(lambda: envs.call_indices(slow_env_id, [3], 0.3)),
            "second": _attempt(lambda: envs.call_indices(slow_env_id, [2, 3], 0.3)),
        }
    finally:
        signal.signal(signal.SIGINT, previous)
        close_promptly(envs)
    assert interrupted
    for key, expected in (("first", [3]), ("second", [2, 3])):
        outcome = outcomes[key]
        if isinstance(outcome, dict):
            assert outcome["type"] in ("WorkerError", "RuntimeError"), (key, outcome)
        else:
            assert outcome == expected, (key, outcomes)


INTERRUPTED_STEP_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import vecaccel
    from vecaccel.testing.envs import env_pid, fault_env_fns
    from vecaccel.testing.leaks import process_gone, wait_until

    def main():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C
        backend, options = sys.argv[2], json.loads(sys.argv[3])
        envs = vecaccel.make_vec(fault_env_fns(4, hang_seconds=300.0), backend=backend,
                                 **options)
        envs.reset(seed=0, options={})
        pids = sorted(set(envs.call(env_pid)))
        actions = np.zeros(4, dtype=np.int64)
        if getattr(envs, "device", None) is not None:  # torch tensors in and out
            import torch
            actions = torch.as_tensor(actions)
        envs.set_attr("inject", "hang")  # every env sleeps 300 s in its next step
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            envs.step(actions)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        envs.close()
        gone = wait_until(lambda: all(process_gone(pid) for pid in pids), 10.0)
        print(json.dumps({"interrupted": interrupted, "gone": gone, "closed": envs.closed}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize("backend, context", spread_start_methods(POOLED, ("fork", "spawn")))
def test_keyboard_interrupt_during_a_step_then_close(backend, context):
    shm_before = shm_entries()
    options = options_for(backend, num_workers=2, context=context)
    completed = run_child(INTERRUPTED_STEP_SCRIPT, backend, json.dumps(options))
    result = last_json(completed)
    assert result == {"interrupted": True, "gone": True, "closed": True}, completed.stderr
    assert completed.returncode == 0
    assert "Traceback" not in completed.stderr, completed.stderr
    assert leaked_shm(shm_before) == set()


@pytest.mark.parametrize("then", ["step", "step_wait", "get_attr"])
def test_keyboard_interrupt_in_a_step_then_going_on(then, leak_check):
    """Ctrl-C while ``step`` waits for the workers (caught, as in a notebook): the step in flight
    is never returned by a later ``step``; ``step_wait`` can still take it; nothing hangs."""
    fns = counter_fns(NUM_ENVS, {3: {"sleep_step": 2, "sleep_seconds": 0.5}})
    envs = make_backend("shm", fns)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        envs.reset(seed=0)
        envs.step(zeros(envs))
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            envs.step(zeros(envs))  # env 3 sleeps through its second step
        if then == "step":  # the interrupted step is finished and dropped: this is step 3
            obs, *_ = envs.step(zeros(envs))
            assert as_numpy(obs)[:, 0].tolist() == [3, 3, 3, 3]
        elif then == "step_wait":  # it is still the step in flight
            obs, *_ = envs.step_wait()
            assert as_numpy(obs)[:, 0].tolist() == [2, 2, 2, 2]
        else:
            assert envs.get_attr("steps") == (2, 2, 2, 2)
            obs, *_ = envs.step(zeros(envs))
            assert as_numpy(obs)[:, 0].tolist() == [3, 3, 3, 3]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        close_promptly(envs)
