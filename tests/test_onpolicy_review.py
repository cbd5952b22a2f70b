"""Review of the on-policy trainers (PPO, A2C) against CleanRL / SB3 and hand computations.

Passing tests pin maths checked by hand; failing tests demonstrate defects (see their messages).
"""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import vecaccel
import vecaccel.trainers.algorithm as algorithm
from vecaccel.sampler import SampleBatch
from vecaccel.trainers import A2C, PPO
from vecaccel.trainers.advantages import compute_gae
from vecaccel.trainers.optim import FlatAdam

torch.set_num_threads(1)

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


# -- GAE, by hand -------------------------------------------------------------------------------


class _NotCpu(torch.Tensor):
    """A CPU tensor that reports another device, to run compute_gae's torch (accelerator)
    recursion on this machine; the CPU path is NumPy's."""

    @property
    def device(self):
        return torch.device("meta")


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_gae_truncation_bootstraps_from_final_obs_and_termination_from_zero_by_hand(path):
    """gamma 0.9, lambda 0.5. Env 0 truncated at t=1 with V(final_obs)=10; env 1 terminated
    at t=1. Worked by hand:
    env 0: d2 = 3 + .9*4 - 1.5 = 5.1; d1 = 2 + .9*10 - 1 = 10 (chain cut); d0 = 1 + .9 - .5 = 1.4,
           A0 = 1.4 + .45*10 = 5.9
    env 1: d2 = 1 + 3.6 - 2 = 2.6; d1 = 1 + 0 - 2 = -1; d0 = 1 + 1.8 - 2 = .8, A0 = .8 - .45 = .35
    """
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 2.0], [1.0, 2.0], [1.5, 2.0]])
    terminated = torch.tensor([[False, False], [False, True], [False, False]])
    truncated = torch.tensor([[False, False], [True, False], [False, False]])
    wrap = (lambda x: x) if path == "numpy" else (lambda x: x.as_subclass(_NotCpu))
    advantages, returns = compute_gae(
        wrap(rewards), wrap(values), wrap(torch.tensor([4.0, 4.0])), wrap(terminated),
        wrap(truncated), wrap(torch.tensor([10.0])), torch.tensor([[1, 0]]), 0.9, 0.5,
    )  # fmt: skip
    advantages = advantages.as_subclass(torch.Tensor)
    returns = returns.as_subclass(torch.Tensor)
    expected = torch.tensor([[5.9, 0.35], [10.0, -1.0], [5.1, 2.6]])
    torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(returns, expected + values, rtol=1e-6, atol=1e-5)


# -- PPO with several minibatches against a CleanRL-style reference ------------------------------


def _reference_gae(rewards, values, next_value, terminated, truncated, finals, gamma, lam):
    T, B = rewards.shape
    adv = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        last = 0.0
        for t in reversed(range(T)):
            if terminated[t, b]:
                nv = 0.0
            elif truncated[t, b]:
                nv = finals[(t, b)]
            else:
                nv = values[t + 1, b] if t + 1 < T else next_value[b]
            delta = rewards[t, b] + gamma * nv - values[t, b]
            done = bool(terminated[t, b] or truncated[t, b])
            last = delta + (0.0 if done else gamma * lam * last)
            adv[t, b] = last
    return adv


def _synthetic_batch(agent, T=6, B=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, B, 3, generator=g)
    actions = torch.randint(0, 2, (T, B), generator=g)
    with torch.no_grad():
        logp, _, value = agent.model.evaluate(obs.reshape(-1, 3), actions.reshape(-1))
    # behaviour policy and values differ from the current ones, so clipping bites
    old_logp = (logp + 0.3 * torch.randn(T * B, generator=g)).reshape(T, B)
    old_value = (value + 0.5 * torch.randn(T * B, generator=g)).reshape(T, B)
    terminated = torch.zeros(T, B, dtype=torch.bool)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    terminated[2, 0] = terminated[4, 3] = True
    truncated[1, 1] = truncated[5, 2] = True
    final_index = torch.tensor([[1, 1], [5, 2]])
    final_obs = torch.randn(2, 3, generator=g)
    return SampleBatch(
        obs=obs,
        actions=actions,
        rewards=torch.randn(T, B, generator=g),
        terminated=terminated,
        truncated=truncated,
        valid=torch.ones(T, B, dtype=torch.bool),
        extras={"log_prob": old_logp, "value": old_value},
        next_obs=torch.randn(B, 3, generator=g),
        final_obs=final_obs,
        final_index=final_index,
    )


