"""The Sampler: time-major batches that mean the same thing on every backend and autoreset mode."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from backend_matrix import options_for, select
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from toy_envs import tagged_counter

import vecaccel
from vecaccel.sampler import SampleBatch, Sampler

torch.set_num_threads(1)

#: the backends the Sampler takes as they are: every env each step, in index order, as NumPy
BACKENDS = select(lockstep=True, tensors=False)

MODES = ["SameStep", "NextStep", "Disabled"]

HORIZON = 40

NUM_ENVS = 4

MAX_STEPS = 12  # short episodes: both truncations (time limit) and terminations happen


def short_cartpole() -> gym.Env:
    return gym.wrappers.RecordEpisodeStatistics(
        gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    )


def make_envs(backend: str, mode: str, **options) -> gym.vector.VectorEnv:
    return vecaccel.make_vec(
        [short_cartpole] * NUM_ENVS,
        backend=backend,
        autoreset_mode=mode,
        **{**options_for(backend), **options},
    )


class RandomPolicy(torch.nn.Module):
    """Samples from its own generator, so two samplers given equal seeds act alike."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, obs: torch.Tensor):
        actions = torch.randint(0, 2, (obs.shape[0],), generator=self.generator)
        return actions, {"value": obs.sum(-1), "pair": torch.stack([obs[:, 0], obs[:, 1]], -1)}


def deterministic_policy(obs: torch.Tensor):
    """Acts on the observation alone: the same actions whatever order envs are served in."""
    return (obs[:, 2] > 0).long(), {"value": obs.sum(-1)}


def snapshot(batch: SampleBatch) -> dict[str, torch.Tensor]:
    fields = {name: getattr(batch, name).clone() for name in batch._fields if name != "extras"}
    fields.update({f"extras.{k}": v.clone() for k, v in batch.extras.items()})
    return fields


def collect(envs, policy, batches: int = 3, seed: int = 7):
    sampler = Sampler(envs, policy, horizon=HORIZON, seed=seed, episode_stats="rewards")
    out = [snapshot(sampler.collect()) for _ in range(batches)]
    return out, sampler.pop_episodes()


def assert_same(a: list[dict], b: list[dict]) -> None:
    for batch_a, batch_b in zip(a, b, strict=True):
        assert batch_a.keys() == batch_b.keys()
        for key in batch_a:
            assert torch.equal(batch_a[key], batch_b[key]), key


# -- shape, types ------------------------------------------------------------------------------


def test_batch_shapes_and_dtypes():
    envs = make_envs("serial", "SameStep")
    try:
        batch = Sampler(envs, RandomPolicy(), horizon=HORIZON, seed=0).collect()
    finally:
        envs.close()
    T, B = HORIZON, NUM_ENVS
    assert batch.obs.shape == (T, B, 4) and batch.obs.dtype == torch.float32
    assert batch.actions.shape == (T, B) and batch.actions.dtype == torch.int64
    assert batch.rewards.shape == (T, B) and batch.rewards.dtype == torch.float32
    assert batch.terminated.dtype == batch.truncated.dtype == batch.valid.dtype == torch.bool
    assert batch.extras["value"].shape == (T, B)
    assert batch.extras["pair"].shape == (T, B, 2)
    assert batch.next_obs.shape == (B, 4)
    assert batch.final_obs.shape[1:] == (4,)
    assert batch.final_index.shape == (len(batch.final_obs), 2)
    assert batch.horizon == T and batch.num_envs == B


def test_buffers_are_preallocated_once():
    envs = make_envs("serial", "SameStep")
    try:
        sampler = Sampler(envs, RandomPolicy(), horizon=8, seed=0)
        first = sampler.collect()
        second = sampler.collect()
    finally:
        envs.close()
    assert first.obs.data_ptr() == second.obs.data_ptr()
    assert first.extras["value"].data_ptr() == second.extras["value"].data_ptr()


