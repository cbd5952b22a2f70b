"""The toy environments that several test modules share (an env one module alone uses is
defined in it; the envs benchmarks share with tests, and those ``check_backend`` runs on, are in
:mod:`vecaccel.testing`).

Everything here is module level so that env functions (``functools.partial`` of these classes
and functions) pickle by reference under the ``spawn`` and ``forkserver`` start methods.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vecaccel.testing.envs import CounterEnv


class EchoEnv(gym.Env):
    """Observation and action spaces are one space; each step observes the action it was given."""

    def __init__(self, space: spaces.Space) -> None:
        self.observation_space = space
        self.action_space = space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(0 if seed is None else seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return action, 0.0, False, False, {}


# -- envs of the async and action-server tests: tagged counters, heavy-tailed step times ----


class TaggedCounterEnv(gym.Env):
    """Observation is ``[env tag, step count]``; the count restarts at reset, and an episode is
    truncated after 50 steps. Sleeps on the steps ``sleep_on`` names, and raises on step
    ``fail_on``."""

    def __init__(self, tag: int = 0, sleep_on: dict[int, float] | None = None, fail_on: int = -1):
        self.tag = tag
        self.sleep_on = dict(sleep_on or {})
        self.fail_on = fail_on
        self.observation_space = spaces.Box(-1e9, 1e9, (2,), np.float64)
        self.action_space = spaces.Discrete(3)
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([self.tag, 0.0]), {}

    def step(self, action):
        self.count += 1
        if self.count == self.fail_on:
            raise ValueError(f"boom at step {self.count} in env {self.tag}")
        delay = self.sleep_on.get(self.count)
        if delay:
            time.sleep(delay)
        return np.array([self.tag, float(self.count)]), float(action), False, self.count >= 50, {}


def tagged_counter(tag: int = 0, **kwargs) -> TaggedCounterEnv:
    return TaggedCounterEnv(tag, **kwargs)


# -- wrappers that slow down or fail a step ----------------------------------------------------


class RaiseAt(gym.Wrapper):
    def __init__(self, env: gym.Env, at: int) -> None:
        super().__init__(env)
        self.at, self.count = at, 0

    def step(self, action):
        self.count += 1
        if self.count == self.at:
            raise ArithmeticError(f"broken at step {self.count}")
        return self.env.step(action)


# -- envs for the Gymnasium API parity checks -------------------------------------------------


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


class BrokenStepEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        raise RuntimeError("this env cannot step")


class ShiftedActions(gym.ActionWrapper):
    """CartPole with Discrete(2, start=1): actions 1 and 2."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Discrete(2, start=1)

    def action(self, action):
        return int(action) - 1


class TinyImageEnv(gym.Env):
    """A 36x36 uint8 image whose bright column is where the agent stands; reward for moving right."""

    observation_space = gym.spaces.Box(0, 255, (36, 36), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(0, 36))
        return self._obs(), {}

    def _obs(self):
        obs = np.zeros((36, 36), np.uint8)
        obs[:, self.position] = 255
        return obs

    def step(self, action):
        self.position = min(35, max(0, self.position + (1 if action == 1 else -1)))
        reward = float(action == 1)
        return self._obs(), reward, self.position == 35, False, {}


# -- Box actions ----------------------------------------------------------------------------------


class WideBoxEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-0.5, 0.5, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(3, 0.1 * self.t, np.float32), 0.0, False, self.t >= 4, {}


class MatrixActionEnv(gym.Env):
    """A Box action space with two axes (as SB3's ``Box(shape=(2, 2))`` envs)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        assert np.shape(action) == (2, 2), f"env got an action of shape {np.shape(action)}"
        self.t += 1
        return np.zeros(3, np.float32), 1.0, False, self.t >= 5, {}


class BoundedMatrixActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(
        np.array([[-1, -2], [-3, -4]], np.float32), np.array([[1, 2], [3, 4]], np.float32)
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, np.float32)), action
        self.t += 1
        reward = -float(np.abs(action).sum())
        return np.full(3, 0.1 * self.t, np.float32), reward, False, self.t >= 5, {}


class NanRewardEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, nan_at: int = 20) -> None:
        self.nan_at = nan_at
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        self.steps += 1
        reward = float("nan") if self.steps == self.nan_at else 1.0
        return np.zeros(2, np.float32), reward, False, self.t >= 10, {}


class NanObsEnv(gym.Env):
    """Observes its step count in both entries, NaN in the second at its ``nan_at``-th step."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, nan_at: int = 20) -> None:
        self.nan_at = nan_at
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        obs = np.full(2, self.steps, np.float32)
        if self.steps == self.nan_at:
            obs[1] = np.nan
        return obs, 1.0, False, False, {}