@pytest.mark.parametrize("target_kl", [None, 0.0], ids=["no-kl-stop", "kl-stop"])
def test_ppo_minibatch_update_matches_cleanrl_reference(target_kl, monkeypatch):
    """3 epochs x 4 minibatches of 6 from a 24-sample batch with terminations and
    truncations: per-minibatch advantage normalisation, clipped surrogate, clipped value loss
    (MSE, SB3's scale), entropy bonus, global grad-norm clip, Adam(eps=1e-5), each sample once
    per epoch, CleanRL's target_kl break after the epoch. Same minibatch permutations."""
    cfg = dict(gamma=0.97, gae_lambda=0.9, update_epochs=3, num_minibatches=4, clip_coef=0.2,
               clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
               learning_rate=3e-3, target_kl=target_kl)  # fmt: skip
    agent = PPO(None, env_id="CartPole-v1", observation_space=OBS,
                action_space=gym.spaces.Discrete(2), backend="serial", num_envs=4, num_steps=6,
                torch_threads=1, seed=0, **cfg)  # fmt: skip
    assert isinstance(agent.optimizer, FlatAdam)
    ref = copy.deepcopy(agent.model)
    batch = _synthetic_batch(agent)

    perms: list[torch.Tensor] = []
    randperm = torch.randperm

    def recording_randperm(*args, **kwargs):
        perm = randperm(*args, **kwargs)
        perms.append(perm.clone())
        return perm

    monkeypatch.setattr(torch, "randperm", recording_randperm)
    agent.update(batch, progress_remaining=1.0)
    monkeypatch.undo()

    # -- the reference, written from CleanRL's ppo.py --
    T, B = 6, 4
    n, mbs = T * B, 6
    for perm in perms:
        assert sorted(perm.tolist()) == list(range(n)), "each sample once per epoch"
    with torch.no_grad():
        finals_v = ref.value(batch.final_obs).double()
        next_v = ref.value(batch.next_obs).double()
    finals = {(1, 1): float(finals_v[0]), (5, 2): float(finals_v[1])}
    values = batch.extras["value"].double()
    adv = _reference_gae(batch.rewards.double(), values, next_v, batch.terminated,
                         batch.truncated, finals, cfg["gamma"], cfg["gae_lambda"])  # fmt: skip
    b_adv = adv.reshape(-1).float()
    b_ret = (adv + values).reshape(-1).float()
    b_obs, b_act = batch.obs.reshape(-1, 3), batch.actions.reshape(-1)
    b_logp, b_val = batch.extras["log_prob"].reshape(-1), batch.extras["value"].reshape(-1)
    opt = torch.optim.Adam(ref.parameters(), lr=cfg["learning_rate"], eps=1e-5)
    clip = cfg["clip_coef"]
    steps = 0
    for epoch in range(cfg["update_epochs"]):
        perm = perms[epoch]
        for start in range(0, n, mbs):
            mb = perm[start : start + mbs]
            newlogp, entropy, newv = ref.evaluate(b_obs[mb], b_act[mb])
            logratio = newlogp - b_logp[mb]
            ratio = logratio.exp()
            approx_kl = ((ratio - 1) - logratio).mean()
            a = b_adv[mb]
            a = (a - a.mean()) / (a.std() + 1e-8)
            pg = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_unclipped = (newv - b_ret[mb]) ** 2
            v_clipped = b_val[mb] + (newv - b_val[mb]).clamp(-clip, clip)
            v = torch.max(v_unclipped, (v_clipped - b_ret[mb]) ** 2).mean()
            loss = pg - cfg["ent_coef"] * entropy.mean() + cfg["vf_coef"] * v
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg["max_grad_norm"])
            opt.step()
            steps += 1
        if target_kl is not None and approx_kl > target_kl:
            break

    assert agent.optimizer.steps == steps, (
        f"expected {steps} optimizer steps (CleanRL's loop), vecaccel took {agent.optimizer.steps}"
    )
    for ours, theirs in zip(agent.model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-6)


# -- learning-rate annealing and A2C's single RMSprop step ---------------------------------------


