"""Replay buffers: n-step targets, frame-once stacks and prioritized sampling against plain
reference loops, and their saved state.
"""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete
from helpers import SMALL_DQN, serial_cartpole
from hypothesis import given, settings
from hypothesis import strategies as st

import vecaccel
from vecaccel.trainers.algos.dqn import Rainbow
from vecaccel.trainers.replay.buffer import ReplayBuffer, ReplayMemoryError, available_memory
from vecaccel.trainers.replay.prioritized import PrioritizedReplayBuffer

torch.set_num_threads(1)


class Stream:
    """Feeds ``num_envs`` synthetic episodes into a buffer and keeps a plain list per env.

    A frame is ``[env, step_id]``, unique per step, so a sampled observation names its transition.
    Observations are stacks of the last ``frame_stack`` frames, padded with the first frame of the
    episode, built naively with a deque (as ``FrameStackObservation`` does).
    """

    def __init__(self, num_envs: int, frame_stack: int) -> None:
        self.num_envs = num_envs
        self.frame_stack = frame_stack
        self.counter = 0
        self.stacks = [deque(maxlen=frame_stack) for _ in range(num_envs)]
        self.transitions: list[list[dict]] = [[] for _ in range(num_envs)]
        self.obs = np.stack([self._reset(b) for b in range(num_envs)])

    def _frame(self, env: int) -> np.ndarray:
        self.counter += 1
        return np.array([env, self.counter], dtype=np.float32)

    def _reset(self, env: int) -> np.ndarray:
        frame = self._frame(env)
        self.stacks[env].clear()
        self.stacks[env].extend([frame] * self.frame_stack)
        return self._observation(env)

    def _observation(self, env: int) -> np.ndarray:
        stack = np.stack(self.stacks[env])
        return stack if self.frame_stack > 1 else stack[0]

    def step(self, buffer: ReplayBuffer, flags: list[tuple[bool, bool]], rng) -> None:
        B = self.num_envs
        action = rng.integers(0, 3, size=B)
        reward = rng.normal(size=B).astype(np.float32)
        terminated = np.array([f[0] for f in flags])
        truncated = np.array([f[1] for f in flags])
        final_obs = np.full(B, None, dtype=object)
        next_obs = []
        for b in range(B):
            self.stacks[b].append(self._frame(b))
            stepped = self._observation(b)
            done = terminated[b] or truncated[b]
            if done:
                final_obs[b] = stepped
            self.transitions[b].append(
                dict(
                    obs=self.obs[b],
                    action=action[b],
                    reward=float(reward[b]),
                    terminated=bool(terminated[b]),
                    truncated=bool(truncated[b]),
                    next_obs=stepped,
                )
            )
            next_obs.append(self._reset(b) if done else stepped)
        buffer.add(self.obs, action, reward, terminated, truncated, final_obs)
        self.obs = np.stack(next_obs)

    def cut(self, buffer: ReplayBuffer) -> None:
        """Reset every env mid-episode, as a second ``learn()`` does, with the expected outcome:
        the last transition of an open episode is dropped (its observation becomes the final
        one) and the transition before it is truncated."""
        for b in range(self.num_envs):
            episode = self.transitions[b]
            if episode and not (episode[-1]["terminated"] or episode[-1]["truncated"]):
                episode.pop()
                if episode and not (episode[-1]["terminated"] or episode[-1]["truncated"]):
                    episode[-1]["truncated"] = True
        buffer.end_episodes()
        self.obs = np.stack([self._reset(b) for b in range(self.num_envs)])

    def reference(self, env: int, index: int, n_step: int, gamma: float):
        """n-step return, discount and bootstrap observation of transition ``index``: a plain loop."""
        episode = self.transitions[env]
        ret = 0.0
        for k in range(n_step):
            if index + k >= len(episode):
                return None  # the window is not complete yet
            transition = episode[index + k]
            ret += gamma**k * transition["reward"]
            if transition["terminated"]:
                return ret, 0.0, transition["next_obs"]
            if transition["truncated"]:
                return ret, gamma ** (k + 1), transition["next_obs"]
        return ret, gamma**n_step, episode[index + n_step - 1]["next_obs"]


def _key(obs: np.ndarray) -> tuple[int, int]:
    newest = obs[-1] if obs.ndim == 2 else obs
    return int(newest[0]), int(newest[1])


