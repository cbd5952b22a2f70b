"""The parent's handle on a worker, the start methods, how a worker's end is told, and the worker
that refuses to start while it imports the caller's main script (a script without the
``__main__`` guard)."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import signal
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import pytest

from vecaccel.worker import WorkerHandle, get_context
from vecaccel.worker.handle import (
    MAIN_GUARD_EXIT_CODE,
    MAIN_GUARD_HINT,
    describe_exit,
    refuse_start_while_importing_main,
)

HAVE_MULTIPROCESS = importlib.util.find_spec("multiprocess") is not None


def test_get_context_gives_the_start_method_asked_for():
    assert get_context(None) is mp.get_context()
    for method in mp.get_all_start_methods():
        assert get_context(method).get_start_method() == method


def test_an_unknown_start_method_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown start method context='forkk'") as caught:
        get_context("forkk")
    for method in [*mp.get_all_start_methods(), "multiprocess"]:
        assert repr(method) in str(caught.value)


@pytest.mark.skipif(not HAVE_MULTIPROCESS, reason="needs the multiprocess package")
def test_multiprocess_is_its_packages_spawn_context():
    import multiprocess

    context = get_context("multiprocess")
    assert context.get_start_method() == "spawn"
    assert type(context) is type(multiprocess.get_context("spawn"))


@pytest.mark.parametrize(
    "exitcode, words",
    [
        (None, "is unresponsive"),
        (0, "exited with code 0"),
        (3, "exited with code 3"),
        (-signal.SIGKILL, "was killed by SIGKILL"),
        (-signal.SIGSEGV, "was killed by SIGSEGV"),
        (-200, "was killed by signal 200"),  # no signal of that number
    ],
)
def test_describe_exit(exitcode, words):
    assert describe_exit(exitcode) == words


def test_a_handle_names_its_slice_and_reads_its_channels():
    done_recv, done_send = mp.Pipe(duplex=False)
    data_parent, data_child = mp.Pipe()
    stack_recv, stack_send = mp.Pipe(duplex=False)
    connections = (done_recv, done_send, data_parent, data_child, stack_recv, stack_send)
    try:
        handle = WorkerHandle(2, 4, 7, None, None, done_recv, data_parent, stack_recv)
        assert handle.env_indices == range(4, 7)
        assert handle.done_fd == done_recv.fileno()
        assert handle.stack_fd == stack_recv.fileno()
        assert (handle.killed_for, handle.stack, handle.stack_armed) == (None, None, False)
        assert handle.loads(ForkingPickler.dumps({"infos": [1, 2]})) == {"infos": [1, 2]}
        alone = WorkerHandle(0, 0, 1, None, None, done_recv, data_parent)
        assert alone.stack_conn is None and alone.stack_fd is None
    finally:
        for conn in connections:
            conn.close()


@pytest.mark.skipif(not HAVE_MULTIPROCESS, reason="needs the multiprocess package")
def test_a_handle_unpickles_with_the_pickler_of_its_data_channel():
    """A worker pickles its payloads with its channel's pickler (dill under ``multiprocess``),
    which the handle's ``loads`` must undo: a lambda only dill can pickle comes back."""
    import multiprocess
    from multiprocess.reduction import ForkingPickler as DillPickler

    done_recv, done_send = multiprocess.Pipe(duplex=False)
    data_parent, data_child = multiprocess.Pipe()
    try:
        handle = WorkerHandle(0, 0, 1, None, None, done_recv, data_parent)
        assert handle.loads(DillPickler.dumps(lambda x: x + 1))(1) == 2
    finally:
        for conn in (done_recv, done_send, data_parent, data_child):
            conn.close()


def test_a_worker_importing_the_main_script_ends_silently_with_its_exit_code(monkeypatch, capsys):
    """The worker says nothing: the caller reports it, once, whatever the number of workers."""
    refuse_start_while_importing_main()  # this process imports no one's main script: no effect
    monkeypatch.setattr(mp.process.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(SystemExit) as caught:
        refuse_start_while_importing_main()
    assert caught.value.code == MAIN_GUARD_EXIT_CODE
    assert capsys.readouterr() == ("", "")


def test_spawn_script_without_main_guard_fails_instead_of_hanging(tmp_path):
    """Under spawn, a worker re-runs a script that lacks the ``__main__`` guard and dies making
    its own vec env. Pong's spaces made the worker's arguments larger than a pipe buffer, and
    multiprocessing's spawn launch then waited forever to write them to the dead child. The
    caller alone says what to do, once, on the last line: the two workers say nothing."""

    script = tmp_path / "no_guard.py"
    script.write_text(
        "import vecaccel\n"
        "envs = vecaccel.make_vec('PongNoFrameskip-v4', 2, backend='shm', context='spawn',\n"
        "                         num_workers=2)\n"
        "envs.close()\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    # one block: what precedes the caller's traceback is the ALE's banner, printed wherever a
    # Pong env is made (to read its spaces), and nothing the workers say of the guard
    before, _, _ = done.stderr.partition("Traceback (most recent call last):")
    assert all(line.startswith(("A.L.E:", "[Powered")) for line in before.splitlines()), before
    lines = done.stderr.rstrip().splitlines()
    assert lines[-1].startswith("vecaccel.errors.WorkerError: worker "), done.stderr
    assert lines[-1].endswith(f"while it imported the main script: {MAIN_GUARD_HINT}")
    # said once, by the caller, on the last line: not once per worker, nor run together
    assert done.stderr.count(MAIN_GUARD_HINT) == 1, done.stderr
    assert "bootstrapping phase" not in done.stderr  # one line, not multiprocessing's page
