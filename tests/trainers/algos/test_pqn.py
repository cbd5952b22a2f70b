"""PQN: its λ-returns by hand and as properties, its ε schedule and ε-greedy acting, LayerNorm in
its Q-network, and training on real envs (CartPole, MinAtar) synchronously and asynchronously,
saved, loaded and resumed, from Python and from the command line."""

from __future__ import annotations

import csv
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.sampler import SampleBatch
from vecaccel.trainers import PQN
from vecaccel.trainers.algos.on_policy.advantages import compute_gae
from vecaccel.trainers.algos.pqn import EpsilonGreedyQ, q_lambda_returns
from vecaccel.trainers.checkpoints.format import load_checkpoint

torch.set_num_threads(1)

#: a tiny CartPole run: 2 envs x 8 steps, 4 minibatches of 4
TINY = dict(
    backend="serial",
    num_envs=2,
    num_steps=8,
    num_minibatches=4,
    hidden_sizes=(16,),
    seed=0,
    device="cpu",
    torch_threads=1,
    progress=False,
    tensorboard=False,
)


def _spaces_agent(**extra: Any) -> PQN:
    """An agent without envs over CartPole-like spaces, for updates on batches made by hand."""
    settings: dict[str, Any] = dict(preset=None, hidden_sizes=(16,), seed=3, device="cpu")
    return PQN(
        None,
        observation_space=gym.spaces.Box(-5.0, 5.0, (4,), np.float32),
        action_space=gym.spaces.Discrete(3),
        **{**settings, **extra},
    )


# -- the λ-returns, by hand --------------------------------------------------------------------


def test_lambda_returns_by_hand():
    """gamma 0.9, lambda 0.5; env 0 runs on past the rollout, env 1 terminates at t=0 and is
    truncated at t=1 (its final observation's max-Q is 40). Worked by hand:
    env 0: G2 = 2 + .9*30 = 29; G1 = 0 + .9*(.5*20 + .5*29) = 22.05;
           G0 = 1 + .9*(.5*10 + .5*22.05) = 15.4225
    env 1: G2 = 3 + .9*50 = 48; G1 = 2 + .9*40 = 38 (no λ-mix across the end);
           G0 = 1 (terminal: the 99 after it is never read)
    """
    rewards = torch.tensor([[1.0, 1.0], [0.0, 2.0], [2.0, 3.0]])
    next_max_q = torch.tensor([[10.0, 99.0], [20.0, 40.0], [30.0, 50.0]])
    terminated = torch.tensor([[False, True], [False, False], [False, False]])
    truncated = torch.tensor([[False, False], [False, True], [False, False]])
    returns = q_lambda_returns(rewards, next_max_q, terminated, truncated, 0.9, 0.5)
    expected = torch.tensor([[15.4225, 1.0], [22.05, 38.0], [29.0, 48.0]])
    torch.testing.assert_close(returns, expected)


# -- the λ-returns, as properties ----------------------------------------------------------------


@st.composite
def rollouts(draw: Any) -> dict[str, Any]:
    """A ``[T, B]`` rollout: rewards, next max-Q values, and each step terminated, truncated
    or neither."""
    T = draw(st.integers(1, 6))
    B = draw(st.integers(1, 3))
    numbers = st.floats(-10.0, 10.0, allow_nan=False, width=32)
    rewards = np.array(draw(st.lists(numbers, min_size=T * B, max_size=T * B)), np.float32)
    next_max_q = np.array(draw(st.lists(numbers, min_size=T * B, max_size=T * B)), np.float32)
    ends = np.array(draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=T * B,
                                  max_size=T * B))).reshape(T, B)  # fmt: skip
    return dict(
        rewards=torch.from_numpy(rewards.reshape(T, B)),
        next_max_q=torch.from_numpy(next_max_q.reshape(T, B)),
        terminated=torch.from_numpy(ends == 1),
        truncated=torch.from_numpy(ends == 2),
        gamma=draw(st.floats(0.0, 1.0)),
    )


def _monte_carlo(rollout: dict[str, Any]) -> torch.Tensor:
    """Each step's discounted rewards to its episode's end, plus the discounted max-Q where the
    episode was truncated or the rollout ends: a plain loop."""
    r, q = rollout["rewards"].double(), rollout["next_max_q"].double()
    term, trunc, gamma = rollout["terminated"], rollout["truncated"], rollout["gamma"]
    T, B = r.shape
    out = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                total += discount * float(r[k, b])
                if term[k, b]:
                    break
                if trunc[k, b] or k == T - 1:
                    total += discount * gamma * float(q[k, b])
                    break
                discount *= gamma
            out[t, b] = total
    return out


