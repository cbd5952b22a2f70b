"""The VecEnv contract, checked for every registered backend.

``vecaccel.testing.check_backend`` runs the contract a third-party backend is held to: each
backend in lockstep with Gymnasium's ``SyncVectorEnv`` (observations, rewards, flags and infos,
``final_obs``/``final_info`` and the ``_key`` masks included, through autoresets and masked
resets, in every autoreset mode it declares), reset seeding, dtypes and shapes, copies, the
action checks, ``call``/``get_attr``/``set_attr`` and ``close``. Beside it, what a user of
``SyncVectorEnv``/``AsyncVectorEnv`` also relies on: per-env RNGs, sub-envs of other spaces
refused, a pending step, a closed env, reset masks, metadata and rendering, views with
``copy=False``, Gymnasium's vector wrappers on top, bad actions named.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Iterator
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from backend_matrix import options_for, select, start_method_cases
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import assert_same
from toy_envs import TextActionEnv, TextObsEnv

import vecaccel
from vecaccel.testing import check_backend
from vecaccel.testing.contract_envs import make_cartpole, make_dict_tuple
from vecaccel.testing.envs import CounterEnv, counter_fns


class ShapeEnv(gym.Env):
    """A constant env whose observation length and number of actions are parameters."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 7}

    def __init__(self, obs_size: int = 3, num_actions: int = 2, render_mode: str | None = None):
        self.observation_space = spaces.Box(-1.0, 1.0, (obs_size,), np.float32)
        self.action_space = spaces.Discrete(num_actions)
        self.render_mode = render_mode
        self.obs_size = obs_size

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(self.obs_size, 0.5, np.float32), {}

    def step(self, action):
        return np.full(self.obs_size, 0.25, np.float32), float(action), False, False, {}

    def render(self):
        return np.full((2, 2, 3), 9, np.uint8)


NUM_ENVS = 3

ENV_FNS = {
    "cartpole": partial(make_cartpole, max_episode_steps=8),
    "dict_tuple": partial(make_dict_tuple, max_episode_steps=6),
}


@contextlib.contextmanager
def lockstep(backend, options, env_fn, mode=AutoresetMode.NEXT_STEP, num_envs=NUM_ENVS, **extra):
    """Yield ``(sync, serial, candidate)`` vector envs over ``num_envs`` copies of ``env_fn``."""
    fns = [env_fn] * num_envs
    with contextlib.ExitStack() as stack:
        envs = []
        for make in (
            lambda: SyncVectorEnv(fns, autoreset_mode=mode, **extra),
            lambda: vecaccel.make_vec(fns, backend="serial", autoreset_mode=mode, **extra),
            lambda: vecaccel.make_vec(
                fns, backend=backend, autoreset_mode=mode, **options, **extra
            ),
        ):
            env = make()
            stack.callback(env.close)
            envs.append(env)
        yield tuple(envs)


def assert_results(results, what):
    reference = results[0]
    for name, result in zip(("serial", "candidate"), results[1:]):
        assert_same(result, reference, f"{what} ({name} vs SyncVectorEnv)")


def test_registered_backend_keeps_the_contract(backend, backend_options):
    """Every registered backend under the step-by-step contract, as a third party checks one."""
    check_backend(backend, **backend_options)


#: The built-in backends' other set-ups under the kit: start methods, views, a batch smaller
#: than the envs (the kit compares such a backend env by env). Under spawn one worker: spawn
#: changes how each worker starts; two workers' slices are the fork set-ups'.
KIT_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "shm-spawn": ("shm", {"num_workers": 1, "context": "spawn"}),
    "shm-views": ("shm", {"num_workers": 2, "context": "fork", "copy": False}),
    "serial-views": ("serial", {"copy": False}),
    "hybrid-two-workers": ("hybrid", {"num_workers": 2, "inline_envs": 1}),
    "async": ("async", {"num_workers": 2, "context": "fork"}),
    "async-batch-2": ("async", {"num_workers": 2, "context": "fork", "batch_size": 2}),
}


