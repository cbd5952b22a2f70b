"""The SB3 adapter's own guarantees beside ``DummyVecEnv``: each env stepped once, returned
observations kept, renders, dict observations through wrappers, indices, infos that do not
alias env state, options at autoreset, copies of terminal observations.

Every check runs on the adapter over the process backends and ``serial`` and, wherever a
result can be compared, side by side with ``DummyVecEnv`` on the same seeds and actions.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import multiprocessing
import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from backend_matrix import options_for, select
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from helpers import assert_same
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecNormalize,
)
from toy_envs import (
    CurrentStepEnv,
    DictObsEnv,
    FrameEnv,
    OptionsEnv,
    SampledSpaceEnv,
    StatefulInfoEnv,
)

import vecaccel
from vecaccel.adapters.sb3 import VecAccelEnv, to_sb3
from vecaccel.testing.envs import CounterEnv, counter_fns

# ---------------------------------------------------------------------------------------------
# the SB3 adapter beside DummyVecEnv

#: SB3 steps every env at once, in index order, as NumPy arrays.
SB3_BACKENDS = select(lockstep=True, tensors=False)


@pytest.fixture
def sb3():
    """Stable-Baselines3's pieces, imported only here (spawned workers import this module)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common import vec_env

    from vecaccel.adapters.sb3 import VecAccelEnv

    return vec_env, VecAccelEnv


def adapter(sb3, env_fns, backend: str, **kwargs: Any):
    _, vec_accel_env = sb3
    return vec_accel_env(list(env_fns), backend=backend, **options_for(backend), **kwargs)


@contextlib.contextmanager
def side_by_side(sb3, env_fns, backend: str) -> Iterator[tuple[Any, Any]]:
    """SB3's ``DummyVecEnv`` and the adapter over ``backend``, on the same env functions."""
    vec_env_module, _ = sb3
    reference = vec_env_module.DummyVecEnv(list(env_fns))
    try:
        venv = adapter(sb3, env_fns, backend)
    except BaseException:
        reference.close()
        raise
    try:
        yield reference, venv
    finally:
        reference.close()
        venv.close()


def assert_tree_close(expected: Any, actual: Any, where: str) -> None:
    if isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_tree_close(expected[key], actual[key], f"{where}[{key!r}]")
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7, err_msg=where)


