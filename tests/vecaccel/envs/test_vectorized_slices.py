"""Vector env functions as worker slices (``make_vec(..., vectorized=True)``): trajectories equal
to the inner vector env stepped alone, per backend and autoreset mode; the mode check; infos
merged per slice; faults and restarts of a slice."""

from __future__ import annotations

import functools
import os
import signal

import numpy as np
import pytest
import torch
from backend_matrix import (
    backend_of,
    options_for,
    partial_batch_options,
    select,
)
from gymnasium.vector import AutoresetMode
from helpers import as_numpy, assert_same
from toy_vector_envs import (
    failing_cartpole,
    native_cartpole,
    not_a_vector_env,
    sync_cartpole,
    sync_info_cartpole,
    wrong_count,
)

import vecaccel
from vecaccel.envs.vectorized_slices import merge_slice_infos, unbatch_infos
from vecaccel.errors import WorkerError
from vecaccel.testing import NUM_ENVS as CONTRACT_ENVS
from vecaccel.testing import check_backend
from vecaccel.testing.leaks import process_gone, wait_until
from vecaccel.worker import derived_seed

torch.set_num_threads(1)

N = 8

#: Steps a trajectory runs: random CartPole episodes last about 20 steps, so each of the N envs
#: passes through two or three autoresets.
STEPS = 60


def _partial_kind(name: str) -> str:
    """The id of ``name`` returning half of its envs per step."""
    return (
        f"{name}_half" if "batch_size" in partial_batch_options(name, N) else f"{name}_alternating"
    )


#: Every backend takes vectorized slices: each with the matrix's options (two slices, or one),
#: and each that can return part of its envs per step also returning half of them.
BACKENDS: dict[str, tuple[str, dict]] = {
    **{name: (name, options_for(name)) for name in select()},
    **{
        _partial_kind(name): (name, {**options_for(name), **partial_batch_options(name, N)})
        for name in select(partial_batches=True)
    },
}


def make(kind: str, env, mode: AutoresetMode = AutoresetMode.NEXT_STEP, **extra):
    backend, options = BACKENDS[kind]
    return vecaccel.make_vec(
        env, N, backend=backend, vectorized=True, autoreset_mode=mode, **{**options, **extra}
    )


def slices_of(envs) -> list[tuple[int, int]]:
    """The ``(start, stop)`` of each inner vector env of ``envs``."""
    if not hasattr(envs, "pool"):
        return [(0, envs.num_envs)]
    inline = getattr(envs, "inline_envs", 0)
    return [(0, inline)] * bool(inline) + [(w.start, w.stop) for w in envs.pool.workers]


class SlicesAlone:
    """The inner vector envs of ``envs``' slices, each built and stepped alone in this process
    and reset with the slice's first seed."""

    def __init__(self, fn, slices: list[tuple[int, int]], seed: int) -> None:
        self.slices = slices
        self.envs = [fn(stop - start) for start, stop in slices]
        self.obs = np.zeros((N, 4), dtype=np.float32)
        self.rewards = np.zeros(N)
        self.terms = np.zeros(N, dtype=np.bool_)
        self.truncs = np.zeros(N, dtype=np.bool_)
        for (start, stop), envs in zip(slices, self.envs):
            self.obs[start:stop] = envs.reset(seed=seed + start)[0]

    def step(self, actions: np.ndarray, ids: np.ndarray) -> dict:
        """Step the slices whose envs are ``ids`` (``actions[k]`` for env ``ids[k]``)."""
        infos: dict = {}
        where = {int(i): k for k, i in enumerate(ids)}
        for (start, stop), envs in zip(self.slices, self.envs):
            if start not in where:
                continue
            chosen = [where[i] for i in range(start, stop)]
            obs, rew, term, trunc, info = envs.step(actions[chosen])
            rows = slice(start, stop)
            self.obs[rows], self.rewards[rows], self.terms[rows], self.truncs[rows] = (
                obs,
                rew,
                term,
                trunc,
            )
            merge_slice_infos(infos, info, start, stop - start, N)
        return infos

    def close(self) -> None:
        for envs in self.envs:
            envs.close()


