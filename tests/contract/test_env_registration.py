"""Env functions that make plugin packages' envs by id (``gym.make("ALE/Pong-v5")``, no
registration line of their own) work wherever vecaccel builds envs: in the caller, in workers
under fork, spawn and forkserver, and in a Ray shard; a namespace that stays unknown says which
package to install."""

from __future__ import annotations

import multiprocessing as mp
import textwrap

import pytest
from backend_matrix import DEFAULT_BACKEND, REFERENCE_BACKEND
from helpers import last_json, run_child
from user_env_fns import make_from_an_unknown_namespace

import vecaccel
from vecaccel.envs.unknown_ids import env_error_message, namespace_hint
from vecaccel.errors import WorkerError

pytest.importorskip("ale_py")

PONG_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import gymnasium as gym
    from user_env_fns import make_pong

    backend, contexts = sys.argv[2], sys.argv[3:]
    known_before = any(env_id.startswith("ALE/") for env_id in gym.registry)
    import vecaccel

    shapes = {}
    for context in contexts:
        # one worker: each start method's worker must know the id; the split is not in question
        options = {} if context == "caller" else {"context": context, "num_workers": 1}
        envs = vecaccel.make_vec(make_pong, 2, backend=backend, **options)
        try:
            obs, _ = envs.reset(seed=0)
            obs, *_ = envs.step(envs.action_space.sample())
        finally:
            envs.close()
        shapes[context] = list(obs.shape)
    print(json.dumps({"known_before": known_before, "shapes": shapes}))
    """
)

START_METHODS = [m for m in ("fork", "spawn", "forkserver") if m in mp.get_all_start_methods()]

#: The start methods whose workers are fresh interpreters: they know nothing of the caller's
#: registry, so one caller serves them all.
FRESH_METHODS = [m for m in START_METHODS if m != "fork"]


# where envs are built: in the caller (the in-process reference), and in the workers of the
# default backend under each start method
@pytest.mark.parametrize(
    ("backend", "contexts"),
    [
        pytest.param(REFERENCE_BACKEND, ["caller"], id="caller"),
        pytest.param(DEFAULT_BACKEND, ["fork"], id="fork"),
        pytest.param(DEFAULT_BACKEND, FRESH_METHODS, id="-".join(FRESH_METHODS)),
    ],
)
def test_a_function_making_ale_pong_by_id_runs_everywhere(backend, contexts):
    # a fresh interpreter: nothing registered ALE before make_vec, as in a user's script
    done = run_child(PONG_SCRIPT, backend, *contexts)
    assert done.returncode == 0, done.stderr[-3000:]
    result = last_json(done)
    assert result["known_before"] is False
    assert result["shapes"] == {context: [2, 210, 160, 3] for context in contexts}


def test_a_function_making_ale_pong_by_id_runs_in_a_ray_shard():
    pytest.importorskip("ray")
    from tests.support.ray_cluster import connected_cluster, loopback_ray
    from tests.support.user_env_fns import make_pong

    with loopback_ray(), connected_cluster(1, 2):
        # serial shards: the actor's own process builds the envs
        envs = vecaccel.make_vec(make_pong, 2, backend="ray", num_shards=2, shard_backend="serial")
        try:
            obs, _ = envs.reset(seed=0)
            obs, *_ = envs.step(envs.action_space.sample())
            assert obs.shape == (2, 210, 160, 3)
        finally:
            envs.close()


# ---------------------------------------------------------------------------------------------
# a namespace that stays unknown


@pytest.fixture
def packaged_namespace(monkeypatch):
    """``NoSuchPackage`` as if a known plugin package that is not installed provided it."""
    monkeypatch.setitem(
        vecaccel.envs.unknown_ids.NAMESPACE_PACKAGES,
        "NoSuchPackage",
        ("no_such_package", "no-such-package", "nosuch"),
    )


@pytest.mark.parametrize("where", ["caller", "fork"])
def test_a_missing_package_is_named_with_its_extra(where, packaged_namespace, no_leaks):
    if where not in ("caller", *START_METHODS):
        pytest.skip(f"no {where} start method here")
    if where == "caller":
        options = {"backend": REFERENCE_BACKEND}
    else:
        options = {"backend": DEFAULT_BACKEND, "context": where}
    with pytest.raises(WorkerError) as caught:
        vecaccel.make_vec(make_from_an_unknown_namespace, 2, **options).close()
    message = str(caught.value)
    assert "NamespaceNotFound" in message
    assert "pip install 'vecaccel[nosuch]'" in message, message


def test_an_unknown_namespace_in_a_spawned_worker_says_how_namespaces_register(no_leaks):
    if "spawn" not in START_METHODS:
        pytest.skip("no spawn start method here")
    with pytest.raises(WorkerError) as caught:
        vecaccel.make_vec(
            make_from_an_unknown_namespace, 2, backend="shm", context="spawn", num_workers=1
        ).close()
    message = str(caught.value)
    assert "NoSuchPackage namespace" in message and "register_envs" in message, message


def test_the_hint_only_answers_a_namespace_not_found():
    import gymnasium as gym

    error = gym.error.NamespaceNotFound("Namespace ALE not found. Have you installed ...?")
    assert "pip install 'vecaccel[atari]'" in namespace_hint(error, installed=lambda m: False)
    assert "gymnasium.register_envs(ale_py)" in namespace_hint(error, installed=lambda m: True)
    assert namespace_hint(ValueError("Namespace ALE not found")) is None
    assert env_error_message(KeyError("x")) == "'x'"


def test_the_async_sampler_process_knows_plugin_ids_under_spawn():
    pytest.importorskip("torch")
    from user_env_fns import report_whether_ale_is_known

    from vecaccel.trainers.runners.asynchronous.process import child_main

    context = mp.get_context("spawn")
    result, errors = context.Queue(), context.Queue()
    process = context.Process(
        target=child_main,
        args=(report_whether_ale_is_known, {"result": result, "errors": errors}),
    )
    process.start()
    try:
        assert result.get(timeout=120) is True
    finally:
        process.join(timeout=30)
    assert process.exitcode == 0
