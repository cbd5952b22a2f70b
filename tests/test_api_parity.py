"""API parity: vecaccel beside ``SyncVectorEnv``/``AsyncVectorEnv`` and SB3's ``DummyVecEnv``.

Each test compares a vecaccel backend with the reference on the same seeds and actions, or
checks a behaviour a user of the reference relies on. The env classes are module level, and
Stable-Baselines3 is imported inside the tests only, so that spawned workers that import this
module stay light.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers_envs import CounterEnv, assert_same, counter_fns

import vecaccel

#: (backend, options) per test id: the serial reference, shm under both start methods, hybrid
#: (inline envs on top of shm) and async (per-env stepping; batch_size = num_envs here).
BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "serial": ("serial", {}),
    "shm-fork": ("shm", {"num_workers": 2, "context": "fork"}),
    "shm-spawn": ("shm", {"num_workers": 2, "context": "spawn"}),
    "hybrid": ("hybrid", {"num_workers": 1, "inline_envs": 1, "context": "fork"}),
    "async": ("async", {"num_workers": 2, "context": "fork"}),
}

LOCKSTEP = ["serial", "shm-fork", "shm-spawn"]  # backends stepping every env, in index order


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
# test environments


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


class TextObsEnv(gym.Env):
    """Observations in a ``Text`` space (``SyncVectorEnv`` batches them as a tuple of str)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Text(max_length=6)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return f"r{self.np_random.integers(1000)}", {}

    def step(self, action):
        self.t += 1
        return f"a{int(action)}t{self.t}", 1.0, self.t >= 3, False, {}


class TextActionEnv(gym.Env):
    """Actions in a ``Text`` space; the observation is the length of the last action."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0, 10, (1,), np.int64)
        self.action_space = spaces.Text(max_length=5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.int64), {}

    def step(self, action):
        return np.array([len(action)], np.int64), 0.0, False, False, {}


class FrameEnv(gym.Env):
    """Renders a frame that says which env it is and how many steps it took."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, index: int, render_mode: str | None = "rgb_array") -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.render_mode = render_mode
        self.index = index
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, self.t >= 4, {}

    def render(self):
        frame = np.zeros((3, 5, 3), np.uint8)
        frame[..., 0] = 40 * self.index + 1
        frame[..., 1] = self.t
        return frame


class DictObsEnv(gym.Env):
    """Seeded Dict observations of Box parts, episodes of random length (for SB3's wrappers)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-5.0, 5.0, (2,), np.float32),
                "img": spaces.Box(0.0, 1.0, (3, 2), np.float32),
            }
        )
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> dict:
        rng = self.np_random
        return {
            "pos": rng.uniform(-5, 5, 2).astype(np.float32),
            "img": rng.uniform(0, 1, (3, 2)).astype(np.float32),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"reset_t": self.t}

    def step(self, action):
        self.t += 1
        terminated = bool(self.np_random.random() < 0.2)
        truncated = self.t >= 5
        return self._obs(), float(action) + self.t, terminated, truncated, {"t": self.t}


# ---------------------------------------------------------------------------------------------
# Gymnasium VectorEnv contract


@pytest.mark.parametrize("backend_id", [*LOCKSTEP, "async"])
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
@pytest.mark.parametrize("backend_id", [*LOCKSTEP, "async"])
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


@pytest.mark.parametrize("backend_id", [*LOCKSTEP, "hybrid", "async"])
def test_step_async_twice_is_refused_and_the_envs_step_once(backend_id):
    """A second ``step_async`` before ``step_wait`` is an error (``AsyncVectorEnv`` raises
    ``AlreadyPendingCallError``); it must neither step the envs a second time nor drop the
    first step's results."""
    with opened(counter_fns(2), backend_id) as envs:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        envs.step_async(actions)
        with pytest.raises((RuntimeError, ValueError, gym.error.AlreadyPendingCallError)):
            envs.step_async(actions)
        obs, rewards, *_ = envs.step_wait()
        assert obs.ravel().tolist() == [1, 1]  # CounterEnv observes its number of steps
        assert rewards.tolist() == [1.0, 1.0]
        assert envs.get_attr("steps") == (1, 1)