@settings(max_examples=60, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    n_step=st.integers(1, 5),
    frame_stack=st.sampled_from([1, 2, 4]),
    gamma=st.sampled_from([0.5, 0.9, 0.99]),
    slots_per_env=st.integers(12, 40),
    done_rate=st.sampled_from([0.02, 0.15, 0.5]),
    steps=st.integers(1, 90),
    seed=st.integers(0, 2**16),
    prioritized=st.booleans(),
    cut_rate=st.sampled_from([0.0, 0.0, 0.08]),
)
def test_every_sampleable_transition_matches_the_reference(
    num_envs,
    n_step,
    frame_stack,
    gamma,
    slots_per_env,
    done_rate,
    steps,
    seed,
    prioritized,
    cut_rate,
) -> None:
    rng = np.random.default_rng(seed)
    stacked = Box(-np.inf, np.inf, (frame_stack, 2) if frame_stack > 1 else (2,), np.float32)
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    buffer = cls(
        stacked,
        Discrete(3),
        capacity=slots_per_env * num_envs,
        num_envs=num_envs,
        n_step=n_step,
        gamma=gamma,
        frame_stack=frame_stack,
        seed=seed,
    )
    stream = Stream(num_envs, frame_stack)
    for _ in range(steps):
        ends = rng.random(num_envs) < done_rate
        kinds = rng.integers(0, 3, size=num_envs)  # terminated, truncated or both
        step_flags = [(bool(e and k != 1), bool(e and k != 0)) for e, k in zip(ends, kinds)]
        stream.step(buffer, step_flags, rng)
        if rng.random() < cut_rate:
            stream.cut(buffer)

    index_of = {}
    for b, episode in enumerate(stream.transitions):
        for i, transition in enumerate(episode):
            index_of[_key(transition["obs"])] = (b, i)

    valid = np.flatnonzero(buffer._valid_mask().reshape(-1))
    if prioritized:
        # exactly the valid slots carry priority
        np.testing.assert_array_equal(np.flatnonzero(buffer.tree.priorities()), valid)
    if len(valid) == 0:
        with pytest.raises(ValueError, match="no transition"):
            buffer.sample(4)
        return
    batch = buffer.get(valid)
    for row in range(len(valid)):
        b, i = index_of[_key(batch.obs[row])]
        transition = stream.transitions[b][i]
        np.testing.assert_array_equal(batch.obs[row], transition["obs"])
        assert batch.action[row] == transition["action"]
        expected = stream.reference(b, i, n_step, gamma)
        assert expected is not None, "a transition whose window is incomplete was sampleable"
        ret, discount, next_obs = expected
        assert batch.reward[row] == pytest.approx(ret, rel=1e-5, abs=1e-5)
        assert batch.discount[row] == pytest.approx(discount, rel=1e-6)
        if discount > 0:
            np.testing.assert_array_equal(batch.next_obs[row], next_obs)

    # every complete transition still in the buffer's window is sampleable (nothing is lost
    # beyond the frames an overwritten stack needs)
    sampled = buffer.sample(16) if not prioritized else buffer.sample(16, beta=0.5)
    assert set(sampled.indices.tolist()) <= set(valid.tolist())


def test_frame_once_storage_equals_gymnasium_frame_stack() -> None:
    """Through a real vector env with FrameStackObservation: rebuilt stacks equal the obs."""

    def make_env() -> gym.Env:
        env = gym.make("CartPole-v1", max_episode_steps=15)
        return gym.wrappers.FrameStackObservation(env, 4)

    envs = vecaccel.make_vec(
        [make_env] * 2, backend="serial", autoreset_mode=vecaccel.AutoresetMode.SAME_STEP
    )
    buffer = ReplayBuffer(
        envs.single_observation_space,
        envs.single_action_space,
        capacity=2 * 64,
        num_envs=2,
        n_step=3,
        gamma=0.9,
        frame_stack=4,
    )
    buffer.validate_period = 1
    naive: dict[bytes, np.ndarray] = {}
    obs, _ = envs.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(100):
        action = rng.integers(0, 2, size=2)
        next_obs, reward, terminated, truncated, infos = envs.step(action)
        buffer.add(obs, action, reward, terminated, truncated, infos.get("final_obs"))
        for b in range(2):
            naive[obs[b, -1].tobytes()] = obs[b]
        obs = next_obs
    envs.close()
    batch = buffer.get(np.flatnonzero(buffer._valid_mask().reshape(-1)))
    assert len(batch.obs) > 50
    for row in batch.obs:
        np.testing.assert_array_equal(row, naive[row[-1].tobytes()])
    assert buffer.nbytes < ReplayBuffer.estimate_nbytes(
        envs.single_observation_space, envs.single_action_space, 128, 2
    )


