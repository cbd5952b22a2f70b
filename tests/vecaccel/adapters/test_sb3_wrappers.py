"""SB3's vec-env wrappers on the adapter (``VecNormalize``, ``VecFrameStack``, ``VecMonitor``,
``VecTransposeImage``, ``VecVideoRecorder``), and the adapter as ``vec_env_cls`` of
``make_vec_env`` and ``make_atari_env``.

Every check runs on the adapter over the process backends and ``serial`` and, wherever a
result can be compared, side by side with ``DummyVecEnv`` on the same seeds and actions.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from backend_matrix import options_for

pytest.importorskip("stable_baselines3")

from sb3_helpers import (
    BACKENDS,
    N_ENVS,
    assert_tree_equal,
    make_adapter,
    make_cartpole,
    run_side_by_side,
)
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    VecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
    VecVideoRecorder,
)
from toy_envs import (
    ImageEnv,
    InfoEnv,
)

from vecaccel.adapters.sb3 import VecAccelEnv

# ---------------------------------------------------------------------------------------------
# SB3's wrappers on top


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_normalize_same_as_dummy(backend: str) -> None:
    env_fns = [functools.partial(make_cartpole, 10)] * N_ENVS
    seen = run_side_by_side(env_fns, backend, 30, seed=3, wrapper=VecNormalize)
    assert seen["dones"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape,channels_order,stacked_axis",
    [
        ((12, 8, 3), None, -1),
        ((3, 12, 8), None, 1),
        ((12, 8, 3), "last", -1),
        ((12, 8, 3), "first", 1),
    ],
)
def test_vec_frame_stack(backend: str, shape, channels_order, stacked_axis) -> None:
    """Both channel orders, terminal observations stacked too, as DummyVecEnv."""
    env_fns = [functools.partial(ImageEnv, shape)] * 2

    def stack(venv: VecEnv) -> VecEnv:
        return VecFrameStack(venv, n_stack=2, channels_order=channels_order)

    with warnings.catch_warnings():
        # e.g. "VecFrameStack wrapping a VecEnv without terminal_observation info"
        warnings.simplefilter("error")
        seen = run_side_by_side(env_fns, backend, 11, seed=0, wrapper=stack)
    assert seen["dones"] > 0
    vec_env = stack(make_adapter(env_fns, backend))
    obs = vec_env.reset()
    expected = list((2, *shape))
    expected[stacked_axis] *= 2
    assert list(obs.shape) == expected
    vec_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_monitor_and_transpose(backend: str) -> None:
    env_fns = [functools.partial(ImageEnv, (12, 8, 3))] * 2

    def wrapper(venv: VecEnv) -> VecEnv:
        return VecTransposeImage(VecMonitor(venv))

    seen = run_side_by_side(env_fns, backend, 11, seed=0, wrapper=wrapper)
    assert seen["dones"] > 0
    vec_env = wrapper(make_adapter(env_fns, backend))
    assert vec_env.reset().shape == (2, 3, 12, 8)
    episodes = []
    for _ in range(5):
        obs, _, dones, infos = vec_env.step(np.zeros(2, dtype=int))
    for done, info in zip(dones, infos):
        assert done
        assert info["terminal_observation"].shape == (3, 12, 8)
        episodes.append(info["episode"])
    assert [episode["l"] for episode in episodes] == [5, 5]
    vec_env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_video_recorder(backend: str, tmp_path) -> None:
    pytest.importorskip("moviepy")
    vec_env = make_adapter([ImageEnv] * N_ENVS, backend)
    images = vec_env.get_images()
    assert len(images) == N_ENVS and images[0].shape == (16, 16, 3)
    assert vec_env.render().shape == (32, 32, 3)  # tiled 2 x 2
    recorder = VecVideoRecorder(
        vec_env, str(tmp_path), record_video_trigger=lambda step: step == 0, video_length=6
    )
    recorder.reset()
    for _ in range(8):
        recorder.step(np.zeros(N_ENVS, dtype=int))
    recorder.close()
    videos = list(tmp_path.glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_images_warns_without_rgb_array(backend: str) -> None:
    vec_env = make_adapter([functools.partial(InfoEnv, 5, None)] * 2, backend)
    with pytest.warns(UserWarning):
        assert vec_env.get_images() == [None, None]
    with pytest.warns(UserWarning):
        assert vec_env.render() is None
    vec_env.close()


# ---------------------------------------------------------------------------------------------
# vec_env_cls for make_vec_env / make_atari_env


@pytest.mark.parametrize("backend", BACKENDS)
def test_make_vec_env_vec_env_cls(backend: str) -> None:
    kwargs = {"backend": backend, **options_for(backend)}
    vec_env = make_vec_env(
        "CartPole-v1", n_envs=2, seed=0, vec_env_cls=VecAccelEnv, vec_env_kwargs=kwargs
    )
    reference = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    assert isinstance(vec_env, VecAccelEnv)
    assert vec_env.env_is_wrapped(Monitor) == [True, True]
    np.testing.assert_array_equal(vec_env.reset(), reference.reset())
    vec_env.close()
    reference.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_make_atari_env_vec_env_cls(backend: str) -> None:
    pytest.importorskip("ale_py")
    kwargs = {"backend": backend, **options_for(backend)}
    vec_env = make_atari_env(
        "PongNoFrameskip-v4", n_envs=2, seed=0, vec_env_cls=VecAccelEnv, vec_env_kwargs=kwargs
    )
    vec_env = VecTransposeImage(VecFrameStack(vec_env, n_stack=4))
    reference = VecTransposeImage(
        VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=2, seed=0), n_stack=4)
    )
    assert_tree_equal(reference.reset(), vec_env.reset())
    assert vec_env.observation_space.shape == (4, 84, 84)
    for _ in range(10):
        actions = np.array([2, 3])
        assert_tree_equal(list(reference.step(actions)[:3]), list(vec_env.step(actions)[:3]))
    vec_env.close()
    reference.close()


def test_spawned_workers_register_atari_ids() -> None:
    """Under ``spawn`` the workers start fresh: SB3's env functions still find ALE ids."""
    pytest.importorskip("ale_py")
    vec_env = make_atari_env(
        "PongNoFrameskip-v4",
        n_envs=2,
        seed=0,
        vec_env_cls=VecAccelEnv,
        vec_env_kwargs={"backend": "shm", "context": "spawn", "num_workers": 1},
    )
    assert vec_env.env_is_wrapped(Monitor) == [True, True]
    assert vec_env.reset().shape == (2, 84, 84, 1)
    _, _, dones, infos = vec_env.step(np.array([0, 1]))
    assert dones.tolist() == [False, False] and "lives" in infos[0]
    vec_env.close()