def act(envs, actions: np.ndarray):
    if getattr(envs, "device", None) is not None:
        return torch.as_tensor(actions)
    return actions


def ids_of(infos: dict, n: int = N) -> np.ndarray:
    return np.asarray(infos["env_id"]) if "env_id" in infos else np.arange(n)


@pytest.mark.parametrize("kind", list(BACKENDS))
def test_native_cartpole_equals_its_slices_stepped_alone(kind):
    envs = make(kind, "CartPole-v1")
    reference = SlicesAlone(native_cartpole, slices_of(envs), seed=11)
    rng = np.random.default_rng(0)
    try:
        obs, infos = envs.reset(seed=11)
        ids = ids_of(infos)
        np.testing.assert_array_equal(as_numpy(obs), reference.obs[ids])
        episodes = 0
        for _ in range(STEPS):
            actions = rng.integers(0, 2, len(ids))
            obs, rew, term, trunc, infos = envs.step(act(envs, actions))
            reference.step(actions, ids)
            ids = ids_of(infos)
            np.testing.assert_array_equal(as_numpy(obs), reference.obs[ids])
            np.testing.assert_array_equal(as_numpy(rew), reference.rewards[ids])
            np.testing.assert_array_equal(as_numpy(term), reference.terms[ids])
            np.testing.assert_array_equal(as_numpy(trunc), reference.truncs[ids])
            episodes += int(as_numpy(term).sum())
        assert episodes > 0  # autoresets were crossed
    finally:
        envs.close()
        reference.close()


MODE_BACKENDS = select()


@pytest.mark.parametrize("mode", list(AutoresetMode))
@pytest.mark.parametrize("kind", MODE_BACKENDS)
def test_every_mode_equals_one_sync_vector_env_alone(kind, mode):
    """A ``SyncVectorEnv`` per slice, seeded with the slice's first seed, seeds its envs as one
    ``SyncVectorEnv`` of all the envs does: the whole trajectory, infos included, is equal."""
    fn = functools.partial(sync_info_cartpole, mode=mode.value)
    envs = make(kind, fn, mode)
    alone = sync_info_cartpole(N, mode.value)
    in_order = kind in select(lockstep=True)
    rng = np.random.default_rng(1)
    try:
        obs, infos = envs.reset(seed=5)
        expected_obs, _ = alone.reset(seed=5)
        order = np.argsort(ids_of(infos))
        np.testing.assert_array_equal(as_numpy(obs)[order], expected_obs)
        ended = 0
        for t in range(STEPS):
            actions = rng.integers(0, 2, N)
            ids = ids_of(infos)
            obs, rew, term, trunc, infos = envs.step(act(envs, actions[ids]))
            expected = alone.step(actions)
            order = np.argsort(ids_of(infos))
            for got, want in zip((obs, rew, term, trunc), expected[:4]):
                np.testing.assert_array_equal(as_numpy(got)[order], want, err_msg=f"step {t}")
            if in_order:
                assert_same(infos, expected[4])
            done = np.logical_or(expected[2], expected[3])
            ended += int(done.sum())
            if mode is AutoresetMode.DISABLED and done.any():
                obs, infos = envs.reset(options={"reset_mask": done})
                expected_obs, _ = alone.reset(options={"reset_mask": done})
                np.testing.assert_array_equal(
                    as_numpy(obs)[np.argsort(ids_of(infos))], expected_obs
                )
        assert ended > 0
    finally:
        envs.close()
        alone.close()


