"""A worker's slice as one batched vector env (``VectorSlice``), stepped in this process over a
shared layout of its own: the slots hold what the inner vector env returns stepped alone, seeded
with the slice's first seed; an error names the slice's envs and its owner, or under the restart
policy rebuilds the vector env and truncates every env of the slice; masked resets, calls and
attributes reach the sub-envs named. ``make_env_slice`` picks the kind of slice."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from toy_vector_envs import (
    FailingVectorEnv,
    failing_cartpole,
    native_cartpole,
    sync_cartpole,
    sync_info_cartpole,
)

from vecaccel.envs.vectorized_slices import SliceEnvFn, VectorEnvFn
from vecaccel.worker import (
    EnvMakeError,
    EnvSlice,
    SharedLayout,
    VectorSlice,
    derived_seed,
    make_env_slice,
)

NUM_ENVS = 6
START, COUNT = 2, 3  # the slice holds envs 2, 3 and 4
ROWS = slice(START, START + COUNT)
CARTPOLE_OBS = gym.make("CartPole-v1").observation_space
CARTPOLE_ACT = gym.make("CartPole-v1").action_space


def slice_fns(fn, mode: AutoresetMode = AutoresetMode.NEXT_STEP, count: int = COUNT) -> list:
    """The env functions of ``count`` sub-envs of vector env function ``fn``."""
    return [SliceEnvFn(VectorEnvFn(fn, mode))] * count


def views_of(obs_space=CARTPOLE_OBS, action_space=CARTPOLE_ACT):
    layout = SharedLayout(obs_space, action_space, NUM_ENVS, 2)
    return layout.views(bytearray(layout.nbytes))


def make_slice(fn, mode=AutoresetMode.NEXT_STEP, restart=False, **spaces_asked) -> VectorSlice:
    obs_space = spaces_asked.get("obs_space", CARTPOLE_OBS)
    action_space = spaces_asked.get("action_space", CARTPOLE_ACT)
    return VectorSlice(
        START,
        slice_fns(fn, mode),
        mode,
        views_of(),
        obs_space,
        action_space,
        restart,
        owner="worker 1",
    )


def same_step_failing(n: int) -> gym.vector.VectorEnv:
    """A ``SAME_STEP`` ``SyncVectorEnv`` of CartPoles that raises in its third step."""
    return FailingVectorEnv(sync_cartpole(n, "SameStep"), fail_at=3)


def test_make_env_slice_picks_the_slice_the_env_functions_ask_for():
    views = views_of()
    mode = AutoresetMode.NEXT_STEP
    vectorized = make_env_slice(
        START, slice_fns(native_cartpole), mode, views, CARTPOLE_OBS, CARTPOLE_ACT, False,
        owner="worker 3",
    )  # fmt: skip
    per_env = make_env_slice(
        START, [lambda: gym.make("CartPole-v1")] * COUNT, mode, views, CARTPOLE_OBS,
        CARTPOLE_ACT, False,
    )  # fmt: skip
    try:
        assert type(vectorized) is VectorSlice and type(per_env) is EnvSlice
        assert vectorized.where == "the vector env of envs 2..4 on worker 3"
        assert len(vectorized.runners) == len(per_env.runners) == COUNT
        assert vectorized.obs_items([2, 3]) == []  # a fixed layout carries no items
        assert vectorized.take_action_items([]) == [0, 1, 2]
    finally:
        vectorized.close()
        per_env.close()


@pytest.mark.parametrize("fn", [native_cartpole, sync_info_cartpole])
def test_steps_write_what_the_vector_env_returns_stepped_alone(fn):
    """Reset with the slice's seeds ``seed + start ..``, the inner vector env is seeded with
    ``seed + start``; its batches land in the slice's slots, its infos stay batched."""
    envs = make_slice(fn)
    reference = fn(COUNT)
    views = envs.views
    try:
        pairs, errors = envs.reset_all([7 + START + j for j in range(COUNT)], None, None)
        assert errors == [] and [i for i, _ in pairs] == [2, 3, 4]
        np.testing.assert_array_equal(views.obs[ROWS], reference.reset(seed=7 + START)[0])
        rng = np.random.default_rng(1)
        ended = 0
        for _ in range(60):
            actions = rng.integers(0, 2, size=COUNT)
            views.actions[ROWS] = actions
            infos, errors = envs.step_all()
            obs, rew, term, trunc, want_infos = reference.step(actions)
            assert errors == []
            np.testing.assert_array_equal(views.obs[ROWS], obs)
            np.testing.assert_array_equal(views.rewards[ROWS], rew)
            np.testing.assert_array_equal(views.terminations[ROWS], term)
            np.testing.assert_array_equal(views.truncations[ROWS], trunc)
            ended += int((term | trunc).sum())
            if want_infos:
                [part] = infos
                assert (part.start, part.count, part.restart_reason) == (START, COUNT, None)
                np.testing.assert_array_equal(part.infos["count"], want_infos["count"])
                np.testing.assert_array_equal(part.infos["_count"], want_infos["_count"])
            else:
                assert infos == []
        assert ended > 2
        assert not views.obs[:START].any() and not views.obs[START + COUNT :].any()
    finally:
        envs.close()
        reference.close()