@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_sb3_step_async_twice_steps_each_env_once(sb3, backend):
    """``DummyVecEnv`` keeps the last actions and steps every env once; the adapter may refuse
    the second ``step_async``, but must not step the envs twice and drop a step's results."""
    vec_env_module, _ = sb3
    with side_by_side(sb3, counter_fns(2), backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
            env.step_async(np.zeros(2, dtype=np.int64))
            with contextlib.suppress(RuntimeError):
                env.step_async(np.ones(2, dtype=np.int64))
            obs, rewards, dones, _ = env.step_wait()
            assert obs.ravel().tolist() == [1, 1], type(env).__name__
            assert env.get_attr("steps") == [1, 1], type(env).__name__


@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_sb3_returned_observations_survive_the_next_step(sb3, backend):
    """SB3's algorithms keep ``_last_obs`` across ``env.step`` (the replay buffer stores it as the
    transition's obs after the step), so every SB3 VecEnv returns fresh arrays. A backend made
    with ``copy=False`` returns views that the next step overwrites: the adapter must copy
    them, or refuse ``copy=False``."""
    vec_env_module, _ = sb3
    fns = [CounterEnv] * 2
    try:
        venv = adapter(sb3, fns, backend, copy=False)
    except ValueError:
        return  # refused: fine
    reference = vec_env_module.DummyVecEnv(fns)
    try:
        for env in (reference, venv):
            env.reset()
            first, *_ = env.step(np.zeros(2, dtype=np.int64))
            kept = first.copy()
            env.step(np.zeros(2, dtype=np.int64))
            np.testing.assert_array_equal(first, kept, err_msg=type(env).__name__)
    finally:
        reference.close()
        venv.close()


@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_sb3_render_tiles_as_dummy_vec_env(sb3, backend):
    vec_env_module, _ = sb3
    fns = [functools.partial(FrameEnv, i) for i in range(3)]
    with side_by_side(sb3, fns, backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
            env.step(np.zeros(3, dtype=np.int64))
        images = venv.get_images()
        expected = reference.get_images()
        assert len(images) == 3
        for got, want in zip(images, expected):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(venv.render("rgb_array"), reference.render("rgb_array"))
        np.testing.assert_array_equal(venv.render(), reference.render())
        assert venv.render_mode == reference.render_mode == "rgb_array"


@pytest.mark.parametrize("wrapper", ["normalize", "frame_stack"])
@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_sb3_dict_observations_through_wrappers(sb3, backend, wrapper):
    """Dict observations through ``VecNormalize``/``VecFrameStack``: obs, rewards, dones,
    terminal observations and ``reset_infos`` as on ``DummyVecEnv``."""
    vec_env_module, _ = sb3

    def wrap(env):
        if wrapper == "normalize":
            return vec_env_module.VecNormalize(env)
        return vec_env_module.VecFrameStack(env, n_stack=2)

    fns = [DictObsEnv] * 2
    reference = wrap(vec_env_module.DummyVecEnv(fns))
    venv = wrap(adapter(sb3, fns, backend))
    try:
        for env in (reference, venv):
            env.seed(5)
        assert_tree_close(reference.reset(), venv.reset(), "reset")
        assert venv.unwrapped.reset_infos == reference.unwrapped.reset_infos
        rng = np.random.default_rng(0)
        dones_seen = 0
        for t in range(12):
            actions = rng.integers(0, 2, size=2)
            ref_obs, ref_rew, ref_dones, ref_infos = reference.step(actions)
            obs, rew, dones, infos = venv.step(actions)
            assert_tree_close(ref_obs, obs, f"step {t} obs")
            np.testing.assert_allclose(rew, ref_rew, rtol=1e-6)
            np.testing.assert_array_equal(dones, ref_dones)
            for ref_info, info in zip(ref_infos, infos):
                assert sorted(info) == sorted(ref_info)
                assert info["TimeLimit.truncated"] == ref_info["TimeLimit.truncated"]
                if "terminal_observation" in ref_info:
                    assert_tree_close(
                        ref_info["terminal_observation"],
                        info["terminal_observation"],
                        f"step {t} terminal_observation",
                    )
            assert venv.unwrapped.reset_infos == reference.unwrapped.reset_infos
            dones_seen += int(dones.sum())
        assert dones_seen > 0
    finally:
        reference.close()
        venv.close()


@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_sb3_env_method_and_get_attr_indices_as_dummy_vec_env(sb3, backend):
    vec_env_module, _ = sb3
    fns = [functools.partial(FrameEnv, i) for i in range(3)]
    with side_by_side(sb3, fns, backend) as (reference, venv):
        for env in (reference, venv):
            env.reset()
        for indices in (None, -1, [2, 0], [-3], np.array([1, 2]), range(0, 3, 2)):
            assert venv.get_attr("index", indices=indices) == reference.get_attr(
                "index", indices=indices
            ), indices
        assert venv.get_attr("index", indices=np.int64(-2)) == [1]  # DummyVecEnv: TypeError
        results = venv.env_method("reset", indices=[np.int64(-1), 0], seed=4, options=None)
        expected = reference.env_method("reset", indices=[-1, 0], seed=4, options=None)
        assert_same([r[1] for r in results], [e[1] for e in expected], "reset infos")
        venv.set_attr("t", 7, indices=[-1])
        reference.set_attr("t", 7, indices=[-1])
        assert venv.get_attr("t") == reference.get_attr("t") == [0, 0, 7]
        with pytest.raises(AttributeError):
            venv.get_attr("no_such_attribute", indices=[1])
        with pytest.raises(IndexError):
            venv.env_method("render", indices=[3])


def make_quiet_adapter(env_fns, backend: str, **kwargs: Any) -> VecAccelEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch-oversubscription warning on small machines
        return VecAccelEnv(
            env_fns, backend=backend, **options_for(backend, num_workers=1), **kwargs
        )


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=10)


@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_step_infos_do_not_alias_env_state(backend: str) -> None:
    """The step infos SB3 receives are copies, not the env's own objects.

    ``DummyVecEnv.step_wait`` returns ``deepcopy(self.buf_infos)``: infos kept from step 1 (a
    callback's ``self.locals["infos"]``, a logging buffer) still say step 1 after step 3. The
    serial backend and hybrid's inline envs, which could hand over the env's dict itself with
    ``per_env_infos``, must do the same, or the kept infos would change as the env runs on.
    """
    fns = [StatefulInfoEnv] * 2
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend)
    try:
        reference.reset()
        adapter.reset()
        ref_kept = [reference.step(np.array([0, 0]))[3] for _ in range(3)]
        kept = [adapter.step(np.array([0, 0]))[3] for _ in range(3)]
        expected = [[info["t"] for info in infos] for infos in ref_kept]
        got = [[info["t"] for info in infos] for infos in kept]
        assert got == expected == [[1, 1], [2, 2], [3, 3]], (
            f"infos['t'] kept from steps 1-3: DummyVecEnv {expected}, adapter {got} (the "
            "adapter returned the env's own info dict, later steps overwrote it)"
        )
        got_pos = [infos[0]["pos"][0] for infos in kept]
        assert got_pos == [1.0, 2.0, 3.0], (
            f"infos[0]['pos'] kept from steps 1-3 should be [1.0, 2.0, 3.0] as with "
            f"DummyVecEnv, got {got_pos} (an array the env updates in place)"
        )
    finally:
        reference.close()
        adapter.close()


