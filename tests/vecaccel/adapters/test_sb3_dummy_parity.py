"""The SB3 adapter step by step beside ``DummyVecEnv``: observations, rewards, dones and infos
on the same seeds and actions, reset options, autoreset modes, refused set-ups.

Every check runs on the adapter over the process backends and ``serial`` and, wherever a
result can be compared, side by side with ``DummyVecEnv`` on the same seeds and actions.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from backend_matrix import options_for, select
from gymnasium.vector import AutoresetMode

pytest.importorskip("stable_baselines3")

from sb3_helpers import (
    BACKENDS,
    N_ENVS,
    assert_tree_equal,
    make_adapter,
    make_cartpole,
    run_side_by_side,
)
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
)
from toy_envs import (
    InfoEnv,
    OptionsSeenEnv,
    StepEnv,
)

import vecaccel
from vecaccel.adapters.sb3 import SB3VecEnv, VecAccelEnv, to_sb3

# ---------------------------------------------------------------------------------------------
# step-by-step equality with DummyVecEnv


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_dummy_vec_env_cartpole(backend: str) -> None:
    """CartPole (Monitor-wrapped, short time limit): obs, rewards, dones, infos identical."""
    env_fns = [functools.partial(make_cartpole, limit) for limit in (10, 30, 500)]
    seen = run_side_by_side(env_fns, backend, 100, seed=7)
    assert seen["terminated"] > 0 and seen["truncated"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_dummy_vec_env_infos(backend: str) -> None:
    """Every kind of info value, sparse keys, nested dicts and reset infos come through."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(4)]
    seen = run_side_by_side(env_fns, backend, 40, seed=11)
    assert seen["terminated"] > 0 and seen["truncated"] > 0


