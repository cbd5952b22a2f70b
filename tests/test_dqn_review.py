"""Review of the DQN family and its replay: behaviour checked against small independent references.

The references here are written from the papers and CleanRL/SB3, not from the library code:
n-step targets from a recorded trajectory, TD / C51 losses recomputed from copies of the
networks, the ε schedule of CleanRL, Polyak averaging, and prioritized replay's invariants
(Schaul et al. 2016) over random interleavings of adds, priority updates and episode cuts.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete
from hypothesis import given, settings
from hypothesis import strategies as st

import vecaccel
from vecaccel.trainers.dqn import (
    DQN,
    DQNConfig,
    Rainbow,
    categorical_projection,
    linear_schedule,
)
from vecaccel.trainers.envs import make_env_for_training
from vecaccel.trainers.prioritized_replay import PrioritizedReplayBuffer
from vecaccel.trainers.replay import ReplayBuffer
from vecaccel.trainers.sumtree import SumTree

torch.set_num_threads(1)

SMALL = dict(
    learning_starts=10**9,  # collect only, unless a test says otherwise
    batch_size=16,
    buffer_size=256,
    hidden_sizes=(16,),
    progress=False,
    tensorboard=False,
)


def _cartpole(num_envs: int = 2) -> gym.vector.VectorEnv:
    return make_env_for_training("CartPole-v1", num_envs, backend="serial", seed=0)


# -- the training loop writes the transitions the envs produced --------------------------------


class _Recorder:
    """Wraps a vector env's reset/step and keeps, per env, the transitions it produced."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs
        self.transitions: list[list[dict]] = [[] for _ in range(self.num_envs)]
        self.obs = None
        self._step, self._reset = envs.step, envs.reset
        envs.step, envs.reset = self.step, self.reset

    def reset(self, **kwargs):
        out = self._reset(**kwargs)
        self.obs = np.array(out[0], copy=True)
        return out

    def step(self, actions):
        out = self._step(actions)
        next_obs, reward, terminated, truncated, infos = out
        for b in range(self.num_envs):
            done = bool(terminated[b] or truncated[b])
            final = infos["final_obs"][b] if done else next_obs[b]
            self.transitions[b].append(
                dict(
                    obs=self.obs[b].copy(),
                    action=int(actions[b]),
                    reward=float(reward[b]),
                    terminated=bool(terminated[b]),
                    truncated=bool(truncated[b]),
                    next_obs=np.array(final, copy=True),
                )
            )
        self.obs = np.array(next_obs, copy=True)
        return out


def _reference_target(episode: list[dict], i: int, n: int, gamma: float):
    ret = 0.0
    for k in range(n):
        t = episode[i + k]
        ret += gamma**k * t["reward"]
        if t["terminated"]:
            return ret, 0.0, t["next_obs"]
        if t["truncated"]:
            return ret, gamma ** (k + 1), t["next_obs"]
    return ret, gamma**n, episode[i + n - 1]["next_obs"]


@pytest.mark.parametrize("prioritized", [False, True])
def test_loop_stores_the_env_transitions_with_n_step_targets(prioritized) -> None:
    """DQN.learn on CartPole cut by a 7-step TimeLimit (truncations) with a wrapping buffer:
    every sampleable transition has the n-step return, discount and bootstrap observation of
    the trajectory the envs really produced (truncation bootstraps from final_obs)."""
    envs = vecaccel.make_vec(
        [lambda: gym.make("CartPole-v1", max_episode_steps=7)] * 2,
        backend="serial",
        autoreset_mode=vecaccel.AutoresetMode.SAME_STEP,
    )
    recorder = _Recorder(envs)
    gamma, n = 0.5, 3
    try:
        agent = DQN(
            env=envs,
            **{**SMALL, "buffer_size": 40},
            n_step=n,
            gamma=gamma,
            prioritized=prioritized,
        )
        agent.learn(120)  # 60 vector steps into 20 slots per env: the ring wraps
    finally:
        envs.close()
    buffer = agent.buffer
    assert np.any(buffer.truncated)
    valid = np.flatnonzero(buffer._valid_mask().reshape(-1))
    assert len(valid) > 20
    batch = buffer.get(valid)
    where = {}
    for b, episode in enumerate(recorder.transitions):
        for i, t in enumerate(episode):
            where[t["obs"].tobytes()] = (b, i)
    for row in range(len(valid)):
        b, i = where[batch.obs[row].tobytes()]
        episode = recorder.transitions[b]
        ret, discount, next_obs = _reference_target(episode, i, n, gamma)
        assert batch.action[row] == episode[i]["action"]
        assert batch.reward[row] == pytest.approx(ret, abs=1e-5)
        assert batch.discount[row] == pytest.approx(discount, abs=1e-7)
        if discount > 0:
            np.testing.assert_array_equal(batch.next_obs[row], next_obs)