def test_merged_step_infos_are_the_sync_vector_envs():
    envs = vecaccel.make_vec(sync_info_cartpole, N, backend="shm", num_workers=2, vectorized=True)
    alone = sync_info_cartpole(N)
    try:
        envs.reset(seed=0)
        alone.reset(seed=0)
        for _ in range(3):
            actions = np.ones(N, dtype=np.int64)
            infos = envs.step(actions)[4]
            assert_same(infos, alone.step(actions)[4])
    finally:
        envs.close()
        alone.close()


def test_per_env_infos_split_the_slices_infos():
    envs = vecaccel.make_vec(sync_info_cartpole, N, backend="shm", num_workers=2, vectorized=True)
    try:
        envs.reset(seed=0)
        envs.per_env_infos = True
        assert envs.step(np.zeros(N, dtype=np.int64))[4] == {}
        assert [i for i, _ in envs.last_infos] == list(range(N))
        assert [int(info["count"]) for _, info in envs.last_infos] == [1] * N
    finally:
        envs.close()


def test_slice_infos_merge_at_their_offset_and_split_by_mask():
    infos = {
        "x": np.array([1.0, 2.0, 3.0]),
        "_x": np.array([True, False, True]),
        "sub": {"y": np.array([4, 5, 6]), "_y": np.array([False, True, False])},
        "_sub": np.array([False, True, False]),
    }
    rows = unbatch_infos(infos, 3)
    assert rows == [{"x": 1.0}, {"sub": {"y": 5}}, {"x": 3.0}]
    merged = merge_slice_infos({}, infos, 3, 3, 6)
    assert merged["x"].tolist() == [0, 0, 0, 1, 2, 3]
    assert merged["_x"].tolist() == [False] * 3 + [True, False, True]
    assert merged["_sub"].tolist() == [False] * 4 + [True, False]
    assert merged["sub"]["y"].tolist() == [0, 0, 0, 4, 5, 6]


# -- the build checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", select())
def test_autoreset_mode_mismatch_names_both_modes(backend):
    with pytest.raises(ValueError, match=r"NEXT_STEP.*SAME_STEP") as caught:
        vecaccel.make_vec(
            "CartPole-v1", 4, backend=backend, vectorized=True, autoreset_mode="SameStep"
        )
    assert "does not convert" in str(caught.value)


def test_a_sync_vector_env_in_another_mode_is_refused():
    fn = functools.partial(sync_cartpole, mode="SameStep")
    with pytest.raises(ValueError, match=r"SAME_STEP.*NEXT_STEP"):
        vecaccel.make_vec(fn, 4, backend="shm", vectorized=True)


def test_an_id_without_a_vector_entry_point_is_refused():
    with pytest.raises(ValueError, match="'Acrobot-v1' has no vector_entry_point"):
        vecaccel.make_vec("Acrobot-v1", 4, vectorized=True)


@pytest.mark.parametrize(
    ("fn", "error", "match"),
    [
        (wrong_count, ValueError, "asked for 1 envs but built 2"),
        (not_a_vector_env, TypeError, "not a gymnasium.vector.VectorEnv"),
    ],
)
def test_a_bad_vector_env_function_is_refused(fn, error, match):
    with pytest.raises(error, match=match):
        vecaccel.make_vec(fn, 4, backend="shm", vectorized=True)


def test_a_backend_stepping_envs_alone_gets_a_clear_error():
    from vecaccel.envs.vectorized_slices import SliceEnvFn, VectorEnvFn

    probe = SliceEnvFn(VectorEnvFn(native_cartpole, AutoresetMode.NEXT_STEP))()
    try:
        with pytest.raises(TypeError, match="sub-env of a vectorized slice"):
            probe.reset()
    finally:
        probe.close()


# -- faults and restarts ------------------------------------------------------------------------

#: 7 envs on 2 workers: envs 0..3 and 4..6; failing_cartpole fails only in a 3-env slice
FAULT_BACKENDS = select(restarts_workers=True, envs_in_workers=True)


def _fault_envs(backend: str, **options):
    return vecaccel.make_vec(
        failing_cartpole,
        7,
        backend=backend,
        vectorized=True,
        **{**options_for(backend, num_workers=2), **options},
    )


