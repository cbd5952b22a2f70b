"""What the SB3 adapter's tests share: the backends it runs on, env functions, and the
side-by-side comparison with ``DummyVecEnv``.

Env functions are module level, so spawned workers import them from here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from backend_matrix import options_for, select
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecFrameStack,
    VecNormalize,
)
from toy_envs import (
    CustomGymEnv,
)

import vecaccel
from vecaccel.adapters.sb3 import VecAccelEnv, to_sb3

N_ENVS = 3

#: SB3 steps every env at once, in index order, as NumPy arrays.
BACKENDS = select(lockstep=True, tensors=False)

VEC_ENV_WRAPPERS = [None, VecNormalize, VecFrameStack]


def make_adapter(env_fns: list[Callable[[], gym.Env]], backend: str, **kwargs: Any) -> VecAccelEnv:
    return VecAccelEnv(env_fns, backend=backend, **options_for(backend), **kwargs)


def wrap(vec_env: VecEnv, wrapper: type | None) -> VecEnv:
    if wrapper is None:
        return vec_env
    if wrapper is VecFrameStack:
        return VecFrameStack(vec_env, n_stack=2)
    return wrapper(vec_env)


def make_custom(space: spaces.Space) -> gym.Env:
    return CustomGymEnv(space)


def make_monitored_custom(space: spaces.Space) -> gym.Env:
    return Monitor(CustomGymEnv(space))


def make_cartpole(max_episode_steps: int = 12) -> gym.Env:
    return Monitor(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))


BOX2 = spaces.Box(low=np.zeros(2, np.float32), high=np.ones(2, np.float32))

SPACES = {
    "discrete": spaces.Discrete(2),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "multibinary": spaces.MultiBinary(3),
    "continuous": BOX2,
}


# ---------------------------------------------------------------------------------------------
# comparing with DummyVecEnv


def assert_tree_equal(expected: Any, actual: Any, path: str = "") -> None:
    """Exact equality of nested dicts/tuples/lists/arrays; Monitor's wall-clock ``t`` skipped."""
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{path}: {type(actual)} is not a mapping"
        assert list(expected) == list(actual) or set(expected) == set(actual), (
            f"{path}: keys {sorted(map(str, expected))} != {sorted(map(str, actual))}"
        )
        for key in expected:
            if key == "t" and path.endswith("episode"):
                continue
            assert_tree_equal(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, (tuple, list)) and not isinstance(actual, np.ndarray):
        assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
        assert len(expected) == len(actual), path
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_tree_equal(e, a, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray) and expected.dtype == object:
        assert isinstance(actual, np.ndarray) and actual.shape == expected.shape, path
        for i, (e, a) in enumerate(zip(expected.ravel(), actual.ravel())):
            assert_tree_equal(e, a, f"{path}[{i}]")
    elif isinstance(expected, np.ndarray) or isinstance(actual, np.ndarray):
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected), err_msg=path)
    else:
        assert expected == actual, f"{path}: {expected!r} != {actual!r}"


def sample_actions(space: spaces.Space, n: int) -> Any:
    items = [space.sample() for _ in range(n)]
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return items  # SB3 style: one action per env
    return np.array(items)


def run_side_by_side(
    env_fns: list[Callable[[], gym.Env]],
    backend: str,
    steps: int,
    *,
    seed: int = 0,
    wrapper: Callable[[VecEnv], VecEnv] | None = None,
    autoreset_mode: AutoresetMode = AutoresetMode.SAME_STEP,
    batched_infos: bool = False,
) -> dict[str, int]:
    """Step ``DummyVecEnv`` and the adapter with the same seeds and actions; compare everything.

    With ``batched_infos`` the backend reports Gymnasium's batched infos (as a third-party
    backend without ``supports_per_env_infos`` does) and the adapter splits them.
    """
    reference: VecEnv = DummyVecEnv(env_fns)
    if batched_infos:
        envs = vecaccel.make_vec(
            env_fns, backend=backend, autoreset_mode=autoreset_mode, **options_for(backend)
        )
        envs.supports_per_env_infos = False
        adapter: VecEnv = to_sb3(envs)
        assert not envs.per_env_infos
    else:
        adapter = make_adapter(env_fns, backend, autoreset_mode=autoreset_mode)
        assert adapter._per_env_infos  # the envs' dicts, no batch-and-split
        assert not adapter.vec_env.per_env_infos  # only during the adapter's own calls
    if wrapper is not None:
        reference, adapter = wrapper(reference), wrapper(adapter)
    seen = {"dones": 0, "terminated": 0, "truncated": 0}
    try:
        assert reference.seed(seed) == adapter.seed(seed)
        assert_tree_equal(reference.reset(), adapter.reset(), "reset obs")
        assert_tree_equal(
            reference.unwrapped.reset_infos, adapter.unwrapped.reset_infos, "reset_infos"
        )
        action_space = copy.deepcopy(reference.action_space)
        action_space.seed(seed)
        for step in range(steps):
            actions = sample_actions(action_space, reference.num_envs)
            ref_obs, ref_rewards, ref_dones, ref_infos = reference.step(actions)
            obs, rewards, dones, infos = adapter.step(actions)
            where = f"step {step}"
            assert_tree_equal(ref_obs, obs, f"{where} obs")
            np.testing.assert_allclose(rewards, ref_rewards, rtol=1e-6, err_msg=where)
            assert dones.dtype == np.bool_
            np.testing.assert_array_equal(dones, ref_dones, err_msg=where)
            assert isinstance(infos, (list, tuple)) and len(infos) == reference.num_envs
            assert_tree_equal(list(ref_infos), list(infos), f"{where} infos")
            assert_tree_equal(
                reference.unwrapped.reset_infos, adapter.unwrapped.reset_infos, f"{where} resets"
            )
            for done, info in zip(dones, infos):
                if done:
                    seen["dones"] += 1
                    seen["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
    finally:
        reference.close()
        adapter.close()
    return seen
