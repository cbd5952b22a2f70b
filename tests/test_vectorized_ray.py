"""Vectorized slices on the ``ray`` backend: each shard's local backend builds one vector env per
worker from the shard's block of slice env functions. Loopback only, as the Ray backend's own
tests: a one-node cluster at 127.0.0.1 inside a namespace with only ``lo`` where allowed."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

import vecaccel
from tests.helpers import assert_same
from tests.ray_cluster import RAY_NODE_ARGS, loopback_namespace, sigterm_handler_kept
from tests.toy_vector_envs import sync_info_cartpole

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

N = 8


@pytest.fixture(scope="module")
def cluster():
    """One node with 2 CPUs at 127.0.0.1, this process connected; Ray stats off."""
    saved = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        with loopback_namespace(), sigterm_handler_kept():
            assert not ray.is_initialized()
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, **RAY_NODE_ARGS})
            try:
                ray.init(address=cluster.address, logging_level="WARNING")
                cluster.wait_for_nodes()
                yield cluster
            finally:
                ray.shutdown()
                cluster.shutdown()
    finally:
        if saved is None:
            os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
        else:
            os.environ["RAY_USAGE_STATS_ENABLED"] = saved


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