@pytest.mark.parametrize("backend", select(worker_processes=True, lockstep=True, tensors=False))
def test_an_inner_error_names_the_worker_and_env_range(backend):
    in_caller = not backend_of(backend).envs_in_workers
    # the failing 3-env slice, envs 4..6, on the last worker: the caller's slice is envs 0..3
    options = options_for(backend, **({"inline_envs": 4} if in_caller else {"num_workers": 2}))
    envs = vecaccel.make_vec(failing_cartpole, 7, backend=backend, vectorized=True, **options)
    try:
        envs.reset(seed=0)
        for _ in range(4):
            envs.step(np.zeros(7, dtype=np.int64))
        with pytest.raises(WorkerError, match=r"boom at step 5") as caught:
            envs.step(np.zeros(7, dtype=np.int64))
        owner = "worker 0" if in_caller else "worker 1"
        assert f"the vector env of envs 4..6 on {owner}" in str(caught.value)
        assert caught.value.env_indices == (4,)
        with pytest.raises(WorkerError, match="call reset"):
            envs.step(np.zeros(7, dtype=np.int64))
        envs.reset(seed=0)  # starts the slice over
        envs.step(np.zeros(7, dtype=np.int64))
    finally:
        envs.close()


def test_serial_names_the_env_range():
    fn = functools.partial(failing_cartpole, fail_at=2, fail_size=N)
    envs = vecaccel.make_vec(fn, N, backend="serial", vectorized=True)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(N, dtype=np.int64))
        with pytest.raises(WorkerError, match=r"the vector env of envs 0\.\.7") as caught:
            envs.step(np.zeros(N, dtype=np.int64))
        assert caught.value.env_indices == tuple(range(N))
    finally:
        envs.close()


@pytest.mark.parametrize("backend", FAULT_BACKENDS)
def test_restart_rebuilds_the_vector_env_and_truncates_its_slice(backend):
    envs = _fault_envs(backend, on_worker_failure="restart")
    fresh = native_cartpole(3)
    try:
        envs.reset(seed=20)
        for _ in range(4):
            envs.step(act(envs, np.zeros(7, dtype=np.int64)))
        obs, rew, term, trunc, infos = envs.step(act(envs, np.zeros(7, dtype=np.int64)))
        order = np.argsort(ids_of(infos, 7))
        obs, rew, trunc = as_numpy(obs)[order], as_numpy(rew)[order], as_numpy(trunc)[order]
        assert trunc.tolist() == [False] * 4 + [True] * 3
        assert rew[4:].tolist() == [0.0] * 3
        restarted = np.asarray(infos["worker_restarted"])[order]
        assert restarted.tolist() == [False] * 4 + [True] * 3
        assert "ValueError: boom at step 5" in str(np.asarray(infos["restart_reason"])[order][4])
        assert envs.failures == 1  # one failure for the whole slice
        expected, _ = fresh.reset(seed=derived_seed(24, 4, 1))
        np.testing.assert_array_equal(obs[4:], expected)
        # NEXT_STEP: the step after the truncation starts the fresh episode where it is
        obs, rew, term, trunc, infos = envs.step(act(envs, np.zeros(7, dtype=np.int64)))
        order = np.argsort(ids_of(infos, 7))
        np.testing.assert_array_equal(as_numpy(obs)[order][4:], expected)
        assert as_numpy(rew)[order][4:].tolist() == [0.0] * 3
        obs, *_, infos = envs.step(act(envs, np.zeros(7, dtype=np.int64)))
        fresh_obs = fresh.step(np.zeros(3, dtype=np.int64))[0]
        np.testing.assert_array_equal(as_numpy(obs)[np.argsort(ids_of(infos, 7))][4:], fresh_obs)
    finally:
        envs.close()
        fresh.close()


