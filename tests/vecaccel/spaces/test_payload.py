"""Spaces with leaves of no fixed size (Text, Graph, Sequence, OneOf, a custom space) on every
backend, beside ``SyncVectorEnv``: alone and nested, as observations and as actions, in every
autoreset mode and under fork, spawn and forkserver; a fixed space pickles nothing per step;
where tensors are needed such spaces are refused up front.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from backend_matrix import backend_of, options_for, select
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from helpers import assert_same, reorder_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from space_strategies import payload_leaves, space_trees
from toy_envs import RaiseAt

import vecaccel
from vecaccel.spaces import PayloadLeaf, check_actions, item_reader, leaf_specs
from vecaccel.spaces.payload import (
    format_path,
    layout_specs,
    require_fixed_layout,
)
from vecaccel.spaces.payload import (
    payload_leaves as leaves_of,
)
from vecaccel.worker import derived_seed


class TokenSpace(spaces.Space):
    """A space Gymnasium and vecaccel know nothing about: sets of up to ``size`` tokens."""

    def __init__(self, tokens: tuple[str, ...] = ("go", "stop", "left", "right"), size: int = 2):
        super().__init__(None, None)
        self.tokens = tuple(tokens)
        self.size = size

    def sample(self, mask=None, probability=None) -> frozenset:
        count = int(self.np_random.integers(self.size + 1))
        return frozenset(self.np_random.choice(self.tokens, size=count, replace=False).tolist())

    def contains(self, x) -> bool:
        return isinstance(x, frozenset) and len(x) <= self.size and x <= set(self.tokens)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, TokenSpace)
            and other.tokens == self.tokens
            and other.size == self.size
        )

    def __repr__(self) -> str:
        return f"TokenSpace({self.size})"


def describe(value: Any) -> str:
    """A deterministic text for any space's item (for an info echoing the action)."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{value.shape}{value.tolist()}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(describe(v) for v in value) + ")"
    if isinstance(value, frozenset):
        return "{" + ",".join(sorted(value)) + "}"
    return f"{type(value).__name__}:{value!r}"


class PayloadSpaceEnv(gym.Env):
    """Seeded samples of any space as observations; the info echoes the action as text (so a
    wrongly delivered action shows in the comparison); episodes end at random."""

    def __init__(self, obs_space, act_space, p_end: float = 0.3):
        self.observation_space = obs_space
        self.action_space = act_space
        self._sampler = copy.deepcopy(obs_space)
        self.p_end = p_end
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sampler.seed(int(self.np_random.integers(2**31)))
        self.t = 0
        return self._sampler.sample(), {"start": int(self.np_random.integers(100))}

    def step(self, action):
        assert self.action_space.contains(action), (action, self.action_space)
        self.t += 1
        info: dict[str, Any] = {"action": describe(action)}
        if self.t % 2:
            info["odd"] = self.t
        terminated = bool(self.np_random.random() < self.p_end)
        return self._sampler.sample(), float(self.t), terminated, self.t % 5 == 0, info


def raising_payload_env(obs_space, act_space, at: int) -> gym.Env:
    """A :class:`PayloadSpaceEnv` whose ``at``-th step raises (each rebuilt one's too)."""
    return RaiseAt(PayloadSpaceEnv(obs_space, act_space, p_end=0.0), at)


NUM_ENVS = 3
#: Every episode ends by its fifth step (truncated at t=5): six steps cross an autoreset in
#: every env.
STEPS = 6
#: every backend that takes and returns NumPy arrays
BACKENDS = select(tensors=False)
#: those of them with worker processes
PROCESS_BACKENDS = select(worker_processes=True, tensors=False)
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]

KINDS: dict[str, spaces.Space] = {
    "text": spaces.Text(4, min_length=1, charset="abcde"),
    "graph": spaces.Graph(spaces.Box(0, 1, (2,)), spaces.Discrete(3)),
    "sequence": spaces.Sequence(spaces.Box(0, 1, (2,))),
    "sequence_stacked": spaces.Sequence(spaces.Discrete(3), stack=True),
    "one_of": spaces.OneOf((spaces.Discrete(2), spaces.Box(-1, 1, (2,)))),
    "custom": TokenSpace(),
}