def test_hand_computed_n_step_targets() -> None:
    """rewards 1, 2, 4, 8 ...; a truncation and a termination, by hand (gamma 0.5, n 3)."""
    buffer = ReplayBuffer(Box(-100, 100, (1,)), Discrete(2), capacity=32, n_step=3, gamma=0.5)
    obs = lambda v: np.full((1, 1), v, np.float32)  # noqa: E731
    # episode 1: s0 -r1-> s1 -r2-> s2 -r4, truncated-> final 99
    buffer.add(obs(0), [0], [1.0], [False], [False])
    buffer.add(obs(1), [1], [2.0], [False], [False])
    buffer.add(obs(2), [0], [4.0], [False], [True], final_obs=obs(99))
    # episode 2: s10 -r8-> s11 -r16, terminated-> final 77
    buffer.add(obs(10), [1], [8.0], [False], [False])
    buffer.add(obs(11), [0], [16.0], [True], [False], final_obs=obs(77))
    for k in range(4):  # episode 3: long enough that everything above is old enough
        buffer.add(obs(20 + k), [0], [0.0], [False], [False])
    # slots: 0 1 2 [3=final 99] 4 5 [6=final 77] 7 8 9 10
    batch = buffer.get(np.array([0, 1, 2, 4, 5]))
    np.testing.assert_allclose(batch.reward, [1 + 1 + 1, 2 + 2, 4, 8 + 8, 16])
    np.testing.assert_allclose(batch.discount, [0.125, 0.25, 0.5, 0.0, 0.0])
    np.testing.assert_array_equal(batch.next_obs[:3, 0], [99, 99, 99])
    valid = set(np.flatnonzero(buffer._valid_mask().reshape(-1)).tolist())
    assert 3 not in valid and 6 not in valid  # final observations are never starting points
    assert {0, 1, 2, 4, 5, 7} <= valid


# -- the update ---------------------------------------------------------------------------------


CONFIGS = [
    dict(),
    dict(double=True),
    dict(dueling=True, loss="mse"),
    dict(prioritized=True, double=True, priority_alpha=0.7),
    dict(categorical=True, v_min=-5.0, v_max=5.0, num_atoms=11),
    dict(categorical=True, double=True, dueling=True, prioritized=True, num_atoms=11),
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda c: "-".join(sorted(c)) or "dqn")
def test_train_step_matches_reference(overrides) -> None:
    """Loss (Double/Dueling/Huber/MSE/C51, importance-weighted) recomputed from copies of the
    networks; prioritized replay then holds (|error| + eps) ** alpha at the sampled indices."""
    envs = _cartpole()
    try:
        agent = DQN(env=envs, **SMALL, n_step=2, gamma=0.9, max_grad_norm=0, **overrides)
        agent.learn(100)
    finally:
        envs.close()
    cfg = agent.config
    torch.manual_seed(0)
    with torch.no_grad():  # a target network distinct from the online one
        for p in agent.target_network.parameters():
            p.add_(0.1 * torch.randn_like(p))
    _, batch = agent.sample_batch(0.5)
    online, target = copy.deepcopy(agent.q_network), copy.deepcopy(agent.target_network)
    rows = torch.arange(len(batch.indices))
    obs, next_obs = torch.as_tensor(batch.obs), torch.as_tensor(batch.next_obs)
    actions = torch.as_tensor(batch.action).long()
    rewards, discounts = torch.as_tensor(batch.reward), torch.as_tensor(batch.discount)
    weights = torch.as_tensor(batch.weights)
    with torch.no_grad():
        if cfg.categorical:
            support = torch.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms)
            target_probs = torch.softmax(target(next_obs), -1)
            chooser = torch.softmax(online(next_obs), -1) if cfg.double else target_probs
            next_actions = (chooser * support).sum(-1).argmax(1)
            projected = categorical_projection(
                target_probs[rows, next_actions], rewards, discounts, support
            )
            per_sample = -(projected * torch.log_softmax(online(obs)[rows, actions], -1)).sum(-1)
            priorities = per_sample
        else:
            chooser = online(next_obs) if cfg.double else target(next_obs)
            next_actions = chooser.argmax(1)
            y = rewards + discounts * target(next_obs)[rows, next_actions]
            error = y - online(obs)[rows, actions]
            if cfg.loss == "huber":
                per_sample = torch.where(error.abs() < 1, 0.5 * error**2, error.abs() - 0.5)
            else:
                per_sample = error**2
            priorities = error.abs()
        expected_loss = float((weights * per_sample).mean())
    stats = agent.train_step(batch)
    assert stats["losses/td_loss"] == pytest.approx(expected_loss, rel=1e-5)
    if cfg.prioritized:
        last = {}
        for i, index in enumerate(batch.indices.tolist()):
            last[index] = float(priorities[i])
        indices = np.array(sorted(last))
        expected = (np.array([last[i] for i in indices]) + cfg.priority_eps) ** cfg.priority_alpha
        np.testing.assert_allclose(agent.buffer.tree[indices], expected, rtol=1e-5)
    # the online network moved, the target did not
    assert any(
        not torch.equal(a, b) for a, b in zip(online.parameters(), agent.q_network.parameters())
    )
    for a, b in zip(target.parameters(), agent.target_network.parameters()):
        assert torch.equal(a, b)


