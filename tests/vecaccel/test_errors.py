"""What a user's script prints when an env fails in a worker: the env's own file and line.

An env's exception reaches the caller as a ``WorkerError`` whose ``__cause__`` is a
``RemoteTraceback`` holding the worker's traceback, so Python prints the worker's lines (the
user's file, with its source line) above vecaccel's one-line summary, as ``concurrent.futures``
does. The scripts run in a child interpreter, as a user runs them, and the test reads what they
print; their env class lives in the script's ``__main__``, which cloudpickle ships by value.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import textwrap

import pytest
from backend_matrix import select, spread_start_methods
from helpers import CHILD_TIMEOUT

import vecaccel
from vecaccel.errors import RemoteTraceback
from vecaccel.worker.handle import MAIN_GUARD_HINT

FAILING_SCRIPT = textwrap.dedent(
    """
    import sys

    import gymnasium as gym
    import numpy as np

    import vecaccel


    class Fragile(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(1, np.float32), {}

        def step(self, action):
            self.t += 1
            if self.t == 3:
                1 / 0  # the env's own line
            return np.zeros(1, np.float32), 0.0, False, False, {}


    if __name__ == "__main__":
        if sys.argv[1] == "action_server":
            import torch

            torch.set_num_threads(1)
        options = {} if sys.argv[1] == "serial" else {"num_workers": 2, "context": sys.argv[2]}
        envs = vecaccel.make_vec([Fragile] * 4, backend=sys.argv[1], **options)
        envs.reset(seed=0)
        try:
            for _ in range(5):
                envs.step(np.zeros(4, np.int64))
        finally:
            envs.close()
    """
)

#: Each backend with worker processes once, and the start methods spread over them.
CASES = spread_start_methods(select(worker_processes=True), ("spawn", "fork", "forkserver"))


def _run(tmp_path, script: str, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train_script.py"
    path.write_text(script)
    return subprocess.run(
        [sys.executable, str(path), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )


@pytest.mark.parametrize("backend, context", CASES)
def test_an_uncaught_env_error_prints_the_envs_own_line_first(tmp_path, backend, context):
    completed = _run(tmp_path, FAILING_SCRIPT, backend, context)
    assert completed.returncode == 1, completed.stderr
    lines = completed.stderr.rstrip().splitlines()
    script = str(tmp_path / "train_script.py")
    step_line = 1 + FAILING_SCRIPT.splitlines().index("            1 / 0  # the env's own line")
    where = f'  File "{script}", line {step_line}, in step'
    assert where in lines, completed.stderr  # the real file, not cloudpickle's <dynamic-code>
    assert "<dynamic-code>" not in completed.stderr
    assert lines[lines.index(where) + 1].strip() == "1 / 0  # the env's own line"
    cause = "The above exception was the direct cause of the following exception:"
    assert lines.index(where) < lines.index(cause), completed.stderr
    # every env fails on the same step; which worker reports first is a race
    assert re.match(
        r"vecaccel\.errors\.WorkerError: env \d raised ZeroDivisionError in step: division by zero",
        lines[-1],
    ), completed.stderr
    assert "Warning" not in completed.stderr


def test_the_serial_backends_cause_is_the_envs_exception_itself(tmp_path):
    completed = _run(tmp_path, FAILING_SCRIPT, "serial", "")
    script = str(tmp_path / "train_script.py")
    assert f'File "{script}"' in completed.stderr.split("direct cause")[0], completed.stderr
    assert completed.stderr.rstrip().splitlines()[-1].startswith("vecaccel.errors.WorkerError")


def test_the_cause_survives_pickling_and_keeps_the_traceback_text():
    text = 'Traceback (most recent call last):\n  File "env.py", line 3\nValueError: bad\n'
    error = vecaccel.WorkerError(
        "env 2 raised ValueError in step: bad",
        env_indices=[2],
        remote_traceback=text,
        original_type="ValueError",
    )
    copy = pickle.loads(pickle.dumps(error))
    for each in (error, copy):
        assert isinstance(each.__cause__, RemoteTraceback)
        assert each.__cause__.traceback == text == each.remote_traceback
        assert 'File "env.py", line 3' in str(each.__cause__)
        assert each.env_indices == (2,) and each.original_type == "ValueError"
    # a worker that died has no env traceback to chain
    died = vecaccel.WorkerError("worker 0 (pid 1, envs [0]) was killed by SIGKILL", exitcode=-9)
    assert died.__cause__ is None


def test_every_failed_envs_traceback_stays_in_remote_traceback(tmp_path):
    script = FAILING_SCRIPT.replace(
        "    finally:\n        envs.close()",
        "    except vecaccel.WorkerError as error:\n"
        "        print(error.env_indices, error.remote_traceback.count('1 / 0'))\n"
        "        print(str(error.__cause__).count('1 / 0'))\n"
        "    finally:\n        envs.close()",
    )
    assert script != FAILING_SCRIPT
    completed = _run(tmp_path, script, "shm", "fork")
    assert completed.returncode == 0, completed.stderr
    # all four envs raised; each one's traceback is kept, the cause prints the first
    assert completed.stdout.split("\n")[:2] == ["(0, 1, 2, 3) 4", "1"], completed.stdout


UNGUARDED_SCRIPT = textwrap.dedent(
    """
    import vecaccel

    envs = vecaccel.make_vec("CartPole-v1", 2, backend="shm", num_workers=2, context="spawn")
    envs.close()
    """
)


def test_a_script_without_the_main_guard_ends_with_what_to_do(tmp_path):
    completed = _run(tmp_path, UNGUARDED_SCRIPT)
    assert completed.returncode == 1
    lines = completed.stderr.rstrip().splitlines()
    # one block, the caller's traceback: neither worker prints a line of its own, so none runs
    # into another's on the shared stderr, and multiprocessing's long RuntimeError is avoided
    assert lines[0] == "Traceback (most recent call last):", completed.stderr
    assert lines[-1].startswith("vecaccel.errors.WorkerError: worker "), completed.stderr
    assert lines[-1].endswith(f"while it imported the main script: {MAIN_GUARD_HINT}")
    assert completed.stderr.count(MAIN_GUARD_HINT) == 1, completed.stderr
    assert "bootstrapping phase" not in completed.stderr


# -- the one "did you mean" rule ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("learning_rat", "learning_rate"),  # a letter short
        ("Learning-Rate", "learning_rate"),  # case and a dash: the same spelling
        ("gama", "gamma"),
        ("gpu", None),  # nothing close: no guess
    ],
)
def test_closest_name_takes_the_same_spelling_then_the_closest(name, meant):
    from vecaccel.errors import closest_name, did_you_mean

    known = ["learning_rate", "gamma", "num_envs"]
    assert closest_name(name, known) == meant
    assert did_you_mean(name, known) == ("" if meant is None else f"; did you mean {meant!r}?")


def test_closest_name_of_an_alias_suggests_the_name_it_stands_for():
    from vecaccel.errors import closest_name

    spellings = {"step_timeout_s": "step_timeout_s", "step_timeout": "step_timeout_s"}
    assert closest_name("step_timout", spellings) == "step_timeout_s"
    assert closest_name("step-timeout", spellings) == "step_timeout_s"
