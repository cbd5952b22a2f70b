"""The ``ray`` backend's options: checked before Ray starts or any actor is made."""

from __future__ import annotations

import pytest

import vecaccel
from vecaccel.options import RayOptions

ray = pytest.importorskip("ray")


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"num_shard": 2}, TypeError, "did you mean 'num_shards'"),
        ({"num_shards": 0}, ValueError, "num_shards must be a positive integer"),
        ({"placement": "STRICT"}, ValueError, "placement must be one of"),
        ({"shard_backend": "ray"}, ValueError, "shard_backend cannot be 'ray'"),
        ({"shard_backend": "nope"}, ValueError, "unknown backend 'nope'"),
        ({"shard_options": {"num_wrokers": 2}}, TypeError, "did you mean 'num_workers'"),
        ({"shard_options": {"autoreset_mode": "SameStep"}}, ValueError, "autoreset_mode"),
        ({"shard_resources": {"num_cpus": -1}}, ValueError, "shard_resources"),
        ({"shard_resources": {"num_cpus": 0}}, ValueError, "must reserve something"),
        ({"on_worker_failure": "retry"}, ValueError, "on_worker_failure"),
        ({"step_timeout_s": 0}, ValueError, "step_timeout_s"),
        ({"connect_timeout_s": -1}, ValueError, "connect_timeout_s must be positive seconds"),
        ({"connect_timeout": "10"}, ValueError, "connect_timeout_s must be positive seconds"),
    ],
)
def test_bad_options_are_refused_before_ray_starts(options, error, match):
    assert not ray.is_initialized()
    with pytest.raises(error, match=match):
        vecaccel.make_vec("CartPole-v1", 4, backend="ray", **options)
    assert not ray.is_initialized()


def test_aliases_and_defaults():
    options = RayOptions.from_kwargs(
        "ray", {"step_timeout": 5, "start_timeout": 9, "connect_timeout": 3}
    )
    assert (options.step_timeout_s, options.start_timeout_s) == (5, 9)
    assert options.connect_timeout_s == 3 and RayOptions().connect_timeout_s < 60
    assert options.shard_backend == "shm" and options.placement == "SPREAD"
    assert options.on_worker_failure == "raise" and options.copy


def test_ray_is_listed_with_its_plugin():
    assert vecaccel.list_backends()["ray"]["plugin"] == "vecaccel.plugins.ray"