def test_polyak_target_update() -> None:
    envs = _cartpole(1)
    try:
        agent = DQN(env=envs, **SMALL, tau=0.25)
        with torch.no_grad():
            for p in agent.q_network.parameters():
                p.add_(1.0)
        before = [p.clone() for p in agent.target_network.parameters()]
        agent.update_target()
        for old, new, online in zip(
            before, agent.target_network.parameters(), agent.q_network.parameters()
        ):
            torch.testing.assert_close(new, 0.75 * old + 0.25 * online)
    finally:
        envs.close()


def test_target_network_updates_every_period(monkeypatch) -> None:
    envs = _cartpole(2)
    calls: list[int] = []
    try:
        agent = DQN(
            env=envs,
            **{**SMALL, "learning_starts": 40},
            target_update_period=30,
            replay_ratio=4.0,
        )
        original = DQN.update_target

        def spy(self):
            calls.append(self.global_step)
            original(self)

        monkeypatch.setattr(DQN, "update_target", spy)
        agent.learn(200)
    finally:
        envs.close()
    assert calls and all(b - a == 30 for a, b in zip(calls, calls[1:])), calls
    assert calls[-1] > 200 - 30


# -- schedules ------------------------------------------------------------------------------


def _cleanrl_linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


@given(
    st.floats(0.05, 1.0),
    st.floats(0.0, 0.05),
    st.integers(1, 10_000),
    st.integers(0, 20_000),
)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_linear_schedule_matches_cleanrl(start, end, duration, t) -> None:
    assert linear_schedule(start, end, duration, t) == pytest.approx(
        _cleanrl_linear_schedule(start, end, duration, t), abs=1e-12
    )


def test_epsilon_and_beta_schedules() -> None:
    agent = DQN(env=None, exploration_fraction=0.5, start_epsilon=1.0, end_epsilon=0.1)
    assert agent.epsilon(0, 1000) == 1.0
    assert agent.epsilon(250, 1000) == pytest.approx(0.55)
    assert agent.epsilon(500, 1000) == pytest.approx(0.1)
    assert agent.epsilon(900, 1000) == pytest.approx(0.1)
    fixed = DQN(env=None, exploration_steps=100, start_epsilon=1.0, end_epsilon=0.0)
    assert fixed.epsilon(50, 10**6) == pytest.approx(0.5)

    envs = _cartpole(1)
    try:
        per = DQN(env=envs, **{**SMALL, "learning_starts": 32}, prioritized=True)
        per.learn(40)
        betas = [per.sample_batch(p)[0] for p in (0.0, 0.5, 1.0, 2.0)]
    finally:
        envs.close()
    assert betas == pytest.approx([0.4, 0.7, 1.0, 1.0])


