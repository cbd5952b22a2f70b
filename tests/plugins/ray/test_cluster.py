"""What a shard asks of Ray and what comes back from it, without a cluster: the shard backend's
options, the resources of its bundle and actor, the batch sizes ``recv`` can return, the shards a
cluster's nodes give by default, and the caller's own copies of read-only arrays. No Ray is
started here (stopping actors is checked on a cluster: ``test_vec_env.py``'s lost shards)."""

from __future__ import annotations

import sys
from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pytest

from vecaccel.options import RayOptions
from vecaccel.plugins.ray.cluster import (
    actor_options,
    check_batch_size,
    default_num_shards,
    import_ray,
    owned,
    shard_bundle,
    shard_options,
)


def test_the_shard_backend_gets_the_ray_options_it_knows_and_hands_out_views() -> None:
    options = RayOptions(shard_backend="shm", num_workers=2, on_worker_failure="restart")
    assert shard_options(options) == {
        "num_workers": 2,
        "on_worker_failure": "restart",
        "max_restarts": 100,
        "copy": False,  # the arrays go into the object store at once: no copy of them first
    }
    # serial has no workers to restart: only what it knows
    assert shard_options(RayOptions(shard_backend="serial", num_workers=2)) == {"copy": False}


def test_the_shard_options_given_win_and_a_misspelled_one_is_refused_before_any_start() -> None:
    given = RayOptions(shard_backend="shm", num_workers=3, shard_options={"num_workers": 1})
    assert shard_options(given)["num_workers"] == 1
    with pytest.raises(TypeError, match="did you mean 'num_workers'"):
        shard_options(RayOptions(shard_backend="shm", shard_options={"num_wrokers": 1}))


def test_a_bundle_names_ray_resources_and_drops_those_of_none() -> None:
    assert shard_bundle(None) == {"CPU": 1}
    assert shard_bundle({"num_cpus": 2, "num_gpus": 0, "memory": 2**30, "sim_node": 1}) == {
        "CPU": 2,
        "memory": 2**30,
        "sim_node": 1,
    }


def test_an_actor_reserves_its_resources_in_its_bundle_and_is_never_restarted_by_ray() -> None:
    pytest.importorskip("ray")
    group = object()
    options = actor_options({"num_cpus": 2, "num_gpus": 0.5, "sim_node": 1}, group, 1)
    strategy = options.pop("scheduling_strategy")
    assert strategy.placement_group is group and strategy.placement_group_bundle_index == 1
    assert options == {
        "num_cpus": 2,
        "num_gpus": 0.5,
        "resources": {"sim_node": 1},
        "max_restarts": 0,  # the backend restarts a shard, reseeding and truncating
        "max_concurrency": 1,
    }
    assert actor_options(None, group, 0)["num_cpus"] == 1


@pytest.mark.parametrize(
    ("batch_size", "bounds", "error"),
    [
        (4, [(0, 2), (2, 4)], None),
        (2, [(0, 2), (2, 4)], None),
        (6, [(0, 2), (2, 4)], "at most num_envs=4"),
        (3, [(0, 2), (2, 4)], "multiple of the shard size"),
        (2, [(0, 3), (3, 4)], "every shard the same size"),
    ],
)
def test_recv_returns_whole_shards(batch_size, bounds, error) -> None:
    if error is None:
        check_batch_size(batch_size, 4, bounds)
    else:
        with pytest.raises(ValueError, match=error):
            check_batch_size(batch_size, 4, bounds)


def test_one_shard_per_live_node_with_cpus_by_default() -> None:
    nodes = [
        {"Alive": True, "Resources": {"CPU": 8.0}},
        {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0}},
        {"Alive": False, "Resources": {"CPU": 8.0}},  # a node that left
        {"Alive": True, "Resources": {"GPU": 1.0}},  # no CPU to step envs on
    ]
    assert default_num_shards(SimpleNamespace(nodes=lambda: nodes)) == 2
    assert default_num_shards(SimpleNamespace(nodes=lambda: [])) == 1


def test_without_ray_the_error_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'vecaccel\[ray\]'"):
        import_ray()


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def test_read_only_arrays_become_the_callers_own_wherever_they_sit() -> None:
    Pair = namedtuple("Pair", "left right")
    writable = np.arange(3)
    objects = np.empty(2, dtype=object)
    objects[0], objects[1] = _read_only(np.ones(2)), "text"
    info = {
        "final_obs": [_read_only(np.zeros(4)), None],
        "pair": Pair(_read_only(np.ones(1)), 5),
        "nested": ({"deep": _read_only(np.full(2, 7.0))},),
        "objects": objects,
        "writable": writable,
    }
    mine = owned(info)
    assert mine["final_obs"][0].flags.writeable and mine["final_obs"][1] is None
    assert isinstance(mine["pair"], Pair) and mine["pair"].left.flags.writeable
    assert mine["pair"].right == 5
    assert isinstance(mine["nested"], tuple) and mine["nested"][0]["deep"].flags.writeable
    assert mine["objects"][0].flags.writeable and mine["objects"][1] == "text"
    assert mine["objects"] is not objects  # a new array of the caller's own items
    assert mine["writable"] is writable  # already the caller's: no copy
    np.testing.assert_array_equal(mine["nested"][0]["deep"], [7.0, 7.0])