def test_frame_stack_that_does_not_fit_the_env_is_caught() -> None:
    space = Box(0, 255, (4, 3), np.uint8)
    buffer = ReplayBuffer(space, Discrete(2), capacity=32, frame_stack=4)
    not_a_stack = np.arange(12, dtype=np.uint8).reshape(1, 4, 3)
    with pytest.raises(ValueError, match="frame_stack=1"):
        buffer.add(not_a_stack, [0], [0.0], [False], [False])


def test_truncation_without_final_obs_is_refused() -> None:
    buffer = ReplayBuffer(Box(-1, 1, (2,)), Discrete(2), capacity=32)
    with pytest.raises(ValueError, match="SAME_STEP"):
        buffer.add(np.zeros((1, 2), np.float32), [0], [0.0], [False], [True])


def test_memory_estimate_and_error() -> None:
    atari = Box(0, 255, (4, 84, 84), np.uint8)
    small = ReplayBuffer(atari, Discrete(6), capacity=1000, num_envs=4, frame_stack=4)
    allocated = sum(array.nbytes for array in small.arrays.values())
    assert small.nbytes == allocated
    estimate = ReplayBuffer.estimate_nbytes(atari, Discrete(6), 10**6, 8, frame_stack=4)
    # one 84x84 frame per slot, not four
    assert 84 * 84 * 10**6 < estimate < 1.1 * 84 * 84 * 10**6
    prioritized = PrioritizedReplayBuffer(atari, Discrete(6), capacity=1000, frame_stack=4)
    assert prioritized.nbytes == sum(array.nbytes for array in prioritized.arrays.values())

    with pytest.raises(ReplayMemoryError, match="needs .* GiB but only") as info:
        ReplayBuffer.check_memory(estimate, available=2**30)
    assert isinstance(info.value, MemoryError)
    assert info.value.required == estimate
    free = available_memory()
    assert free is not None and free > 0
    # far more than any machine: refused before a byte is allocated
    with pytest.raises(ReplayMemoryError):
        ReplayBuffer(atari, Discrete(6), capacity=10**12, num_envs=8)


def test_buffers_allocate_from_the_given_factory() -> None:
    made: list[np.ndarray] = []

    def factory(shape, dtype):
        array = np.zeros(shape, dtype)
        made.append(array)
        return array

    buffer = PrioritizedReplayBuffer(Box(-1, 1, (3,)), Discrete(2), 64, 2, array_factory=factory)
    assert {id(a) for a in buffer.arrays.values()} == {id(a) for a in made}
    for step in range(10):
        buffer.add(np.full((2, 3), step, np.float32), [0, 1], [1.0, 1.0], [False] * 2, [False] * 2)
    # a second buffer object over the same arrays sees the same data (as another process would)
    assert made[0][:10, 0, 0].tolist() == list(range(10))
    assert buffer.steps_added == 20 and len(buffer) == 18


def test_prioritized_weights_follow_the_formula() -> None:
    buffer = PrioritizedReplayBuffer(
        Box(-10, 10, (1,)), Discrete(2), capacity=64, alpha=0.5, n_step=1, seed=1
    )
    for step in range(20):
        buffer.add(np.full((1, 1), step, np.float32), [0], [0.0], [False], [False])
    valid = np.flatnonzero(buffer._valid_mask().reshape(-1))
    errors = np.linspace(0.1, 4.0, len(valid))
    buffer.update_priorities(valid, errors)
    probabilities = (errors + buffer.eps) ** 0.5
    probabilities /= probabilities.sum()
    batch = buffer.sample(256, beta=0.7)
    position = {index: i for i, index in enumerate(valid)}
    p = probabilities[[position[i] for i in batch.indices]]
    expected = (len(valid) * p) ** -0.7 / (len(valid) * probabilities.min()) ** -0.7
    np.testing.assert_allclose(batch.weights, expected, rtol=1e-5)
    # a new transition gets the largest priority seen so far
    buffer.add(np.full((1, 1), 99, np.float32), [0], [0.0], [False], [False])
    newest = (buffer.cursor[0] - 2) % buffer.T
    assert buffer.tree[np.array([newest])][0] == pytest.approx((4.0 + buffer.eps) ** 0.5)