# -- prioritized replay invariants ----------------------------------------------------------


@st.composite
def _operations(draw):
    ops = []
    for _ in range(draw(st.integers(5, 70))):
        kind = draw(st.sampled_from(["add", "add", "add", "end", "update"]))
        if kind == "add":
            ops.append(("add", draw(st.lists(st.integers(0, 9), min_size=3, max_size=3))))
        elif kind == "end":
            ops.append(("end", None))
        else:
            ops.append(("update", draw(st.lists(st.floats(-5, 5), min_size=1, max_size=8))))
    return ops


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    ops=_operations(),
    num_envs=st.integers(1, 3),
    n_step=st.integers(1, 3),
    frame_stack=st.sampled_from([1, 2]),
    alpha=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_prioritized_replay_invariants(ops, num_envs, n_step, frame_stack, alpha) -> None:
    """Across adds, priority updates (stale indices included) and episode cuts: exactly the
    valid slots carry priority; a newly valid slot gets max_priority ** alpha; an updated one
    (|e| + eps) ** alpha; the minimum and total match; samples are valid with the right weights."""
    shape = (frame_stack, 2) if frame_stack > 1 else (2,)
    buffer = PrioritizedReplayBuffer(
        Box(-np.inf, np.inf, shape, np.float32),
        Discrete(2),
        capacity=(n_step + frame_stack + 4) * num_envs,
        num_envs=num_envs,
        n_step=n_step,
        frame_stack=frame_stack,
        alpha=alpha,
        eps=1e-3,
        seed=0,
    )
    rng = np.random.default_rng(0)
    counter = 0
    stacks = [None] * num_envs

    def fresh(b):
        nonlocal counter
        counter += 1
        return np.array([b, counter], np.float32)

    def observation(b):
        return np.stack(stacks[b]) if frame_stack > 1 else stacks[b][-1]

    for b in range(num_envs):
        stacks[b] = [fresh(b)] * frame_stack
    expected: dict[int, float] = {}
    max_priority = 1.0
    valid_before = set()
    sampled = np.empty(0, np.int64)
    for kind, arg in ops:
        if kind == "add":
            obs = np.stack([observation(b) for b in range(num_envs)])
            term = np.array([v == 0 for v in arg[:num_envs]])
            trunc = np.array([v == 1 for v in arg[:num_envs]])
            final = np.full(num_envs, None, dtype=object)
            for b in range(num_envs):
                stacks[b] = (stacks[b] + [fresh(b)])[-frame_stack:]
                if term[b] or trunc[b]:
                    final[b] = observation(b)
                    stacks[b] = [fresh(b)] * frame_stack
            cursor = buffer.cursor.copy()
            buffer.add(
                obs, rng.integers(0, 2, num_envs), rng.normal(size=num_envs), term, trunc, final
            )
            for b in range(num_envs):  # slots holding new data now (1, or 2 with a final obs)
                for k in range(int((buffer.cursor[b] - cursor[b]) % buffer.T)):
                    rewritten = int((cursor[b] + k) % buffer.T) * num_envs + b
                    valid_before.discard(rewritten)
                    expected.pop(rewritten, None)
        elif kind == "end":
            buffer.end_episodes()
            for b in range(num_envs):
                stacks[b] = [fresh(b)] * frame_stack
        else:
            if len(sampled) == 0:
                continue
            errors = np.array(arg)
            indices = sampled[: len(errors)]
            errors = errors[: len(indices)]
            buffer.update_priorities(indices, errors)
            max_priority = max(max_priority, float(np.max(np.abs(errors) + 1e-3)))
            for index, error in zip(indices.tolist(), errors.tolist()):
                if index in valid_before:  # still valid: nothing was written meanwhile
                    expected[index] = (abs(error) + 1e-3) ** alpha
        valid_now = set(np.flatnonzero(buffer._valid_mask().reshape(-1)).tolist())
        for index in valid_now - valid_before:
            expected[index] = max_priority**alpha
        for index in valid_before - valid_now:
            expected.pop(index, None)
        valid_before = valid_now
        leaves = buffer.tree.priorities()
        assert set(np.flatnonzero(leaves).tolist()) == valid_now
        for index, value in expected.items():
            assert leaves[index] == pytest.approx(value, rel=1e-9)
        if valid_now:
            assert buffer.tree.total() == pytest.approx(sum(expected.values()), rel=1e-9)
            assert buffer.tree.min() == pytest.approx(min(expected.values()), rel=1e-9)
            batch = buffer.sample(8, beta=0.6)
            assert set(batch.indices.tolist()) <= valid_now
            p = np.array([expected[i] for i in batch.indices.tolist()])
            np.testing.assert_allclose(
                batch.weights, (p / min(expected.values())) ** -0.6, rtol=1e-5
            )
            sampled = batch.indices
        else:
            with pytest.raises(ValueError, match="no transition"):
                buffer.sample(4)
            sampled = np.empty(0, np.int64)


