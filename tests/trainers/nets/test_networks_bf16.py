"""bfloat16 autocast and channels_last leave PPO's learning unchanged on a real Pong batch.

One batch is collected from real ``PongNoFrameskip-v4`` envs with the standard Atari set-up;
then an fp32 NCHW model and copies of the same weights in fp32 channels_last, bf16 autocast NCHW
and bf16 autocast channels_last are compared on it: the policy and values, the PPO loss and its gradient, and the policy after a full PPO
update (4 epochs of minibatches, the same shuffles). The bounds are generous multiples of what
was measured (see each assert), so they check that bf16 changes the numbers by rounding only,
not that it is fast; the test is deterministic (fixed seeds, fixed thread count).
"""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

pytest.importorskip("ale_py")

from vecaccel.trainers import PPO
from vecaccel.trainers.nets.networks import ActorCritic, NatureCNN, bf16_autocast_helps

ENV_ID = "PongNoFrameskip-v4"


def _policy_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) of two categorical policies given by their logits."""
    p_log, q_log = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (p_log.exp() * (p_log - q_log)).sum(-1).mean()


def _logits_values(model: ActorCritic, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return model._heads(obs)


@pytest.fixture(scope="module")
def pong_batch():
    """A 2-env x 64-step batch of real Pong frames and an fp32 NCHW agent that collected it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    agent = PPO(
        ENV_ID,
        backend="serial",
        num_envs=2,
        num_steps=64,
        num_minibatches=2,
        update_epochs=4,
        bf16="off",
        channels_last=False,
        seed=0,
        tensorboard=False,
    )
    try:
        agent.sampler.reset(seed=0)
        # a few rollouts so the frames hold moving paddles and ball, not only the start screen
        for _ in range(2):
            batch = agent.sampler.collect()
        batch = type(batch)(*(copy.deepcopy(field) for field in batch))
        yield agent, batch
    finally:
        agent.close()
        torch.set_num_threads(threads)


def _twin(agent: PPO, bf16: bool = True, channels_last: bool = True) -> PPO:
    """An env-less PPO agent with ``agent``'s weights and optimizer state and the given format."""
    twin = PPO(
        None,
        observation_space=agent.observation_space,
        action_space=agent.action_space,
        **{
            **vars(agent.config),
            "bf16": "on" if bf16 else "off",
            "channels_last": channels_last,
            "tensorboard": False,
        },
    )
    assert twin.model.encoder.bf16 == bf16
    assert twin.model.encoder.channels_last == channels_last
    twin.model.load_state_dict(agent.model.state_dict())
    twin.optimizer.load_state_dict(agent.optimizer.state_dict())
    return twin


def _ppo_loss(model: ActorCritic, batch, clip_coef: float = 0.1) -> torch.Tensor:
    """The clipped PPO loss on the whole batch, with the batch's advantages approximated by
    its rewards-to-go minus the collected values (enough to give every head a gradient)."""
    obs = batch.obs.reshape(-1, *batch.obs.shape[2:])
    actions = batch.actions.reshape(-1)
    old_log_prob = batch.extras["log_prob"].reshape(-1)
    old_value = batch.extras["value"].reshape(-1)
    returns = batch.rewards.flip(0).cumsum(0).flip(0).reshape(-1)
    advantages = returns - old_value
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_prob, entropy, value = model.evaluate(obs, actions)
    ratio = (log_prob - old_log_prob).exp()
    pg_loss = torch.max(
        -advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)
    ).mean()
    return pg_loss - 0.01 * entropy.mean() + 0.5 * (value - returns).pow(2).mean()


def test_bf16_outputs_stay_float32(pong_batch):
    agent, batch = pong_batch
    twin = _twin(agent)
    obs = batch.obs[0]
    # the heads, and so everything the loss and the optimizer see, stay float32
    logits, value = twin.model._heads(obs)
    assert logits.dtype == torch.float32 and value.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in twin.model.parameters())
    log_prob, entropy, value = twin.model.evaluate(obs, batch.actions[0])
    assert {log_prob.dtype, entropy.dtype, value.dtype} == {torch.float32}


FORMATS = {"fp32-cl": (False, True), "bf16-nchw": (True, False), "bf16-cl": (True, True)}