def test_invalid_arguments():
    envs = make_envs("serial", "SameStep")
    try:
        with pytest.raises(ValueError, match="horizon"):
            Sampler(envs, RandomPolicy(), horizon=0)
        with pytest.raises(ValueError, match="episode_stats"):
            Sampler(envs, RandomPolicy(), horizon=4, episode_stats="nope")
    finally:
        envs.close()


def test_policy_runs_without_grad():
    seen = []

    def policy(obs):
        seen.append(torch.is_grad_enabled())
        return torch.zeros(obs.shape[0], dtype=torch.int64), {}

    envs = make_envs("serial", "SameStep")
    try:
        Sampler(envs, policy, horizon=3, seed=0).collect()
    finally:
        envs.close()
    assert seen and not any(seen)


# -- semantics against a plain loop over single envs -------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_batch_matches_single_env_reference(mode):
    """Replays each env alone with the batch's actions and checks every field of the batch."""
    envs = make_envs("serial", mode)
    try:
        sampler = Sampler(envs, RandomPolicy(3), horizon=HORIZON, seed=11, episode_stats="rewards")
        batches = [snapshot(sampler.collect()) for _ in range(2)]
        episodes = sampler.pop_episodes()
    finally:
        envs.close()

    reference_returns = []
    for b in range(NUM_ENVS):
        env = short_cartpole()
        obs, _ = env.reset(seed=11 + b)
        pending_reset = False  # NEXT_STEP: the next step is a reset step
        episode_return = 0.0
        for batch in batches:
            finals = {tuple(i): k for k, i in enumerate(batch["final_index"].tolist())}
            for t in range(HORIZON):
                if mode == "NextStep" and pending_reset:
                    assert not batch["valid"][t, b]
                    assert torch.equal(batch["obs"][t, b], torch.as_tensor(obs))
                    assert batch["rewards"][t, b] == 0
                    obs, _ = env.reset()
                    pending_reset = False
                    continue
                assert batch["valid"][t, b]
                assert torch.equal(batch["obs"][t, b], torch.as_tensor(obs)), (t, b)
                action = int(batch["actions"][t, b])
                obs, reward, terminated, truncated, _ = env.step(action)
                episode_return += reward
                assert batch["rewards"][t, b] == reward
                assert bool(batch["terminated"][t, b]) == terminated
                assert bool(batch["truncated"][t, b]) == truncated
                if truncated and not terminated:
                    k = finals[(t, b)]
                    assert torch.equal(batch["final_obs"][k], torch.as_tensor(obs))
                else:
                    assert (t, b) not in finals
                if terminated or truncated:
                    reference_returns.append(episode_return)
                    episode_return = 0.0
                    if mode == "NextStep":
                        pending_reset = True
                    else:
                        obs, _ = env.reset()
            assert torch.equal(batch["next_obs"][b], torch.as_tensor(obs))
        env.close()
    assert sorted(episodes.returns) == sorted(reference_returns)


def test_same_step_and_disabled_give_the_same_batch():
    results = {}
    for mode in ("SameStep", "Disabled"):
        envs = make_envs("serial", mode)
        try:
            results[mode] = collect(envs, RandomPolicy(5))
        finally:
            envs.close()
    assert_same(results["SameStep"][0], results["Disabled"][0])
    assert results["SameStep"][1] == results["Disabled"][1]


def test_truncations_are_reported_with_final_obs():
    envs = vecaccel.make_vec(
        [lambda: gym.make("CartPole-v1", max_episode_steps=5)] * 2,
        backend="serial",
        autoreset_mode="SameStep",
    )
    try:
        # pushing left then right keeps CartPole alive for 5 steps: every episode is truncated
        def policy(obs):
            return (obs[:, 1] < 0).long(), {}

        batch = Sampler(envs, policy, horizon=10, seed=0).collect()
    finally:
        envs.close()
    assert batch.truncated.sum() == 4 and not batch.terminated.any()
    assert batch.final_index.tolist() == [[4, 0], [4, 1], [9, 0], [9, 1]]
    # the final observation differs from the reset observation stored in the next row
    assert not torch.equal(batch.final_obs[0], batch.obs[5, 0])