def test_importance_weights_by_hand_with_several_envs() -> None:
    buffer = PrioritizedReplayBuffer(
        Box(-10, 10, (1,)), Discrete(2), capacity=16, num_envs=2, alpha=1.0, eps=0.0, seed=0
    )
    for step in range(5):
        buffer.add(np.full((2, 1), step, np.float32), [0, 1], [0.0, 0.0], [False] * 2, [False] * 2)
    valid = np.flatnonzero(buffer._valid_mask().reshape(-1))
    assert valid.tolist() == list(range(8))  # slots 0..3 of both envs
    buffer.update_priorities(valid, np.arange(1, 9, dtype=float))
    batch = buffer.sample(64, beta=1.0)
    # with alpha 1, beta 1: w_i = (N P(i))^-1 / max_j = p_min / p_i = 1 / (index + 1)
    np.testing.assert_allclose(batch.weights, 1.0 / (batch.indices + 1), rtol=1e-6)
    # flat index = slot * num_envs + env: the observation and action are that env's
    np.testing.assert_array_equal(batch.obs[:, 0], batch.indices // 2)
    np.testing.assert_array_equal(batch.action, batch.indices % 2)


def test_sumtree_single_leaf_and_stratified_coverage() -> None:
    tree = SumTree(1)
    tree.update(np.array([0]), np.array([2.5]))
    assert tree.total() == 2.5 and tree.min() == 2.5
    assert tree.sample(5, np.random.default_rng(0)).tolist() == [0] * 5
    tree = SumTree(7)
    tree.update(np.arange(7), np.ones(7))
    # stratified: one draw per equal segment, so 7 draws over 7 equal leaves hit every leaf once
    drawn = tree.sample(7, np.random.default_rng(1), stratified=True)
    assert sorted(drawn.tolist()) == list(range(7))
    tree.update(np.array([3]), np.array([0.0]))
    assert tree.min() == 1.0 and tree.total() == 6.0
    assert 3 not in tree.sample(1000, np.random.default_rng(2)).tolist()


def test_uniform_buffer_state_dict_round_trip() -> None:
    space = Box(-1, 1, (2,))
    buffer = ReplayBuffer(space, Discrete(2), 40, num_envs=2, n_step=2, seed=0)
    for step in range(30):  # wraps
        buffer.add(
            np.full((2, 2), step, np.float32),
            [1, 0],
            [1.0, 2.0],
            [step % 7 == 6, False],
            [False, step % 5 == 4],
            final_obs=np.full((2, 2), -step, np.float32),
        )
    clone = ReplayBuffer(space, Discrete(2), 40, num_envs=2, n_step=2, seed=99)
    clone.load_state_dict(buffer.state_dict())
    for x, y in zip(buffer.sample(32), clone.sample(32)):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(buffer.sample(32), clone.sample(32)):
        np.testing.assert_array_equal(x, y)


# -- defects ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    [
        dict(gamma=1.5),
        dict(gamma=-0.1),
        dict(tau=0.0),
        dict(tau=-0.5),
        dict(priority_alpha=-1.0),
        dict(priority_beta_start=-0.5),
        dict(priority_eps=-1.0),
    ],
    ids=lambda s: "{}={}".format(*next(iter(s.items()))),
)
def test_config_rejects_settings_that_cannot_train(setting) -> None:
    """gamma outside [0, 1] makes the targets diverge, tau <= 0 never moves (or pushes away)
    the target network, a negative alpha prefers the best-fitted transitions, a negative beta
    up-weights the over-sampled ones, and a negative eps crashes the sum tree mid-run.
    DQNConfig validates batch sizes, the loss and the C51 support already; these should fail
    the same way, at construction."""
    with pytest.raises(ValueError):
        DQNConfig(**setting)