def test_bf16_auto_follows_the_hardware(pong_batch):
    agent, _ = pong_batch
    auto = PPO(
        None,
        observation_space=agent.observation_space,
        action_space=agent.action_space,
        bf16="auto",
        tensorboard=False,
    )
    assert auto.model.encoder.bf16 == bf16_autocast_helps("cpu")
    # vector observations never get autocast: there is no CNN torso to speed up
    mlp = PPO(
        None,
        observation_space=gym.spaces.Box(-1, 1, (4,)),
        action_space=gym.spaces.Discrete(2),
        bf16="auto",
        tensorboard=False,
    )
    assert not isinstance(mlp.model.encoder, NatureCNN)


@pytest.mark.parametrize("fmt", FORMATS)
def test_bf16_forward_matches_fp32(pong_batch, fmt):
    agent, batch = pong_batch
    twin = _twin(agent, *FORMATS[fmt])
    obs = batch.obs.reshape(-1, *batch.obs.shape[2:])
    logits32, values32 = _logits_values(agent.model, obs)
    logits16, values16 = _logits_values(twin.model, obs)
    # measured: KL ~1e-9, mean value error ~3% of the mean |value| (bf16 keeps 8 mantissa bits)
    assert float(_policy_kl(logits32, logits16)) < 1e-5
    assert float((values32 - values16).abs().mean() / values32.abs().mean()) < 0.1


@pytest.mark.parametrize("fmt", FORMATS)
def test_bf16_loss_and_gradient_match_fp32(pong_batch, fmt):
    agent, batch = pong_batch
    twin = _twin(agent, *FORMATS[fmt])
    loss32 = _ppo_loss(agent.model, batch)
    loss16 = _ppo_loss(twin.model, batch)
    # measured: relative loss difference ~1e-2 (the value term)
    assert abs(loss32.item() - loss16.item()) <= 0.05 * abs(loss32.item()) + 1e-4
    grads32 = torch.autograd.grad(loss32, list(agent.model.parameters()))
    grads16 = torch.autograd.grad(loss16, list(twin.model.parameters()))
    flat32 = torch.cat([g.reshape(-1) for g in grads32])
    flat16 = torch.cat([g.reshape(-1) for g in grads16])
    # measured: cosine 0.99999 over all parameters, 0.9999 or more per tensor, norms within 1%
    assert float(torch.nn.functional.cosine_similarity(flat32, flat16, dim=0)) > 0.99
    assert float(flat16.norm() / flat32.norm()) == pytest.approx(1.0, abs=0.05)
    for (name, _), g32, g16 in zip(agent.model.named_parameters(), grads32, grads16):
        if g32.norm() > 0:
            cosine = torch.nn.functional.cosine_similarity(g32.reshape(-1), g16.reshape(-1), dim=0)
            assert float(cosine) > 0.99, name


@pytest.mark.parametrize("fmt", FORMATS)
def test_bf16_ppo_update_matches_fp32(pong_batch, fmt):
    agent, batch = pong_batch
    fp32 = _twin(agent, bf16=False, channels_last=False)  # the fixture's agent stays untouched
    twin = _twin(agent, *FORMATS[fmt])
    obs = batch.obs.reshape(-1, *batch.obs.shape[2:])
    logits_before, _ = _logits_values(fp32.model, obs)

    torch.manual_seed(123)  # the same minibatch shuffles in both updates
    metrics32 = fp32.update(batch, 1.0)
    torch.manual_seed(123)
    metrics16 = twin.update(batch, 1.0)

    logits32, _ = _logits_values(fp32.model, obs)
    logits16, _ = _logits_values(twin.model, obs)
    moved = float(_policy_kl(logits_before, logits32))
    apart = float(_policy_kl(logits32, logits16))
    assert moved > 0  # the update did change the policy
    # measured: the updated policies are ~1e4 times closer to each other (KL ~1e-7) than to
    # the policy they started from (KL ~1e-3)
    assert apart < 0.01 * moved
    for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
        assert metrics16[key] == pytest.approx(metrics32[key], rel=0.05, abs=1e-3), key


@pytest.mark.parametrize("fmt", ["fp32-nchw", *FORMATS])
def test_cnn_input_conversion_is_exact(fmt):
    """NatureCNN converts uint8 frames in one pass to bf16 or float32; it must give bit for bit
    what dividing in float32, re-laying out and letting autocast cast would give."""
    bf16, channels_last = FORMATS.get(fmt, (False, False))
    torch.manual_seed(0)
    cnn = NatureCNN(channels_last=channels_last, bf16=bf16)
    frames = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    frames[0].view(-1)[:256] = torch.arange(256, dtype=torch.uint8)  # every value once
    reference = frames.float() / 255.0
    if channels_last:
        reference = reference.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        expected = cnn.linear(cnn.convs(reference)).float()
    assert torch.equal(cnn(frames), expected)