# -- envs for the SB3 adapter -----------------------------------------------------------------


class CustomGymEnv(gym.Env):
    """SB3's test env, seeded through Gymnasium's RNG so that runs are reproducible."""

    def __init__(self, space: spaces.Space, render_mode: str | None = "rgb_array", ep_length=4):
        # each env samples from its own copy, so that no two envs share a random generator
        self.action_space = copy.deepcopy(space)
        self.observation_space = copy.deepcopy(space)
        self.current_step = 0
        self.ep_length = ep_length
        self.render_mode = render_mode

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.current_step = 0
        self._choose_next_state()
        return self.state, {}

    def step(self, action):
        reward = float(self.np_random.random())
        self._choose_next_state()
        self.current_step += 1
        terminated = truncated = self.current_step >= self.ep_length
        return self.state, reward, terminated, truncated, {}

    def _choose_next_state(self) -> None:
        self.state = self.observation_space.sample()

    def render(self):
        if self.render_mode == "rgb_array":
            return np.zeros((4, 4, 3))
        return None

    @staticmethod
    def custom_method(dim_0: int = 1, dim_1: int = 1) -> np.ndarray:
        return np.ones((dim_0, dim_1))


class ShuffledDictEnv(CustomGymEnv):
    """Returns its Dict observations with the keys in reverse order."""

    def _choose_next_state(self) -> None:
        sample = self.observation_space.sample()
        self.state = {key: sample[key] for key in reversed(list(sample))}


class StepEnv(gym.Env):
    """Observation = the step count: checks that ``terminal_observation`` is the right one."""

    def __init__(self, max_steps: int) -> None:
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(np.array([0]), np.array([999]), dtype=np.int64)
        self.max_steps = max_steps
        self.current_step = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.current_step = 0
        return np.array([self.current_step], dtype=np.int64), {}

    def step(self, action):
        prev_step = self.current_step
        self.current_step += 1
        terminated = truncated = self.current_step >= self.max_steps
        return np.array([prev_step], dtype=np.int64), 0.0, terminated, truncated, {}