def test_negative_priority_eps_crashes_mid_training() -> None:
    """The user-visible consequence of accepting priority_eps < 0: construction and the first
    steps succeed, then an update raises from inside the sum tree."""
    envs = _cartpole(1)
    try:
        try:
            agent = DQN(
                env=envs,
                **{**SMALL, "learning_starts": 32},
                prioritized=True,
                priority_eps=-10.0,
            )
        except ValueError:
            return  # rejected up front: correct
        agent.learn(80)  # fails inside update_priorities / SumTree.update
    finally:
        envs.close()


def test_load_overrides_reach_the_optimizer(tmp_path) -> None:
    """DQN.load(path, learning_rate=...) (documented: overrides change config fields) reports the
    new rate in agent.learning_rate and charts/learning_rate, but the optimizer keeps the saved
    one because optimizer.load_state_dict restores the saved param_groups."""
    envs = _cartpole(1)
    try:
        agent = DQN(env=envs, **{**SMALL, "learning_starts": 32}, learning_rate=1e-3)
        agent.learn(60)
        path = agent.save(tmp_path / "agent.pt")
    finally:
        envs.close()
    loaded = DQN.load(path, learning_rate=5e-2, adam_eps=1e-2)
    assert loaded.learning_rate == pytest.approx(5e-2)
    group = loaded.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(loaded.learning_rate)
    assert group["eps"] == pytest.approx(1e-2)
    # the Adam moments are still restored
    saved = agent.optimizer.state_dict()["state"]
    for key, value in loaded.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(value["exp_avg"], saved[key]["exp_avg"])


def test_loaded_replay_with_other_n_step_samples_only_complete_windows(tmp_path) -> None:
    """A prioritized replay file read into a buffer whose n_step was overridden on load keeps the
    saved priorities, so slots whose n-step window is not written yet (invalid under the new
    n_step) can be sampled, with returns and bootstrap observations read from unwritten slots."""
    envs = _cartpole(1)
    try:
        agent = Rainbow(env=envs, **{**SMALL, "learning_starts": 32}, n_step=1)
        agent.learn(100)
        path = agent.save(tmp_path / "agent.pt", replay=True)
    finally:
        envs.close()
    envs = _cartpole(1)
    try:
        loaded = Rainbow.load(path, env=envs, n_step=3)
        buffer = loaded.buffer
        valid = buffer._valid_mask().reshape(-1)
        stale = np.flatnonzero((buffer.tree.priorities() > 0) & ~valid)
        assert stale.size == 0, f"slots {stale.tolist()} have priority but an incomplete window"
    finally:
        envs.close()


@pytest.mark.parametrize("new_alpha", [0.9, 0.0])
def test_loaded_replay_with_other_priority_alpha_holds_the_new_exponent(tmp_path, new_alpha):
    """The tree holds priority ** alpha: loaded under another priority_alpha, every leaf must be
    the saved priority under the new exponent (0: uniform), not the old exponent's value."""
    envs = _cartpole(1)
    try:
        agent = Rainbow(env=envs, **{**SMALL, "learning_starts": 32}, priority_alpha=0.5)
        agent.learn(100)
        saved = agent.buffer.tree.priorities().copy()
        path = agent.save(tmp_path / "agent.pt", replay=True)
    finally:
        envs.close()
    envs = _cartpole(1)
    try:
        loaded = Rainbow.load(path, env=envs, priority_alpha=new_alpha)
        assert loaded.buffer.alpha == new_alpha
        expected = np.where(saved > 0, saved ** (new_alpha / 0.5), 0.0)
        np.testing.assert_allclose(loaded.buffer.tree.priorities(), expected, rtol=1e-9)
        assert loaded.buffer.tree.total() == pytest.approx(expected.sum())
    finally:
        envs.close()


