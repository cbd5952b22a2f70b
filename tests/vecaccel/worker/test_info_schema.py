"""Step infos of a fixed schema in shared memory, side by side with ``SyncVectorEnv``.

Once the parent has seen a few steps' infos it announces a schema, and infos that fit it are
written into shared slots instead of being pickled. Whatever path an info takes, the batched
infos (``_key`` masks, dtypes), the per-env infos of the SB3 adapter, and their order must be
exactly what Gymnasium's own vector env returns; an info that differs falls back to the
payload path for that step only.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import pickle
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from backend_matrix import backend_of, options_for, select
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same
from toy_envs import TextActionEnv, TextObsEnv

import vecaccel
from vecaccel.vec_env import EnvRunner
from vecaccel.worker import Status
from vecaccel.worker.info_schema import (
    INFO_BLOCK_BYTES,
    STALE_AFTER,
    InfoSchema,
    InfoSchemaTracker,
    InfoSlots,
    info_fields,
)
from vecaccel.worker.replies import Replies


def schema_info(tag: int, t: int) -> dict[str, Any]:
    """The info :class:`SchemaInfoEnv` returns at step ``t`` of an episode: every kind of value
    an info schema holds (Python and numpy scalars, arrays of several dtypes, a 0-d array)."""
    return {
        "count": t,
        "ratio": t / 7,
        "even": t % 2 == 0,
        "score": np.float32(tag + t / 4),
        "level": np.int16(tag - 2),
        "pos": np.array([t, -t], dtype=np.float32),
        "grid": (np.arange(6, dtype=np.uint8) + t).reshape(2, 3),
        "scale": np.array(t * 1.5),
    }


#: How :class:`SchemaInfoEnv` makes an info differ from the schema now and then.
ODD_INFOS = (
    "extra",
    "type",
    "missing",
    "renamed",
    "order",
    "shape",
    "dtype",
    "nested",
    "text",
    "empty",
)


class SchemaInfoEnv(gym.Env):
    """Infos of one fixed schema, except every ``odd_every`` steps (shifted by ``tag``), where
    they differ as ``odd`` says (see :data:`ODD_INFOS`). Episodes end every ``episode`` steps
    (terminated, or truncated for odd tags); the reset info has a schema of its own. From its
    ``switch_at``-th step on (over all episodes), every info has one more key: a new schema.
    ``big`` adds an array too large for an env's block of the info area."""

    def __init__(
        self,
        tag: int = 0,
        odd_every: int = 0,
        odd: str = "extra",
        episode: int = 9,
        switch_at: int = 0,
        big: bool = False,
    ):
        self.observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.tag, self.odd_every, self.odd, self.episode = tag, odd_every, odd, episode
        self.switch_at, self.big = switch_at, big
        self.t = self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.tag, 0], np.float32), {"tag": self.tag, "seeded": seed is not None}

    def step(self, action):
        self.t += 1
        self.steps += 1
        info = schema_info(self.tag, self.t)
        info["count"] += int(action)
        if self.switch_at and self.steps >= self.switch_at:
            info["phase"] = 2
        if self.big:
            info["big"] = np.full(300, self.t, np.float64)
        if self.odd_every and (self.t + self.tag) % self.odd_every == 0:
            info = odd_info(info, self.odd, self.t)
        end = self.t % self.episode == 0
        obs = np.array([self.tag, self.t], np.float32)
        return obs, float(self.t), end and self.tag % 2 == 0, end and self.tag % 2 == 1, info


def odd_info(info: dict[str, Any], odd: str, t: int) -> dict[str, Any]:
    """``info`` changed in the way ``odd`` names, so that it no longer fits its schema."""
    info = dict(info)
    if odd == "extra":
        info["bonus"] = t
    elif odd == "type":
        info["count"] = float(info["count"])
    elif odd == "missing":
        del info["ratio"]
    elif odd == "renamed":  # the same types in the same places, under another key
        info = {("counter" if key == "count" else key): value for key, value in info.items()}
    elif odd == "order":
        info = dict(reversed(list(info.items())))
    elif odd == "shape":
        info["pos"] = np.zeros(3, np.float32)
    elif odd == "dtype":
        info["grid"] = info["grid"].astype(np.int64)
    elif odd == "nested":
        info["stats"] = {"t": t, "half": t / 2}
    elif odd == "text":
        info["note"] = f"step {t}"
    elif odd == "empty":
        info = {}
    return info


