"""Checks shared by the test suite: process trees, /dev/shm entries, descriptors, waits.

Everything here is module level so that it can be imported by the test modules, by the child
interpreters some tests start, and by the benchmark scripts.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

#: The repository root, put on ``PYTHONPATH`` of the interpreters ``run_vecaccel`` starts.
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# the command line


def run_main(argv: list[str]) -> int:
    """The exit code of ``vecaccel ARGV`` run in this process (argparse's usage errors and
    ``--help`` end in ``SystemExit``)."""
    from vecaccel.cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def run_vecaccel(
    argv: list[str], cwd: Path, extra_env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m vecaccel ARGV`` in a fresh interpreter, the repository first on
    ``PYTHONPATH`` (``extra_env["PYTHONPATH"]`` after it)."""
    env = dict(os.environ)
    extra = dict(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), extra.pop("PYTHONPATH", "")]))
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "vecaccel", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


# ---------------------------------------------------------------------------------------------
# checks


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Assert two results are identical: same tree, keys, types, dtypes, shapes and values.

    Object arrays (``final_obs``, infos of unknown types) are compared element by element.
    """
    where = path or "<root>"
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), f"{where}: {type(a)} vs {type(b)}"
        assert sorted(a) == sorted(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), (
            f"{where}: {type(a)} vs {type(b)}"
        )
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} vs {b.shape}"
        if a.dtype == object:
            for index in np.ndindex(a.shape):
                assert_same(a[index], b[index], f"{path}[{index}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=where, strict=True)
    else:
        assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)} ({a!r} vs {b!r})"
        assert a == b, f"{where}: {a!r} vs {b!r}"


def reorder_batch(space: gym.Space, batch: Any, order: np.ndarray) -> Any:
    """Put a batch of single space ``space`` (batched as ``SyncVectorEnv`` batches it: arrays,
    and a tuple of items for a leaf with no fixed size) into the order ``order``."""
    from vecaccel.spaces.payload import is_fixed_leaf

    if isinstance(space, gym.spaces.Dict):
        return {key: reorder_batch(sub, batch[key], order) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(reorder_batch(sub, part, order) for sub, part in zip(space.spaces, batch))
    if is_fixed_leaf(space):
        return batch[order]
    return tuple(batch[i] for i in order)


# ---------------------------------------------------------------------------------------------
# process backends of two workers, as the fault, lifecycle, restart and interrupt tests build them

#: Generous bound for "returns at once": it catches hangs, not slowness.
LONG_PROMPT = 10.0

NUM_ENVS = 4  # two workers: envs [0, 1] and [2, 3]


def make_backend(backend: str, env_fns, context: str = "fork", **options):
    """``backend`` over ``env_fns`` on two workers, with the options of ``backend_matrix``
    (every env returned each step unless ``options`` say otherwise)."""
    from backend_matrix import options_for

    import vecaccel

    matrix = options_for(backend, num_workers=2, context=context)
    return vecaccel.make_vec(env_fns, backend=backend, **{**matrix, **options})


def zeros(envs, n: int = NUM_ENVS):
    """Action 0 for ``n`` envs, as a tensor for the action server."""
    actions = np.zeros(n, dtype=np.int64)
    if getattr(envs, "device", None) is not None:  # action_server takes torch tensors
        import torch

        return torch.as_tensor(actions)
    return actions


def as_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def close_promptly(envs) -> None:
    """``close()`` twice returns at once and leaves the env closed."""
    started = time.monotonic()
    envs.close()
    envs.close()
    assert envs.closed
    assert time.monotonic() - started < LONG_PROMPT


# ---------------------------------------------------------------------------------------------
# child interpreters

#: The tests folder, put first on the path of the interpreters ``run_child`` starts.
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

#: How long a child interpreter may run before the test calls it stuck.
CHILD_TIMEOUT = 90.0


def run_child(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter (tests dir first on its path); a hang fails."""
    try:
        return subprocess.run(
            [sys.executable, "-c", script, TESTS_DIR, *args],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:  # workers follow their parent out
        raise AssertionError(f"the child hung: {exc.stdout!r} {exc.stderr!r}") from None


def last_json(completed: subprocess.CompletedProcess) -> dict:
    """The last JSON line a child printed."""
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result (rc {completed.returncode}): {completed.stderr}"
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# small trainers (torch is imported only by the helpers that need it)

PENDULUM_OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)

