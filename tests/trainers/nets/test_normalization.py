"""The normaliser: SB3's observation and reward formulas, the three places observed values go
(at once, deferred to a sync, handed to the trainer), bad input refused before it is counted, and
the statistics as plain data."""

from __future__ import annotations

import io

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.algos.dqn import DQNConfig
from vecaccel.trainers.algos.ppo import PPOConfig
from vecaccel.trainers.nets.normalization import (
    NonFiniteInputError,
    NormalizationSettings,
    Normalizer,
    make_normalizer,
)

BOX = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOTH = NormalizationSettings(norm_obs=True, norm_reward=True, gamma=0.9)


def test_settings_come_from_the_config_with_the_algorithms_gamma() -> None:
    assert NormalizationSettings.of(PPOConfig()) is None  # off by default
    ppo = NormalizationSettings.of(PPOConfig(norm_obs=True, gamma=0.95, clip_obs=5.0))
    assert ppo == NormalizationSettings(norm_obs=True, clip_obs=5.0, gamma=0.95)
    dqn = NormalizationSettings.of(DQNConfig(norm_reward=True, norm_gamma=0.5))
    assert dqn is not None and dqn.gamma == 0.5 and dqn.epsilon == 1e-8 and dqn.clip_reward == 10
    assert make_normalizer(PPOConfig(), BOX) is None
    assert make_normalizer(PPOConfig(norm_obs=True), BOX, world_size=2).mode == "defer"


@pytest.mark.parametrize(
    "field, value",
    [("clip_obs", 0.0), ("clip_reward", -1.0), ("norm_epsilon", 0.0), ("norm_gamma", 1.5),
     ("norm_obs", "yes")],
)  # fmt: skip
def test_the_config_refuses_settings_that_cannot_normalise(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        PPOConfig(**{field: value})


def test_observations_are_centred_scaled_and_clipped_in_the_spaces_dtype() -> None:
    normalizer = Normalizer(NormalizationSettings(norm_obs=True, clip_obs=2.0), BOX)
    batch = np.array([[0.0, 10.0, -4.0], [2.0, 30.0, 4.0]], np.float32)
    normalizer.observe_obs(batch)
    mean, std = batch.mean(0), np.sqrt(batch.var(0) + 1e-8)
    probe = np.array([[1.0, 50.0, 0.0]], np.float32)
    out = normalizer.normalize_obs(probe)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.clip((probe - mean) / std, -2.0, 2.0), rtol=1e-6)
    assert out[0, 1] == 2.0  # (50 - 20) / 10 = 3, clipped
    wide = Normalizer(NormalizationSettings(norm_obs=True), gym.spaces.Box(-1, 1, (3,), np.float64))
    assert wide.normalize_obs(probe).dtype == np.float64


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda envs: st.tuples(
            st.lists(st.lists(st.floats(-50, 50), min_size=envs, max_size=envs), min_size=1,
                     max_size=30),
            st.lists(st.lists(st.booleans(), min_size=envs, max_size=envs), min_size=30,
                     max_size=30),
        )
    ),
    st.sampled_from([0.0, 0.9, 0.99, 1.0]),
)  # fmt: skip
def test_rewards_are_scaled_by_the_discounted_returns_std_as_sb3_does(case, gamma) -> None:
    """SB3's ``VecNormalize``: the return takes the reward and is counted, the reward is
    divided by the standard deviation of every return counted so far and clipped, and the
    return restarts where the episode ended."""
    rewards, dones = np.array(case[0]), np.array(case[1][: len(case[0])])
    normalizer = Normalizer(NormalizationSettings(norm_reward=True, gamma=gamma, clip_reward=3.0),
                            BOX)  # fmt: skip
    returns, seen = np.zeros(rewards.shape[1]), []
    for t in range(len(rewards)):
        returns = returns * gamma + rewards[t]
        seen.append(returns.copy())
        expected = np.clip(rewards[t] / np.sqrt(np.var(np.concatenate(seen)) + 1e-8), -3, 3)
        scaled = normalizer.scale_rewards(rewards[t], dones[t])
        assert scaled.dtype == np.float32
        np.testing.assert_allclose(scaled, expected.astype(np.float32), rtol=1e-5, atol=1e-6)
        returns[dones[t]] = 0.0
    assert normalizer.returns.count == rewards.size