class SchemaInfos(gym.Wrapper):
    """Gives any env :func:`schema_info`'s infos (for envs with leaves of no fixed size)."""

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        self.t += 1
        return obs, reward, terminated, truncated, schema_info(0, self.t)


def schema_text_obs() -> gym.Env:
    return SchemaInfos(TextObsEnv())


def schema_text_action() -> gym.Env:
    return SchemaInfos(TextActionEnv())


def make_pong(max_episode_steps: int | None = None) -> gym.Env:
    """ALE Pong (frame skip 4, sticky actions), importable in a spawned worker too."""
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5", max_episode_steps=max_episode_steps)


NUM_ENVS = 4
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
#: the backends with worker processes, whose infos ride in shared slots
BACKENDS = select(worker_processes=True)
#: those of them stepping every env, in index order, as NumPy arrays
LOCKSTEP = select(worker_processes=True, lockstep=True, tensors=False)


def schema_fns(num_envs: int = NUM_ENVS, **kwargs: Any) -> list:
    return [functools.partial(SchemaInfoEnv, tag, **kwargs) for tag in range(num_envs)]


def host(x: Any) -> Any:
    """A tensor as numpy (the action server's results); anything else as it is."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


def assert_same_infos(a: Any, b: Any, where: str) -> None:
    """Same keys in the same order at every level, then the same values, types and dtypes."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same_infos(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, np.ndarray) and a.dtype == object and isinstance(b, np.ndarray):
        assert a.shape == b.shape and b.dtype == object, where
        for x, y in zip(a.tolist(), b.tolist()):
            assert_same_infos(x, y, where)
    else:
        assert_same(a, b, where)


class Stepper:
    """Steps a backend in lock-step (every env, in index order) whatever its API."""

    def __init__(self, backend: str, env_fns: list, mode: AutoresetMode, context: str, **extra):
        self.backend = backend_of(backend)
        options = {**options_for(backend, num_workers=2, context=context), **extra}
        self.envs = vecaccel.make_vec(env_fns, backend=backend, autoreset_mode=mode, **options)
        self.ids = np.arange(len(env_fns))

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, infos = self.envs.reset(**kwargs)  # async: batch_size is every env, in order
        return host(obs), self._drop_ids(infos)

    def step(self, actions: np.ndarray) -> tuple:
        if self.backend.accepts("batch_size"):  # send and receive every env, in index order
            self.envs.send(actions, self.ids)
            obs, rew, term, trunc, infos = self.envs.recv_ids(self.ids)
        elif self.backend.tensors:
            import torch

            obs, rew, term, trunc, infos = self.envs.step(torch.as_tensor(actions))
        else:
            obs, rew, term, trunc, infos = self.envs.step(actions)
        return host(obs), host(rew), host(term), host(trunc), self._drop_ids(infos)

    def _drop_ids(self, infos: dict) -> dict:
        if self.backend.partial_batches:
            infos = dict(infos)
            np.testing.assert_array_equal(infos.pop("env_id"), self.ids)
        return infos

    def in_slots(self) -> np.ndarray:
        """Per env: whether its last step's info came through the shared slots."""
        pool = self.envs.pool
        generation = pool.info_schema.generation
        return (pool.views.info_flags == generation) & (generation != 0)

    def close(self) -> None:
        self.envs.close()


@dataclass(frozen=True)
class Reference:
    """What ``SyncVectorEnv`` returns for a seed and the actions drawn from it: the reset, then
    per step the actions, the step's result and (``DISABLED``) the masked reset after it."""

    seed: int
    reset: tuple
    steps: list[tuple[np.ndarray, tuple, tuple | None]]