@pytest.mark.parametrize("case", list(KIT_CASES))
def test_built_in_backend_keeps_the_contract(case):
    name, options = KIT_CASES[case]
    check_backend(name, **options)


def test_autoreset_mode_as_string(backend, backend_options):
    fns = [ENV_FNS["cartpole"]] * 2
    env = vecaccel.make_vec(fns, backend=backend, autoreset_mode="SameStep", **backend_options)
    with contextlib.closing(env):
        assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP


def test_render_rgb_array(backend, backend_options):
    env_fn = partial(make_dict_tuple, render_mode="rgb_array")
    with lockstep(backend, backend_options, env_fn) as envs:
        for env in envs:
            env.reset(seed=3)
        envs[0].action_space.seed(0)
        for _ in range(3):
            actions = envs[0].action_space.sample()
            for env in envs:
                env.step(actions)
        assert envs[2].render_mode == "rgb_array"
        frames = [env.render() for env in envs]
        assert_results(frames, "render")
        assert len(frames[2]) == NUM_ENVS and frames[2][0].shape == (6, 4, 3)


def test_copy_false_returns_views(backend, backend_options):
    fns = [ENV_FNS["cartpole"]] * NUM_ENVS
    sync = SyncVectorEnv(fns)
    env = vecaccel.make_vec(fns, backend=backend, copy=False, **backend_options)
    with contextlib.closing(env), contextlib.closing(sync):
        first, _ = env.reset(seed=0)
        sync.reset(seed=0)
        actions = np.array([0, 1, 1])
        second = env.step(actions)[0]
        expected = sync.step(actions)[0]
        np.testing.assert_array_equal(second, expected)
        # both calls returned the same buffer, now holding the latest observation
        assert np.shares_memory(first, second)
        np.testing.assert_array_equal(first, expected)


# ---------------------------------------------------------------------------------------------
# Gymnasium's vector wrappers on top


def _without_times(infos):
    infos = dict(infos)
    if "episode" in infos:
        infos["episode"] = {k: v for k, v in infos["episode"].items() if k != "t"}
    return infos


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_record_episode_statistics(backend, backend_options, mode):
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    with lockstep(backend, backend_options, ENV_FNS["cartpole"], mode) as (sync, _, env):
        wrapped = [RecordEpisodeStatistics(vec) for vec in (sync, env)]
        assert_results([w.reset(seed=4) for w in wrapped], "reset")
        rng = np.random.default_rng(1)
        for t in range(20):
            actions = rng.integers(0, 2, size=NUM_ENVS)
            obs, rew, term, trunc, infos = zip(*(w.step(actions) for w in wrapped))
            assert_same(obs[1], obs[0], f"obs {t}")
            assert_same(_without_times(infos[1]), _without_times(infos[0]), f"infos {t}")
        assert wrapped[1].episode_count == wrapped[0].episode_count > 0
        assert list(wrapped[1].return_queue) == list(wrapped[0].return_queue)


def test_normalize_observation(backend, backend_options):
    from gymnasium.wrappers.vector import NormalizeObservation

    with lockstep(backend, backend_options, ENV_FNS["cartpole"]) as (sync, _, env):
        wrapped = [NormalizeObservation(vec) for vec in (sync, env)]
        assert_same(wrapped[1].reset(seed=2), wrapped[0].reset(seed=2), "reset")
        rng = np.random.default_rng(2)
        for t in range(10):
            actions = rng.integers(0, 2, size=NUM_ENVS)
            assert_same(wrapped[1].step(actions), wrapped[0].step(actions), f"step {t}")