@pytest.mark.parametrize("operation", ["get_attr", "set_attr", "call"])
@pytest.mark.parametrize("backend_id", [*LOCKSTEP, "hybrid", "async"])
def test_control_call_during_pending_step_keeps_the_step(backend_id, operation):
    """``get_attr``/``set_attr``/``call`` between ``step_async`` and ``step_wait``: either refused
    (``AsyncVectorEnv``: ``AlreadyPendingCallError``) or done, but the step in flight must
    still be returned by ``step_wait`` (serial and async do; shm must not discard it)."""
    with opened(counter_fns(2), backend_id) as envs:
        envs.reset(seed=0)
        envs.step_async(np.zeros(2, dtype=np.int64))
        with contextlib.suppress(RuntimeError, gym.error.AlreadyPendingCallError):
            if operation == "get_attr":
                envs.get_attr("steps")
            elif operation == "set_attr":
                envs.set_attr("tag", 5)
            else:
                envs.call("_obs")
        obs, rewards, *_ = envs.step_wait()
        assert obs.ravel().tolist() == [1, 1]  # CounterEnv observes its number of steps
        assert rewards.tolist() == [1.0, 1.0]
        assert envs.get_attr("steps") == (1, 1)


@pytest.mark.parametrize("backend_id", [*LOCKSTEP, "async"])
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
    """``serial`` is the in-process reference, and shm's error for a space it cannot lay out in
    shared memory says "use backend='serial' otherwise": it must run what ``SyncVectorEnv`` runs."""
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


@pytest.mark.parametrize("backend_id", ["serial", "shm-fork", "async"])
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


# ---------------------------------------------------------------------------------------------
# the SB3 adapter beside DummyVecEnv

SB3_BACKENDS = {"serial": {}, "shm": {"num_workers": 2}}


@pytest.fixture
def sb3():
    """Stable-Baselines3's pieces, imported only here (spawned workers import this module)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common import vec_env

    from vecaccel.sb3 import VecAccelEnv

    return vec_env, VecAccelEnv


def adapter(sb3, env_fns, backend: str, **kwargs: Any):
    _, vec_accel_env = sb3
    return vec_accel_env(list(env_fns), backend=backend, **SB3_BACKENDS[backend], **kwargs)


@contextlib.contextmanager
def side_by_side(sb3, env_fns, backend: str) -> Iterator[tuple[Any, Any]]:
    """SB3's ``DummyVecEnv`` and the adapter over ``backend``, on the same env functions."""
    vec_env_module, _ = sb3
    reference = vec_env_module.DummyVecEnv(list(env_fns))
    try:
        venv = adapter(sb3, env_fns, backend)
    except BaseException:
        reference.close()
        raise
    try:
        yield reference, venv
    finally:
        reference.close()
        venv.close()