@pytest.mark.parametrize("backend", FAULT_BACKENDS)
def test_a_dead_worker_is_restarted_with_its_vector_env(backend):
    envs = vecaccel.make_vec(
        native_cartpole,
        7,
        backend=backend,
        vectorized=True,
        on_worker_failure="restart",
        **options_for(backend, num_workers=2),
    )
    try:
        envs.reset(seed=3)
        envs.step(act(envs, np.zeros(7, dtype=np.int64)))
        pid = envs.pool.workers[1].process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: process_gone(pid))
        obs, rew, term, trunc, infos = envs.step(act(envs, np.zeros(7, dtype=np.int64)))
        order = np.argsort(ids_of(infos, 7))
        assert as_numpy(trunc)[order].tolist() == [False] * 4 + [True] * 3
        assert np.asarray(infos["worker_restarted"])[order].tolist() == [False] * 4 + [True] * 3
        assert envs.failures == 1
        fresh = native_cartpole(3)
        expected, _ = fresh.reset(seed=derived_seed(3 + 4, 4, 1))
        fresh.close()
        np.testing.assert_array_equal(as_numpy(obs)[order][4:], expected)
        for _ in range(3):
            envs.step(act(envs, np.zeros(7, dtype=np.int64)))
    finally:
        envs.close()


def test_a_dead_worker_under_raise_names_its_envs():
    envs = vecaccel.make_vec(native_cartpole, 7, backend="shm", num_workers=2, vectorized=True)
    try:
        envs.reset(seed=3)
        pid = envs.pool.workers[1].process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: process_gone(pid))
        with pytest.raises(WorkerError) as caught:
            envs.step(np.zeros(7, dtype=np.int64))
        assert set(caught.value.env_indices) == {4, 5, 6}
    finally:
        envs.close()


# -- start methods, partial slices, lifecycle ---------------------------------------------------


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_fresh_interpreters_build_their_slices(context):
    envs = vecaccel.make_vec(
        "CartPole-v1", N, backend="shm", num_workers=2, context=context, vectorized=True
    )
    reference = SlicesAlone(native_cartpole, slices_of(envs), seed=2)
    pids = [w.process.pid for w in envs.pool.workers]
    try:
        obs, _ = envs.reset(seed=2)
        np.testing.assert_array_equal(obs, reference.obs)
        actions = np.ones(N, dtype=np.int64)
        obs = envs.step(actions)[0]
        reference.step(actions, np.arange(N))
        np.testing.assert_array_equal(obs, reference.obs)
    finally:
        envs.close()
        reference.close()
    assert all(wait_until(lambda p=p: process_gone(p)) for p in pids)


def test_async_needs_whole_slices():
    with pytest.raises(ValueError, match="multiples of the slice size"):
        vecaccel.make_vec(
            native_cartpole, N, backend="async", num_workers=2, batch_size=3, vectorized=True
        )
    envs = vecaccel.make_vec(
        native_cartpole, N, backend="async", num_workers=2, batch_size=4, vectorized=True
    )
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="step together"):
            envs.send(np.zeros(2, dtype=np.int64), [0, 1])
    finally:
        envs.close()


@pytest.mark.parametrize("backend", select(lockstep=True, tensors=False))
def test_call_and_set_attr_reach_the_inner_vector_env(backend):
    options = options_for(backend)
    # a SyncVectorEnv answers per sub-env, through its own call()
    envs = vecaccel.make_vec(sync_cartpole, 4, backend=backend, vectorized=True, **options)
    try:
        assert [spec.id for spec in envs.call("spec")] == ["CartPole-v1"] * 4
        envs.set_attr("marker", [1, 2, 3, 4])
        assert envs.get_attr("marker") == (1, 2, 3, 4)
    finally:
        envs.close()
    # a native vector env answers once for its slice
    envs = vecaccel.make_vec(native_cartpole, 4, backend=backend, vectorized=True, **options)
    try:
        sizes = tuple(stop - start for start, stop in slices_of(envs) for _ in range(start, stop))
        assert envs.get_attr("num_envs") == sizes
        envs.set_attr("marker", 7)
        assert envs.get_attr("marker") == (7,) * 4
        with pytest.raises((ValueError, WorkerError), match="one value of 'marker'"):
            envs.set_attr("marker", [1, 2, 3, 4])
    finally:
        envs.close()


