"""Review of the SB3 adapter (``vecaccel/sb3.py``): behaviour the existing SB3 tests do not cover.

Every check compares the adapter with ``DummyVecEnv`` on the same env functions. The failing
tests each demonstrate one defect; the passing ones pin behaviour that was verified.
"""

from __future__ import annotations

import copy
import functools
import multiprocessing
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

import vecaccel  # noqa: E402
from vecaccel.sb3 import VecAccelEnv, to_sb3  # noqa: E402

BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    "serial": {},
    "shm": {"num_workers": 1},
    "hybrid": {"num_workers": 1},
}
BACKENDS = list(BACKEND_OPTIONS)


def make_adapter(env_fns, backend: str, **kwargs: Any) -> VecAccelEnv:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch-oversubscription warning on small machines
        return VecAccelEnv(env_fns, backend=backend, **BACKEND_OPTIONS[backend], **kwargs)


# ---------------------------------------------------------------------------------------------
# test envs (top level: they pickle by reference)


class StatefulInfoEnv(gym.Env):
    """Reports its state in ``info`` through objects it keeps and updates in place.

    A common pattern (``info = self._info``; ``info["pos"] = self.pos`` with ``self.pos += v``).
    ``DummyVecEnv`` deep-copies the infos it returns, so each step's infos stay what they were.
    """

    def __init__(self, ep_length: int = 50) -> None:
        self.observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.ep_length = ep_length
        self.t = 0
        self.pos = np.zeros(2)
        self._info: dict[str, Any] = {"t": 0, "pos": self.pos}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.pos[:] = 0.0
        return np.zeros(2, np.float32), {"options_is_none": options is None}

    def step(self, action):
        self.t += 1
        self.pos += 1.0  # in place: info["pos"] is this very array
        self._info["t"] = self.t
        truncated = self.t >= self.ep_length
        return self.pos.astype(np.float32), 1.0, False, truncated, self._info


class OptionsEnv(gym.Env):
    """Reads ``options["start"]`` whenever options are given (``options is not None``)."""

    def __init__(self, ep_length: int = 2) -> None:
        self.observation_space = spaces.Box(-10, 10, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.ep_length = ep_length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        start = 0.0 if options is None else float(options["start"])
        return np.array([start], np.float32), {"options": options}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, self.t >= self.ep_length, {}


class SpaceEnv(gym.Env):
    """Samples observations of ``space``; episodes of ``ep_length`` steps."""

    def __init__(self, space: spaces.Space, ep_length: int = 2) -> None:
        self.observation_space = copy.deepcopy(space)
        self.action_space = spaces.Discrete(2)
        self.ep_length = ep_length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.ep_length
        return self.observation_space.sample(), 0.5, done, False, {}


class CurrentStepEnv(gym.Env):
    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1, 1, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.current_step = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def double(self, x: int) -> int:
        return 2 * x


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=10)


# ---------------------------------------------------------------------------------------------
# defects


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_infos_do_not_alias_env_state(backend: str) -> None:
    """DEFECT (serial, hybrid): the step infos SB3 receives are the env's own objects.

    ``DummyVecEnv.step_wait`` returns ``deepcopy(self.buf_infos)``: infos kept from step 1 (a
    callback's ``self.locals["infos"]``, a logging buffer) still say step 1 after step 3. With
    ``per_env_infos`` the serial backend (and hybrid's inline envs) hand over the env's dict
    itself, so the kept infos change as the env runs on.
    """
    fns = [StatefulInfoEnv] * 2
    reference = DummyVecEnv(fns)
    adapter = make_adapter(fns, backend)
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