def sync_reference(env_fns: list, mode: AutoresetMode, steps: int, seed: int = 0) -> Reference:
    """Step a ``SyncVectorEnv`` of ``env_fns`` from ``reset(seed=seed)`` with random actions of
    ``np.random.default_rng(seed)``, resetting its ended envs in ``DISABLED`` mode."""
    reference = SyncVectorEnv(env_fns, autoreset_mode=mode)
    try:
        reset = reference.reset(seed=seed)
        rng = np.random.default_rng(seed)
        records = []
        for _ in range(steps):
            actions = rng.integers(0, reference.single_action_space.n, size=len(env_fns))
            result = reference.step(actions)
            done = result[2] | result[3]
            masked = None
            if mode is AutoresetMode.DISABLED and done.any():
                masked = reference.reset(options={"reset_mask": done})
            records.append((actions, result, masked))
    finally:
        reference.close()
    return Reference(seed, reset, records)


def run_side_by_side(
    backend: str,
    env_fns: list,
    mode: AutoresetMode,
    steps: int,
    context: str = "fork",
    seed: int = 0,
    reference: Reference | None = None,
    **extra: Any,
) -> np.ndarray:
    """Step ``backend`` as ``SyncVectorEnv`` was stepped (``reference``, or a run of
    :func:`sync_reference` made here) with the same seeds and actions; compare everything.
    Returns, per step and env, whether the info came through the slots."""
    if reference is None:
        reference = sync_reference(env_fns, mode, steps, seed)
    assert (reference.seed, len(reference.steps)) == (seed, steps)
    stepper = Stepper(backend, env_fns, mode, context, **extra)
    history = []
    try:
        obs, infos = stepper.reset(seed=seed)
        ref_obs, ref_infos = reference.reset
        assert_same(ref_obs, obs, "reset obs")
        assert_same_infos(ref_infos, infos, "reset infos")
        for step, (actions, ref, masked) in enumerate(reference.steps):
            obs, rew, term, trunc, infos = stepper.step(actions)
            where = f"step {step}"
            assert_same(ref[0], obs, f"{where} obs")
            np.testing.assert_array_equal(ref[1], rew, err_msg=where)
            np.testing.assert_array_equal(ref[2], term, err_msg=where)
            np.testing.assert_array_equal(ref[3], trunc, err_msg=where)
            assert_same_infos(ref[4], infos, f"{where} infos")
            history.append(stepper.in_slots())
            if masked is not None:
                ref_obs, ref_infos = masked
                obs, infos = stepper.reset(options={"reset_mask": ref[2] | ref[3]})
                assert_same(ref_obs, obs, f"{where} masked reset obs")
                assert_same_infos(ref_infos, infos, f"{where} masked reset infos")
    finally:
        stepper.close()
    return np.array(history)


def both_directions(history: np.ndarray) -> bool:
    """Whether some env went from the slots to the payload path and back again."""
    return any(re.search("10+1", "".join(map(str, column.astype(int)))) for column in history.T)


# -- the schema and its slots, without processes ----------------------------------------------