@pytest.mark.parametrize("algo", [PPO, A2C], ids=["ppo", "a2c"])
def test_lr_anneals_linearly_per_update_as_cleanrl_and_a2c_steps_once(algo):
    """CleanRL: lr_i = lr * (1 - i / num_iterations), i = 0..N-1, set before the rollout."""
    seen = []
    agent = algo("CartPole-v1", backend="serial", num_envs=2, num_steps=4, torch_threads=1,
                 seed=0, learning_rate=1e-3, anneal_lr=True,
                 **({"update_epochs": 1, "num_minibatches": 1} if algo is PPO else {}))  # fmt: skip
    try:
        agent.learn(
            40,  # 5 updates of 8
            callback=lambda a, m: seen.append(
                (m["charts/learning_rate"], a.optimizer.param_groups[0]["lr"], a.optimizer.steps)
            ),
        )
    finally:
        agent.close()
    expected = [1e-3 * (1 - i / 5) for i in range(5)]
    assert [s[0] for s in seen] == pytest.approx(expected)
    assert [s[1] for s in seen] == pytest.approx(expected)
    assert [s[2] for s in seen] == [1, 2, 3, 4, 5], "one optimizer step per rollout"
    if algo is A2C:
        group = agent.optimizer.param_groups[0]
        assert (group["alpha"], group["eps"]) == (0.99, 1e-5)  # SB3's A2C RMSprop


# -- Box actions ----------------------------------------------------------------------------------


class _WideBoxEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-0.5, 0.5, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(3, 0.1 * self.t, np.float32), 0.0, False, self.t >= 4, {}


def test_box_batch_keeps_unclipped_actions_with_their_gaussian_log_prob():
    """The stored action is the raw sample (outside [-0.5, 0.5] here) and the stored log-prob
    is log N(a; mu, sigma) of that raw sample, by hand from the network's mean and log_std."""
    envs = vecaccel.make_vec([_WideBoxEnv] * 2, backend="serial", autoreset_mode="SameStep")
    agent = PPO(envs, num_envs=2, num_steps=8, torch_threads=1, seed=0)
    try:
        with torch.no_grad():
            agent.model.log_std.fill_(0.5)
        batch = agent.sampler.collect()
        actions = batch.actions.reshape(-1, 2)
        assert (actions.abs() > 0.5).any(), "the test needs samples outside the bounds"
        with torch.no_grad():
            mean = agent.model.actor_head(agent.model._features(batch.obs.reshape(-1, 3))[0])
        var = math.exp(0.5) ** 2
        by_hand = (-((actions - mean) ** 2) / (2 * var) - 0.5 - 0.5 * math.log(2 * math.pi)).sum(-1)
        torch.testing.assert_close(batch.extras["log_prob"].reshape(-1), by_hand, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    finally:
        envs.close()


class _MatrixActionEnv(gym.Env):
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


def test_multi_axis_box_actions_have_the_space_shape():
    """SB3 reshapes the Gaussian's flat sample to ``action_space.shape``; vecaccel's
    ActorCritic returns ``[N, prod(shape)]`` and never reshapes, so the sampler's clip to
    ``low``/``high`` (shape (2, 2)) and ``predict`` fail to broadcast."""
    envs = vecaccel.make_vec([_MatrixActionEnv] * 2, backend="serial", autoreset_mode="SameStep")
    try:
        agent = PPO(envs, num_envs=2, num_steps=4, update_epochs=1, torch_threads=1, seed=0)
        try:
            action, _ = agent.predict(np.zeros(3, np.float32), deterministic=True)
        except ValueError as exc:
            pytest.fail(f"predict on a Box(2, 2) action space should give a (2, 2) action, "
                        f"raised ValueError: {exc}")  # fmt: skip
        assert np.shape(action) == (2, 2), f"expected a (2, 2) action, got {np.shape(action)}"
        try:
            agent.learn(8)
        except ValueError as exc:
            pytest.fail(f"PPO on a Box(2, 2) action space should train, raised: {exc}")
    finally:
        envs.close()


# -- unsupported action spaces must not leak the env ---------------------------------------------


def test_refused_action_space_closes_the_env_it_built(monkeypatch):
    """A MultiDiscrete action space is refused (TypeError) after the trainer has built its
    envs (worker processes for shm); the observation-space refusal closes them, this one
    does not."""
    closed: list[bool] = []
    make = algorithm.make_env_for_training

    def make_and_spy(*args, **kwargs):
        env = make(*args, **kwargs)
        env.single_action_space = gym.spaces.MultiDiscrete([2, 3])
        close = env.close

        def spy_close(*a, **k):
            closed.append(True)
            return close(*a, **k)

        env.close = spy_close
        return env

    monkeypatch.setattr(algorithm, "make_env_for_training", make_and_spy)
    with pytest.raises(TypeError, match="MultiDiscrete"):
        PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=4, torch_threads=1)
    assert closed, "the trainer raised for its action space but left the envs it built open"


