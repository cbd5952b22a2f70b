"""The envs of one worker (``EnvSlice``), stepped in this process over a shared layout of their
own: what it writes into the slots is what ``SyncVectorEnv`` returns for the same envs; an env's
error is a report naming it, or under the restart policy a rebuilt env whose episode ends as
truncated; infos of the announced schema go into the info area; control calls report each env
that fails. Also the seeds of rebuilt envs and the failure count of the restart policy."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_envs import RaiseAt, TaggedCounterEnv, TextActionEnv, TextObsEnv

from vecaccel.spaces.payload import item_columns, store_items
from vecaccel.testing.envs import CounterEnv
from vecaccel.worker import (
    ENV_ERRORS,
    EnvMakeError,
    EnvSlice,
    FailureCounter,
    InfoSlots,
    SharedLayout,
    derived_seed,
    restarted_info,
)
from vecaccel.worker.info_schema import InfoSchema, info_fields

NUM_ENVS = 5
START = 2  # the slice holds envs 2, 3 and 4; envs 0 and 1 belong to others


def views_of(env: gym.Env, num_envs: int = NUM_ENVS):
    """The views of a shared layout for ``num_envs`` envs of ``env``'s spaces, in plain memory."""
    layout = SharedLayout(env.observation_space, env.action_space, num_envs, 1)
    return layout.views(bytearray(layout.nbytes))


def make_slice(env_fns, mode=AutoresetMode.NEXT_STEP, restart=False, like=None):
    """An ``EnvSlice`` of ``env_fns`` at :data:`START`, with the spaces of an env that ``like``
    (default: the first env function) makes."""
    probe = (like or env_fns[0])()
    obs_space, action_space = probe.observation_space, probe.action_space
    probe.close()
    views = views_of(probe)
    return EnvSlice(START, env_fns, mode, views, obs_space, action_space, restart)


def _spaces(env: gym.Env) -> tuple[gym.Space, gym.Space]:
    return env.observation_space, env.action_space


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


class CountingInfoEnv(TaggedCounterEnv):
    """A tagged counter whose step info holds its count, and from ``odd_from`` on a name too."""

    def __init__(self, tag: int = 0, odd_from: int = 10**9) -> None:
        super().__init__(tag)
        self.odd_from = odd_from

    def step(self, action):
        obs, rew, term, trunc, _ = super().step(action)
        info = {"count": self.count}
        if self.count >= self.odd_from:
            info["name"] = "odd"
        return obs, rew, term, trunc, info


# -- derived seeds, the info of a rebuilt env, the failure count ------------------------------


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    base=st.integers(0, 2**63 - 1),
    env_index=st.integers(0, 10_000),
    restart=st.integers(0, 1_000),
)
def test_derived_seeds_repeat_and_differ_per_restart(base, env_index, restart):
    seed = derived_seed(base, env_index, restart)
    assert seed == derived_seed(base, env_index, restart)
    assert 0 <= seed < 2**32
    assert seed != derived_seed(base, env_index, restart + 1)
    assert derived_seed(None, env_index, restart) is None  # an unseeded env stays random


def test_restarted_info_ends_the_episode_as_the_autoreset_mode_reports_it():
    obs = np.arange(3.0)
    same_step = restarted_info(AutoresetMode.SAME_STEP, obs, "worker died")
    assert same_step["worker_restarted"] and same_step["restart_reason"] == "worker died"
    assert same_step["final_obs"] is obs
    assert same_step["final_info"] == {"worker_restarted": True, "restart_reason": "worker died"}
    for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED):
        assert restarted_info(mode, obs, "x") == {"worker_restarted": True, "restart_reason": "x"}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    failures=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), max_size=12),
    max_restarts=st.integers(0, 8),
)
def test_failure_counter_counts_each_failure_once_and_each_env_it_hits(failures, max_restarts):
    counter = FailureCounter(num_envs=6, max_restarts=max_restarts)
    per_env = np.zeros(6, dtype=np.int64)
    for k, envs in enumerate(failures, start=1):
        message = counter.count(envs, "env failed")
        for i in envs:
            per_env[i] += 1
        assert counter.total == k
        assert (message is None) == (k <= max_restarts)
        if message is not None:
            assert f"{k} failures exceed max_restarts={max_restarts}" in message
    np.testing.assert_array_equal(counter.per_env, per_env)
    assert [counter.seed(3, i) for i in range(6)] == [
        derived_seed(3, i, int(per_env[i])) for i in range(6)
    ]