class _Batcher(gym.vector.VectorEnv):
    """Gymnasium's ``_add_info``, on its own."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


def test_slots_rebuild_each_value_with_its_type_and_batch_as_gymnasium_does():
    fields = info_fields(schema_info(1, 3))
    assert fields is not None
    area = np.zeros((3, INFO_BLOCK_BYTES), np.uint8)
    flags = np.zeros(3, np.uint8)
    slots = InfoSlots(InfoSchema(1, fields), area, flags)
    infos = [schema_info(tag, 5 + tag) for tag in range(3)]
    for i, info in enumerate(infos):
        assert slots.store(i, info)
    for original, rebuilt in zip(infos, slots.decode([0, 1, 2])):
        assert_same_infos(original, rebuilt, "decoded")
    expected: dict = {}
    for i in (0, 2):
        expected = _Batcher(3)._add_info(expected, infos[i], i)
    assert_same_infos(expected, slots.batch(np.array([True, False, True])), "batched")
    assert slots.batch(np.zeros(3, bool)) == {}


@pytest.mark.parametrize("odd", [o for o in ODD_INFOS if o != "empty"])
def test_an_info_that_differs_is_refused_by_the_slots(odd):

    slots = InfoSlots(
        InfoSchema(1, info_fields(schema_info(0, 1))),
        np.zeros((1, INFO_BLOCK_BYTES), np.uint8),
        np.zeros(1, np.uint8),
    )
    assert slots.store(0, schema_info(0, 2))
    assert not slots.store(0, odd_info(schema_info(0, 2), odd, 2))


@pytest.mark.parametrize(
    "info",
    [
        {"name": "pong"},
        {"flag": np.bool_(True)},  # Gymnasium batches numpy bools as objects
        {"_hidden": 1},
        {"nested": {"a": 1}},
        {"labels": np.array(["a", "b"])},
        {1: 2},
    ],
    ids=["str", "np-bool", "underscore", "nested", "str-array", "int-key"],
)
def test_values_without_a_fixed_layout_have_no_schema(info):
    assert info_fields(info) is None


def test_a_schema_too_big_for_a_block_is_not_learned():
    tracker = InfoSchemaTracker(np.zeros((2, INFO_BLOCK_BYTES), np.uint8), np.zeros(2, np.uint8))
    big = {"big": np.zeros(INFO_BLOCK_BYTES // 8 + 1)}
    assert tracker.observe([(0, big), (1, big)], 0) is None
    assert tracker.current is None
    small = {"small": np.zeros(4)}
    assert tracker.observe([(0, small)], 0) is not None


def test_the_schema_most_infos_share_is_learned():
    tracker = InfoSchemaTracker(np.zeros((3, INFO_BLOCK_BYTES), np.uint8), np.zeros(3, np.uint8))
    schema = tracker.observe([(0, {"a": 1, "b": 2}), (1, {"c": 1.0}), (2, {"c": 2.0})], 0)
    assert [field.key for field in schema.fields] == ["c"]


# -- (a) infos that always fit ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_fitting_infos_match_sync_vector_env(backend, mode):
    history = run_side_by_side(backend, schema_fns(episode=50), mode, 24)
    # after the first step every info (the reset steps' included) rides in the slots
    assert history[1:].all(), history.astype(int)


#: Each lockstep backend and each mode under spawn, on one worker: what spawn changes is how a
#: worker starts and finds the slots; every (backend, mode) pair is the fork test's.
SPAWN_CASES = list(zip(itertools.cycle(LOCKSTEP), MODES))


@pytest.mark.parametrize(
    "backend, mode", [pytest.param(b, m, id=f"{b}-{m.name}") for b, m in SPAWN_CASES]
)
def test_fitting_infos_match_sync_vector_env_under_spawn(backend, mode):
    history = run_side_by_side(backend, schema_fns(), mode, 20, context="spawn", num_workers=1)
    assert history[1:].any()


# -- (b) infos that fit mostly ----------------------------------------------------------------


# (an array of another shape: Gymnasium's batching itself fails on it, with or without slots)
@pytest.mark.parametrize("odd", [odd for odd in ODD_INFOS if odd != "shape"])
@pytest.mark.parametrize("backend", select(worker_processes=True, tensors=False))
def test_infos_that_differ_fall_back_and_come_back(backend, odd):
    history = run_side_by_side(
        backend, schema_fns(odd_every=3, odd=odd), AutoresetMode.SAME_STEP, 24
    )
    assert both_directions(history), history.astype(int)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_episode_ends_and_odd_infos_in_every_autoreset_mode(backend, mode):
    history = run_side_by_side(backend, schema_fns(odd_every=4, odd="type", episode=5), mode, 30)
    assert both_directions(history), history.astype(int)


def test_a_schema_that_no_longer_fits_is_learned_again():
    fns = schema_fns(switch_at=6, episode=1000)
    history = run_side_by_side("shm", fns, AutoresetMode.NEXT_STEP, 6 + STALE_AFTER + 8)
    assert history[1:5].all()
    assert not history[5 : 5 + STALE_AFTER].any()  # the new key: payload path for a while
    assert history[-4:].all()  # then a new schema holds it


def test_infos_too_big_for_the_slots_keep_the_payload_path():
    history = run_side_by_side("shm", schema_fns(big=True), AutoresetMode.SAME_STEP, 12)
    assert not history.any()


@pytest.mark.parametrize("backend", select(worker_processes=True, tensors=False))
def test_slots_with_text_observations(backend):
    """Observation items ride with the reply; the same step's infos ride in the slots."""
    history = run_side_by_side(backend, [schema_text_obs] * NUM_ENVS, AutoresetMode.NEXT_STEP, 10)
    assert both_directions(history), history.astype(int)  # the reset steps' infos are empty


