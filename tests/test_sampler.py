"""The Sampler: time-major batches that mean the same thing on every backend and autoreset mode."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import vecaccel
from vecaccel.sampler import SampleBatch, Sampler

torch.set_num_threads(1)

BACKENDS = [b for b in ("serial", "shm") if b in vecaccel.list_backends()]
MODES = ["SameStep", "NextStep", "Disabled"]
HORIZON = 40
NUM_ENVS = 4
MAX_STEPS = 12  # short episodes: both truncations (time limit) and terminations happen


def short_cartpole() -> gym.Env:
    return gym.wrappers.RecordEpisodeStatistics(
        gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    )


def backend_options(backend: str) -> dict:
    return {"num_workers": 2} if backend in ("shm", "action_server") else {}


def make_envs(backend: str, mode: str, **options) -> gym.vector.VectorEnv:
    return vecaccel.make_vec(
        [short_cartpole] * NUM_ENVS,
        backend=backend,
        autoreset_mode=mode,
        **{**backend_options(backend), **options},
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