def test_one_env_alone_cannot_step():
    envs = make_slice(native_cartpole)
    try:
        info, report = envs.step(1)
        assert info is None
        assert (report.env_index, report.type_name, report.what) == (3, "TypeError", "step")
        assert "steps all its envs at once" in report.message
    finally:
        envs.close()


def test_an_inner_error_names_the_slice_and_its_owner():
    envs = make_slice(functools.partial(failing_cartpole, fail_at=2, fail_size=COUNT))
    try:
        envs.reset_all([0] * COUNT, None, None)
        assert envs.step_all() == ([], [])
        infos, [report] = envs.step_all()
        assert infos == []
        assert (report.env_index, report.type_name) == (START, "ValueError")
        assert report.what == "step of the vector env of envs 2..4 on worker 1"
        assert report.message == "boom at step 2"
    finally:
        envs.close()


@pytest.mark.parametrize(
    "fn, mode",
    [
        (functools.partial(failing_cartpole, fail_at=3, fail_size=COUNT), AutoresetMode.NEXT_STEP),
        (same_step_failing, AutoresetMode.SAME_STEP),
    ],
    ids=["NextStep", "SameStep"],
)
def test_restart_rebuilds_the_vector_env_and_truncates_the_slice(fn, mode):
    envs = make_slice(fn, mode, restart=True)
    views = envs.views
    fresh = (native_cartpole if mode is AutoresetMode.NEXT_STEP else sync_cartpole)(COUNT)
    try:
        envs.reset_all([20 + START + j for j in range(COUNT)], None, None)
        views.actions[ROWS] = 0
        envs.step_all()
        envs.step_all()
        [part], errors = envs.step_all()
        assert errors == []
        assert (part.start, part.count) == (START, COUNT)
        assert part.restart_reason == "ValueError: boom at step 3"
        assert part.infos["worker_restarted"].all() and part.infos["_worker_restarted"].all()
        assert list(part.infos["restart_reason"]) == [part.restart_reason] * COUNT
        expected, _ = fresh.reset(seed=derived_seed(20 + START, START, 1))
        np.testing.assert_array_equal(views.obs[ROWS], expected)
        assert views.truncations[ROWS].all() and not views.terminations[ROWS].any()
        assert not views.rewards[ROWS].any()
        assert envs.restarts == 1
        if mode is AutoresetMode.SAME_STEP:
            final_obs = np.stack(part.infos["final_obs"])
            np.testing.assert_array_equal(final_obs, expected)
            assert part.infos["final_info"]["worker_restarted"].all()
        else:  # the next step only reports the fresh episode, where it stands
            assert envs.step_all() == ([], [])
            np.testing.assert_array_equal(views.obs[ROWS], expected)
            assert not views.truncations[ROWS].any() and not views.rewards[ROWS].any()
        envs.step_all()  # and the rebuilt vector env steps on
        np.testing.assert_array_equal(views.obs[ROWS], fresh.step(np.zeros(COUNT, np.int64))[0])
    finally:
        envs.close()
        fresh.close()


def test_a_rebuild_that_fails_is_reported_as_a_restart_error():
    built = []

    def fails_when_rebuilt(n: int) -> gym.vector.VectorEnv:
        if built:
            raise OSError("the simulator is gone")
        built.append(n)
        return failing_cartpole(n, fail_at=1, fail_size=n)

    envs = make_slice(fails_when_rebuilt, restart=True)
    try:
        envs.reset_all([0] * COUNT, None, None)
        infos, [report] = envs.step_all()
        assert infos == []
        assert (report.env_index, report.type_name) == (START, "OSError")
        assert report.what == "restart of the vector env of envs 2..4 on worker 1"
    finally:
        envs.close()


# -- building a slice -----------------------------------------------------------------------


def test_a_vector_env_of_other_spaces_is_refused_naming_the_slice():
    with pytest.raises(EnvMakeError) as caught:
        make_slice(native_cartpole, obs_space=spaces.Box(-1, 1, (4,), np.float32))
    assert caught.value.index == START
    assert "the vector env of envs 2..4 on worker 1 has single observation space" in str(
        caught.value.error
    )


def test_spaces_of_no_fixed_size_are_refused():
    with pytest.raises(EnvMakeError, match="fixed size"):
        make_slice(native_cartpole, action_space=spaces.Text(4))


def test_a_vector_env_function_that_raises_names_the_slices_first_env():
    def broken(n: int) -> gym.vector.VectorEnv:
        raise RuntimeError("no display")

    with pytest.raises(EnvMakeError) as caught:
        make_slice(broken)
    assert caught.value.index == START and str(caught.value.error) == "no display"