@pytest.mark.parametrize("autoreset_mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_dummy_vec_env_from_batched_infos(backend: str, autoreset_mode) -> None:
    """A backend that only batches its infos Gymnasium-style gives SB3 the same per-env dicts."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(4)]
    seen = run_side_by_side(
        env_fns, backend, 40, seed=11, autoreset_mode=autoreset_mode, batched_infos=True
    )
    assert seen["terminated"] > 0 and seen["truncated"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_env_infos_are_the_batched_infos_unbatched(backend: str) -> None:
    """With ``per_env_infos`` a backend returns ``{}`` and each env's own info dict instead."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(4)]
    options = dict(autoreset_mode=AutoresetMode.SAME_STEP, **options_for(backend))
    batched = vecaccel.make_vec(env_fns, backend=backend, **options)
    per_env = vecaccel.make_vec(env_fns, backend=backend, **options)
    per_env.per_env_infos = True
    try:
        assert per_env.supports_per_env_infos
        expected, _ = batched.reset(seed=3)
        obs, infos = per_env.reset(seed=3)
        assert infos == {}
        assert_tree_equal(expected, obs, "reset obs")
        rng = np.random.default_rng(0)
        for step in range(30):
            actions = rng.integers(0, 2, size=4)
            *_, batched_infos = batched.step(actions)
            *_, infos = per_env.step(actions)
            assert infos == {}
            rebuilt: dict[str, Any] = {}
            for index, info in per_env.last_infos:
                rebuilt = per_env._add_info(rebuilt, info, index)
            assert_tree_equal(batched_infos, rebuilt, f"step {step} infos")
    finally:
        batched.close()
        per_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_disabled_autoreset_mode(backend: str) -> None:
    """An env made with autoreset_mode=DISABLED is reset by the adapter, same results."""
    env_fns = [functools.partial(InfoEnv, 4 + i) for i in range(N_ENVS)]
    seen = run_side_by_side(env_fns, backend, 30, seed=1, autoreset_mode=AutoresetMode.DISABLED)
    assert seen["dones"] > 0
    envs = vecaccel.make_vec(
        env_fns, backend=backend, autoreset_mode=AutoresetMode.DISABLED, **options_for(backend)
    )
    adapter = to_sb3(envs)
    assert isinstance(adapter, SB3VecEnv) and adapter.vec_env is envs
    adapter.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_next_step_mode_is_refused(backend: str) -> None:
    envs = vecaccel.make_vec(
        [functools.partial(InfoEnv)] * 2,
        backend=backend,
        autoreset_mode=AutoresetMode.NEXT_STEP,
        **options_for(backend),
    )
    with pytest.raises(ValueError, match="SAME_STEP"):
        to_sb3(envs)
    envs.close()
    with pytest.raises(ValueError, match="SAME_STEP"):
        make_adapter([InfoEnv] * 2, backend, autoreset_mode="NextStep")


@pytest.mark.parametrize("backend", select(partial_batches=True))
def test_async_backends_are_refused(backend: str) -> None:
    """Backends that return envs in the order they finish cannot give SB3's per-index steps."""
    with pytest.raises(ValueError, match="shm"):
        make_vec_env(
            "CartPole-v1",
            n_envs=2,
            vec_env_cls=VecAccelEnv,
            vec_env_kwargs={"backend": backend, "num_workers": 1},
        )


def test_to_sb3_refuses_foreign_vector_envs() -> None:
    envs = gym.vector.SyncVectorEnv([InfoEnv], autoreset_mode=AutoresetMode.SAME_STEP)
    with pytest.raises(TypeError, match="make_vec"):
        to_sb3(envs)
    envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_set_options_applied_once_and_per_env(backend: str) -> None:
    """``set_options`` applies at the next reset only; per-env options reach their own env."""
    env_fns = [InfoEnv] * N_ENVS
    reference = DummyVecEnv(env_fns)
    adapter = make_adapter(env_fns, backend)
    try:
        for venv in (reference, adapter):
            venv.seed(4)
            venv.set_options({"start": 0.5})
        assert_tree_equal(reference.reset(), adapter.reset())
        assert adapter.reset_infos[0]["options"] == {"start": 0.5}
        assert [info["seeded"] for info in adapter.reset_infos] == [True] * N_ENVS
        assert_tree_equal(reference.reset_infos, adapter.reset_infos)

        obs = adapter.reset()  # options and seeds were cleared
        reference.reset()
        assert "options" not in adapter.reset_infos[0]
        assert not adapter.reset_infos[0]["seeded"]
        assert not np.allclose(obs[:, 0], 0.5)

        per_env = [{"start": 0.25}, {}, {"start": -0.75}]
        for venv in (reference, adapter):
            venv.seed(9)
            venv.set_options(per_env)
        assert_tree_equal(reference.reset(), adapter.reset())
        assert_tree_equal(reference.reset_infos, adapter.reset_infos)
        assert adapter.reset_infos[2]["options"] == {"start": -0.75}
    finally:
        reference.close()
        adapter.close()


def test_set_options_wrong_length_raises_value_error() -> None:
    """A per-env options list of the wrong length is refused where it is given, naming both
    lengths (``DummyVecEnv`` raises ``IndexError`` at the next reset for a short one)."""
    adapter = make_adapter([InfoEnv] * N_ENVS, "serial")
    try:
        for options in ([{"start": 1.0}], [{}] * (N_ENVS + 1)):
            with pytest.raises(ValueError, match=rf"list of {N_ENVS} .* length {len(options)}"):
                adapter.set_options(options)
        adapter.reset()
        assert all("options" not in info for info in adapter.reset_infos)  # nothing was kept
        adapter.set_options(({"start": 0.5},) * N_ENVS)  # any sequence of the right length
        assert adapter.reset()[:, 0].tolist() == [0.5] * N_ENVS
    finally:
        adapter.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_mask_options_for_gymnasium_users_unchanged(backend: str) -> None:
    """The adapter resets done envs with ``options=None``; Gymnasium's
    ``reset(options={"reset_mask": m})`` still gives the envs what is left of the dict, ``{}``,
    as ``SyncVectorEnv`` does."""
    env_fns = [functools.partial(OptionsSeenEnv, 3)] * 2
    sync = gym.vector.SyncVectorEnv(env_fns)
    envs = vecaccel.make_vec(env_fns, backend=backend, **options_for(backend))
    try:
        mask = np.array([False, True])
        for venv in (sync, envs):
            _, infos = venv.reset(seed=0)
            assert infos["options_is_none"].tolist() == [True, True]
            _, infos = venv.reset(options={"reset_mask": mask})
            assert infos["options_is_none"].tolist() == [False, False]
            assert infos["_options_is_none"].tolist() == [False, True]
    finally:
        sync.close()
        envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrapped_env_keeps_gymnasium_infos(backend: str) -> None:
    """``to_sb3`` does not switch the user's env to per-env infos: between the adapter's calls
    (and during a step the adapter left in flight) the env returns Gymnasium's batched infos,
    and the adapter's infos stay right."""
    envs = vecaccel.make_vec(
        [InfoEnv] * 2, backend=backend, autoreset_mode="SameStep", **options_for(backend)
    )
    adapter = to_sb3(envs)
    try:
        adapter.reset()
        *_, infos = adapter.step(np.array([0, 1]))
        assert infos[1]["nested"]["action"] == 1
        assert not envs.per_env_infos
        _, batched = envs.reset(seed=1)
        assert batched["_resets"].tolist() == [True, True]  # Gymnasium's batched form
        adapter.step_async(np.array([1, 2]))
        assert envs.get_attr("max_steps") == (6, 6)  # shm finishes the step in flight first
        _, _, _, infos = adapter.step_wait()
        assert [info["nested"]["action"] for info in infos] == [1, 2]
    finally:
        adapter.close()


def test_failed_init_leaves_the_env_as_it_was() -> None:
    envs = vecaccel.make_vec([InfoEnv] * 2, backend="serial")  # NEXT_STEP: refused
    try:
        with pytest.raises(ValueError, match="NEXT_STEP"):
            to_sb3(envs)
        assert not envs.per_env_infos
        _, infos = envs.reset(seed=0)
        assert infos["resets"].tolist() == [1, 1]
    finally:
        envs.close()


def test_start_method_is_subproc_vec_envs_name_for_context() -> None:
    """``vec_env_kwargs={"start_method": ...}`` written for ``SubprocVecEnv`` works."""
    vec_env = make_vec_env(
        "CartPole-v1",
        n_envs=2,
        vec_env_cls=VecAccelEnv,
        vec_env_kwargs={"backend": "shm", "num_workers": 1, "start_method": "spawn"},
    )
    try:
        assert vec_env.vec_env.pool.ctx.get_start_method() == "spawn"
        assert vec_env.reset().shape == (2, 4)
    finally:
        vec_env.close()
    with pytest.raises(ValueError, match="disagree"):
        VecAccelEnv([InfoEnv] * 2, backend="shm", start_method="spawn", context="fork")


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_async_step_wait(backend: str) -> None:
    vec_env = make_adapter([functools.partial(StepEnv, 3)] * 2, backend)
    vec_env.reset()
    vec_env.step_async(np.zeros(2, dtype=int))
    obs, rewards, dones, infos = vec_env.step_wait()
    assert obs.tolist() == [[0], [0]] and rewards.tolist() == [0.0, 0.0]
    assert dones.tolist() == [False, False]
    assert infos == [{"TimeLimit.truncated": False}] * 2
    vec_env.close()
    assert vec_env.vec_env.closed