def test_failure_counter_finds_the_rebuilt_envs_in_a_steps_infos():
    pairs = [
        (0, {}),
        (2, {"worker_restarted": True, "restart_reason": "ValueError: boom"}),
        (3, {"worker_restarted": False}),
        (4, {"worker_restarted": True}),
    ]
    assert FailureCounter.restarts_in(pairs) == [(2, "ValueError: boom"), (4, "env failed")]


# -- building a slice -----------------------------------------------------------------------


def test_an_env_function_that_raises_names_its_env_and_closes_the_envs_built():
    closed: list[int] = []

    class Closing(CounterEnv):
        def close(self):
            closed.append(id(self))

    fns = [Closing, Closing, functools.partial(CounterEnv, fault_init=True)]
    views = views_of(CounterEnv())
    with pytest.raises(EnvMakeError) as caught:
        EnvSlice(START, fns, AutoresetMode.NEXT_STEP, views, *_spaces(CounterEnv()), False)
    error = caught.value
    assert error.index == START + 2
    assert isinstance(error.error, ValueError) and "boom in init" in str(error.error)
    assert len(closed) == 2
    report = error.report()
    assert (report.env_index, report.type_name, report.what) == (START + 2, "ValueError", "make")


def test_an_env_with_other_spaces_is_refused_naming_it():
    fns = [CounterEnv, cartpole]
    with pytest.raises(EnvMakeError) as caught:
        make_slice(fns)
    assert caught.value.index == START + 1
    assert f"env {START + 1} has observation space" in str(caught.value.error)


# -- stepping -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_steps_write_what_sync_vector_env_returns(mode):
    envs = make_slice([cartpole] * 3, mode)
    reference = SyncVectorEnv([cartpole] * 3, autoreset_mode=mode)
    views = envs.views
    rows = slice(START, START + 3)
    try:
        infos, errors = envs.reset_all([10, 11, 12], None, None)
        assert errors == [] and [i for i, _ in infos] == [2, 3, 4]
        np.testing.assert_array_equal(views.obs[rows], reference.reset(seed=[10, 11, 12])[0])
        rng = np.random.default_rng(0)
        episodes_ended = 0
        for _ in range(80):
            actions = rng.integers(0, 2, size=3)
            views.actions[rows] = actions
            infos, errors = envs.step_all()
            obs, rew, term, trunc, want_infos = reference.step(actions)
            assert errors == []
            np.testing.assert_array_equal(views.obs[rows], obs)
            np.testing.assert_array_equal(views.rewards[rows], rew)
            np.testing.assert_array_equal(views.terminations[rows], term)
            np.testing.assert_array_equal(views.truncations[rows], trunc)
            ended = [START + j for j in np.flatnonzero(term | trunc)]
            episodes_ended += len(ended)
            if mode is AutoresetMode.SAME_STEP:  # CartPole's own infos are empty
                assert [i for i, _ in infos] == ended
                for i, info in infos:
                    np.testing.assert_array_equal(
                        info["final_obs"], want_infos["final_obs"][i - START]
                    )
            else:
                assert infos == []
        assert episodes_ended > 3
        assert not views.obs[:START].any()  # the other slices' slots are untouched
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("fault", ["raise", "sys_exit"])
def test_an_env_error_is_reported_naming_the_env_and_the_others_step_on(fault):
    fns = [CounterEnv, functools.partial(CounterEnv, fault=fault, fault_step=2), CounterEnv]
    envs = make_slice(fns)
    try:
        envs.reset_all([None] * 3, None, None)
        assert envs.step_all() == ([], [])
        infos, errors = envs.step_all()
        assert infos == [] and len(errors) == 1
        report = errors[0]
        assert (report.env_index, report.what) == (START + 1, "step")
        assert report.type_name == {"raise": "ValueError", "sys_exit": "SystemExit"}[fault]
        assert envs.views.obs[START : START + 3, 0].tolist() == [2, 1, 2]
        info, error = envs.step(0)  # one env alone, as a per-env step does
        assert (info, error) == ({}, None)
        assert envs.views.obs[START, 0] == 3
    finally:
        envs.close()