@pytest.mark.parametrize("backend", select(envs_in_workers=True, tensors=False))
def test_slots_with_text_actions(backend):
    """Action items follow the step command; the same step's infos ride in the slots."""
    fns = [schema_text_action] * NUM_ENVS
    stepper = Stepper(backend, fns, AutoresetMode.NEXT_STEP, "fork")
    reference = SyncVectorEnv(fns)
    try:
        assert_same_infos(reference.reset(seed=0)[1], stepper.reset(seed=0)[1], "reset")
        for step in range(8):
            actions = tuple("abcde"[: 1 + (step + i) % 5] for i in range(NUM_ENVS))
            out, ref = stepper.step(actions), reference.step(actions)
            assert_same(ref[0], out[0], f"step {step} obs")
            assert_same_infos(ref[4], out[4], f"step {step} infos")
        assert stepper.in_slots().all()
    finally:
        stepper.close()
        reference.close()


# -- per-env infos (the SB3 adapter) ----------------------------------------------------------


@pytest.mark.parametrize("backend", LOCKSTEP)
def test_per_env_infos_are_the_envs_own_values(backend):
    """``per_env_infos`` hands each env's dict: a Python int stays an int, and so on."""
    fns = schema_fns(odd_every=4, odd="extra", episode=6)
    options = dict(options_for(backend, num_workers=2), autoreset_mode="SameStep")
    envs = vecaccel.make_vec(fns, backend=backend, **options)
    reference = vecaccel.make_vec(fns, backend="serial", autoreset_mode="SameStep")
    envs.per_env_infos = reference.per_env_infos = True
    try:
        envs.reset(seed=1)
        reference.reset(seed=1)
        for step in range(20):
            actions = np.full(NUM_ENVS, step % 3)
            envs.step(actions)
            reference.step(actions)
            assert_same_infos(dict(reference.last_infos), dict(envs.last_infos), f"step {step}")
        assert envs.pool.views.info_flags.any()
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("backend", LOCKSTEP)
def test_sb3_adapter_infos_match_dummy_vec_env(backend):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from vecaccel.adapters.sb3 import VecAccelEnv

    fns = schema_fns(odd_every=5, odd="missing", episode=7)
    reference = DummyVecEnv(fns)
    adapter = VecAccelEnv(fns, backend=backend, num_workers=2)
    try:
        reference.seed(3)
        adapter.seed(3)
        assert_same(reference.reset(), adapter.reset(), "reset")
        for step in range(24):
            actions = np.full(NUM_ENVS, step % 3)
            ref = reference.step(actions)
            out = adapter.step(actions)
            assert_same(ref[0], out[0], f"step {step} obs")
            assert_same(list(ref[3]), list(out[3]), f"step {step} infos")
    finally:
        reference.close()
        adapter.close()


# -- async in arrival order -------------------------------------------------------------------


@pytest.mark.parametrize("odd", ["extra", "text"])
def test_async_batches_in_arrival_order_match_gymnasium(odd):
    """``recv()`` returns whichever envs are ready: each batch's infos are what Gymnasium's
    ``_add_info`` makes of those envs' own infos, in the order returned."""
    fns = schema_fns(odd_every=3, odd=odd, episode=5)
    envs = vecaccel.make_vec(fns, backend="async", batch_size=2, num_workers=2)
    runners = [EnvRunner(fn(), AutoresetMode.NEXT_STEP, i) for i, fn in enumerate(fns)]
    # each env's latest result's info: its reset's, then its steps' as they are sent
    latest = {i: runner.reset(seed=i)[1] for i, runner in enumerate(runners)}

    def check(infos: dict, where: str) -> list[int]:
        held = infos.pop("env_id").tolist()
        expected: dict = {}
        for position, i in enumerate(held):
            if latest[i]:
                expected = _Batcher(len(held))._add_info(expected, latest[i], position)
        assert_same_infos(expected, infos, where)
        return held

    try:
        held = check(envs.reset(seed=0)[1], "reset")
        rng = np.random.default_rng(0)
        for step in range(40):
            actions = rng.integers(0, 3, size=len(held))
            for i, action in zip(held, actions):
                latest[i] = runners[i].step(int(action))[4]
            envs.send(actions, held)
            held = check(envs.recv()[4], f"step {step}")
        assert envs.pool.info_schema.generation == 1
    finally:
        envs.close()
        for runner in runners:
            runner.env.close()


