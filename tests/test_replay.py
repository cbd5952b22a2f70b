"""Replay buffers: n-step targets and frame-once stacks against plain reference loops."""

from __future__ import annotations

from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete
from hypothesis import given, settings
from hypothesis import strategies as st

import vecaccel
from vecaccel.trainers.prioritized_replay import PrioritizedReplayBuffer
from vecaccel.trainers.replay import ReplayBuffer, ReplayMemoryError, available_memory


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