def nested(leaf: spaces.Space) -> spaces.Space:
    """``leaf`` two levels down, beside fixed leaves (which stay in shared memory)."""
    return spaces.Dict(
        {
            "pos": spaces.Box(-1, 1, (2,), np.float32),
            "more": spaces.Tuple(
                (
                    spaces.Discrete(4, start=1),
                    spaces.Dict({"leaf": leaf, "bits": spaces.MultiBinary(2)}),
                )
            ),
        }
    )


def every_kind() -> spaces.Space:
    return spaces.Tuple((spaces.Dict(dict(KINDS)), spaces.Box(0, 5, (), np.int32)))


def backend_options(backend: str, context: str) -> dict:
    return options_for(backend, context=context)


def in_arrival_order(backend: str) -> bool:
    """Whether ``backend`` returns its envs as they finish, naming them in ``info["env_id"]``."""
    return backend_of(backend).partial_batches


# ---------------------------------------------------------------------------------------------
# driving a backend in env order (async returns envs as they finish)


def reorder_infos(infos: Any, order: np.ndarray) -> Any:
    if isinstance(infos, dict):
        return {key: reorder_infos(value, order) for key, value in infos.items()}
    return infos[order]


def reset(env, backend: str, **kwargs):
    obs, infos = env.reset(**kwargs)
    if not in_arrival_order(backend):
        return obs, infos
    order = np.argsort(infos["env_id"])
    if kwargs.get("options", {}).get("reset_mask") is not None:
        order = np.arange(env.num_envs)  # a masked reset returns the envs held, in order
    infos = reorder_infos(infos, order)
    infos.pop("env_id")
    return reorder_batch(env.single_observation_space, obs, order), infos


def step(env, backend: str, actions):
    if not in_arrival_order(backend):
        return env.step(actions)
    ids = np.arange(env.num_envs)
    env.send(actions, ids)
    obs, rew, term, trunc, infos = env.recv_ids(ids)
    np.testing.assert_array_equal(infos.pop("env_id"), ids)
    return obs, rew, term, trunc, infos


def run_beside_sync(
    obs_space, act_space, backend, mode, context="fork", seed=0, steps=STEPS, **options
):
    """Step ``backend`` and ``SyncVectorEnv`` with the same seeds and actions; compare all.
    ``options`` update the backend's."""
    fns = [partial(PayloadSpaceEnv, obs_space, act_space)] * NUM_ENVS
    sync = SyncVectorEnv(fns, autoreset_mode=mode)
    with contextlib.closing(sync):
        env = vecaccel.make_vec(
            fns,
            backend=backend,
            autoreset_mode=mode,
            **{**backend_options(backend, context), **options},
        )
        with contextlib.closing(env):
            assert env.single_observation_space == obs_space
            assert env.single_action_space == act_space
            assert_same(reset(env, backend, seed=seed), sync.reset(seed=seed), "reset")
            sync.action_space.seed(seed)
            ended = 0
            for t in range(steps):
                actions = sync.action_space.sample()
                expected = sync.step(actions)
                assert_same(step(env, backend, actions), expected, f"step {t}")
                done = expected[2] | expected[3]
                ended += int(done.sum())
                if mode is AutoresetMode.DISABLED and done.any():
                    options = {"reset_mask": done}
                    assert_same(
                        reset(env, backend, options=options),
                        sync.reset(options=options),
                        f"masked reset after step {t}",
                    )
            assert ended >= 2  # the episodes ended: autoresets were compared too


# ---------------------------------------------------------------------------------------------
# every kind, alone and nested, observation and action, every backend and autoreset mode


def kind_backend_mode(shift: int = 0) -> list:
    """Every (kind, backend) pair once, with an autoreset mode that turns with both, so that
    each (kind, mode) and each (backend, mode) pair comes up too; every kind in every mode on
    every backend is ``test_every_kind_together_matches_sync``."""
    cases = []
    for k, kind in enumerate(KINDS):
        for b, backend in enumerate(BACKENDS):
            mode = MODES[(k + b + shift) % len(MODES)]
            cases.append(pytest.param(kind, backend, mode, id=f"{kind}-{backend}-{mode.name}"))
    return cases