@settings(max_examples=60, deadline=None)
@given(rollouts())
def test_lambda_zero_gives_one_step_targets(rollout):
    returns = q_lambda_returns(**rollout, q_lambda=0.0)
    not_terminal = (~rollout["terminated"]).float()
    one_step = rollout["rewards"] + rollout["gamma"] * not_terminal * rollout["next_max_q"]
    torch.testing.assert_close(returns, one_step, rtol=1e-5, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(rollouts())
def test_lambda_one_gives_monte_carlo_returns_bootstrapped_at_the_end(rollout):
    returns = q_lambda_returns(**rollout, q_lambda=1.0)
    torch.testing.assert_close(returns.double(), _monte_carlo(rollout), rtol=1e-4, atol=1e-3)


@settings(max_examples=60, deadline=None)
@given(rollouts(), st.floats(0.0, 1.0), st.data())
def test_lambda_returns_are_gae_returns_on_the_max_q_values(rollout, q_lambda, data):
    """TD(λ) returns with ``V(s) = max_a Q(s, a)`` are GAE's ``advantages + values``: the same
    targets from the equations of the on-policy family's GAE, truncations and all."""
    T, B = rollout["rewards"].shape
    numbers = st.floats(-10.0, 10.0, allow_nan=False, width=32)
    values = torch.tensor(data.draw(st.lists(numbers, min_size=T * B, max_size=T * B))).view(T, B)
    next_value = torch.tensor(data.draw(st.lists(numbers, min_size=B, max_size=B)))
    final_index = rollout["truncated"].nonzero()
    final_values = torch.tensor(
        data.draw(st.lists(numbers, min_size=len(final_index), max_size=len(final_index)))
    )
    # the max-Q after each step: the next row's, next_value's at the end, the final one's at a cut
    next_max_q = torch.cat([values[1:], next_value[None]])
    next_max_q[final_index[:, 0], final_index[:, 1]] = final_values
    _, gae_returns = compute_gae(
        rollout["rewards"],
        values,
        next_value,
        rollout["terminated"],
        rollout["truncated"],
        final_values,
        final_index,
        rollout["gamma"],
        q_lambda,
    )
    rollout["next_max_q"] = next_max_q
    returns = q_lambda_returns(**rollout, q_lambda=q_lambda)
    torch.testing.assert_close(returns, gae_returns, rtol=1e-4, atol=1e-3)


# -- the bootstraps of a batch -----------------------------------------------------------------


def test_a_truncated_step_bootstraps_from_its_final_observation_a_terminal_one_from_nothing():
    """The max-Q after each step of a batch: the next row's as recorded when acting, the
    batch's next observation's after the last row, the true final observation's at a
    truncation; a terminal step's target is its reward."""
    agent = _spaces_agent(gamma=0.9, q_lambda=0.5)
    g = torch.Generator().manual_seed(0)
    T, B = 3, 2
    obs = torch.randn(T, B, 4, generator=g)
    with torch.no_grad():
        max_q = agent.model(obs.reshape(T * B, 4)).max(dim=1).values.reshape(T, B)
    final_obs = torch.randn(1, 4, generator=g)
    batch = SampleBatch(
        obs=obs,
        actions=torch.zeros(T, B, dtype=torch.int64),
        rewards=torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 5.0]]),
        terminated=torch.tensor([[False, False], [False, False], [False, True]]),
        truncated=torch.tensor([[False, False], [True, False], [False, False]]),
        valid=torch.ones(T, B, dtype=torch.bool),
        extras={"max_q": max_q},
        next_obs=torch.randn(B, 4, generator=g),
        final_obs=final_obs,
        final_index=torch.tensor([[1, 0]]),
    )
    with torch.no_grad():
        final_q = agent.model(final_obs).max(dim=1).values[0]
        last_q = agent.model(batch.next_obs).max(dim=1).values
    next_max_q = agent.next_max_q(batch)
    assert next_max_q[0, 0] == max_q[1, 0] and next_max_q[1, 1] == max_q[2, 1]
    assert next_max_q[1, 0] == final_q  # not the next row's, which starts a new episode
    torch.testing.assert_close(next_max_q[2], last_q)
    returns = q_lambda_returns(
        batch.rewards, next_max_q, batch.terminated, batch.truncated, 0.9, 0.5
    )
    assert returns[2, 1] == 5.0
    torch.testing.assert_close(returns[1, 0], 2.0 + 0.9 * final_q)


# -- acting and ε ------------------------------------------------------------------------------


