"""The normalised vector env: every env's observations of a step counted in one set of
statistics in the caller, whatever worker stepped it, and all normalised by it; resets not
counted; bad observations and rewards refused in the caller, naming the env."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from toy_envs import NanObsEnv, NanRewardEnv

import vecaccel
from vecaccel.trainers.envs.normalized import NormalizedVecEnv, normalized_envs
from vecaccel.trainers.nets.normalization import (
    NonFiniteInputError,
    NormalizationSettings,
    Normalizer,
)

OBS = NormalizationSettings(norm_obs=True)


def _normalizer(envs, settings=OBS) -> Normalizer:
    return Normalizer(settings, envs.single_observation_space)


def test_every_env_of_every_worker_shares_the_statistics_of_the_whole_batch() -> None:
    """Four CartPoles on two worker processes against the same envs stepped serially without
    normalisation: the statistics are NumPy's over every env's observations of every step (not
    one worker's), and each env's observation, final ones included, is normalised by them."""
    kwargs = dict(autoreset_mode="SameStep")
    wrapped_envs = vecaccel.make_vec("CartPole-v1", 4, backend="shm", num_workers=2, **kwargs)
    raw_envs = vecaccel.make_vec("CartPole-v1", 4, backend="serial", **kwargs)
    normalizer = _normalizer(raw_envs)
    envs = NormalizedVecEnv(wrapped_envs, normalizer)
    rng = np.random.default_rng(0)
    try:
        envs.reset(seed=7)
        raw_envs.reset(seed=7)
        seen, finals = [], 0
        for _ in range(40):
            actions = rng.integers(0, 2, 4)
            obs, _, terminated, truncated, infos = envs.step(actions)
            raw, _, _, _, raw_infos = raw_envs.step(actions)
            seen.append(raw)
            mean, var = normalizer.obs.mean, normalizer.obs.var  # one set for every env
            scale = np.sqrt(var + 1e-8)
            np.testing.assert_allclose(obs, ((raw - mean) / scale).astype(np.float32), 1e-5, 1e-5)
            for i in np.flatnonzero(terminated | truncated):
                expected = (raw_infos["final_obs"][i] - mean) / scale
                np.testing.assert_allclose(infos["final_obs"][i], expected, 1e-5, 1e-5)
                finals += 1
        assert finals > 0, "no episode ended: the final observations were not checked"
        every = np.concatenate(seen).astype(np.float64)
        assert normalizer.obs.count == len(every) == 160
        np.testing.assert_allclose(normalizer.obs.mean, every.mean(0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(normalizer.obs.var, every.var(0), rtol=1e-9)
    finally:
        wrapped_envs.close()
        raw_envs.close()


def test_a_reset_is_normalised_but_not_counted() -> None:
    raw_envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial", autoreset_mode="SameStep")
    normalizer = _normalizer(raw_envs)
    normalizer.observe_obs(np.full((2, 4), 3.0, np.float32) + np.eye(2, 4, dtype=np.float32))
    envs = NormalizedVecEnv(raw_envs, normalizer)
    try:
        counted = normalizer.obs.data.copy()
        obs, _ = envs.reset(seed=1)
        raw, _ = raw_envs.reset(seed=1)
        np.testing.assert_array_equal(normalizer.obs.data, counted)
        np.testing.assert_allclose(obs, normalizer.normalize_obs(raw))
    finally:
        envs.close()


def test_a_nan_observation_is_refused_naming_the_env_before_it_is_counted() -> None:
    env_fns = [NanObsEnv, functools.partial(NanObsEnv, nan_at=3)]
    raw_envs = vecaccel.make_vec(env_fns, backend="shm", num_workers=2, autoreset_mode="SameStep")
    normalizer = _normalizer(raw_envs)
    envs = NormalizedVecEnv(raw_envs, normalizer)
    try:
        envs.reset(seed=0)
        actions = np.zeros(2, np.int64)
        envs.step(actions)
        envs.step(actions)
        counted = normalizer.obs.data.copy()
        with pytest.raises(NonFiniteInputError, match=r"env 1 returned a non-finite observation"):
            envs.step(actions)
        np.testing.assert_array_equal(normalizer.obs.data, counted)
    finally:
        envs.close()


def test_a_nan_reward_is_refused_at_its_step_when_rewards_are_normalised() -> None:
    env_fns = [NanRewardEnv, functools.partial(NanRewardEnv, nan_at=2)]
    raw_envs = vecaccel.make_vec(env_fns, backend="serial", autoreset_mode="SameStep")
    envs = NormalizedVecEnv(
        raw_envs, _normalizer(raw_envs, NormalizationSettings(norm_reward=True))
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(2, np.int64))
        with pytest.raises(NonFiniteInputError, match=r"env 1 returned a non-finite reward") as err:
            envs.step(np.zeros(2, np.int64))
        assert err.value.kind == "reward"
    finally:
        envs.close()


def test_envs_of_another_shape_or_returned_in_part_are_refused() -> None:
    cartpole = vecaccel.make_vec("CartPole-v1", 2, backend="serial", autoreset_mode="SameStep")
    pendulum = Normalizer(OBS, gym.spaces.Box(-np.inf, np.inf, (3,), np.float32))
    partial = vecaccel.make_vec("CartPole-v1", 4, backend="async", batch_size=2)
    try:
        with pytest.raises(ValueError, match=r"shape \(3,\).*shape \(4,\)"):
            NormalizedVecEnv(cartpole, pendulum)
        with pytest.raises(ValueError, match="part of its envs per step"):
            NormalizedVecEnv(partial, _normalizer(cartpole))
    finally:
        cartpole.close()
        partial.close()


def test_training_steps_the_same_wrapper_while_the_envs_stay() -> None:
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
    normalizer = _normalizer(envs)
    try:
        assert normalized_envs(envs, None) is envs  # normalisation off: the envs themselves
        first = normalized_envs(envs, normalizer)
        assert normalized_envs(envs, normalizer, first) is first
        assert normalized_envs(envs, _normalizer(envs), first) is not first
    finally:
        envs.close()