class InfoEnv(gym.Env):
    """Random episode ends (terminated, truncated or both) and infos of many kinds.

    Infos carry ints, floats, bools, arrays, strings present only on some steps and nested
    dicts; reset infos echo the options, so every conversion of the adapter is exercised.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, max_steps: int = 6, render_mode: str | None = None) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.resets = 0
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.resets += 1
        self.steps = 0
        start = float((options or {}).get("start", 0.0))
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        obs[0] = start
        info: dict[str, Any] = {"resets": self.resets, "seeded": seed is not None}
        if options:
            info["options"] = dict(options)
        return obs, info

    def step(self, action):
        self.steps += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        reward = float(self.np_random.normal()) + int(action)
        terminated = bool(self.np_random.random() < 0.15)
        truncated = self.steps >= self.max_steps
        info: dict[str, Any] = {
            "steps": self.steps,
            "value": float(obs[0]),
            "flag": bool(obs[1] > 0),
            "vector": obs * 2,
            "nested": {"action": int(action), "deep": {"half": self.steps / 2}},
        }
        if obs[2] > 0.5:
            info["note"] = f"high {self.steps}"
        return obs, reward, terminated, truncated, info

    def render(self):
        return np.full((8, 6, 3), self.steps * 10, dtype=np.uint8)


class ImageEnv(CustomGymEnv):
    """An image env (uint8) that renders frames a video encoder accepts."""

    def __init__(self, shape=(12, 8, 3), render_mode: str | None = "rgb_array") -> None:
        space = spaces.Box(0, 255, shape, np.uint8)
        super().__init__(space, render_mode=render_mode, ep_length=5)
        self.action_space = spaces.Discrete(2)

    def render(self):
        return np.full((16, 16, 3), 10 * self.current_step, dtype=np.uint8)


class CrashEnv(InfoEnv):
    """Raises inside ``step`` after a few steps."""

    def __init__(self, crash_at: int | None) -> None:
        super().__init__(max_steps=100)
        self.crash_at = crash_at
        self.total_steps = 0

    def step(self, action):
        self.total_steps += 1
        if self.total_steps == self.crash_at:
            raise RuntimeError("boom from the env")
        return super().step(action)


class OptionsSeenEnv(StepEnv):
    """Reports in its reset info whether it was given options (``None`` or a dict)."""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {"options_is_none": options is None}


class StatefulInfoEnv(gym.Env):
    """Reports its state in ``info`` through objects it keeps and updates in place.

    A common pattern (``info = self._info``; ``info["pos"] = self.pos`` with ``self.pos += v``).
    ``DummyVecEnv`` deep-copies the infos it returns, so each step's infos stay what they were.
    """

    def __init__(self, ep_length: int = 50) -> None:
        self.observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.ep_length = ep_length
        self.t = 0
        self.pos = np.zeros(2)
        self._info: dict[str, Any] = {"t": 0, "pos": self.pos}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.pos[:] = 0.0
        return np.zeros(2, np.float32), {"options_is_none": options is None}

    def step(self, action):
        self.t += 1
        self.pos += 1.0  # in place: info["pos"] is this very array
        self._info["t"] = self.t
        truncated = self.t >= self.ep_length
        return self.pos.astype(np.float32), 1.0, False, truncated, self._info


class OptionsEnv(gym.Env):
    """Reads ``options["start"]`` whenever options are given (``options is not None``)."""

    def __init__(self, ep_length: int = 2) -> None:
        self.observation_space = spaces.Box(-10, 10, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.ep_length = ep_length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        start = 0.0 if options is None else float(options["start"])
        return np.array([start], np.float32), {"options": options}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, self.t >= self.ep_length, {}


class SampledSpaceEnv(gym.Env):
    """Samples observations of ``space``; episodes of ``ep_length`` steps."""

    def __init__(self, space: spaces.Space, ep_length: int = 2) -> None:
        self.observation_space = copy.deepcopy(space)
        self.action_space = spaces.Discrete(2)
        self.ep_length = ep_length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.ep_length
        return self.observation_space.sample(), 0.5, done, False, {}


class CurrentStepEnv(gym.Env):
    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.current_step = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def double(self, x: int) -> int:
        return 2 * x


def _relayout(tree: Any, how: str) -> Any:
    """The same values in another memory layout (and Dict keys in reverse order)."""
    if isinstance(tree, dict):
        return {key: _relayout(tree[key], how) for key in reversed(list(tree))}
    if isinstance(tree, tuple):
        return tuple(_relayout(value, how) for value in tree)
    if isinstance(tree, np.ndarray) and tree.ndim:
        if how == "F":
            return np.asfortranarray(tree)
        if how == "strided":
            return np.repeat(tree[..., None], 2, axis=-1)[..., 1]  # a non-contiguous view
    return tree


# -- envs over any space, beside SyncVectorEnv ----------------------------------------------


class SpaceEnv(gym.Env):
    """Emits seeded random observations of its space (in a chosen memory layout, Dict keys
    reversed), rich infos, and the flattened action it received; episodes end at random."""

    metadata = {"render_modes": []}

    def __init__(self, obs_space, act_space, layout: str = "C", p_end: float = 0.3):
        self.observation_space = obs_space
        self.action_space = act_space
        self._sampler = copy.deepcopy(obs_space)
        self.layout = layout
        self.p_end = p_end
        self.t = 0

    def _obs(self):
        return _relayout(self._sampler.sample(), self.layout)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sampler.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        info: dict[str, Any] = {"start": np.int16(self.np_random.integers(100))}
        if options:
            info["options"] = dict(options)
        return self._obs(), info

    def step(self, action):
        assert self.action_space.contains(action), (action, self.action_space)
        self.t += 1
        rng = self.np_random
        info: dict[str, Any] = {"act": spaces.flatten(self.action_space, action).astype(np.float64)}
        kind = int(rng.integers(6))
        if kind == 0:
            info["f32"] = np.float32(rng.random())
        elif kind == 1:
            info["nested"] = {"s": "x" * int(rng.integers(3)), "n": None, "deep": {"v": self.t}}
        elif kind == 2:
            info["arr"] = rng.random(2)
        elif kind == 3:
            info["flag"] = bool(rng.integers(2))
            info["none"] = None
        elif kind == 4:
            info["f32"] = np.float32(-1.0)
            info["label"] = f"t{self.t}"
        terminated = bool(rng.random() < self.p_end)
        truncated = self.t % 4 == 0
        return self._obs(), float(self.t) + 0.25, terminated, truncated, info


class ConstObsEnv(gym.Env):
    """Returns the given observation on reset and on every step."""

    def __init__(self, space, value):
        self.observation_space = space
        self.action_space = spaces.Discrete(2)
        self.value = value

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return copy.deepcopy(self.value), {}

    def step(self, action):
        return copy.deepcopy(self.value), 0.0, False, False, {}


class ShortTupleEnv(gym.Env):
    """A ``Tuple(Box, Box)`` observation, except that step ``short_at`` returns only its first part."""

    def __init__(self, short_at: int = 2):
        box = spaces.Box(0, 100, (1,), np.float32)
        self.observation_space = spaces.Tuple((box, box))
        self.action_space = spaces.Discrete(2)
        self.short_at = short_at
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return (np.zeros(1, np.float32), np.zeros(1, np.float32)), {}

    def step(self, action):
        self.t += 1
        first = np.full(1, self.t, np.float32)
        if self.t == self.short_at:
            return (first,), 0.0, False, False, {}
        return (first, np.full(1, 10 * self.t, np.float32)), 0.0, False, False, {}


class PreviousActionEnv(gym.Env):
    """Observes the action of the *previous* step, kept as the env received it (a common
    pattern: action-rate penalties, last-action features)."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "box": spaces.Box(-10, 10, (2,), np.float32),
                "md": spaces.MultiDiscrete([5, 5]),
            }
        )
        self.action_space = self.observation_space
        self.prev = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.prev = {"box": np.zeros(2, np.float32), "md": np.zeros(2, np.int64)}
        return {k: np.array(v) for k, v in self.prev.items()}, {}

    def step(self, action):
        obs = {k: np.array(v) for k, v in self.prev.items()}
        self.prev = action  # kept by reference, as envs commonly do
        return obs, 0.0, False, False, {}