@pytest.mark.parametrize("kind, backend, mode", kind_backend_mode())
def test_each_kind_alone_matches_sync(kind, backend, mode):
    leaf = KINDS[kind]
    run_beside_sync(leaf, spaces.Discrete(3), backend, mode)  # observations
    run_beside_sync(spaces.Box(0, 1, (2,), np.float32), leaf, backend, mode)  # actions


@pytest.mark.parametrize("kind, backend, mode", kind_backend_mode(shift=1))
def test_each_kind_nested_matches_sync(kind, backend, mode):
    run_beside_sync(nested(KINDS[kind]), nested(KINDS[kind]), backend, mode, seed=5)


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kind_together_matches_sync(backend, mode):
    run_beside_sync(every_kind(), every_kind(), backend, mode, seed=11)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
def test_every_kind_under_spawn_and_forkserver(backend, context):
    if context not in multiprocessing.get_all_start_methods():
        pytest.skip(f"{context} is not available here")
    mode = AutoresetMode.SAME_STEP if in_arrival_order(backend) else AutoresetMode.NEXT_STEP
    # one worker: each is a fresh interpreter that imports this module for its env; two workers'
    # slices are the fork tests'
    run_beside_sync(
        every_kind(), nested(KINDS["custom"]), backend, mode, context, seed=2, num_workers=1
    )


@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    obs_space=space_trees(
        st.one_of(payload_leaves(st.just(TokenSpace())), st.just(spaces.Discrete(3)))
    ),
    act_space=space_trees(st.one_of(payload_leaves(), st.just(spaces.Box(0, 1, (2,))))),
    backend=st.sampled_from(PROCESS_BACKENDS),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**20),
)
def test_random_trees_with_payload_leaves_match_sync(obs_space, act_space, backend, mode, seed):
    run_beside_sync(obs_space, act_space, backend, mode, seed=seed, steps=6)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    space=space_trees(
        st.one_of(payload_leaves(st.just(TokenSpace())), st.just(spaces.Discrete(3)))
    ),
    n=st.integers(1, 4),
    seed=st.integers(0, 2**20),
)
def test_check_actions_splits_payload_leaves_as_gymnasium_iterates(space, n, seed):
    batched = batch_space(space, n)
    batched.seed(seed)
    actions = batched.sample()
    read = item_reader(check_actions(space, actions, n))
    for i, expected in enumerate(iterate(batched, actions)):
        assert_same(read(i), expected, f"env {i}")
        assert space.contains(read(i))


def test_shm_without_copy_shares_nothing_stale():
    """``copy=False``: arrays are views, items a tuple of this step's items."""
    space = nested(KINDS["text"])
    fns = [partial(PayloadSpaceEnv, space, spaces.Discrete(2))] * NUM_ENVS
    sync = SyncVectorEnv(fns, copy=False)
    env = vecaccel.make_vec(fns, backend="shm", num_workers=2, context="fork", copy=False)
    with contextlib.closing(sync), contextlib.closing(env):
        assert_same(env.reset(seed=1), sync.reset(seed=1))
        for t in range(4):
            actions = np.array([0, 1, 0])
            assert_same(env.step(actions), sync.step(actions), f"step {t}")


@pytest.mark.parametrize("backend", select(envs_in_workers=True, tensors=False))
def test_items_larger_than_the_payload_slab(backend):
    """Items past the worker's shared-memory slab take its pipe, whole."""
    space = spaces.Sequence(spaces.Box(0, 1, (4096,), np.float64), stack=True)  # 32 KiB an item
    run_beside_sync(space, space, backend, AutoresetMode.NEXT_STEP, seed=4, steps=4)


# ---------------------------------------------------------------------------------------------
# restarts: a rebuilt env's (or a restarted worker's) first observation items reach the caller


def _fresh_obs(space, seed):
    env = PayloadSpaceEnv(space, spaces.Discrete(2))
    return env.reset(seed=seed)[0]