def test_numpy_to_torch(backend, backend_options):
    torch = pytest.importorskip("torch")
    from gymnasium.wrappers.vector import NumpyToTorch

    # (plain CartPole: the wrapper cannot convert object-dtype infos such as strings)
    env_fn = partial(make_cartpole, max_episode_steps=8, infos=False)
    with lockstep(backend, backend_options, env_fn) as (sync, _, env):
        torch_env = NumpyToTorch(env)
        obs, _ = torch_env.reset(seed=5)
        expected, _ = sync.reset(seed=5)
        assert isinstance(obs, torch.Tensor)
        np.testing.assert_array_equal(obs.numpy(), expected)
        for t in range(8):
            actions = torch.tensor([t % 2, 1, 0])
            obs, rew, term, trunc, _ = torch_env.step(actions)
            expected = sync.step(actions.numpy())
            np.testing.assert_array_equal(obs.numpy(), expected[0])
            np.testing.assert_array_equal(rew.numpy(), expected[1])
            np.testing.assert_array_equal(term.numpy(), expected[2])
            np.testing.assert_array_equal(trunc.numpy(), expected[3])


def test_torch_actions_accepted(backend, backend_options):
    """A step with a torch tensor of actions is the same step as with the NumPy array."""
    torch = pytest.importorskip("torch")
    results = []
    for actions in (torch.tensor([0, 1]), np.array([0, 1])):
        env = vecaccel.make_vec([ENV_FNS["cartpole"]] * 2, backend=backend, **backend_options)
        with contextlib.closing(env):
            env.reset(seed=0)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            results.append([np.asarray(x).copy() for x in (obs, rewards, terminated, truncated)])
    for with_torch, with_numpy in zip(*results):
        np.testing.assert_array_equal(with_torch, with_numpy)


def _cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """(backend, options) per test id: every backend that returns NumPy arrays, those with
    worker processes under ``fork``, the default backend under ``spawn`` too, on one worker
    (spawn changes how each worker starts; two workers' slices are the fork case's). A backend
    under several start methods has its start method in its id."""
    pairs = start_method_cases(select(tensors=False), ("fork", "spawn"))
    runs = collections.Counter(name for name, _ in pairs)
    workers = {"spawn": {"num_workers": 1}}
    return {
        f"{name}-{context}" if runs[name] > 1 else name: (
            name,
            options_for(name, context=context, **workers.get(context, {})),
        )
        for name, context in pairs
    }


BACKENDS = _cases()

#: backends stepping every env, in index order
LOCKSTEP = [case for case, (name, _) in BACKENDS.items() if name in select(lockstep=True)]

#: each backend once, under fork
ONE_EACH = [case for case, (_, options) in BACKENDS.items() if options.get("context") != "spawn"]


def make(env_fns, backend_id: str, **extra: Any) -> gym.vector.VectorEnv:
    backend, options = BACKENDS[backend_id]
    return vecaccel.make_vec(list(env_fns), backend=backend, **options, **extra)


@contextlib.contextmanager
def opened(env_fns, backend_id: str, **extra: Any) -> Iterator[gym.vector.VectorEnv]:
    envs = make(env_fns, backend_id, **extra)
    try:
        yield envs
    finally:
        envs.close()


# ---------------------------------------------------------------------------------------------
# beside SyncVectorEnv and AsyncVectorEnv: what their users rely on


@pytest.mark.parametrize("backend_id", list(BACKENDS))
def test_np_random_and_np_random_seed_are_per_env_tuples(backend_id):
    """``SyncVectorEnv``/``AsyncVectorEnv`` report the sub-envs' seeds and generators, as tuples."""
    fns = [functools.partial(gym.make, "CartPole-v1")] * 2
    sync = SyncVectorEnv(fns)
    with contextlib.closing(sync), opened(fns, backend_id) as envs:
        sync.reset(seed=3)
        envs.reset(seed=3)
        assert sync.np_random_seed == (3, 4)
        assert envs.np_random_seed == sync.np_random_seed
        generators = envs.np_random
        assert isinstance(generators, tuple) and len(generators) == 2
        expected = [g.random() for g in sync.np_random]
        assert [g.random() for g in generators] == expected


