"""Env functions pickled for a worker keep their file names: code defined in ``__main__`` (or
a notebook) goes by value, and a fresh interpreter that loads it reports the user's file and
line in its tracebacks."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import cloudpickle

from vecaccel.worker.pickling import dumps

SOURCE = textwrap.dedent(
    """\
    import gymnasium as gym


    class BrokenEnv(gym.Env):
        def step(self, action):
            raise ValueError("broken on purpose")


    def make_env():
        return BrokenEnv()
    """
)


def _defined_in_main(filename: str) -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(SOURCE, filename, "exec"), namespace)
    return namespace


def test_functions_and_methods_keep_their_file_and_lines() -> None:
    namespace = _defined_in_main("/home/user/train.py")
    make_env = pickle.loads(dumps(namespace["make_env"]))
    assert make_env.__code__.co_filename == "/home/user/train.py"
    assert make_env.__code__.co_firstlineno == 9
    env = make_env()
    assert type(env).step.__code__.co_filename == "/home/user/train.py"
    assert type(env).step.__code__.co_firstlineno == 5
    # cloudpickle alone renames them, which is what dumps is for
    plain = cloudpickle.loads(cloudpickle.dumps(namespace["make_env"]))
    assert plain.__code__.co_filename != "/home/user/train.py"


def test_a_fresh_interpreter_names_the_users_line_in_its_traceback(tmp_path) -> None:
    payload = tmp_path / "env_fn.pkl"
    payload.write_bytes(dumps(_defined_in_main(str(tmp_path / "train.py"))["make_env"]))
    (tmp_path / "train.py").write_text(SOURCE)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())().step(0)",
            str(payload),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 1
    assert f'File "{tmp_path / "train.py"}", line 6, in step' in child.stderr
    assert 'raise ValueError("broken on purpose")' in child.stderr