@pytest.mark.parametrize("how", ["env_raises", "worker_dies"])
def test_restarted_envs_return_their_new_observation_items(how):
    space = nested(KINDS["graph"])
    at = 3 if how == "env_raises" else 10**6
    fns = [partial(raising_payload_env, space, spaces.Discrete(2), at)] * 4
    env = vecaccel.make_vec(
        fns, backend="shm", num_workers=2, context="fork", on_worker_failure="restart"
    )
    with contextlib.closing(env):
        env.reset(seed=10)
        actions = np.zeros(4, dtype=np.int64)
        env.step(actions)
        if how == "worker_dies":
            env.pool.workers[0].process.kill()
            env.pool.workers[0].process.join(5)
        else:
            env.step(actions)
        obs, _, _, trunc, infos = env.step(actions)
        restarted = [0, 1] if how == "worker_dies" else [0, 1, 2, 3]
        assert infos["worker_restarted"][restarted].all() and trunc[restarted].all()
        for i in restarted:
            expected = _fresh_obs(space, derived_seed(10 + i, i, 1))
            got = reorder_batch(space, obs, np.array([i]))
            assert_same(got, reorder_batch(space, _batch_of_one(space, expected), [0]), f"env {i}")
        env.step(actions)  # and they step on


def _batch_of_one(space, item):
    return concatenate(space, [item], create_empty_array(space, 1))


# ---------------------------------------------------------------------------------------------
# a space fixed throughout pickles nothing per step


class _Counted:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.mark.parametrize("backend", PROCESS_BACKENDS)
def test_fixed_space_pickles_nothing_per_step(backend):
    env = vecaccel.make_vec("CartPole-v1", 4, backend=backend, **backend_options(backend, "fork"))
    with contextlib.closing(env):
        pool = env.pool
        assert pool.obs_columns == [] and pool.action_columns == []
        env.reset(seed=0)
        received, sent = _Counted(pool.recv_payload), _Counted(pool.send_many)
        pool.recv_payload, pool.send_many = received, sent
        slab = pool.views.payload_len
        for _ in range(300):  # CartPole's infos are empty: nothing to pickle either way
            step(env, backend, np.zeros(4, dtype=np.int64))
            assert (slab == -1).all()
        assert received.calls == 0 and sent.calls == 0


def test_payload_space_takes_the_payload_path():
    """The counterpart of the test above: a Text observation comes with every reply."""
    fns = [partial(PayloadSpaceEnv, KINDS["text"], spaces.Discrete(2), 0.0)] * 4
    env = vecaccel.make_vec(fns, backend="shm", num_workers=2, context="fork")
    with contextlib.closing(env):
        env.reset(seed=0)
        received = _Counted(env.pool.recv_payload)
        env.pool.recv_payload = received
        for _ in range(5):
            obs, *_ = env.step(np.zeros(4, dtype=np.int64))
            assert all(isinstance(text, str) for text in obs)
        assert received.calls == 5 * 2


# ---------------------------------------------------------------------------------------------
# where tensors are needed: refused up front, naming the space, the leaf and the backends


def test_payload_leaves_and_layout():
    space = nested(KINDS["graph"])
    assert [path for path, _ in leaves_of(space)] == [("more", 1, "leaf")]
    assert leaves_of(spaces.Box(0, 1, (2,))) == []
    assert leaves_of(KINDS["text"]) == [((), KINDS["text"])]
    specs = layout_specs(space, 3)
    assert specs["more"][1]["leaf"] == PayloadLeaf(3)
    assert specs["pos"] == leaf_specs(space["pos"], 3)
    assert format_path("obs", ("more", 1, "leaf")) == "obs['more'][1]['leaf']"
    fixed = spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Tuple((spaces.MultiBinary(3),))})
    assert layout_specs(fixed, 2) == leaf_specs(fixed, 2)
    require_fixed_layout(fixed, "PPO")


def test_require_fixed_layout_names_the_leaf_and_the_backends():
    with pytest.raises(TypeError) as info:
        require_fixed_layout(nested(KINDS["text"]), "PPO", "action")
    message = str(info.value)
    assert message.startswith("PPO needs tensors")
    assert "action['more'][1]['leaf']" in message and "Text(" in message
    assert "'shm'" in message and "'async'" in message


