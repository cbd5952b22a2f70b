"""Worker start: thread pools the caller's process already runs, and workers that do not start.

* A worker forked from a process whose OpenCV, torch or OpenMP pool has run must start and
  step (resizing an inherited pool waits for threads that did not survive the fork), and the
  caller's own thread settings stay as they were.
* A worker that loads OpenCV or torch itself still caps it at ``worker_threads``.
* A worker that does not start within ``start_timeout_s`` (stuck in its env's constructor, or
  before vecaccel's code) ends in an error that names it, its envs, and where it is stuck (its
  Python stack at that moment, where it has one).

The thread-pool scenarios run in child interpreters, so that what the caller's process has
loaded and run is exactly what the scenario says.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import pickle
import subprocess
import sys
import textwrap
from functools import partial

import pytest
from helpers import CHILD_TIMEOUT, last_json, run_child
from toy_envs import wait_in_constructor

import vecaccel
from vecaccel.testing.envs import CounterEnv
from vecaccel.testing.leaks import open_fds, wait_until


def _have(*modules: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in modules)


# ---------------------------------------------------------------------------------------------
# thread pools started in the caller's process

POOL_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    import numpy as np

    def start_pools(scenario):
        '''Run the scenario's thread pools in this process; return its thread settings.'''
        if scenario == "human_rendering":
            import gymnasium as gym
            from gymnasium.wrappers.vector import HumanRendering

            env = HumanRendering(gym.make_vec("CartPole-v1", 3, render_mode="rgb_array"))
            env.reset(seed=0)
            for _ in range(5):
                env.step(env.action_space.sample())
            env.close()
        elif scenario == "torch":
            import torch

            torch.set_num_threads(2)
            a = torch.randn(1024, 1024)
            for _ in range(2):  # the pool's threads start at the first product
                a = torch.tanh(a @ a)
        elif scenario == "cv2":
            import cv2

            cv2.setNumThreads(2)
            image = np.random.default_rng(0).integers(0, 255, (2000, 2000, 3), dtype=np.uint8)
            for _ in range(2):  # the pool's threads start at the first call
                cv2.resize(image, (1000, 1000), interpolation=cv2.INTER_AREA)
                cv2.GaussianBlur(image, (5, 5), 0)
        return threads()

    def threads():
        out = {}
        if "cv2" in sys.modules:
            out["cv2"] = sys.modules["cv2"].getNumThreads()
        if "torch" in sys.modules:
            out["torch"] = sys.modules["torch"].get_num_threads()
        return out

    def main():
        scenario, contexts = sys.argv[2], sys.argv[3:]
        before = start_pools(scenario)
        import vecaccel

        steps = {}
        for context in contexts:
            envs = vecaccel.make_vec("CartPole-v1", 2, backend="shm", context=context,
                                     start_timeout_s=20)
            envs.reset(seed=0)
            steps[context] = 0
            for _ in range(10):
                envs.step(np.zeros(2, dtype=np.int64))
                steps[context] += 1
            envs.close()
        print(json.dumps({"steps": steps, "before": before, "after": threads()}))

    if __name__ == "__main__":
        main()
    """
)

#: Each scenario under fork (the inherited pools), then, in the same caller, under a start
#: method that starts a fresh interpreter (forkserver for two scenarios, spawn for the third).
POOL_CASES = [
    pytest.param("human_rendering", "forkserver", marks=pytest.mark.skipif(
        not _have("pygame", "cv2"), reason="needs pygame and OpenCV")),
    pytest.param("cv2", "spawn", marks=pytest.mark.skipif(not _have("cv2"), reason="needs cv2")),
    pytest.param("torch", "forkserver", marks=pytest.mark.skipif(
        not _have("torch"), reason="needs torch")),
]  # fmt: skip