@pytest.mark.parametrize("kind", ["observation", "action"])
@pytest.mark.parametrize("backend_id", list(BACKENDS))
def test_sub_envs_with_different_spaces_are_refused(backend_id, kind):
    """``SyncVectorEnv`` raises at construction when the sub-envs' spaces differ; batching an
    observation of shape (1,) into a slot of shape (3,) must not silently broadcast it, and env
    1's actions must not be checked against env 0's ``Discrete(2)``."""
    if kind == "observation":
        fns = [functools.partial(ShapeEnv, 3), functools.partial(ShapeEnv, 1)]
    else:
        fns = [functools.partial(ShapeEnv, 3, 2), functools.partial(ShapeEnv, 3, 3)]
    with pytest.raises(RuntimeError):
        SyncVectorEnv(fns)
    envs = None
    try:
        with pytest.raises((RuntimeError, ValueError), match="(?i)space"):
            envs = make(fns, backend_id)
    finally:
        if envs is not None:
            envs.close()


def _assert_stepped(envs, result, steps: int) -> None:
    """``result`` is the ``steps``-th step of both envs, and each env stepped ``steps`` times."""
    obs, rewards, *_ = result
    assert obs.ravel().tolist() == [steps, steps]  # CounterEnv observes its number of steps
    assert rewards.tolist() == [1.0, 1.0]
    assert envs.get_attr("steps") == (steps, steps)


@pytest.mark.parametrize("backend_id", list(BACKENDS))
def test_step_async_twice_or_a_control_call_during_a_pending_step_keeps_the_step(backend_id):
    """A second ``step_async`` before ``step_wait`` is an error (``AsyncVectorEnv`` raises
    ``AlreadyPendingCallError``); it must neither step the envs a second time nor drop the
    first step's results. ``get_attr``/``set_attr``/``call`` between ``step_async`` and
    ``step_wait``: either refused (``AsyncVectorEnv``: ``AlreadyPendingCallError``) or done, but
    the step in flight must still be returned by ``step_wait`` (serial and async do; shm must
    not discard it). Each case is a step of its own on the same envs."""
    with opened(counter_fns(2), backend_id) as envs:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        envs.step_async(actions)
        with pytest.raises((RuntimeError, ValueError, gym.error.AlreadyPendingCallError)):
            envs.step_async(actions)
        _assert_stepped(envs, envs.step_wait(), 1)
        for steps, operation in enumerate(["get_attr", "set_attr", "call"], start=2):
            envs.step_async(actions)
            with contextlib.suppress(RuntimeError, gym.error.AlreadyPendingCallError):
                if operation == "get_attr":
                    envs.get_attr("steps")
                elif operation == "set_attr":
                    envs.set_attr("tag", 5)
                else:
                    envs.call("_obs")
            _assert_stepped(envs, envs.step_wait(), steps)


@pytest.mark.parametrize("backend_id", list(BACKENDS))
def test_closed_env_raises_gymnasium_closed_environment_error(backend_id):
    """``AsyncVectorEnv`` raises ``gymnasium.error.ClosedEnvironmentError`` after ``close()``;
    code catching it must catch vecaccel's error too (still a ``vecaccel.ClosedEnvError``)."""
    envs = make(counter_fns(2), backend_id)
    envs.reset(seed=0)
    envs.close()
    envs.close()
    for call in (
        lambda: envs.step(np.zeros(2, dtype=np.int64)),
        lambda: envs.reset(seed=0),
        lambda: envs.get_attr("steps"),
    ):
        with pytest.raises(gym.error.ClosedEnvironmentError) as info:
            call()
        assert isinstance(info.value, vecaccel.ClosedEnvError)


