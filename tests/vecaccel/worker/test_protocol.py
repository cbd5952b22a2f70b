"""Reply payloads (infos, call results, error reports) between workers and the parent.

A payload that fits in the worker's shared-memory slab travels there; a bigger one takes the
data pipe. Both must arrive intact, in order, under every start method, including the
``multiprocess`` (dill) one whose pickler differs from the standard library's."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from backend_matrix import options_for, select
from gymnasium import spaces

import vecaccel
from vecaccel.worker import PAYLOAD_SLAB_BYTES

BIG = 3 * PAYLOAD_SLAB_BYTES  # past the slab: the pipe
SMALL = 100


class PayloadEnv(gym.Env):
    """Action 1 returns an info holding ``BIG`` bytes, action 0 one of ``SMALL`` bytes."""

    def __init__(self, tag: int = 0) -> None:
        self.tag = tag
        self.observation_space = spaces.Box(-1e9, 1e9, (2,), np.float64)
        self.action_space = spaces.Discrete(2)
        self.count = 0
        self.blob = np.full(BIG, tag, dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([self.tag, 0.0]), {"blob": np.arange(self.tag + 1)}

    def step(self, action):
        self.count += 1
        size = BIG if action == 1 else SMALL
        info = {"blob": np.full(size, (self.tag + self.count) % 256, dtype=np.uint8)}
        return np.array([self.tag, float(self.count)]), 0.0, False, False, info


def _contexts() -> list[str]:
    contexts = ["fork", "spawn"]
    try:
        import multiprocess  # noqa: F401

        contexts.append("multiprocess")
    except ImportError:
        pass
    return contexts


@pytest.mark.parametrize("context", _contexts())
@pytest.mark.parametrize("backend", select(worker_processes=True, lockstep=True, tensors=False))
def test_small_and_big_payloads_arrive_intact(backend, context, leak_check):
    num_envs = 4
    envs = vecaccel.make_vec(
        [functools.partial(PayloadEnv, tag) for tag in range(num_envs)],
        backend=backend,
        autoreset_mode="SameStep",
        **options_for(backend, num_workers=2, context=context),
    )
    envs.per_env_infos = True  # each env's own info dict, so every blob is checked whole
    try:
        envs.reset(seed=0)
        assert [len(info["blob"]) for _, info in sorted(envs.last_infos)] == [1, 2, 3, 4]
        rng = np.random.default_rng(0)
        for step in range(1, 13):
            actions = rng.integers(0, 2, size=num_envs)
            if step == 1:
                actions[:] = 1  # every worker's payload on the pipe at once
            envs.step(actions)
            infos = dict(envs.last_infos)
            assert sorted(infos) == list(range(num_envs))
            for tag, info in infos.items():
                blob = info["blob"]
                assert len(blob) == (BIG if actions[tag] else SMALL), (step, tag)
                assert (blob == (tag + step) % 256).all(), (step, tag)
        # call results, big and small, go the same ways
        blobs = envs.get_attr("blob")
        assert [int(b[0]) for b in blobs] == list(range(num_envs))
        assert envs.get_attr("tag") == tuple(range(num_envs))
    finally:
        envs.close()