# -- config validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algo, field, value",
    [
        (PPO, "learning_rate", -1e-3),
        (PPO, "learning_rate", float("nan")),
        (A2C, "learning_rate", -7e-4),
        (PPO, "clip_coef", -0.1),
        (PPO, "max_grad_norm", -0.5),
        (PPO, "target_kl", -0.01),
        (PPO, "bf16", "bogus"),
        (A2C, "rms_alpha", 1.5),
    ],
    ids=["ppo-lr-negative", "ppo-lr-nan", "a2c-lr-negative", "clip-coef-negative",
         "max-grad-norm-negative", "target-kl-negative", "bf16-bogus", "rms-alpha-above-1"],
)  # fmt: skip
def test_bad_config_values_are_refused_naming_the_field(algo, field, value):
    """``--activation bogus`` and ``num_envs=0`` are ValueErrors naming the field; these values
    are accepted and train silently (a negative learning rate ascends the loss, NaN makes every
    parameter NaN, ``bf16='bogus'`` is quietly 'off', a negative clip_coef inverts the clamp)."""
    config = algo.config_cls
    try:
        config(**{field: value})
    except ValueError as exc:
        assert field in str(exc), f"the error should name {field!r}: {exc}"
        return
    pytest.fail(f"{config.__name__}({field}={value!r}) was accepted; expected a ValueError "
                f"naming {field!r}")  # fmt: skip


# -- the atari preset against CleanRL's ppo_atari.py -----------------------------------------------


def test_atari_preset_loss_is_cleanrl_ppo_atari_loss(monkeypatch):
    """PRESETS["atari"] is documented as "the standard Atari PPO (baselines, CleanRL
    ppo_atari.py)". Both write ``v_loss = 0.5 * mean(max(...))`` and ``vf_coef=0.5``, so the
    value term weighs 0.25 x MSE; vecaccel's value loss is the plain MSE (SB3's convention)
    with the same ``vf_coef=0.5``: twice CleanRL's weight on the value term of a shared torso
    (and the 0.5 grad-norm clip is reached sooner).

    The reference below is CleanRL's loss with CleanRL's own ``vf_coef=0.5`` (as first written
    it took the preset's ``vf_coef``, which after the fix is 0.25, and would have asked for
    0.125 x MSE: half CleanRL's weight)."""
    from vecaccel.trainers.ppo import PRESETS

    preset = PRESETS["atari"]
    settings = {k: preset[k] for k in ("clip_coef", "ent_coef", "vf_coef", "learning_rate")}
    agent = PPO(None, env_id="CartPole-v1", observation_space=OBS,
                action_space=gym.spaces.Discrete(2), backend="serial", num_envs=4, num_steps=6,
                update_epochs=1, num_minibatches=1, torch_threads=1, seed=0,
                **settings)  # fmt: skip
    batch = _synthetic_batch(agent)
    ref = copy.deepcopy(agent.model)
    losses = []
    monkeypatch.setattr(
        agent, "backward_step", lambda loss, clip: losses.append(float(loss.detach()))
    )
    agent.update(batch, progress_remaining=1.0)

    with torch.no_grad():
        next_v = ref.value(batch.next_obs)
        finals = ref.value(batch.final_obs)
        adv, ret = compute_gae(batch.rewards, batch.extras["value"], next_v, batch.terminated,
                               batch.truncated, finals, batch.final_index, 0.99, 0.95)  # fmt: skip
        newlogp, entropy, newv = ref.evaluate(batch.obs.reshape(-1, 3), batch.actions.reshape(-1))
        a, ret = adv.reshape(-1), ret.reshape(-1)
        a = (a - a.mean()) / (a.std() + 1e-8)
        old_v = batch.extras["value"].reshape(-1)
        ratio = (newlogp - batch.extras["log_prob"].reshape(-1)).exp()
        c = settings["clip_coef"]
        pg = torch.max(-a * ratio, -a * ratio.clamp(1 - c, 1 + c)).mean()
        v_clipped = old_v + (newv - old_v).clamp(-c, c)
        v_loss = 0.5 * torch.max((newv - ret) ** 2, (v_clipped - ret) ** 2).mean()  # CleanRL
        cleanrl_vf_coef = 0.5  # ppo_atari.py's default
        cleanrl = pg - settings["ent_coef"] * entropy.mean() + cleanrl_vf_coef * v_loss
    assert losses[0] == pytest.approx(float(cleanrl), rel=1e-5), (
        f"the atari preset's loss should be CleanRL ppo_atari's ({float(cleanrl):.6f}); got "
        f"{losses[0]:.6f}, whose value term is {settings['vf_coef']} x MSE instead of "
        f"{cleanrl_vf_coef} x 0.5 x MSE"
    )