def test_action_server_refuses_payload_spaces_before_starting_workers():
    pytest.importorskip("torch")
    before = set(multiprocessing.active_children())
    for obs_space, act_space, needle in [
        (nested(KINDS["sequence"]), spaces.Discrete(2), "obs['more'][1]['leaf']"),
        (spaces.Box(0, 1, (2,)), KINDS["custom"], "the whole space"),
    ]:
        fns = [partial(PayloadSpaceEnv, obs_space, act_space)] * 2
        with pytest.raises(TypeError) as info:
            vecaccel.make_vec(fns, backend="action_server", device="cpu", num_workers=1)
        message = str(info.value)
        assert needle in message and "action_server" in message and "'shm'" in message
        assert set(multiprocessing.active_children()) == before


def test_sampler_refuses_payload_spaces():
    pytest.importorskip("torch")
    from vecaccel.sampler import Sampler

    fns = [partial(PayloadSpaceEnv, nested(KINDS["one_of"]), spaces.Discrete(2))] * 2
    env = vecaccel.make_vec(fns, backend="serial")
    with contextlib.closing(env):
        with pytest.raises(TypeError, match=r"the Sampler needs tensors.*obs\['more'\]\[1\]"):
            Sampler(env, lambda obs: (None, {}), horizon=2)


# ---------------------------------------------------------------------------------------------
# Gymnasium's error types for actions


@pytest.mark.parametrize("backend", select())
def test_unbatched_actions_are_type_errors_and_wrong_counts_value_errors(backend):
    if backend_of(backend).tensors:
        pytest.importorskip("torch")
        options = options_for(backend, num_workers=1)
    else:
        options = backend_options(backend, "fork")
    env = vecaccel.make_vec("CartPole-v1", 2, backend=backend, **options)
    sync = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")
    with contextlib.closing(env), contextlib.closing(sync):
        env.reset(seed=0)
        sync.reset(seed=0)
        with pytest.raises(TypeError):
            sync.step(0)  # what Gymnasium raises
        with pytest.raises(TypeError) as info:
            env.step(0)
        assert "Discrete(2)" in str(info.value) and "(2,)" in str(info.value)
        with pytest.raises(ValueError, match=r"shape \(2,\)"):
            env.step(np.zeros(3, dtype=np.int64))  # three actions for two envs
        with pytest.raises(ValueError, match="env 1"):
            env.step(np.array([0, 2]))  # out of range: vecaccel checks, Gymnasium does not


def test_box_action_without_the_batch_axis_is_a_type_error():
    fns = [partial(PayloadSpaceEnv, spaces.Discrete(2), spaces.Box(-1, 1, (3,), np.float32))] * 2
    env = vecaccel.make_vec(fns, backend="shm", num_workers=1, context="fork")
    with contextlib.closing(env):
        env.reset(seed=0)
        with pytest.raises(TypeError, match=r"Box\(-1.0, 1.0, \(3,\), float32\).*\(2, 3\)"):
            env.step(np.zeros(3, np.float32))
        with pytest.raises(ValueError):
            env.step(np.zeros((3, 3), np.float32))
        with pytest.raises(TypeError, match="Text"):
            require_fixed_layout(KINDS["text"], "x")
        env.step(np.zeros((2, 3), np.float32))  # nothing was sent: it steps on


def test_unbatched_payload_and_dict_actions_are_type_errors():
    space = spaces.Dict({"t": KINDS["text"], "d": spaces.Discrete(2)})
    fns = [partial(PayloadSpaceEnv, spaces.Discrete(2), space)] * 2
    env = vecaccel.make_vec(fns, backend="shm", num_workers=1, context="fork")
    with contextlib.closing(env):
        env.reset(seed=0)
        with pytest.raises(TypeError, match="must be a dict"):
            env.step(0)
        with pytest.raises(TypeError, match=r"Text\("):
            env.step({"t": "abc", "d": np.array([0, 1])})  # one text for two envs
        with pytest.raises(ValueError, match="2 items"):
            env.step({"t": ("a", "b", "c"), "d": np.array([0, 1])})
        env.step({"t": ("a", "bb"), "d": np.array([0, 1])})