@pytest.mark.parametrize("backend", ["serial", "shm"])
def test_disabled_mode_autoreset_passes_no_options(backend: str) -> None:
    """DEFECT: with autoreset_mode=DISABLED the adapter's autoreset gives the env ``options={}``.

    ``DummyVecEnv`` resets a done env with ``env.reset()`` (``options=None``); the adapter calls
    ``vec_env.reset(options={"reset_mask": dones})`` and the backend passes on what is left of
    that dict, ``{}``. An env that reads options whenever they are not None (``OptionsEnv``)
    then fails in the middle of training.
    """
    fns = [functools.partial(StatefulInfoEnv, 2)] * 2
    reference = DummyVecEnv(fns)
    adapter = make_adapter(fns, backend, autoreset_mode="Disabled")
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

    adapter = make_adapter([OptionsEnv] * 2, backend, autoreset_mode="Disabled")
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
        ("serial", [{"start": 1.0}, {}, {"start": 2.0}]),
        ("shm", [{"start": 1.0}, {}, {"start": 2.0}]),
        ("serial", [None, {"start": 1.0}, None]),
    ],
    ids=["empty-dict-serial", "empty-dict-shm", "none-entries-serial"],
)
def test_per_env_falsy_options_mean_no_options(backend: str, per_env: list) -> None:
    """DEFECT: a falsy per-env entry (``{}`` or ``None``) gave the env ``options={}`` (the
    adapter's per-group masked reset, ``{**{}, "reset_mask": mask}``), or raised TypeError
    (``{**None, ...}``). ``DummyVecEnv.reset`` passes ``options`` only where the entry is truthy.
    """
    fns = [OptionsEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_adapter(fns, backend)
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
    """DEFECT: a per-env options list shorter than num_envs is silently applied to all envs.

    ``DummyVecEnv.reset`` raises IndexError for env 1 of ``set_options([{"start": 1.0}])``
    with 3 envs. The adapter sees a single options group and resets *every* env with env 0's
    options, so a wrong-length list goes unnoticed and changes the other envs.

    Fixed: the adapter's ``set_options`` raises ``ValueError`` at once (where the wrong list is
    given, rather than at a reset that may come much later), so both calls are in the ``try``.
    """
    fns = [OptionsEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_adapter(fns, "serial")
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
    """DEFECT: ``to_sb3(envs)`` switches ``envs.per_env_infos`` on, so the user's own
    Gymnasium vector env returns ``{}`` infos from then on (its reset/step contract changes
    silently, e.g. for an evaluation loop run on ``envs`` directly)."""
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


# ---------------------------------------------------------------------------------------------
# verified behaviour (passing)


@pytest.mark.parametrize("backend", BACKENDS)
def test_indices_like_dummy_vec_env(backend: str) -> None:
    """Empty lists, ranges, numpy int arrays, tuples, negative and out-of-range indices."""
    fns = [CurrentStepEnv] * 3
    reference = DummyVecEnv(fns)
    adapter = make_adapter(fns, backend)
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["SameStep", "Disabled"])
def test_terminal_obs_dict_tuple_are_copies_with_copy_false(backend: str, mode: str) -> None:
    """Returned obs and ``terminal_observation`` (Dict and Tuple) never change afterwards, with
    ``copy=False`` backends too, and equal DummyVecEnv's."""
    box = spaces.Box(-1, 1, (2,), np.float32)
    for space in (
        spaces.Dict({"a": box, "b": spaces.Discrete(3)}),
        spaces.Tuple((box, spaces.MultiBinary(2))),
    ):
        fns = [functools.partial(SpaceEnv, space)] * 2
        reference = DummyVecEnv(fns)
        adapter = make_adapter(fns, backend, autoreset_mode=mode, copy=False)
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
    venv = VecNormalize(make_adapter([cartpole] * 2, "shm"))
    venv.seed(0)
    venv.reset()
    for _ in range(15):
        venv.step(np.array([0, 1]))
    path = tmp_path / "vn.pkl"
    venv.save(str(path))
    loaded = VecNormalize.load(str(path), make_adapter([cartpole] * 2, "shm"))
    np.testing.assert_array_equal(loaded.obs_rms.mean, venv.obs_rms.mean)
    assert loaded.reset().shape == (2, 4)
    venv.close()
    venv.close()
    loaded.close()
    with pytest.raises(RuntimeError):
        loaded.step(np.array([0, 1]))
    left = {p.pid for p in multiprocessing.active_children()} - before
    assert not left, f"worker processes left behind: {left}"
