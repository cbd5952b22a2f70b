"""SB3's A2C and PPO beside vecaccel's: the same weights, the same rollout and the same random
draws, so that an update or a whole run can be compared parameter by parameter.

Nothing here imports SB3: the tests that use it skip without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch


def short_cartpole() -> gym.Env:
    """CartPole cut at 12 steps: a rollout of 16 steps has truncations."""
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=12))


def sb3_parameter_pairs(model: Any, policy: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(SB3 parameter, the same parameter of vecaccel's ActorCritic)`` for the MLP policy."""
    twins = (policy.mlp_extractor.policy_net, policy.mlp_extractor.value_net)
    for twin, net in enumerate(twins):  # the TwinMLP's copy 0 is the actor, 1 the critic
        for layer, index in enumerate((0, 2)):  # Linear, Tanh, Linear, Tanh
            weight, bias = model.encoder.weights[layer][twin], model.encoder.biases[layer][twin]
            yield net[index].weight, weight.T
            yield net[index].bias, bias[0]
    for theirs_layer, our_layer in (
        (policy.action_net, model.actor_head),
        (policy.value_net, model.critic_head),
    ):
        yield theirs_layer.weight, our_layer.weight
        yield theirs_layer.bias, our_layer.bias


def copy_weights_to_sb3(model: Any, policy: Any) -> None:
    with torch.no_grad():
        for theirs_param, our_param in sb3_parameter_pairs(model, policy):
            theirs_param.copy_(our_param)


def assert_one_update_matches_sb3(ours: Any, theirs: Any, gamma: float, lam: float) -> None:
    """From the same weights and one rollout of ``ours``, one update of each side gives SB3's
    advantages and parameters.

    SB3's buffer is filled from our rollout with SB3's own truncation bootstrap
    (``reward += gamma * V(terminal_observation)``), so the comparison covers vecaccel's
    ``final_obs`` against it, GAE, the losses and the optimizer step.
    """
    from stable_baselines3.common.logger import configure

    from vecaccel.trainers.algos.on_policy.advantages import compute_gae

    theirs.set_logger(configure(None, []))
    model = ours.model
    copy_weights_to_sb3(model, theirs.policy)

    batch = ours.sampler.collect()
    T, B = batch.rewards.shape
    assert batch.terminated.any() and len(batch.final_index) > 0
    with torch.no_grad():
        final_values = model.value(batch.final_obs)
        last_values = model.value(batch.next_obs)
    rewards = batch.rewards.clone()
    rewards[batch.final_index[:, 0], batch.final_index[:, 1]] += gamma * final_values
    dones = (batch.terminated | batch.truncated).numpy()
    buffer = theirs.rollout_buffer
    buffer.reset()
    for t in range(T):
        buffer.add(
            batch.obs[t].numpy(),
            batch.actions[t].numpy().reshape(-1, 1),
            rewards[t].numpy(),
            dones[t - 1] if t else np.zeros(B, dtype=bool),
            batch.extras["value"][t],
            batch.extras["log_prob"][t],
        )
    buffer.compute_returns_and_advantage(last_values, dones[-1])
    advantages, _ = compute_gae(
        batch.rewards, batch.extras["value"], last_values, batch.terminated, batch.truncated,
        final_values, batch.final_index, gamma, lam,
    )  # fmt: skip
    np.testing.assert_allclose(advantages.numpy(), buffer.advantages, rtol=1e-5, atol=1e-5)

    theirs.train()
    ours.update(batch, progress_remaining=1.0)
    for theirs_param, our_param in sb3_parameter_pairs(model, theirs.policy):
        torch.testing.assert_close(theirs_param, our_param, rtol=1e-4, atol=1e-6)


def inverse_cdf_sample(self: Any) -> torch.Tensor:
    """SB3's ``CategoricalDistribution.sample`` as vecaccel samples: by inverse CDF from
    ``torch.rand`` (SB3's own ``torch.multinomial`` draws the same distribution from another
    random stream)."""
    cdf = self.distribution.logits.log_softmax(-1).exp().cumsum(-1)
    uniform = torch.rand(cdf.shape[:-1] + (1,), dtype=cdf.dtype)
    return (cdf < uniform).sum(-1).clamp_(max=cdf.shape[-1] - 1)


def learn_side_by_side(ours: Any, theirs: Any, total_timesteps: int) -> tuple[list, list]:
    """Both sides learn ``total_timesteps`` from the same weights and the same torch seed; the
    returns of the episodes each one ended, in order. ``ours`` is closed."""
    from stable_baselines3.common.callbacks import BaseCallback

    copy_weights_to_sb3(ours.model, theirs.policy)
    our_returns: list[float] = []
    sb3_returns: list[float] = []

    class Returns(BaseCallback):
        def _on_step(self) -> bool:
            sb3_returns.extend(i["episode"]["r"] for i in self.locals["infos"] if "episode" in i)
            return True

    torch.manual_seed(0)
    try:
        ours.learn(
            total_timesteps, callback=lambda a, m: our_returns.extend(a.last_episodes.returns)
        )
    finally:
        ours.close()
    torch.manual_seed(0)
    theirs.learn(total_timesteps, callback=Returns())
    return our_returns, sb3_returns