# -- (c) ALE Pong ------------------------------------------------------------------------------


#: Pong's infos on every backend in SAME_STEP (where ``final_info`` sends an env to the payload
#: path and back), and in the other two modes on one backend each; every backend in every mode
#: is ``test_episode_ends_and_odd_infos_in_every_autoreset_mode``, on toy envs.
PONG_CASES = [(backend, AutoresetMode.SAME_STEP) for backend in BACKENDS] + [
    ("shm", AutoresetMode.NEXT_STEP),
    ("async", AutoresetMode.DISABLED),
]


#: Three Pongs (each takes a quarter of a second to make), episodes of 10 steps: the process
#: backends still split them, hybrid one in the caller and one in each worker.
PONG_FNS = [functools.partial(make_pong, 10)] * 3
PONG_STEPS = 30


@pytest.fixture(scope="module")
def pong_reference() -> Callable[[AutoresetMode], Reference]:
    """``SyncVectorEnv``'s Pong run in a mode, made once for every backend compared with it."""
    runs: dict[AutoresetMode, Reference] = {}

    def reference(mode: AutoresetMode) -> Reference:
        if mode not in runs:
            runs[mode] = sync_reference(PONG_FNS, mode, PONG_STEPS)
        return runs[mode]

    return reference


@pytest.mark.parametrize(
    "backend, mode", [pytest.param(b, m, id=f"{b}-{m.name}") for b, m in PONG_CASES]
)
def test_pong_infos_match_sync_vector_env(backend, mode, pong_reference):
    pytest.importorskip("ale_py")
    history = run_side_by_side(backend, PONG_FNS, mode, PONG_STEPS, reference=pong_reference(mode))
    # ALE's unseeded reset info has the step's schema; final_info (SAME_STEP) has not
    assert history[1:].mean() > 0.8, history.astype(int)
    assert both_directions(history) == (mode is AutoresetMode.SAME_STEP), history.astype(int)


def test_pong_infos_match_sync_vector_env_under_spawn(pong_reference):
    pytest.importorskip("ale_py")
    mode = AutoresetMode.SAME_STEP
    # one worker: a fresh interpreter that registers ALE and finds the slots; two workers'
    # slices are the fork tests'
    history = run_side_by_side(
        "shm",
        PONG_FNS,
        mode,
        PONG_STEPS,
        context="spawn",
        reference=pong_reference(mode),
        num_workers=1,
    )
    assert both_directions(history)


# -- the hot path pickles nothing -------------------------------------------------------------


class PickleCounter:
    """Counts every pickle and unpickle call, in this process and (forked) in the workers,
    in shared memory; and the payloads the parent takes from its workers."""

    PICKLERS = (
        (pickle, "dumps"),
        (pickle, "loads"),
        (cloudpickle, "dumps"),
        (cloudpickle, "loads"),
    )

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts = multiprocessing.get_context("fork").RawArray("q", 3)
        self.parent = os.getpid()
        counts, parent = self.counts, self.parent

        def counting(original):
            def wrapper(*args, **kwargs):
                counts[0 if os.getpid() == parent else 1] += 1
                return original(*args, **kwargs)

            return wrapper

        for module, name in self.PICKLERS:
            monkeypatch.setattr(module, name, counting(getattr(module, name)))
        dumps = counting(ForkingPickler.dumps)  # bound to the class already
        monkeypatch.setattr(
            ForkingPickler, "dumps", classmethod(lambda cls, *a, **k: dumps(*a, **k))
        )
        monkeypatch.setattr(ForkingPickler, "loads", staticmethod(counting(ForkingPickler.loads)))
        recv_payload = Replies.recv_payload

        def counted_recv_payload(pool, *args, **kwargs):
            counts[2] += 1
            return recv_payload(pool, *args, **kwargs)

        monkeypatch.setattr(Replies, "recv_payload", counted_recv_payload)

    def clear(self) -> None:
        self.counts[:] = [0, 0, 0]

    @property
    def parent_calls(self) -> int:
        return self.counts[0]

    @property
    def worker_calls(self) -> int:
        return self.counts[1]

    @property
    def payloads(self) -> int:
        return self.counts[2]