def test_epsilon_greedy_acts_greedily_at_zero_and_uniformly_at_one():
    torch.manual_seed(0)
    network = torch.nn.Linear(4, 3)
    model = EpsilonGreedyQ(network, num_actions=3, action_start=-1, epsilon=0.0)
    obs = torch.randn(300, 4)
    actions, extras = model.explore(obs)
    q = network(obs)
    torch.testing.assert_close(actions, q.argmax(dim=1) - 1)  # in the env's numbering
    torch.testing.assert_close(extras["max_q"], q.max(dim=1).values)
    model.epsilon.fill_(1.0)
    actions, _ = model.explore(obs)
    counts = torch.bincount(actions + 1, minlength=3)
    assert set(actions.tolist()) == {-1, 0, 1} and counts.min() > 60


def test_epsilon_decays_over_the_first_fraction_of_the_updates():
    agent = _spaces_agent(start_epsilon=1.0, end_epsilon=0.05, exploration_fraction=0.1)
    assert agent.epsilon(1.0) == 1.0
    assert agent.epsilon(0.95) == pytest.approx(0.525)
    assert agent.epsilon(0.9) == pytest.approx(0.05) and agent.epsilon(0.0) == 0.05
    # the value set goes into the weights the asynchronous rollout process receives: the
    # published tensors are the state dict's, updated in place
    published = dict(agent.model.state_dict())
    agent.apply_learning_rate(0.95)
    assert float(published["epsilon"]) == pytest.approx(0.525)


def test_each_rollout_is_acted_with_the_epsilon_of_its_update():
    """Ten updates of a run whose ε decays over the first half: each update reports the ε its
    rollout was collected with, and the learning rate anneals alongside."""
    seen: list[tuple[float, float]] = []
    agent = PQN("CartPole-v1", exploration_fraction=0.5, end_epsilon=0.0, **TINY)
    try:
        agent.learn(160, lambda agent, metrics: seen.append(
            (metrics["charts/epsilon"], metrics["charts/learning_rate"])))  # fmt: skip
    finally:
        agent.close()
    epsilons = [max(0.0, 1.0 - (k / 10) / 0.5) for k in range(10)]
    assert [e for e, _ in seen] == pytest.approx(epsilons)
    lr = agent.config.learning_rate
    assert [rate for _, rate in seen] == pytest.approx([lr * (1 - k / 10) for k in range(10)])