def test_sampler_collects_from_vectorized_slices():
    from vecaccel.sampler import Sampler

    envs = vecaccel.make_vec("CartPole-v1", N, backend="shm", num_workers=2, vectorized=True)
    try:
        sampler = Sampler(envs, lambda obs: (torch.zeros(len(obs), dtype=torch.int64), {}), 16)
        batch = sampler.collect()
        assert tuple(batch.obs.shape) == (16, N, 4)
    finally:
        envs.close()


def test_sb3_adapter_steps_vectorized_slices():
    pytest.importorskip("stable_baselines3")
    from vecaccel.adapters.sb3 import SB3VecEnv

    fn = functools.partial(sync_cartpole, mode="SameStep")
    envs = vecaccel.make_vec(
        fn, N, backend="shm", num_workers=2, vectorized=True, autoreset_mode="SameStep"
    )
    venv = SB3VecEnv(envs)
    try:
        obs = venv.reset()
        assert obs.shape == (N, 4)
        dones_seen = 0
        for _ in range(60):
            obs, rew, dones, infos = venv.step(np.zeros(N, dtype=np.int64))
            assert len(infos) == N
            for done, info in zip(dones, infos):
                if done:
                    dones_seen += 1
                    assert "terminal_observation" in info
        assert dones_seen > 0
    finally:
        venv.close()


@pytest.mark.parametrize(
    "kind",
    [
        _partial_kind(name) if backend_of(name).partial_batches else name
        for name in select(worker_processes=True)
    ],
)
def test_close_leaves_no_process_or_shared_memory(kind, no_leaks):
    envs = make(kind, "CartPole-v1", on_worker_failure="restart")
    obs, infos = envs.reset(seed=0)
    ids = ids_of(infos)
    envs.step(act(envs, np.zeros(len(ids), dtype=np.int64)))
    envs.close()
    assert envs.closed


def test_auto_keeps_a_few_native_cartpoles_in_the_caller():
    envs = vecaccel.make_vec("CartPole-v1", N, backend="auto", vectorized=True)
    try:
        record = envs.metadata["backend"]
        assert record["probed"] is True
        assert record["name"] == "serial", record
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (N, 4)
    finally:
        envs.close()


def test_sampler_takes_alternating_halves_of_slices():
    from vecaccel.sampler import Sampler

    envs = make("action_server_alternating", "CartPole-v1")
    try:
        sampler = Sampler(envs, lambda obs: (torch.zeros(len(obs), dtype=torch.int64), {}), 8)
        batch = sampler.collect()
        assert tuple(batch.obs.shape) == (8, N, 4)
        assert [g.tolist() for g in envs.groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    finally:
        envs.close()


def _contract_cases() -> list:
    """Each backend that returns NumPy arrays, under fork (returning half of the kit's envs per
    step where it can). Views (``copy=False``) are the caller's side only, the same with or
    without slices: tests/contract/test_contract.py runs the kit with them."""
    cases = []
    for name in select(tensors=False):
        options = options_for(name, context="fork")
        case = name
        if backend_of(name).partial_batches:
            half = partial_batch_options(name, CONTRACT_ENVS)
            options.update(half)
            case = f"{name}-batch-{half['batch_size']}" if "batch_size" in half else f"{name}-alt"
        cases.append(pytest.param(name, options, id=case))
    return cases


@pytest.mark.parametrize("backend, options", _contract_cases())
def test_vectorized_slices_keep_the_backend_contract(backend, options):
    # every worker slice one SyncVectorEnv of the kit's envs, compared with one SyncVectorEnv
    check_backend(backend, vectorized=True, **options)