def assert_tree_close(expected: Any, actual: Any, where: str) -> None:
    if isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_tree_close(expected[key], actual[key], f"{where}[{key!r}]")
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7, err_msg=where)


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_step_async_twice_steps_each_env_once(sb3, backend):
    """``DummyVecEnv`` keeps the last actions and steps every env once; the adapter may refuse
    the second ``step_async``, but must not step the envs twice and drop a step's results."""
    vec_env_module, _ = sb3
    with side_by_side(sb3, counter_fns(2), backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
            env.step_async(np.zeros(2, dtype=np.int64))
            with contextlib.suppress(RuntimeError):
                env.step_async(np.ones(2, dtype=np.int64))
            obs, rewards, dones, _ = env.step_wait()
            assert obs.ravel().tolist() == [1, 1], type(env).__name__
            assert env.get_attr("steps") == [1, 1], type(env).__name__


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_returned_observations_survive_the_next_step(sb3, backend):
    """SB3's algorithms keep ``_last_obs`` across ``env.step`` (the replay buffer stores it as the
    transition's obs after the step), so every SB3 VecEnv returns fresh arrays. A backend made
    with ``copy=False`` returns views that the next step overwrites: the adapter must copy
    them, or refuse ``copy=False``."""
    vec_env_module, _ = sb3
    fns = [CounterEnv] * 2
    try:
        venv = adapter(sb3, fns, backend, copy=False)
    except ValueError:
        return  # refused: fine
    reference = vec_env_module.DummyVecEnv(fns)
    try:
        for env in (reference, venv):
            env.reset()
            first, *_ = env.step(np.zeros(2, dtype=np.int64))
            kept = first.copy()
            env.step(np.zeros(2, dtype=np.int64))
            np.testing.assert_array_equal(first, kept, err_msg=type(env).__name__)
    finally:
        reference.close()
        venv.close()


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_render_tiles_as_dummy_vec_env(sb3, backend):
    vec_env_module, _ = sb3
    fns = [functools.partial(FrameEnv, i) for i in range(3)]
    with side_by_side(sb3, fns, backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
            env.step(np.zeros(3, dtype=np.int64))
        images = venv.get_images()
        expected = reference.get_images()
        assert len(images) == 3
        for got, want in zip(images, expected):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(venv.render("rgb_array"), reference.render("rgb_array"))
        np.testing.assert_array_equal(venv.render(), reference.render())
        assert venv.render_mode == reference.render_mode == "rgb_array"


@pytest.mark.parametrize("wrapper", ["normalize", "frame_stack"])
@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_dict_observations_through_wrappers(sb3, backend, wrapper):
    """Dict observations through ``VecNormalize``/``VecFrameStack``: obs, rewards, dones,
    terminal observations and ``reset_infos`` as on ``DummyVecEnv``."""
    vec_env_module, _ = sb3

    def wrap(env):
        if wrapper == "normalize":
            return vec_env_module.VecNormalize(env)
        return vec_env_module.VecFrameStack(env, n_stack=2)

    fns = [DictObsEnv] * 2
    reference = wrap(vec_env_module.DummyVecEnv(fns))
    venv = wrap(adapter(sb3, fns, backend))
    try:
        for env in (reference, venv):
            env.seed(5)
        assert_tree_close(reference.reset(), venv.reset(), "reset")
        assert venv.unwrapped.reset_infos == reference.unwrapped.reset_infos
        rng = np.random.default_rng(0)
        dones_seen = 0
        for t in range(12):
            actions = rng.integers(0, 2, size=2)
            ref_obs, ref_rew, ref_dones, ref_infos = reference.step(actions)
            obs, rew, dones, infos = venv.step(actions)
            assert_tree_close(ref_obs, obs, f"step {t} obs")
            np.testing.assert_allclose(rew, ref_rew, rtol=1e-6)
            np.testing.assert_array_equal(dones, ref_dones)
            for ref_info, info in zip(ref_infos, infos):
                assert sorted(info) == sorted(ref_info)
                assert info["TimeLimit.truncated"] == ref_info["TimeLimit.truncated"]
                if "terminal_observation" in ref_info:
                    assert_tree_close(
                        ref_info["terminal_observation"],
                        info["terminal_observation"],
                        f"step {t} terminal_observation",
                    )
            assert venv.unwrapped.reset_infos == reference.unwrapped.reset_infos
            dones_seen += int(dones.sum())
        assert dones_seen > 0
    finally:
        reference.close()
        venv.close()


@pytest.mark.parametrize("backend", list(SB3_BACKENDS))
def test_sb3_env_method_and_get_attr_indices_as_dummy_vec_env(sb3, backend):
    vec_env_module, _ = sb3
    fns = [functools.partial(FrameEnv, i) for i in range(3)]
    with side_by_side(sb3, fns, backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
        for indices in (None, -1, [2, 0], [-3], np.array([1, 2]), range(0, 3, 2)):
            assert venv.get_attr("index", indices=indices) == reference.get_attr(
                "index", indices=indices
            ), indices
        assert venv.get_attr("index", indices=np.int64(-2)) == [1]  # DummyVecEnv: TypeError
        results = venv.env_method("reset", indices=[np.int64(-1), 0], seed=4, options=None)
        expected = reference.env_method("reset", indices=[-1, 0], seed=4, options=None)
        assert_same([r[1] for r in results], [e[1] for e in expected], "reset infos")
        venv.set_attr("t", 7, indices=[-1])
        reference.set_attr("t", 7, indices=[-1])
        assert venv.get_attr("t") == reference.get_attr("t") == [0, 0, 7]
        with pytest.raises(AttributeError):
            venv.get_attr("no_such_attribute", indices=[1])
        with pytest.raises(IndexError):
            venv.env_method("render", indices=[3])