def test_buffer_state_dict_carries_alpha() -> None:
    """state_dict/load_state_dict between prioritized buffers of different alpha re-exponentiate,
    and one saved under alpha 0 (all priorities lost) starts its valid slots over at the max."""
    space = Box(-1, 1, (1,))

    def filled(alpha):
        buffer = PrioritizedReplayBuffer(space, Discrete(2), 16, alpha=alpha, seed=0)
        for step in range(10):
            buffer.add(np.full((1, 1), step, np.float32), [0], [0.0], [False], [False])
        batch = buffer.sample(4, beta=0.4)
        buffer.update_priorities(batch.indices, np.arange(1.0, 5.0))
        return buffer

    source = filled(0.5)
    target = PrioritizedReplayBuffer(space, Discrete(2), 16, alpha=1.0, seed=0)
    target.load_state_dict(source.state_dict())
    leaves = source.tree.priorities()
    np.testing.assert_allclose(target.tree.priorities(), np.where(leaves > 0, leaves**2, 0.0))
    uniform = filled(0.0)
    target.load_state_dict(uniform.state_dict())
    held = uniform.tree.priorities() > 0
    np.testing.assert_allclose(target.tree.priorities()[held], uniform.max_priority[0])
    assert (target.tree.priorities()[~held] == 0).all()


class _ShiftedActions(gym.ActionWrapper):
    """CartPole with Discrete(2, start=1): actions 1 and 2."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.action_space = gym.spaces.Discrete(2, start=1)

    def action(self, action):
        return int(action) - 1


def test_discrete_action_space_with_offset_start() -> None:
    """DQN accepts any Discrete action space, but acts with 0..n-1 and ignores ``start``: an env
    whose actions are 1..n fails on the first step of learn(). It should either act in
    ``start..start+n-1`` or refuse the env when it is built."""
    envs = vecaccel.make_vec(
        [lambda: _ShiftedActions(gym.make("CartPole-v1"))],
        backend="serial",
        autoreset_mode=vecaccel.AutoresetMode.SAME_STEP,
    )
    try:
        try:
            agent = DQN(env=envs, **{**SMALL, "learning_starts": 32})
        except (TypeError, ValueError):
            return  # refused up front: acceptable
        agent.learn(64)
        actions, _ = agent.predict(np.zeros((8, 4), np.float32))
        assert set(actions.tolist()) <= {1, 2}
    finally:
        envs.close()


@pytest.mark.parametrize("algorithm", ["PPO", "A2C"])
def test_on_policy_discrete_action_space_with_offset_start(algorithm) -> None:
    """PPO and A2C sampled 0..n-1 from the categorical head and sent it to the env as is, so an
    env whose actions are 1..n failed on the first step; they act in ``start..start+n-1`` now,
    in learn() (and their losses still index the head with 0..n-1) and in predict()."""
    from vecaccel.trainers.a2c import A2C
    from vecaccel.trainers.ppo import PPO

    cls = {"PPO": PPO, "A2C": A2C}[algorithm]
    envs = vecaccel.make_vec(
        [lambda: _ShiftedActions(gym.make("CartPole-v1"))] * 2,
        backend="serial",
        autoreset_mode=vecaccel.AutoresetMode.SAME_STEP,
    )
    try:
        agent = cls(envs, num_envs=2, num_steps=16, seed=0, torch_threads=1, tensorboard=False)
        sent: list[int] = []
        step = envs.step
        envs.step = lambda actions: (sent.extend(np.asarray(actions).tolist()), step(actions))[1]
        agent.learn(64)
        assert sent and set(sent) <= {1, 2}
        for deterministic in (False, True):
            actions, _ = agent.predict(np.zeros((8, 4), np.float32), deterministic=deterministic)
            assert set(actions.tolist()) <= {1, 2}
    finally:
        envs.close()


def test_a_run_dir_given_as_a_path_checkpoints_and_loads(tmp_path):
    """``run_dir=Path(...)`` (as PPO takes it) used to put a ``PosixPath`` into the saved
    config, which the weights-only load refused as a corrupt checkpoint."""
    agent = DQN(
        env="CartPole-v1", num_envs=1, backend="serial", learning_starts=8, batch_size=8,
        buffer_size=64, run_dir=tmp_path / "run", progress=False, tensorboard=False,
    )  # fmt: skip
    try:
        agent.learn(16)
    finally:
        agent.close()
    loaded = DQN.load(tmp_path / "run" / "checkpoint.pt")
    assert loaded.global_step == 16
    assert loaded.config.run_dir == str(tmp_path / "run")