def test_env_errors_are_exceptions_and_system_exit():
    assert issubclass(SystemExit, ENV_ERRORS) and issubclass(ValueError, ENV_ERRORS)
    assert not issubclass(KeyboardInterrupt, ENV_ERRORS)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_restart_on_error_rebuilds_the_env_from_a_derived_seed(mode):
    """The rebuilt env is reset from ``derived_seed(its last seed, its index, 1)``; its
    interrupted episode ends as truncated with no reward, and under ``NEXT_STEP`` the step after
    that resets it again, as after any truncation."""
    fns = [cartpole, lambda: RaiseAt(gym.make("CartPole-v1"), at=3)]
    envs = make_slice(fns, mode, restart=True)
    views = envs.views
    i = START + 1
    try:
        envs.reset_all([40, 41], None, None)
        views.actions[START : START + 2] = 0
        envs.step_all()
        envs.step_all()
        infos, errors = envs.step_all()
        assert errors == []
        [(index, info)] = infos
        assert index == i and info["worker_restarted"]
        assert info["restart_reason"] == "ArithmeticError: broken at step 3"
        fresh = gym.make("CartPole-v1")
        expected = fresh.reset(seed=derived_seed(41, i, 1))[0]
        np.testing.assert_array_equal(views.obs[i], expected)
        assert (views.rewards[i], views.terminations[i], views.truncations[i]) == (0, 0, 1)
        assert envs.restarts == [0, 1]
        if mode is AutoresetMode.SAME_STEP:
            np.testing.assert_array_equal(info["final_obs"], expected)
        else:
            assert envs.step(1) == ({}, None)
            np.testing.assert_array_equal(views.obs[i], fresh.reset()[0])
            assert (views.rewards[i], views.truncations[i]) == (0, 0)
    finally:
        envs.close()
        fresh.close()


def test_a_rebuild_that_fails_is_reported_as_a_restart_error():
    built = []

    def fails_when_rebuilt():
        if built:
            raise OSError("the simulator is gone")
        built.append(1)
        return TaggedCounterEnv(0, fail_on=1)

    envs = make_slice([fails_when_rebuilt], restart=True, like=TaggedCounterEnv)
    try:
        envs.reset_all([0], None, None)
        infos, errors = envs.step_all()
        assert infos == []
        [report] = errors
        assert (report.env_index, report.type_name, report.what) == (START, "OSError", "restart")
    finally:
        envs.close()


# -- infos in the shared info area ------------------------------------------------------------


def test_infos_of_the_announced_schema_go_into_the_info_area():
    fns = [functools.partial(CountingInfoEnv, tag, odd_from=3 if tag == 1 else 10**9)
           for tag in range(3)]  # fmt: skip
    envs = make_slice(fns)
    views = envs.views
    try:
        envs.reset_all([0] * 3, None, None)
        assert envs.step_all() == ([(2, {"count": 1}), (3, {"count": 1}), (4, {"count": 1})], [])
        schema = InfoSchema(7, info_fields({"count": 1}))
        envs.set_info_schema(schema)
        assert envs.step_all() == ([], [])  # every info in its block
        assert views.info_flags.tolist() == [0, 0, 7, 7, 7]
        slots = InfoSlots(schema, views.info_area, views.info_flags)
        assert slots.decode([2, 3, 4]) == [{"count": 2}] * 3
        infos, _ = envs.step_all()  # env 3's info has a key more: it takes the payload path
        assert infos == [(3, {"count": 3, "name": "odd"})]
        assert views.info_flags.tolist() == [0, 0, 7, 0, 7]
        assert envs.step(0) == (None, None)  # one env alone, the same way
        assert envs.step(1) == ({"count": 4, "name": "odd"}, None)
        assert slots.decode([2]) == [{"count": 4}]
    finally:
        envs.close()