class ReusedInfoEnv(gym.Env):
    """Returns one info dict object, updated in place by ``step`` and ``reset``."""

    def __init__(self, length: int = 2):
        self.observation_space = spaces.Box(0, 100, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length = length
        self.info: dict[str, Any] = {}
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.info.clear()
        self.info["episode_steps"] = 0
        return np.zeros(1, np.float32), self.info

    def step(self, action):
        self.t += 1
        self.info["episode_steps"] = self.t
        obs = np.full(1, self.t, np.float32)
        return obs, 1.0, self.t == self.length, False, self.info


class FreeSpaceEnv(gym.Env):
    """Seeded samples of any space (Text, Sequence, Graph...), for the serial backend."""

    def __init__(self, obs_space, act_space):
        self.observation_space = obs_space
        self.action_space = act_space
        self._sampler = copy.deepcopy(obs_space)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sampler.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self._sampler.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        return self._sampler.sample(), 1.0, self.t % 3 == 0, False, {"action": action}


# -- Discrete(start) and bounded Box actions ---------------------------------------------------


class ShiftedCartPole(gym.ActionWrapper):
    """CartPole with ``Discrete(2, start=3)``: any action outside 3..4 is an error."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Discrete(2, start=3)

    def action(self, action):
        action = int(action)
        if action not in (3, 4):
            raise ValueError(f"action {action} outside Discrete(2, start=3)")
        return action - 3


def make_shifted_cartpole(**kwargs) -> gym.Env:
    return ShiftedCartPole(gym.make("CartPole-v1", **kwargs))


SHIFTED_ID = "VecaccelShiftedCartPole-v0"


if SHIFTED_ID not in gym.registry:
    gym.register(SHIFTED_ID, entry_point=make_shifted_cartpole)


#: Every action a ``BoundedActionEnv`` stepped with, in this process.
BOUNDED_ACTIONS_SEEN: list[np.ndarray] = []


class BoundedActionEnv(gym.Env):
    """Actions in [-1, 1]; records every action it is given (a physics env that does not clip)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        BOUNDED_ACTIONS_SEEN.append(np.array(action, dtype=np.float64))
        self.t += 1
        return np.zeros(2, np.float32), -float(np.square(action).sum()), False, self.t >= 5, {}


# -- envs that get stuck, for the errors that show a stuck worker's stack ---------------------


def wait_in_constructor(seconds: float = 600.0) -> gym.Env:
    """An env function whose construction blocks, as one waiting on a lock that never frees."""
    threading.Event().wait(seconds)
    return CounterEnv()


class WaitingEnv(CounterEnv):
    """A ``CounterEnv`` whose ``step`` (or ``reset``, as ``wait_in`` says) blocks for
    ``seconds``."""

    def __init__(self, wait_in: str = "step", seconds: float = 600.0) -> None:
        super().__init__()
        self.wait_in, self.seconds = wait_in, seconds

    def step(self, action):
        if self.wait_in == "step":
            threading.Event().wait(self.seconds)
        return super().step(action)

    def reset(self, *, seed=None, options=None):
        if self.wait_in == "reset":
            threading.Event().wait(self.seconds)
        return super().reset(seed=seed, options=options)


class Cv2ImportingEnv(CounterEnv):
    """A ``CounterEnv`` whose constructor imports OpenCV, as ``AtariPreprocessing`` does."""

    def __init__(self) -> None:
        import cv2  # noqa: F401 - loaded by the worker itself

        super().__init__()


def cv2_threads(env: gym.Env) -> int:
    """A function for ``call(fn)``: the threads OpenCV uses in the env's process (importing it
    there if nothing did)."""
    import cv2

    return cv2.getNumThreads()


def torch_threads(env: gym.Env) -> int:
    """A function for ``call(fn)``: torch's intra-op threads in the env's process."""
    import torch

    return torch.get_num_threads()