# -- every backend gives the serial backend's batch ---------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_batch_on_every_backend(backend, mode):
    reference_envs = make_envs("serial", mode)
    envs = make_envs(backend, mode)
    try:
        expected, expected_episodes = collect(reference_envs, RandomPolicy(1))
        got, got_episodes = collect(envs, RandomPolicy(1))
    finally:
        reference_envs.close()
        envs.close()
    assert_same(expected, got)
    assert expected_episodes == got_episodes


@pytest.mark.skipif("action_server" not in vecaccel.list_backends(), reason="no action_server")
@pytest.mark.parametrize("alternating", [False, True])
@pytest.mark.parametrize("mode", ["SameStep", "NextStep"])
def test_action_server_batches_are_exact(mode, alternating):
    """Tensors in and out; with alternating halves each env's time series is still exact."""
    reference_envs = make_envs("serial", mode)
    envs = make_envs("action_server", mode, device="cpu", alternating=alternating)
    try:
        expected, expected_episodes = collect(reference_envs, deterministic_policy)
        got, got_episodes = collect(envs, deterministic_policy)
    finally:
        reference_envs.close()
        envs.close()
    assert_same(expected, got)
    assert sorted(expected_episodes.returns) == sorted(got_episodes.returns)


@pytest.mark.skipif("async" not in vecaccel.list_backends(), reason="no async backend")
def test_async_batches_are_refused_clearly():
    envs = vecaccel.make_vec([short_cartpole] * 4, backend="async", batch_size=2, num_workers=2)
    try:
        with pytest.raises(ValueError, match="every env back"):
            Sampler(envs, RandomPolicy(), horizon=4)
    finally:
        envs.close()