def test_predict_is_greedy_or_draws_from_its_own_generator():
    agent = _spaces_agent(eval_epsilon=1.0)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    with torch.no_grad():
        greedy = agent.model(torch.as_tensor(obs)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(agent.predict(obs, deterministic=True)[0], greedy)
    before = torch.get_rng_state()
    actions, _ = agent.predict(obs)
    assert torch.equal(torch.get_rng_state(), before)  # the run's draws are left alone
    assert set(actions.tolist()) == {0, 1, 2}


# -- the Q-network -------------------------------------------------------------------------------


@pytest.mark.parametrize("layer_norm", [True, False])
def test_layer_norm_is_a_setting_of_the_q_network(layer_norm):
    agent = _spaces_agent(layer_norm=layer_norm, hidden_sizes=(16, 8))
    norms = [m for m in agent.model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert [m.normalized_shape for m in norms] == ([(16,), (8,)] if layer_norm else [])
    if layer_norm:  # each hidden layer's features leave their LayerNorm at mean 0, variance 1
        outputs: list[torch.Tensor] = []
        for norm in norms:
            norm.register_forward_hook(lambda module, args, out: outputs.append(out))
        agent.model(torch.randn(32, 4))
        for out in outputs:
            torch.testing.assert_close(out.mean(dim=1), torch.zeros(32), atol=1e-5, rtol=0)
            torch.testing.assert_close(
                out.var(dim=1, unbiased=False), torch.ones(32), atol=1e-3, rtol=0
            )


def test_the_minatar_preset_is_purejaxqls_network_and_setting():
    from vecaccel.trainers.nets.networks import ChannelLayerNorm, MinAtarNet

    agent = PQN(None, env_id="MinAtar/Breakout-v0", device="cpu")
    cfg = agent.config
    assert cfg.preset == "minatar"
    assert (cfg.num_envs, cfg.num_steps, cfg.update_epochs, cfg.num_minibatches) == (128, 32, 2, 32)
    assert (cfg.q_lambda, cfg.gamma, cfg.learning_rate, cfg.max_grad_norm) == (0.65, 0.99, 5e-4, 10)
    assert (cfg.start_epsilon, cfg.end_epsilon, cfg.exploration_fraction) == (1.0, 0.05, 0.1)
    assert cfg.anneal_lr and cfg.loss == "mse" and isinstance(agent.optimizer, torch.optim.RAdam)
    torso = next(m for m in agent.model.modules() if isinstance(m, MinAtarNet))
    # conv -> LayerNorm over its 16 channels -> ReLU, then linear -> LayerNorm(128) -> ReLU
    assert [type(m) for m in torso.conv][:3] == [torch.nn.Conv2d, ChannelLayerNorm, torch.nn.ReLU]
    assert [type(m) for m in torso.linear] == [torch.nn.Linear, torch.nn.LayerNorm, torch.nn.ReLU]
    with pytest.raises(ValueError, match="preset 'minatar' of pqn is made for MinAtar's games"):
        PQN(None, env_id="CartPole-v1", preset="minatar", device="cpu")


def test_a_continuous_action_space_is_refused():
    with pytest.raises(TypeError, match="PQN needs a Discrete action space"):
        PQN(None, env_id="Pendulum-v1", device="cpu")


# -- training on real envs ---------------------------------------------------------------------


def test_pqn_keeps_the_trainers_contract():
    """Synchronous and asynchronous training on CartPole, a crash resumed bit-identically from
    its periodic checkpoint, save, load and predict (the kit every algorithm passes)."""
    from vecaccel.trainers.testing import check_algorithm

    check_algorithm(
        "pqn",
        total_timesteps=128,
        context="fork",
        num_envs=2,
        num_steps=8,
        num_minibatches=4,
        hidden_sizes=(16,),
    )


def test_asynchronous_rollouts_train_without_a_fixed_lag():
    agent = PQN(None, env_id="CartPole-v1", **TINY)
    agent.learn(64, mode="async", context="fork")
    assert agent.async_run and agent.global_step == 64 and agent.num_updates == 4
    assert all(bool(torch.isfinite(p).all()) for p in agent.model.parameters())


def test_a_checkpoint_round_trip_keeps_weights_epsilon_optimizer_and_schedule(tmp_path):
    agent = PQN("CartPole-v1", exploration_fraction=0.5, **TINY)
    try:
        agent.learn(64)
        path = agent.save(tmp_path / "agent.pt")
    finally:
        agent.close()
    state = load_checkpoint(path)
    assert state["algorithm"] == "pqn" and "on_policy" in state
    assert state["config"]["q_lambda"] == 0.65 and state["config"]["layer_norm"] is True
    loaded = PQN.load(path)
    for (name, a), (_, b) in zip(agent.model.state_dict().items(),
                                 loaded.model.state_dict().items()):  # fmt: skip
        assert torch.equal(a, b), name
    assert float(loaded.model.epsilon) == float(agent.model.epsilon) < 1.0
    assert isinstance(loaded.optimizer, torch.optim.RAdam)
    saved, restored = agent.optimizer.state_dict()["state"], loaded.optimizer.state_dict()["state"]
    assert all(torch.equal(saved[k]["exp_avg"], restored[k]["exp_avg"]) for k in saved)
    assert (loaded.schedule_start_update, loaded.schedule_updates) == (0, 4)
    assert loaded.config == agent.config


def test_train_and_eval_with_the_preset_on_the_command_line(tmp_path, capsys):
    """``vecaccel train pqn`` on MinAtar takes the preset by itself; a budget of a few hundred
    steps is one rollout of its 128 envs x 32 steps."""
    pytest.importorskip("minatar")
    run_dir = tmp_path / "run"
    code = run_main(
        ["train", "pqn", "--env", "MinAtar/Breakout-v0", "--total-timesteps", "300",
         "--backend", "serial", "--run-dir", str(run_dir), "--no-progress", "--device", "cpu",
         "--torch-threads", "1", "--no-tensorboard"]
    )  # fmt: skip
    assert code == 0
    assert "preset: minatar, made for MinAtar games" in capsys.readouterr().err
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["algorithm"] == "pqn" and state["config"]["preset"] == "minatar"
    assert (state["global_step"], state["num_updates"]) == (4096, 1)
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert float(rows[-1]["charts/epsilon"]) == 1.0 and float(rows[-1]["losses/td_loss"]) > 0
    assert run_main(["eval", str(run_dir), "--episodes", "2"]) == 0


def test_a_run_resumed_on_the_command_line_goes_on_to_its_new_budget(tmp_path):
    run_dir = tmp_path / "run"
    tiny = ["--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "8",
            "--num-minibatches", "4", "--hidden-sizes", "16", "--no-progress", "--no-tensorboard",
            "--device", "cpu", "--torch-threads", "1"]  # fmt: skip
    assert (
        run_main(["train", "pqn", *tiny, "--total-timesteps", "64", "--run-dir", str(run_dir)]) == 0
    )
    first = load_checkpoint(run_dir / "checkpoint.pt")
    assert (first["global_step"], first["num_updates"]) == (64, 4)
    assert run_main(["train", "pqn", "--resume", str(run_dir), "--total-timesteps", "128"]) == 0
    resumed = load_checkpoint(run_dir / "checkpoint.pt")
    assert (resumed["global_step"], resumed["num_updates"]) == (128, 8)
    assert resumed["config"]["num_minibatches"] == 4 and resumed["algorithm"] == "pqn"