@pytest.mark.parametrize("scenario, fresh_context", POOL_CASES)
def test_workers_start_after_the_callers_thread_pools_ran(scenario, fresh_context):
    """The caller's pools ran before the workers started: forked workers (which inherit the
    pools) and then fresh ones start and step, and the caller's thread settings are
    untouched."""
    completed = run_child(POOL_SCRIPT, scenario, "fork", fresh_context)
    result = last_json(completed)
    assert result["steps"] == {"fork": 10, fresh_context: 10}, completed.stderr
    assert result["after"] == result["before"]
    assert "Traceback" not in completed.stderr, completed.stderr


CAP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import vecaccel
    from toy_envs import Cv2ImportingEnv, cv2_threads, torch_threads
    from vecaccel.testing.envs import CounterEnv

    def threads_in_workers(env_fn, fn, context, worker_threads):
        # one worker, two envs: the cap is the worker process's, whichever env loads the module
        envs = vecaccel.make_vec([env_fn] * 2, backend="shm", num_workers=1, context=context,
                                 worker_threads=worker_threads, start_timeout_s=60)
        try:
            return envs.call(fn)
        finally:
            envs.close()

    def caps(what, context):
        if what == "cv2":
            return {
                # loaded by the env's constructor: capped after the envs are built
                "constructor": threads_in_workers(Cv2ImportingEnv, cv2_threads, context, 1),
                # loaded after that, by a call: capped by OpenCV's variable
                "later": threads_in_workers(CounterEnv, cv2_threads, context, 1),
                "two": threads_in_workers(Cv2ImportingEnv, cv2_threads, context, 2),
            }
        return {"later": threads_in_workers(CounterEnv, torch_threads, context, 1)}

    def main():
        what, contexts = sys.argv[2], sys.argv[3:]
        preloaded = "cv2" in sys.modules or "torch" in sys.modules
        result = {context: caps(what, context) for context in contexts}
        print(json.dumps({"preloaded": preloaded, **result}))

    if __name__ == "__main__":
        main()
    """
)


#: The start methods a worker that loads a module itself is checked under, one caller for all.
CAP_CONTEXTS = ("fork", "spawn")


@pytest.mark.skipif(not _have("cv2"), reason="needs OpenCV")
def test_a_worker_caps_the_opencv_it_loads_itself():
    result = last_json(run_child(CAP_SCRIPT, "cv2", *CAP_CONTEXTS))
    assert not result["preloaded"]
    for context in CAP_CONTEXTS:
        assert result[context]["constructor"] == [1, 1], context
        assert result[context]["later"] == [1, 1], context
        assert result[context]["two"] == [2, 2], context


@pytest.mark.skipif(not _have("torch"), reason="needs torch")
def test_a_worker_caps_the_torch_it_loads_itself():
    result = last_json(run_child(CAP_SCRIPT, "torch", *CAP_CONTEXTS))
    assert not result["preloaded"]
    for context in CAP_CONTEXTS:
        assert result[context]["later"] == [1, 1], context


INHERITED_CV2_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import cv2  # loaded, its pool never run: as when the caller builds an Atari env to look
    import vecaccel
    from toy_envs import Cv2ImportingEnv, cv2_threads

    def main():
        envs = vecaccel.make_vec([Cv2ImportingEnv] * 2, backend="shm", num_workers=2,
                                 context="fork", start_timeout_s=20)
        try:
            print(json.dumps({"workers": envs.call(cv2_threads)}))
        finally:
            envs.close()

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.skipif(not _have("cv2"), reason="needs OpenCV")
def test_an_inherited_opencv_whose_pool_never_ran_is_still_capped():
    """Under fork a worker leaves an inherited ``cv2`` alone, but OpenCV sizes its pool from
    its variable when the pool first starts, in the worker."""
    assert last_json(run_child(INHERITED_CV2_SCRIPT))["workers"] == [1, 1]


# ---------------------------------------------------------------------------------------------
# workers that do not start


def _line_of(function, text: str) -> int:
    """The line number, in its file, of the first line of ``function`` holding ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_a_worker_stuck_in_an_env_constructor_shows_where(context, no_leaks):
    warm = vecaccel.make_vec([CounterEnv], backend="shm", num_workers=1, context=context)
    warm.close()  # multiprocessing's own lazily made fds (its heap, spawn's tracker) exist now
    gc.collect()
    fds = open_fds()
    fns = [CounterEnv, CounterEnv, partial(wait_in_constructor), CounterEnv]
    with pytest.raises(vecaccel.WorkerTimeoutError) as caught:
        vecaccel.make_vec(fns, backend="shm", num_workers=2, context=context, start_timeout_s=3)
    error = caught.value
    assert isinstance(error, TimeoutError) and isinstance(error, vecaccel.WorkerError)
    assert error.worker_indices == (1,)
    assert error.env_indices == (2, 3)
    message = str(error)
    assert message.startswith("worker 1 (envs [2, 3]) did not start within start_timeout_s=3")
    line = _line_of(wait_in_constructor, ".wait(")
    assert f'toy_envs.py", line {line} in wait_in_constructor' in message, message
    assert "wait_in_constructor" in error.remote_traceback
    copy = pickle.loads(pickle.dumps(error))  # as it crosses a process boundary
    assert type(copy) is vecaccel.WorkerTimeoutError and str(copy) == message
    assert (copy.worker_indices, copy.env_indices) == (error.worker_indices, error.env_indices)
    del copy
    del caught, error  # the traceback holds the pool's frames
    gc.collect()
    assert wait_until(lambda: open_fds() <= fds), sorted(open_fds() - fds)