@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_disabled_mode_autoreset_passes_no_options(backend: str) -> None:
    """With autoreset_mode=DISABLED the adapter's autoreset gives the env ``options=None``.

    ``DummyVecEnv`` resets a done env with ``env.reset()`` (``options=None``); the adapter calls
    ``vec_env.reset(options={"reset_mask": dones})``, and the backend must not pass on what is
    left of that dict, ``{}``: an env that reads options whenever they are not None
    (``OptionsEnv``) would fail in the middle of training.
    """
    fns = [functools.partial(StatefulInfoEnv, 2)] * 2
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend, autoreset_mode="Disabled")
    try:
        for venv in (reference, adapter):
            venv.reset()
            venv.step(np.array([0, 0]))
            _, _, dones, _ = venv.step(np.array([0, 0]))
            assert dones.all()
        assert reference.reset_infos == [{"options_is_none": True}] * 2
        assert adapter.reset_infos == reference.reset_infos, (
            f"after an autoreset DummyVecEnv's reset_infos are {reference.reset_infos}, the "
            f"adapter's {adapter.reset_infos}: the env got options={{}} instead of None"
        )
    finally:
        reference.close()
        adapter.close()

    adapter = make_quiet_adapter([OptionsEnv] * 2, backend, autoreset_mode="Disabled")
    try:
        adapter.reset()
        adapter.step(np.array([0, 0]))
        try:
            adapter.step(np.array([0, 0]))  # episode ends: the adapter resets the envs
        except vecaccel.WorkerError as error:
            pytest.fail(f"autoreset of an env that reads options when given: {error}")
    finally:
        adapter.close()


@pytest.mark.parametrize(
    "backend, per_env",
    [
        *(
            pytest.param(b, [{"start": 1.0}, {}, {"start": 2.0}], id=f"empty-dict-{b}")
            for b in SB3_BACKENDS
        ),
        pytest.param("serial", [None, {"start": 1.0}, None], id="none-entries-serial"),
    ],
)
def test_per_env_falsy_options_mean_no_options(backend: str, per_env: list) -> None:
    """A falsy per-env entry (``{}`` or ``None``) means no options, as ``DummyVecEnv.reset``
    passes ``options`` only where the entry is truthy: the adapter's per-group masked reset
    must neither give the env ``options={}`` nor raise TypeError (``{**None, ...}``).
    """
    fns = [OptionsEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend)
    try:
        reference.set_options(per_env)
        expected = reference.reset()
        adapter.set_options(per_env)
        try:
            obs = adapter.reset()
        except (vecaccel.WorkerError, TypeError) as error:
            pytest.fail(
                f"DummyVecEnv resets the envs without options with options=None (obs "
                f"{expected.ravel().tolist()}); the adapter raised {type(error).__name__}: {error}"
            )
        np.testing.assert_array_equal(obs, expected)
        assert adapter.reset_infos == reference.reset_infos
    finally:
        reference.close()
        adapter.close()


def test_set_options_short_list_is_not_applied_to_every_env() -> None:
    """A per-env options list shorter than num_envs is not applied to every env.

    ``DummyVecEnv.reset`` raises IndexError for env 1 of ``set_options([{"start": 1.0}])``
    with 3 envs. The adapter must not read it as a single options group and reset *every* env
    with env 0's options. Its ``set_options`` raises ``ValueError`` at once (where the wrong
    list is given, rather than at a reset that may come much later), so both calls are in the
    ``try``.
    """
    fns = [OptionsEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, "serial")
    try:
        reference.set_options([{"start": 1.0}])
        with pytest.raises(IndexError):
            reference.reset()
        try:
            adapter.set_options([{"start": 1.0}])
            obs = adapter.reset()
        except (IndexError, ValueError):
            return  # refused, as DummyVecEnv refuses it
        assert obs[1:, 0].tolist() == [0.0, 0.0], (
            "options given for env 0 only reached envs 1 and 2 too: reset obs "
            f"{obs.ravel().tolist()} (DummyVecEnv raises IndexError instead)"
        )
    finally:
        reference.close()
        adapter.close()


