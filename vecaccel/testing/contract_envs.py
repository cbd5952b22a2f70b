"""The small envs :func:`vecaccel.testing.check_backend` runs a backend on.

Between them they cover what a backend must carry unchanged: a ``Box`` observation with
irregular infos of several types (ints, floats, arrays, strings) on CartPole, and nested
``Dict``/``Tuple`` spaces of every fixed-size leaf type (``Box`` of ``float32`` and ``uint8``,
``Discrete`` with a ``start``, ``MultiDiscrete``, ``MultiBinary``) with nested infos, an
``rgb_array`` render, and episodes that end at random and at a time limit. Both are seeded, so
the same seeds and actions give the same trajectory in any backend.

Everything is module level, so env functions pickle by reference under ``spawn``.

Example:
    >>> from vecaccel.testing.contract_envs import make_dict_tuple
    >>> env = make_dict_tuple(max_episode_steps=5)
    >>> obs, info = env.reset(seed=0)
    >>> sorted(obs)
    ['flags', 'mode', 'pair', 'position']
    >>> env.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, SupportsFloat, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "DictTupleEnv",
    "InfoWrapper",
    "SyncVectorEnvFn",
    "env_value",
    "make_cartpole",
    "make_dict_tuple",
]


class DictTupleEnv(gym.Env):
    """A seeded env with nested Dict/Tuple spaces, irregular infos and an ``rgb_array`` render.

    Episodes end at random (terminated) and, through ``make_dict_tuple``, at a time limit.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-100.0, 100.0, shape=(2,), dtype=np.float32),
                "mode": spaces.Discrete(4, start=-1),
                "flags": spaces.MultiBinary(3),
                "pair": spaces.Tuple(
                    (
                        spaces.MultiDiscrete([3, 5]),
                        spaces.Box(0, 255, shape=(2, 2), dtype=np.uint8),
                    )
                ),
            }
        )
        self.action_space = spaces.Tuple(
            (
                spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
                spaces.Dict({"choice": spaces.Discrete(3), "bits": spaces.MultiBinary(2)}),
            )
        )
        self.value = 0  # read and written by get_attr/set_attr tests
        self.t = 0
        self.position = np.zeros(2, dtype=np.float32)

    def add(self, x: int) -> int:
        """``value + x`` (for ``call``)."""
        return self.value + x

    def _obs(self) -> dict[str, Any]:
        rng = self.np_random
        return {
            "position": self.position.copy(),
            "mode": np.int64(self.t % 4 - 1),
            "flags": rng.integers(0, 2, size=3, dtype=np.int8),
            "pair": (
                np.array([self.t % 3, int(rng.integers(0, 5))], dtype=np.int64),
                rng.integers(0, 256, size=(2, 2), dtype=np.uint8),
            ),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.position = self.np_random.uniform(-1, 1, size=2).astype(np.float32)
        info: dict[str, Any] = {"start": self.position.copy()}
        if options and "tag" in options:
            info["tag"] = options["tag"]
        return self._obs(), info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        move, discrete = action
        self.t += 1
        self.position = np.clip(self.position + move, -100, 100).astype(np.float32)
        reward = float(discrete["choice"]) - float(np.sum(discrete["bits"])) * 0.5
        terminated = bool(self.np_random.random() < 0.15)
        info: dict[str, Any] = {"t": self.t}
        if self.t % 2 == 0:
            info["even"] = np.array([self.t, -self.t], dtype=np.int32)
        if self.t % 3 == 0:
            info["nested"] = {"third": float(self.t) / 3, "label": f"t{self.t}"}
        return self._obs(), reward, terminated, False, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        frame = np.zeros((6, 4, 3), dtype=np.uint8)
        frame[..., 0] = self.t % 256
        frame[0, 0] = (np.abs(self.position[0]) * 10) % 256
        return frame


def make_dict_tuple(max_episode_steps: int = 7, render_mode: str | None = None) -> gym.Env:
    """A :class:`DictTupleEnv` truncated after ``max_episode_steps`` steps."""
    env = DictTupleEnv(render_mode=render_mode)
    return gym.wrappers.TimeLimit(env, max_episode_steps=max_episode_steps)


class InfoWrapper(gym.Wrapper):
    """Adds irregular infos of several types to an env (ints, floats, arrays, objects)."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.count = 0
        return obs, {**info, "reset_count": np.int32(7)}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.count += 1
        info = dict(info)
        info["count"] = self.count
        if self.count % 2:
            info["odd"] = np.float32(self.count) / 2
            info["label"] = f"step-{self.count}"
        return obs, reward, terminated, truncated, info


def make_cartpole(max_episode_steps: int = 10, infos: bool = True) -> gym.Env:
    """CartPole truncated after ``max_episode_steps`` steps, with :class:`InfoWrapper`'s infos
    unless ``infos`` is false."""
    env = gym.make("CartPole-v1", max_episode_steps=max_episode_steps)
    return InfoWrapper(env) if infos else env


def env_value(env: gym.Env, offset: int = 0) -> int:
    """A function for ``call_indices(fn, ...)``: reads ``value`` through the wrappers."""
    return cast(int, env.get_wrapper_attr("value")) + offset


class SyncVectorEnvFn:
    """A vector env function, ``fn(n)``: ``n`` copies of one env in a ``SyncVectorEnv``.

    What :func:`~vecaccel.testing.check_backend` hands a backend with ``vectorized=True``: each
    worker slice is one such vector env, and seeding a slice with ``seed + start`` seeds its
    ``j``-th env with ``seed + start + j``, as one ``SyncVectorEnv`` of all the envs would.

    Args:
        env_fn: builds one env (module level, so that the function pickles under ``spawn``).
        autoreset_mode: the mode of the vector envs it builds.

    Example:
        >>> from gymnasium.vector import AutoresetMode
        >>> build = SyncVectorEnvFn(make_cartpole, AutoresetMode.NEXT_STEP)
        >>> envs = build(3)
        >>> envs.num_envs, envs.metadata["autoreset_mode"].value
        (3, 'NextStep')
        >>> envs.close()
    """

    def __init__(
        self, env_fn: Callable[[], gym.Env], autoreset_mode: gym.vector.AutoresetMode
    ) -> None:
        self.env_fn = env_fn
        self.autoreset_mode = autoreset_mode

    def __call__(self, num_envs: int) -> gym.vector.SyncVectorEnv:
        return gym.vector.SyncVectorEnv(
            [self.env_fn] * num_envs, autoreset_mode=self.autoreset_mode
        )