@pytest.mark.parametrize("kind", ["observation", "reward"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_is_refused_naming_the_env_before_it_is_counted(kind, bad) -> None:
    normalizer = Normalizer(BOTH, BOX)
    normalizer.observe_obs(np.ones((3, 3), np.float32))
    normalizer.scale_rewards(np.ones(3), np.zeros(3, bool))
    before = [normalizer.obs.data.copy(), normalizer.returns.data.copy()]
    with pytest.raises(NonFiniteInputError, match=rf"env 2 returned a non-finite {kind}") as err:
        if kind == "observation":
            obs = np.zeros((3, 3), np.float32)
            obs[2, 1] = bad
            normalizer.observe_obs(obs)
        else:
            normalizer.scale_rewards(np.array([0.0, 1.0, bad]), np.zeros(3, bool))
    assert err.value.env_index == 2 and err.value.kind == kind
    np.testing.assert_array_equal(normalizer.obs.data, before[0])
    np.testing.assert_array_equal(normalizer.returns.data, before[1])


@pytest.mark.parametrize(
    "space",
    [gym.spaces.Discrete(3), gym.spaces.MultiBinary(4), gym.spaces.MultiDiscrete([2, 3]),
     gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Box(0, 1, (10, 10, 4), bool)],
    ids=str,
)  # fmt: skip
def test_norm_obs_refuses_what_is_not_a_float_box_naming_the_space(space) -> None:
    with pytest.raises(TypeError, match=r"floating-point Box") as err:
        Normalizer(NormalizationSettings(norm_obs=True), space)
    assert str(space) in str(err.value)
    # the rewards of such an env may still be scaled
    assert Normalizer(NormalizationSettings(norm_reward=True), space).obs is None


def test_deferred_statistics_normalise_with_this_ranks_share_until_the_sync_merges_it() -> None:
    """On several ranks a rank normalises with the common statistics and what it observed
    since; the sync (here one rank, no process group) merges its share, which then normalises
    as a normaliser that merged at once."""
    rng = np.random.default_rng(0)
    first, second = rng.normal(3, 2, (4, 3)), rng.normal(-1, 5, (4, 3))
    deferred, direct = Normalizer(BOTH, BOX, "defer"), Normalizer(BOTH, BOX, "update")
    for normalizer in (deferred, direct):
        normalizer.observe_obs(first)
    deferred.sync()
    for normalizer in (deferred, direct):
        normalizer.observe_obs(second)
    assert deferred.obs.count == 4.0  # the common statistics: the first sync's
    probe = rng.normal(0, 3, (2, 3)).astype(np.float32)
    np.testing.assert_allclose(deferred.normalize_obs(probe), direct.normalize_obs(probe), 1e-6)
    deferred.sync()
    assert deferred.obs.count == 8.0
    np.testing.assert_allclose(deferred.obs.data, direct.obs.data, rtol=1e-12)


def test_a_collector_normalises_with_the_statistics_handed_over_and_hands_its_moments_back():
    trainer = Normalizer(BOTH, BOX)
    trainer.observe_obs(np.random.default_rng(1).normal(5, 3, (6, 3)))
    collector = trainer.for_collector()
    assert collector.mode == "collect"
    rng = np.random.default_rng(2)
    steps = [rng.normal(2, 4, (2, 3)) for _ in range(3)]
    rewards = [rng.normal(0, 1, 2) for _ in range(3)]
    twin = Normalizer(BOTH, BOX)  # what the trainer would hold had it stepped the envs itself
    twin.obs.data[:] = trainer.obs.data
    probe = rng.normal(0, 1, (1, 3)).astype(np.float32)
    for obs, reward in zip(steps, rewards):
        collector.observe_obs(obs)
        collector.scale_rewards(reward, np.zeros(2, bool))
        twin.observe_obs(obs)
        twin.scale_rewards(reward, np.zeros(2, bool))
        # the collector's own observations do not move what it normalises with
        np.testing.assert_array_equal(collector.normalize_obs(probe), trainer.normalize_obs(probe))
    moments = np.zeros(collector.moments_size)
    collector.take_moments(moments)
    trainer.add_moments(moments)
    assert trainer.obs.count == twin.obs.count == 12.0 and trainer.returns.count == 6.0
    np.testing.assert_allclose(trainer.obs.data, twin.obs.data, rtol=1e-12)
    np.testing.assert_allclose(trainer.returns.data, twin.returns.data, rtol=1e-12)
    collector.take_moments(moments)  # taken: nothing is handed over twice
    assert moments[-1] == 0.0 and moments[2 * 3] == 0.0


def test_the_handed_tensors_are_the_statistics_themselves() -> None:
    """An asynchronous run publishes these tensors with the weights and copies them in place
    into the sampler's: what is copied in is what normalises there."""
    trainer, collector = Normalizer(BOTH, BOX), Normalizer(BOTH, BOX).for_collector()
    trainer.observe_obs(np.arange(9.0).reshape(3, 3))
    trainer.scale_rewards(np.array([1.0, 2.0, 5.0]), np.zeros(3, bool))
    for mine, theirs in zip(collector.tensors(), trainer.tensors(), strict=True):
        assert mine.dtype == torch.float64
        mine.copy_(theirs)
    np.testing.assert_array_equal(collector.obs.data, trainer.obs.data)
    np.testing.assert_array_equal(collector.returns.data, trainer.returns.data)


def test_the_state_loads_weights_only_and_refuses_another_shape_naming_both() -> None:
    normalizer = Normalizer(BOTH, BOX)
    normalizer.observe_obs(np.random.default_rng(3).normal(size=(5, 3)))
    normalizer.scale_rewards(np.ones(2), np.zeros(2, bool))
    buffer = io.BytesIO()
    torch.save(normalizer.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    restored = Normalizer(BOTH, BOX)
    restored.load_state_dict(state)
    np.testing.assert_array_equal(restored.obs.data, normalizer.obs.data)
    np.testing.assert_array_equal(restored.returns.data, normalizer.returns.data)
    other = Normalizer(BOTH, gym.spaces.Box(-1, 1, (4,), np.float32))
    with pytest.raises(ValueError, match=r"shape \(3,\).*shape \(4,\)"):
        other.load_state_dict(state)