STUCK_MAIN = textwrap.dedent(
    """
    import sys, time
    import vecaccel

    if __name__ != "__main__":
        time.sleep(600)  # a spawned worker imports this module first, and stays here

    if __name__ == "__main__":
        try:
            vecaccel.make_vec("CartPole-v1", 1, backend="shm", context="spawn",
                              start_timeout_s=3)
        except vecaccel.WorkerTimeoutError as error:
            print(error)
    """
)


def test_a_worker_stuck_before_vecaccels_code_is_named_too(tmp_path, no_leaks):
    """A spawned worker stuck importing the main module cannot dump its stack yet: it is not
    sent the signal (which would end it), and the error says where it was."""
    script = tmp_path / "stuck_main.py"
    script.write_text(STUCK_MAIN)
    completed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=CHILD_TIMEOUT
    )
    assert "worker 0 (envs [0]) did not start within start_timeout_s=3" in completed.stdout, (
        completed.stdout + completed.stderr
    )
    assert "had not reached vecaccel's worker code yet" in completed.stdout


STUCK_IN_MAIN = textwrap.dedent(
    """
    import sys, time
    import gymnasium as gym
    import vecaccel


    def make_env():
        return gym.make("CartPole-v1")


    def make_slow_env():
        time.sleep(600)  # the line the stack must name
        return gym.make("CartPole-v1")


    if __name__ == "__main__":
        try:
            vecaccel.make_vec([make_env, make_slow_env], backend="shm", num_workers=2,
                              context=sys.argv[1], start_timeout_s=8)
        except vecaccel.WorkerTimeoutError as error:
            print(error)
    """
)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_stuck_env_function_of_the_main_script_is_named_by_its_file(tmp_path, context, no_leaks):
    """cloudpickle ships a function of ``__main__`` by value; its stack still names the file."""
    script = tmp_path / "my_training.py"
    script.write_text(STUCK_IN_MAIN)
    completed = subprocess.run(
        [sys.executable, str(script), context],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    line = 1 + STUCK_IN_MAIN.splitlines().index(
        "    time.sleep(600)  # the line the stack must name"
    )
    assert f'File "{script}", line {line} in make_slow_env' in completed.stdout, (
        completed.stdout + completed.stderr
    )
    assert "<dynamic-code>" not in completed.stdout