def test_state_dict_round_trip() -> None:
    space = Box(-1, 1, (2,))
    buffer = PrioritizedReplayBuffer(space, Discrete(2), 32, seed=0)
    for step in range(12):
        buffer.add(np.full((1, 2), step, np.float32), [1], [1.0], [step == 5], [False])
    state = buffer.state_dict()
    copy = PrioritizedReplayBuffer(space, Discrete(2), 32, seed=123)
    copy.load_state_dict(state)
    a, b = buffer.sample(8, beta=0.4), copy.sample(8, beta=0.4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


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


def test_loaded_replay_with_other_n_step_samples_only_complete_windows(tmp_path) -> None:
    """A prioritized replay file read into a buffer whose n_step was overridden on load samples
    only slots whose n-step window is complete under the new n_step: the saved priorities of the
    others must not let returns and bootstrap observations be read from unwritten slots."""
    envs = serial_cartpole(1)
    try:
        agent = Rainbow(env=envs, **{**SMALL_DQN, "learning_starts": 32}, n_step=1)
        agent.learn(100)
        path = agent.save_with_replay(tmp_path / "agent.pt")
    finally:
        envs.close()
    envs = serial_cartpole(1)
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
    envs = serial_cartpole(1)
    try:
        agent = Rainbow(env=envs, **{**SMALL_DQN, "learning_starts": 32}, priority_alpha=0.5)
        agent.learn(100)
        saved = agent.buffer.tree.priorities().copy()
        path = agent.save_with_replay(tmp_path / "agent.pt")
    finally:
        envs.close()
    envs = serial_cartpole(1)
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


def test_n_step_returns_stop_at_truncation_and_termination_by_hand():
    """One env, n = 3, gamma = 0.5: an episode truncated after 3 steps (final obs 99), one
    terminated after 2 steps, then a running one. Targets and discounts by hand."""
    buffer = ReplayBuffer(gym.spaces.Box(-1e3, 1e3, (1,), np.float32), gym.spaces.Discrete(2),
                          capacity=32, n_step=3, gamma=0.5, seed=0)  # fmt: skip

    def add(obs, reward, terminated=False, truncated=False, final=None):
        buffer.add(np.array([[obs]], np.float32), np.array([1]), np.array([reward]),
                   np.array([terminated]), np.array([truncated]),
                   None if final is None else np.array([[final]], np.float32))  # fmt: skip

    add(0, 1.0)
    add(1, 2.0)
    add(2, 4.0, truncated=True, final=99)  # slot 3 holds 99
    add(10, 8.0)
    add(11, 16.0, terminated=True)  # slot 6 holds a zero final obs
    for k, obs in enumerate((12, 13, 14, 15, 16)):
        add(obs, 32.0 * 2**k)
    # slot -> (obs, n-step return, discount, bootstrap obs)
    expected = {
        0: (0, 1 + 0.5 * 2 + 0.25 * 4, 0.125, 99),
        1: (1, 2 + 0.5 * 4, 0.25, 99),
        2: (2, 4, 0.5, 99),
        4: (10, 8 + 0.5 * 16, 0.0, None),
        5: (11, 16, 0.0, None),
        7: (12, 32 + 0.5 * 64 + 0.25 * 128, 0.125, 15),
        8: (13, 64 + 0.5 * 128 + 0.25 * 256, 0.125, 16),
    }
    valid = set(np.flatnonzero(buffer._valid_mask().reshape(-1)).tolist())
    assert valid == set(expected)
    sample = buffer.get(np.array(sorted(expected)))
    for row, slot in enumerate(sorted(expected)):
        obs, ret, discount, bootstrap = expected[slot]
        assert sample.obs[row, 0] == obs
        assert sample.reward[row] == pytest.approx(ret)
        assert sample.discount[row] == pytest.approx(discount)
        if bootstrap is not None:
            assert sample.next_obs[row, 0] == bootstrap