# -- leaves with no fixed size ----------------------------------------------------------------


def test_text_observations_and_actions_travel_as_items():
    parent = views_of(TextObsEnv())  # what the caller's process holds
    envs = make_slice([TextObsEnv] * 2)
    try:
        envs.reset_all([5, 6], None, None)
        items = envs.obs_items([START, START + 1])
        store_items(item_columns(parent.obs), items)
        assert [parent.obs[i] for i in (START, START + 1)] == [
            TextObsEnv().reset(seed=seed)[0] for seed in (5, 6)
        ]
    finally:
        envs.close()
    envs = make_slice([TextActionEnv] * 3)
    try:
        envs.reset_all([None] * 3, None, None)
        slots = envs.take_action_items([(START + 2, ["abcd"]), (START, ["x"])])
        assert slots == [2, 0]
        for j in slots:
            envs.step(j)
        assert envs.views.obs[START : START + 3, 0].tolist() == [1, 0, 4]
    finally:
        envs.close()


# -- reset and control calls ------------------------------------------------------------------


def test_a_masked_reset_resets_only_its_envs_and_remembers_their_seeds():
    envs = make_slice([functools.partial(TaggedCounterEnv, tag) for tag in range(3)])
    views = envs.views
    try:
        envs.reset_all([1, 2, 3], None, None)
        views.actions[START : START + 3] = 1
        envs.step_all()
        envs.step_all()
        infos, errors = envs.reset_all([9, None, 7], None, np.array([True, True, False]))
        assert errors == [] and [i for i, _ in infos] == [2, 3]
        assert views.obs[START : START + 3, 1].tolist() == [0, 0, 2]
        assert views.rewards[START : START + 3].tolist() == [0, 0, 1]
        assert envs.last_seeds == [9, 2, 3]  # no seed keeps the one before, for rebuilds
    finally:
        envs.close()


def test_a_failing_reset_names_its_env():
    envs = make_slice([CounterEnv, functools.partial(CounterEnv, fault_reset=2)])
    try:
        envs.reset_all([None] * 2, None, None)
        infos, errors = envs.reset_all([None] * 2, None, None)
        assert [i for i, _ in infos] == [START]
        [report] = errors
        assert (report.env_index, report.what, report.message) == (START + 1, "reset",
                                                                    "boom in reset 2")  # fmt: skip
    finally:
        envs.close()


def test_calls_and_attributes_reach_the_envs_named_and_report_each_failure():
    envs = make_slice([functools.partial(TaggedCounterEnv, tag) for tag in range(3)])
    try:
        assert envs.call_all("tag", [2, 0], (), {}) == ([2, 0], [])
        assert envs.set_attrs("tag", [(0, 30), (2, 50)]) == []
        assert envs.call_all(lambda env, k: env.unwrapped.tag * k, [0, 1, 2], (2,), {}) == (
            [60, 2, 100],
            [],
        )
        results, errors = envs.call_all("no_such_method", [1, 2], (), {})
        assert results == []
        assert [(r.env_index, r.type_name, r.what) for r in errors] == [
            (3, "AttributeError", "call('no_such_method')"),
            (4, "AttributeError", "call('no_such_method')"),
        ]
        [report] = envs.set_attrs("unwrapped", [(1, None)])  # a property without a setter
        assert (report.env_index, report.what) == (3, "set_attr('unwrapped')")
    finally:
        envs.close()


def test_close_closes_every_env_even_when_one_fails_to():
    closed = []

    class FailsToClose(CounterEnv):
        def close(self):
            closed.append(self)
            raise RuntimeError("cannot close")

    envs = make_slice([FailsToClose, FailsToClose], like=CounterEnv)
    envs.close()
    assert len(closed) == 2 and envs.runners == []
    envs.close()  # a second close has nothing left to do