PENDULUM_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


def pendulum_agent(mean: float, log_std: float):
    """A Pendulum PPO agent whose Gaussian has mean ``mean`` and log-std ``log_std`` for every
    observation."""
    import torch

    from vecaccel.trainers import PPO

    agent = PPO(None, env_id="Pendulum-v1", observation_space=PENDULUM_OBS,
                action_space=PENDULUM_ACT, backend="serial", torch_threads=1)  # fmt: skip
    with torch.no_grad():
        agent.model.actor_head.weight.zero_()
        agent.model.actor_head.bias.fill_(mean)
        agent.model.log_std.fill_(log_std)
    return agent


#: A small DQN config that only collects, unless a test says otherwise.
SMALL_DQN = dict(
    learning_starts=10**9,
    batch_size=16,
    buffer_size=256,
    hidden_sizes=(16,),
    progress=False,
    tensorboard=False,
)


#: A DQN that learns within a few hundred steps of CartPole: the sync trainer's tests.
TINY_DQN = dict(
    learning_starts=64,
    batch_size=16,
    buffer_size=512,
    replay_ratio=8.0,
    target_update_period=50,
    log_every_steps=100,
    hidden_sizes=(32, 32),
    progress=False,
    tensorboard=False,
)

#: The DQN of the asynchronous runs' tests: a replay that fills in a few hundred steps.
TINY_ASYNC_DQN = dict(
    batch_size=16,
    buffer_size=2_000,
    learning_starts=200,
    replay_ratio=4.0,
    progress=False,
    tensorboard=False,
    torch_threads=1,
    log_every_steps=250,
    hidden_sizes=(32, 32),
)


def best_rolling_return(agent: Any, window: int = 10) -> float:
    """The best mean of ``window`` consecutive logged episodic returns of ``agent``'s run."""
    returns = [
        r["charts/episodic_return"] for r in agent.logger.history if "charts/episodic_return" in r
    ]
    if len(returns) < window:
        return float("-inf")
    return max(np.mean(returns[i : i + window]) for i in range(len(returns) - window + 1))


def train_async(agent: Any, total_timesteps: int, **options: Any) -> Any:
    """``AsyncRunner(agent).run(total_timesteps, **options)``, and the ``AsyncStats`` it measured."""
    from vecaccel.trainers import AsyncRunner

    runner = AsyncRunner(agent)
    runner.run(total_timesteps, **options)
    assert runner.stats is not None
    return runner.stats


def serial_cartpole(num_envs: int = 2) -> gym.vector.VectorEnv:
    """CartPole as the trainers build it, on the serial backend."""
    from vecaccel.trainers.envs.make import make_env_for_training

    return make_env_for_training("CartPole-v1", num_envs, backend="serial", seed=0)


# ---------------------------------------------------------------------------------------------
# the machine's load


@contextlib.contextmanager
def busy_loop_elsewhere(nice: int = 0, setsid: bool = False) -> Iterator[int]:
    """A busy loop that is not this process's descendant (the shell that starts it exits at
    once), as another user's job would be, at ``nice`` above this process's, started by ``setsid``
    where asked; yields its pid and kills it on exit."""
    from vecaccel.bench.seeds import start_elsewhere

    pid = start_elsewhere([sys.executable, "-c", "while True: pass"], nice=nice, setsid=setsid)
    time.sleep(0.2)
    try:
        yield pid
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