class TorchVecEnv(gym.vector.VectorEnv):
    """Adapter returning torch tensors, as the action server does, over a serial env."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs
        self.metadata = envs.metadata
        self.single_observation_space = envs.single_observation_space
        self.single_action_space = envs.single_action_space
        self.actions_seen: list[type] = []

    def reset(self, *, seed=None, options=None):
        obs, infos = self.envs.reset(seed=seed, options=options)
        return torch.as_tensor(obs), infos

    def step(self, actions):
        self.actions_seen.append(type(actions))
        obs, rew, term, trunc, infos = self.envs.step(actions.numpy())
        return (torch.as_tensor(obs), torch.as_tensor(rew), torch.as_tensor(term),
                torch.as_tensor(trunc), infos)  # fmt: skip


def test_tensor_envs_get_tensor_actions_and_the_same_batch():
    reference_envs = make_envs("serial", "SameStep")
    envs = TorchVecEnv(make_envs("serial", "SameStep"))
    try:
        expected, _ = collect(reference_envs, RandomPolicy(2))
        got, _ = collect(envs, RandomPolicy(2))
    finally:
        reference_envs.close()
        envs.envs.close()
    assert_same(expected, got)
    assert set(envs.actions_seen) == {torch.Tensor}


# -- episode statistics ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["SameStep", "NextStep"])
def test_episode_stats_from_infos_match_reward_sums(mode):
    stats = {}
    for source in ("infos", "rewards"):
        envs = make_envs("serial", mode)
        try:
            sampler = Sampler(envs, RandomPolicy(4), horizon=HORIZON, seed=3, episode_stats=source)
            sampler.collect()
            sampler.collect()
            stats[source] = sampler.pop_episodes()
        finally:
            envs.close()
    assert stats["infos"] == stats["rewards"]
    assert len(stats["infos"].returns) > 4
    # NEXT_STEP's reset steps are not counted: lengths equal returns (reward 1 per step)
    assert stats["rewards"].lengths == [int(r) for r in stats["rewards"].returns]


def test_reset_drops_running_episodes_and_reseeds():
    envs = make_envs("serial", "SameStep")
    try:
        sampler = Sampler(envs, RandomPolicy(4), horizon=5, seed=3, episode_stats="rewards")
        sampler.collect()
        sampler.reset(seed=99)
        first = sampler.last_obs.clone()
        assert sampler.pop_episodes().returns == []
        sampler.reset(seed=99)
        assert torch.equal(first, sampler.last_obs)
    finally:
        envs.close()


def capped_cartpole(max_episode_steps: int = 6) -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)


class SeededPolicy:
    """Random actions from its own generator; extras that depend on the observation."""

    def __init__(self, seed: int = 0, high: int = 2) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.high = high

    def __call__(self, obs: torch.Tensor):
        actions = torch.randint(0, self.high, (obs.shape[0],), generator=self.generator)
        return actions, {"value": obs.float().sum(-1)}


def observation_policy(obs: torch.Tensor):
    """Acts on the observation alone, so the order envs are served in does not matter."""
    return (obs[:, 2] > 0).long(), {"value": obs.sum(-1)}


def numpy_policy(obs: torch.Tensor):
    """A policy written with NumPy: actions and extras are arrays, not tensors."""
    array = np.asarray(obs)
    return (array[:, 2] > 0).astype(np.int64), {"value": array.sum(-1)}


def assert_same_batches(expected: list[dict], got: list[dict]) -> None:
    for index, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (index, key)


# ---------------------------------------------------------------------------------------------
# against Gymnasium's loop and wrappers, and on the async and action-server backends


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "views"])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_sampler_matches_a_sync_vector_env_loop(mode, copy):
    """Step by step against Gymnasium's ``SyncVectorEnv`` on the same seeds and actions: obs,
    rewards, flags, validity, and the final observation of every truncated episode.

    With ``copy=False`` (views, valid until the next step, as README documents) the Sampler
    copies the final observation: a view would be overwritten by the next step (NEXT_STEP) or
    by its own masked reset (DISABLED).
    """
    B, T, seed = 3, 14, 4
    envs = vecaccel.make_vec(
        [capped_cartpole] * B, backend="serial", autoreset_mode=mode, copy=copy
    )
    try:
        sampler = Sampler(envs, SeededPolicy(1), horizon=T, seed=seed, episode_stats="rewards")
        batches = [snapshot(sampler.collect()) for _ in range(2)]
    finally:
        envs.close()

    reference = gym.vector.SyncVectorEnv([capped_cartpole] * B, autoreset_mode=AutoresetMode(mode))
    try:
        obs, _ = reference.reset(seed=seed)
        pending = np.zeros(B, dtype=bool)
        truncations = 0
        for batch in batches:
            finals = []
            for t in range(T):
                np.testing.assert_array_equal(batch["obs"][t].numpy(), obs, err_msg=f"t={t}")
                obs, rew, term, trunc, infos = reference.step(batch["actions"][t].numpy())
                np.testing.assert_array_equal(batch["rewards"][t].numpy(), rew.astype(np.float32))
                np.testing.assert_array_equal(batch["terminated"][t].numpy(), term)
                np.testing.assert_array_equal(batch["truncated"][t].numpy(), trunc)
                valid = ~pending if mode == "NextStep" else np.ones(B, dtype=bool)
                np.testing.assert_array_equal(batch["valid"][t].numpy(), valid)
                for b in np.flatnonzero(trunc & ~term & valid):
                    final = infos["final_obs"][b] if mode == "SameStep" else obs[b]
                    finals.append(((t, int(b)), np.array(final)))
                done = (term | trunc) & valid
                if mode == "NextStep":
                    pending = done
                if mode == "Disabled" and done.any():
                    obs, _ = reference.reset(options={"reset_mask": done})
            np.testing.assert_array_equal(batch["next_obs"].numpy(), obs)
            finals.sort(key=lambda item: item[0])
            assert batch["final_index"].tolist() == [list(index) for index, _ in finals]
            for k, (index, final) in enumerate(finals):
                np.testing.assert_array_equal(batch["final_obs"][k].numpy(), final, str(index))
            truncations += len(finals)
        assert truncations >= 3
    finally:
        reference.close()


@pytest.mark.parametrize("episode_stats", ["infos", "auto"])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_sampler_episode_stats_from_gymnasiums_vector_record_episode_statistics(
    mode, episode_stats
):
    """``RecordEpisodeStatistics`` as a vector wrapper (Gymnasium's for vector envs) puts
    ``info["episode"]`` at the top level in every mode, with ``info["_episode"]`` the wrapper's
    own ``prev_dones`` array. The Sampler finds it there in every mode (not only in
    ``final_info`` under SAME_STEP), and under DISABLED reads the mask before its masked reset
    clears that very array."""
    results = {}
    for source in ("rewards", episode_stats):
        envs = RecordEpisodeStatistics(
            vecaccel.make_vec(
                [functools.partial(capped_cartpole, 12)] * 3, backend="serial", autoreset_mode=mode
            )
        )
        try:
            sampler = Sampler(envs, observation_policy, horizon=30, seed=0, episode_stats=source)
            sampler.collect()
            results[source] = sampler.pop_episodes()
        finally:
            envs.close()
    assert len(results["rewards"].returns) >= 6
    assert results[episode_stats] == results["rewards"]


def test_sampler_on_async_keeps_each_env_in_its_own_column():
    """``async`` with ``batch_size == num_envs`` (its default) returns all envs, in the order
    they finished (``info["env_id"]``). The Sampler places rows by env id (or refuses the env),
    so that no column mixes several envs' trajectories, as writing rows by position would."""
    fns = [functools.partial(tagged_counter, 0, sleep_on={1: 0.2})] + [
        functools.partial(tagged_counter, tag) for tag in range(1, 4)
    ]
    envs = vecaccel.make_vec(fns, backend="async", num_workers=2)
    try:
        try:
            sampler = Sampler(envs, SeededPolicy(0, high=3), horizon=4, seed=0)
        except ValueError:
            return  # refusing an env that returns envs out of order is a correct answer
        batch = sampler.collect()
    finally:
        envs.close()
    tags = batch.obs[..., 0]  # CounterEnv observes [its tag, its step count]
    expected = torch.arange(4, dtype=tags.dtype).expand_as(tags)
    assert torch.equal(tags, expected), tags
    assert torch.equal(batch.next_obs[:, 0], torch.arange(4, dtype=tags.dtype))


def test_sampler_accepts_a_numpy_policy_on_the_alternating_action_server():
    """NumPy actions and extras work on every backend (``_store_policy_output`` converts them),
    the alternating action server included, whose stash must not call ``actions.clone()``."""
    results = {}
    for backend, options in (
        ("serial", {}),
        ("action_server", {"device": "cpu", "alternating": True, "num_workers": 2}),
    ):
        envs = vecaccel.make_vec([capped_cartpole] * 4, backend=backend, **options)
        try:
            sampler = Sampler(envs, numpy_policy, horizon=3, seed=2)
            results[backend] = [snapshot(sampler.collect()) for _ in range(2)]
        finally:
            envs.close()
    assert_same_batches(results["serial"], results["action_server"])


@pytest.mark.parametrize("horizon", [1, 3])
@pytest.mark.parametrize("mode", ["SameStep", "NextStep"])
def test_sampler_short_horizons_on_the_alternating_action_server_equal_serial(mode, horizon):
    """Horizon 1 and an odd horizon: the half that finishes first acts once more and that
    action becomes its row 0 of the next batch; every batch still equals serial's."""
    results = {}
    for backend, options in (
        ("serial", {}),
        ("action_server", {"device": "cpu", "alternating": True, "num_workers": 2}),
    ):
        envs = vecaccel.make_vec(
            [functools.partial(capped_cartpole, 4)] * 4,
            backend=backend,
            autoreset_mode=mode,
            **options,
        )
        try:
            sampler = Sampler(envs, observation_policy, horizon=horizon, seed=1)
            batches = [snapshot(sampler.collect()) for _ in range(8 // horizon + 1)]
            results[backend] = (batches, sampler.pop_episodes())
        finally:
            envs.close()
    assert_same_batches(results["serial"][0], results["action_server"][0])
    assert sorted(results["serial"][1].returns) == sorted(results["action_server"][1].returns)
    assert results["serial"][1].returns  # episodes of 4 steps did end