@pytest.mark.parametrize("env_fn", [TextObsEnv, TextActionEnv], ids=["text_obs", "text_action"])
def test_serial_reference_handles_spaces_sync_vector_env_handles(env_fn):
    """``serial`` is the in-process reference: it runs what ``SyncVectorEnv`` runs, spaces with
    no fixed size included (the process backends' side is tests/vecaccel/spaces/test_payload.py)."""
    fns = [env_fn] * 2
    sync = SyncVectorEnv(fns)
    with contextlib.closing(sync), opened(fns, "serial") as envs:
        assert envs.single_observation_space == sync.single_observation_space
        assert envs.single_action_space == sync.single_action_space
        assert_same(envs.reset(seed=1), sync.reset(seed=1), "reset")
        actions = ("ab", "abcd") if env_fn is TextActionEnv else np.array([0, 1])
        for t in range(4):
            assert_same(envs.step(actions), sync.step(actions), f"step {t}")


@pytest.mark.parametrize("backend_id", LOCKSTEP)
def test_reset_mask_validation_matches_sync_vector_env(backend_id):
    fns = [CounterEnv] * 2
    sync = SyncVectorEnv(fns)
    bad_masks = [
        ([True, False], TypeError),  # not an array
        (np.array([True]), ValueError),  # wrong shape
        (np.array([1, 0]), TypeError),  # not bool
        (np.array([False, False]), ValueError),  # nothing to reset
    ]
    with contextlib.closing(sync), opened(fns, backend_id) as envs:
        sync.reset(seed=0)
        envs.reset(seed=0)
        for mask, error in bad_masks:
            with pytest.raises(error):
                sync.reset(options={"reset_mask": mask})
            with pytest.raises(error):
                envs.reset(options={"reset_mask": mask})
        with pytest.raises(ValueError):
            envs.reset(seed=[1, 2, 3])  # one seed per env, as SyncVectorEnv
        # still usable, and a valid mask resets only the masked env
        envs.step(np.zeros(2, dtype=np.int64))
        obs, _ = envs.reset(options={"reset_mask": np.array([False, True])})
        assert obs.ravel().tolist() == [1, 1]  # CounterEnv counts steps across resets
        assert envs.get_attr("resets") == (1, 2)


@pytest.mark.parametrize("backend_id", LOCKSTEP)
def test_metadata_render_mode_and_render_match_sync_vector_env(backend_id):
    fns = [functools.partial(ShapeEnv, render_mode="rgb_array")] * 2
    sync = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    with (
        contextlib.closing(sync),
        opened(fns, backend_id, autoreset_mode=AutoresetMode.SAME_STEP) as envs,
    ):
        assert envs.metadata == sync.metadata
        assert envs.render_mode == sync.render_mode == "rgb_array"
        assert envs.unwrapped is envs
        assert envs.autoreset_mode is AutoresetMode.SAME_STEP
        sync.reset(seed=0)
        envs.reset(seed=0)
        assert_same(envs.render(), sync.render(), "render")
        assert isinstance(envs.render(), tuple)
        assert_same(envs.call("render"), envs.render(), "call('render')")


@pytest.mark.parametrize("backend_id", ONE_EACH)
def test_bad_actions_fail_in_the_caller_naming_env_and_space(backend_id):
    """The check happens before any env steps: no env saw the bad batch."""
    with opened(counter_fns(3), backend_id) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"env 2 .*Discrete\(2\)"):
            envs.step(np.array([0, 1, 2]))
        with pytest.raises(ValueError, match=r"Discrete\(2\)"):
            envs.step(np.array([0.0, 1.0, 1.0]))  # floats for a Discrete space
        with pytest.raises(ValueError, match=r"Discrete\(2\).*shape"):
            envs.step(np.zeros((3, 1), dtype=np.int64))
        assert envs.get_attr("steps") == (0, 0, 0)
        obs, *_ = envs.step(np.array([1, 0, 1], dtype=np.int32))  # another integer dtype
        assert sorted(obs.ravel().tolist()) == [1, 1, 1]