def test_to_sb3_leaves_the_wrapped_vector_env_a_gymnasium_vector_env() -> None:
    """``to_sb3(envs)`` leaves the user's own Gymnasium vector env as it was: switching
    ``envs.per_env_infos`` on would make it return ``{}`` infos from then on (its reset/step
    contract would change silently, e.g. for an evaluation loop run on ``envs`` directly)."""
    envs = vecaccel.make_vec([OptionsEnv] * 2, backend="serial", autoreset_mode="SameStep")
    try:
        _, before = envs.reset(seed=0, options={"start": 1.0})
        assert "options" in before
        adapter = to_sb3(envs)
        adapter.reset()
        _, after = envs.reset(seed=0, options={"start": 1.0})
        assert after.keys() == before.keys(), (
            f"envs.reset() infos before to_sb3: keys {sorted(before)}, after: {after!r}"
        )
    finally:
        envs.close()


@pytest.mark.parametrize("backend", SB3_BACKENDS)
def test_indices_like_dummy_vec_env(backend: str) -> None:
    """Empty lists, ranges, numpy int arrays, tuples, negative and out-of-range indices."""
    fns = [CurrentStepEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_quiet_adapter(fns, backend)
    try:
        for indices in ([], range(1, 3), np.array([2, 0]), (0,), [-3], -1, None):
            for venv in (reference, adapter):
                venv.set_attr("current_step", 0)
                venv.set_attr("current_step", 7, indices=indices)
            assert adapter.get_attr("current_step") == reference.get_attr("current_step")
            assert adapter.get_attr("current_step", indices) == reference.get_attr(
                "current_step", indices
            )
            assert adapter.env_method("double", 4, indices=indices) == reference.env_method(
                "double", 4, indices=indices
            )
            assert adapter.env_is_wrapped(gym.Wrapper, indices) == reference.env_is_wrapped(
                gym.Wrapper, indices
            )
        for bad in (3, [5], -4):
            with pytest.raises(IndexError):
                adapter.get_attr("current_step", bad)
    finally:
        reference.close()
        adapter.close()


@pytest.mark.parametrize("backend", SB3_BACKENDS)
@pytest.mark.parametrize("mode", ["SameStep", "Disabled"])
def test_terminal_obs_dict_tuple_are_copies_with_copy_false(backend: str, mode: str) -> None:
    """Returned obs and ``terminal_observation`` (Dict and Tuple) never change afterwards, with
    ``copy=False`` backends too, and equal DummyVecEnv's."""
    box = spaces.Box(-1, 1, (2,), np.float32)
    for space in (
        spaces.Dict({"a": box, "b": spaces.Discrete(3)}),
        spaces.Tuple((box, spaces.MultiBinary(2))),
    ):
        fns = [functools.partial(SampledSpaceEnv, space)] * 2
        reference = DummyVecEnv(fns)
        adapter = make_quiet_adapter(fns, backend, autoreset_mode=mode, copy=False)
        try:
            results = {}
            for name, venv in (("dummy", reference), ("adapter", adapter)):
                venv.seed(3)
                live, snapshots = [], []
                for step in range(5):
                    out = venv.reset() if step == 0 else venv.step(np.array([0, 1]))
                    live.append(out)
                    snapshots.append(copy.deepcopy(out))
                assert repr(live) == repr(snapshots), f"{name}: returned data changed later"
                results[name] = snapshots
            terminal = [
                [info.get("terminal_observation") for info in out[3]]
                for out in results["adapter"][1:]
            ]
            expected = [
                [info.get("terminal_observation") for info in out[3]]
                for out in results["dummy"][1:]
            ]
            assert repr(terminal).replace("np.int64(", "(") == repr(expected).replace(
                "np.int64(", "("
            )
        finally:
            reference.close()
            adapter.close()


def test_vec_normalize_save_load_and_double_close(tmp_path) -> None:
    """VecNormalize statistics save/load onto a fresh adapter; close() twice is harmless, calls
    after close raise; nothing is left behind."""
    before = {p.pid for p in multiprocessing.active_children()}
    venv = VecNormalize(make_quiet_adapter([cartpole] * 2, "shm"))
    venv.seed(0)
    venv.reset()
    for _ in range(15):
        venv.step(np.array([0, 1]))
    path = tmp_path / "vn.pkl"
    venv.save(str(path))
    loaded = VecNormalize.load(str(path), make_quiet_adapter([cartpole] * 2, "shm"))
    np.testing.assert_array_equal(loaded.obs_rms.mean, venv.obs_rms.mean)
    assert loaded.reset().shape == (2, 4)
    venv.close()
    venv.close()
    loaded.close()
    with pytest.raises(RuntimeError):
        loaded.step(np.array([0, 1]))
    left = {p.pid for p in multiprocessing.active_children()} - before
    assert not left, f"worker processes left behind: {left}"
