"""The ``shm`` backend's own promises, beyond the contract every backend keeps (``contract/``):
options given to the factory as keywords, views into shared memory with ``copy=False``, a failed
env refused until a reset includes it, and a step that timed out finished by ``reset`` without
its error (the ``hybrid`` share of the caller: ``test_shm_hybrid.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import vecaccel
from vecaccel.plugins.shm import ShmVecEnv, make_shm
from vecaccel.testing.envs import counter_fns

NUM_ENVS = 4  # two workers: envs [0, 1] and [2, 3]


def _zeros() -> np.ndarray:
    return np.zeros(NUM_ENVS, dtype=np.int64)


def _counts(obs: np.ndarray) -> list[int]:
    return obs.ravel().tolist()  # CounterEnv observes its number of steps


def test_a_direct_call_takes_the_options_as_keywords_and_refuses_a_misspelled_one() -> None:
    envs = make_shm(counter_fns(2), num_workers=2, context="fork", drain_timeout_s=2.5)
    try:
        assert isinstance(envs, ShmVecEnv)
        assert (envs.num_workers, envs.drain_timeout_s) == (2, 2.5)
    finally:
        envs.close()
    with pytest.raises(TypeError, match="did you mean 'num_workers'"):
        make_shm(counter_fns(2), num_wrokers=2)


def test_without_copies_the_arrays_are_shared_memory_the_next_step_rewrites(leak_check) -> None:
    views = make_shm(counter_fns(NUM_ENVS), num_workers=2, context="fork", copy=False)
    copies = make_shm(counter_fns(NUM_ENVS), num_workers=2, context="fork")
    try:
        for envs in (views, copies):
            envs.reset(seed=0)
        view, rewards, *_ = views.step(_zeros())
        copy, *_ = copies.step(_zeros())
        assert _counts(view) == _counts(copy) == [1, 1, 1, 1]
        again, rewards_again, *_ = views.step(_zeros())
        copies.step(_zeros())
        assert again is view and rewards_again is rewards
        assert _counts(view) == [2, 2, 2, 2], "a view shows the latest step"
        assert _counts(copy) == [1, 1, 1, 1], "a copy keeps its step"
    finally:
        views.close()
        copies.close()


def test_a_failed_env_is_refused_until_a_reset_includes_it(leak_check) -> None:
    envs = vecaccel.make_vec(
        counter_fns(NUM_ENVS, {1: {"fault_step": 1}}), backend="shm", num_workers=2,
        context="fork",
    )  # fmt: skip
    try:
        envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError) as info:
            envs.step(_zeros())
        assert info.value.env_indices == (1,)
        others = np.array([True, False, True, True])
        envs.reset(options={"reset_mask": others})
        with pytest.raises(vecaccel.WorkerError, match=r"envs \[1\] failed in an earlier call"):
            envs.step(_zeros())
        envs.reset(options={"reset_mask": ~others})  # env 1 starts over
        assert _counts(envs.step(_zeros())[0]) == [2, 2, 2, 2]
    finally:
        envs.close()


def test_reset_finishes_a_step_that_timed_out_without_raising_its_error(leak_check) -> None:
    """The step that timed out raised in env 2 meanwhile: ``reset`` finishes it and starts env 2
    over instead of raising (as ``async`` and ``action_server`` do)."""
    faulty = {2: {"sleep_step": 2, "sleep_seconds": 0.3, "fault_step": 2}}
    envs = vecaccel.make_vec(
        counter_fns(NUM_ENVS, faulty), backend="shm", num_workers=2, context="fork"
    )
    try:
        envs.reset(seed=0)
        envs.step(_zeros())
        envs.step_async(_zeros())
        with pytest.raises(TimeoutError):
            envs.step_wait(timeout=0.05)
        obs, _ = envs.reset(seed=1)
        assert _counts(obs) == [2, 2, 2, 2]  # the late step ran, then the reset
        assert _counts(envs.step(_zeros())[0]) == [3, 3, 3, 3]
    finally:
        envs.close()
