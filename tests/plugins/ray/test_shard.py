"""Vectorized slices on the ``ray`` backend: each shard's local backend builds one vector env per
worker from the shard's block of slice env functions. Loopback only, as the Ray backend's own
tests: a one-node cluster at 127.0.0.1 inside a namespace with only ``lo`` where allowed."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import vecaccel
from tests.support.helpers import assert_same
from tests.support.ray_cluster import connected_cluster, loopback_ray
from tests.support.toy_vector_envs import sync_info_cartpole

ray = pytest.importorskip("ray")

N = 8


@pytest.fixture(scope="module")
def cluster():
    """One node with 2 CPUs at 127.0.0.1, this process connected; Ray stats off."""
    with loopback_ray(), connected_cluster(1, 2) as cluster:
        yield cluster


@pytest.mark.parametrize(("mode", "shard_backend"), [("NextStep", "shm"), ("SameStep", "serial")])
def test_ray_shards_of_slices_equal_one_sync_vector_env(cluster, mode, shard_backend):
    fn = functools.partial(sync_info_cartpole, mode=mode)
    envs = vecaccel.make_vec(
        fn,
        N,
        backend="ray",
        vectorized=True,
        autoreset_mode=mode,
        num_shards=2,
        shard_backend=shard_backend,
        num_workers=1,
    )
    alone = sync_info_cartpole(N, mode)
    rng = np.random.default_rng(0)
    try:
        obs, _ = envs.reset(seed=7)
        np.testing.assert_array_equal(obs, alone.reset(seed=7)[0])
        for _ in range(60):
            actions = rng.integers(0, 2, N)
            got, want = envs.step(actions), alone.step(actions)
            for a, b in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(a, b)
            assert_same(got[4], want[4])
    finally:
        envs.close()
        alone.close()