def _step_many(stepper: Stepper, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        stepper.step(rng.integers(0, 3, size=NUM_ENVS))


@pytest.mark.parametrize("backend", BACKENDS)
def test_steps_whose_infos_fit_pickle_nothing(backend, monkeypatch):
    counter = PickleCounter(monkeypatch)  # before the workers fork: they count too
    steps = 40
    fitting = Stepper(backend, schema_fns(episode=1000), AutoresetMode.NEXT_STEP, "fork")
    try:
        fitting.reset(seed=0)
        _step_many(fitting, 3)  # the schema is learned and announced
        payload_len = fitting.envs.pool.views.payload_len
        counter.clear()
        _step_many(fitting, steps)
        assert (counter.parent_calls, counter.worker_calls, counter.payloads) == (0, 0, 0)
        assert (payload_len == -1).all()
        assert fitting.in_slots().all()
    finally:
        fitting.close()
    odd = Stepper(
        backend, schema_fns(odd_every=1, odd="text", episode=1000), AutoresetMode.NEXT_STEP, "fork"
    )
    try:
        odd.reset(seed=0)
        _step_many(odd, 3)
        counter.clear()
        _step_many(odd, steps)
        assert counter.worker_calls >= steps  # at least one payload per step
        assert counter.parent_calls >= steps and counter.payloads >= steps
        assert not odd.in_slots().any()
    finally:
        odd.close()


def test_pong_steps_pickle_nothing(monkeypatch):
    pytest.importorskip("ale_py")
    counter = PickleCounter(monkeypatch)
    stepper = Stepper("shm", [make_pong] * NUM_ENVS, AutoresetMode.NEXT_STEP, "fork")
    try:
        stepper.reset(seed=0)
        _step_many(stepper, 2)
        counter.clear()
        _step_many(stepper, 20)
        assert (counter.parent_calls, counter.worker_calls, counter.payloads) == (0, 0, 0)
    finally:
        stepper.close()


# -- restarts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", select(envs_in_workers=True, tensors=False))
def test_a_restarted_worker_gets_the_schema(backend, monkeypatch):
    counter = PickleCounter(monkeypatch)
    stepper = Stepper(
        backend,
        schema_fns(episode=1000),
        AutoresetMode.NEXT_STEP,
        "fork",
        on_worker_failure="restart",
    )
    try:
        stepper.reset(seed=0)
        actions = np.zeros(NUM_ENVS, np.int64)
        for _ in range(3):
            stepper.step(actions)
        victim = stepper.envs.pool.workers[1]
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.join(5)
        *_, infos = stepper.step(actions)
        restarted = set(np.flatnonzero(infos.get("_worker_restarted", [])).tolist())
        assert restarted == set(victim.env_indices)
        stepper.step(actions)  # the restarted envs' reset step: a reset info, pickled
        counter.clear()
        for step in range(1, 6):
            *_, infos = stepper.step(actions)
            assert stepper.in_slots().all()
            for i in range(NUM_ENVS):
                t = step if i in restarted else step + 5
                for key, value in schema_info(i, t).items():
                    assert_same(np.asarray(value)[()], infos[key][i][()], f"env {i} {key}")
        assert (counter.parent_calls, counter.worker_calls, counter.payloads) == (0, 0, 0)
    finally:
        stepper.close()


def test_reply_statuses_carry_no_payload_once_learned():
    """Seen from the protocol: a worker's step reply is ``OK``, never ``OK_DATA``."""
    envs = vecaccel.make_vec(schema_fns(), backend="shm", num_workers=2)
    statuses = []
    wait = envs.pool.wait

    def recording_wait(*args, **kwargs):
        results = wait(*args, **kwargs)
        statuses.extend(status[0] for status in results.values())
        return results

    envs.pool.wait = recording_wait
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(NUM_ENVS, np.int64))
        statuses.clear()
        for _ in range(5):
            envs.step(np.zeros(NUM_ENVS, np.int64))
        assert statuses == [Status.OK] * 10
    finally:
        envs.close()