def test_env_functions_of_two_vector_env_functions_are_refused():
    fns = slice_fns(native_cartpole, count=2) + slice_fns(native_cartpole, count=1)
    with pytest.raises(EnvMakeError, match="one vector env function for all its envs"):
        VectorSlice(START, fns, AutoresetMode.NEXT_STEP, views_of(), CARTPOLE_OBS, CARTPOLE_ACT,
                    False)  # fmt: skip


# -- resets, calls and attributes -------------------------------------------------------------


def test_a_masked_reset_resets_only_the_sub_envs_it_names():
    envs = make_slice(sync_cartpole)
    reference = sync_cartpole(COUNT)
    views = envs.views
    mask = np.array([True, False, True])
    try:
        envs.reset_all([1, 2, 3], None, None)
        reference.reset(seed=[1, 2, 3])
        views.actions[ROWS] = 1
        envs.step_all()
        reference.step(np.ones(COUNT, np.int64))
        pairs, errors = envs.reset_all([11, None, 13], None, mask)
        assert errors == [] and [i for i, _ in pairs] == [2, 4]
        obs, _ = reference.reset(seed=[11, None, 13], options={"reset_mask": mask})
        np.testing.assert_array_equal(views.obs[ROWS], obs)
        assert views.rewards[ROWS].tolist() == [0.0, 1.0, 0.0]
        assert envs.last_seed == 11
        assert envs.reset_all([5] * COUNT, None, np.zeros(COUNT, bool)) == ([], [])
    finally:
        envs.close()
        reference.close()


def test_a_reset_that_leaves_the_envs_to_reset_skips_the_next_step():
    envs = make_slice(native_cartpole)
    try:
        envs.reset_all([0] * COUNT, None, None, needs_reset=True)
        before = envs.views.obs[ROWS].copy()
        envs.views.rewards[ROWS] = 5.0
        assert envs.step_all() == ([], [])
        np.testing.assert_array_equal(envs.views.obs[ROWS], before)
        assert not envs.views.rewards[ROWS].any()
    finally:
        envs.close()


def test_a_reset_of_one_env_resets_the_whole_slice_with_its_seed():
    envs = make_slice(sync_cartpole)
    reference = sync_cartpole(COUNT)
    try:
        assert envs.reset(1, 4, None) == {}
        np.testing.assert_array_equal(envs.views.obs[ROWS], reference.reset(seed=[4] * COUNT)[0])
    finally:
        envs.close()
        reference.close()


def test_calls_and_attributes_reach_the_sub_envs_named():
    envs = make_slice(sync_cartpole)
    try:
        assert envs.set_attrs("tag", [(0, "a"), (2, "c")]) == []
        assert envs.call_all("tag", [2, 0], (), {}) == (["c", "a"], [])
        assert envs.call_all(lambda env, k: env.spec.id * k, [1], (2,), {}) == (
            ["CartPole-v1CartPole-v1"],
            [],
        )
        assert envs.call_all("tag", [], (), {}) == ([], [])
        results, [report] = envs.call_all("tag", [1], (), {})  # env 3 has no tag
        assert results == []
        assert (report.env_index, report.type_name, report.what) == (
            3, "AttributeError", "call('tag')"
        )  # fmt: skip
    finally:
        envs.close()


def test_a_vector_env_holding_no_sub_envs_takes_one_value_for_all():
    envs = make_slice(native_cartpole)
    try:
        assert envs.set_attrs("gravity", [(j, 5.0) for j in range(COUNT)]) == []
        assert envs.call_all("gravity", [0, 2], (), {}) == ([5.0, 5.0], [])
        [report] = envs.set_attrs("gravity", [(0, 1.0), (1, 2.0)])
        assert report.env_index == START and report.type_name == "ValueError"
        assert report.what == "set_attr('gravity') of the vector env of envs 2..4 on worker 1"
    finally:
        envs.close()


def test_close_is_final_and_may_repeat():
    envs = make_slice(native_cartpole)
    envs.close()
    envs.close()
    assert envs.envs is None


def test_a_slice_as_big_as_its_vector_env_is_what_sync_vector_env_is():
    """The whole vector env in one slice (``start=0``): seeds go to the sub-envs as to
    ``SyncVectorEnv``'s, one list per reset."""
    layout = SharedLayout(CARTPOLE_OBS, CARTPOLE_ACT, COUNT, 1)
    views = layout.views(bytearray(layout.nbytes))
    mode = AutoresetMode.NEXT_STEP
    envs = VectorSlice(0, slice_fns(sync_cartpole), mode, views, CARTPOLE_OBS, CARTPOLE_ACT, False)
    reference = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * COUNT)
    try:
        envs.reset_all([3, 5, 8], None, None)
        np.testing.assert_array_equal(views.obs, reference.reset(seed=[3, 5, 8])[0])
    finally:
        envs.close()
        reference.close()
