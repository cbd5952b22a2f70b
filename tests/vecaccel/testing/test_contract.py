"""``vecaccel.testing.check_backend`` fails on broken backends, naming what broke.

Each broken backend is the ``serial`` backend with one defect, registered through the plugin
hook as a third party's backend would be; ``check_backend`` must raise an ``AssertionError``
that names the property, the env index and the step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import vecaccel
from vecaccel.plugins.serial import SerialVecEnv
from vecaccel.testing import NUM_ENVS, check_backend
from vecaccel.vec_env import EnvRunner, VecEnv

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[3] / "examples" / "vecaccel-example-plugin"


class WrongRewardAfterAutoreset(SerialVecEnv):
    """Reports reward 1.0 on the step that resets an env (``NEXT_STEP``), where it is 0.0."""

    def step_wait(self, timeout: float | None = None):
        resetting = self._terminations | self._truncations
        obs, rewards, terminated, truncated, infos = super().step_wait(timeout)
        rewards[resetting] = 1.0
        return obs, rewards, terminated, truncated, infos


class Float32Rewards(SerialVecEnv):
    """Returns rewards as ``float32`` (``SyncVectorEnv``'s are ``float64``)."""

    def step_wait(self, timeout: float | None = None):
        obs, rewards, terminated, truncated, infos = super().step_wait(timeout)
        return obs, rewards.astype(np.float32), terminated, truncated, infos


class SeedsIgnored(SerialVecEnv):
    """Resets every env with ``seed=None``, whatever seed it is given."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=None, options=options)


class ObservationsOverwritten(SerialVecEnv):
    """Hands out its observation buffer, which the next step rewrites, without ``copy=False``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.copy = False


class SameStepClaimedNotDone(SerialVecEnv):
    """Says it runs the mode it was given, and always runs ``NEXT_STEP``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runners = [
            EnvRunner(env, AutoresetMode.NEXT_STEP, i) for i, env in enumerate(self.envs)
        ]


class ActionsUnchecked(SerialVecEnv):
    """Hands actions to the envs without checking them."""

    def _check_actions(self, actions: Any, env_ids: Any = None) -> Any:
        return actions


class WithoutCall(SerialVecEnv):
    """``serial`` with ``vecaccel.VecEnv``'s placeholders for ``call`` and ``set_attr``."""

    call = VecEnv.call
    call_indices = VecEnv.call_indices
    get_attr = VecEnv.get_attr
    set_attr = VecEnv.set_attr
    set_attr_indices = VecEnv.set_attr_indices


def plain_sync_vector_env(env_fns, *, autoreset_mode, **options):
    """A backend built on ``gymnasium.vector.VectorEnv`` alone: Gymnasium's ``SyncVectorEnv``."""
    return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=autoreset_mode)


class ReadOnlyFinalObs(SerialVecEnv):
    """Returns ``infos["final_obs"]`` read-only, as arrays received from another process are."""

    def step_wait(self, timeout: float | None = None):
        obs, rewards, terminated, truncated, infos = super().step_wait(timeout)
        for item in infos.get("final_obs", ()):
            if isinstance(item, np.ndarray):
                item.flags.writeable = False
        return obs, rewards, terminated, truncated, infos


class BrokenBackends:
    """A plugin registering each broken backend under its class name."""

    classes = (
        WrongRewardAfterAutoreset,
        Float32Rewards,
        SeedsIgnored,
        ObservationsOverwritten,
        SameStepClaimedNotDone,
        ActionsUnchecked,
        WithoutCall,
        ReadOnlyFinalObs,
    )

    @vecaccel.hookimpl
    def vecaccel_register_backends(self, registry: vecaccel.BackendRegistry) -> None:
        for cls in self.classes:
            registry.add(cls.__name__, self._factory(cls), cls.__doc__.splitlines()[0])
        registry.add(
            "SameStepOnly",
            self._factory(SerialVecEnv),
            "the serial backend, declaring one autoreset mode",
            autoreset_modes=["SameStep"],
        )

        registry.add("Recording", self._recording, "the serial backend, keeping its options")
        registry.add("PlainSync", plain_sync_vector_env, "gymnasium's SyncVectorEnv as it is")

    #: the options each vector env of the ``Recording`` backend was built with
    recorded: list[dict[str, Any]] = []

    def _recording(self, env_fns, *, autoreset_mode, **options):
        self.recorded.append(options)
        return SerialVecEnv(env_fns, autoreset_mode=autoreset_mode)

    @staticmethod
    def _factory(cls: type[SerialVecEnv]):
        def factory(env_fns, *, autoreset_mode, **options):
            return cls(env_fns, autoreset_mode=autoreset_mode)

        return factory


@pytest.fixture(scope="module")
def broken_backends() -> Iterator[None]:
    plugin = BrokenBackends()
    manager = vecaccel.get_plugin_manager()
    manager.register(plugin, name="broken-backends")
    yield
    manager.unregister(plugin)


#: (backend, what the message must say): the property, the env and the step that broke.
BROKEN = {
    "WrongRewardAfterAutoreset": r"the trajectory \((step|step_async/step_wait)\) broke at env "
    r"\d, step \d+ .*autoreset_mode=NextStep.*reward is 1\.0, expected 0\.0",
    "Float32Rewards": r"dtypes and shapes broke at step 0 .*rewards is an array of dtype "
    r"float32.*expected float64",
    "SeedsIgnored": r"reset seeding broke at env 0, reset\(seed=123\).*observation",
    "ObservationsOverwritten": r"returned arrays not overwritten by the next step broke at step 1"
    r" .*changed in place.*copy=False",
    "SameStepClaimedNotDone": r"the trajectory .* broke at env \d, step \d+ .*"
    r"autoreset_mode=SameStep.*final_obs",
    "ReadOnlyFinalObs": r"writable arrays broke at step \d+ .*autoreset_mode=SameStep.*"
    r"infos\['final_obs'\]\[\d\] are read-only",
    "ActionsUnchecked": r"the action checks broke at step 2 .*was accepted|the action checks "
    r"broke at step 2 .*raised",
    "WithoutCall": r"the vector-env methods broke at construction .*WithoutCall has no call\(\), "
    r"get_attr\(\), set_attr\(\).*How to fix: call: subclass vecaccel.VecEnv and implement call",
    "PlainSync": r"the vector-env methods broke at construction .*SyncVectorEnv has no "
    r"step_async\(\), step_wait\(\) .*How to fix: step_async: subclass vecaccel.VecEnv",
}


@pytest.mark.usefixtures("broken_backends")
@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_backend_fails_naming_what_broke(name: str) -> None:
    with pytest.raises(AssertionError, match=BROKEN[name]) as info:
        check_backend(name)
    message = str(info.value)
    assert message.startswith(f"check_backend({name!r})")
    assert "How to fix:" in message


@pytest.mark.usefixtures("broken_backends")
def test_declared_autoreset_modes_are_the_ones_checked_and_built() -> None:
    check_backend("SameStepOnly")  # NEXT_STEP and DISABLED are not its to keep
    with pytest.raises(ValueError, match="does not implement autoreset_mode='NextStep'"):
        vecaccel.make_vec("CartPole-v1", 2, backend="SameStepOnly")


@pytest.mark.usefixtures("broken_backends")
def test_options_reach_the_backend_as_given() -> None:
    BrokenBackends.recorded.clear()
    check_backend("Recording", num_shards=2, placement={"a": [0, 1]})
    assert BrokenBackends.recorded, "check_backend built no vector env"
    assert all(
        options == {"num_shards": 2, "placement": {"a": [0, 1]}}
        for options in BrokenBackends.recorded
    ), BrokenBackends.recorded


def test_autoreset_modes_are_checked_at_registration() -> None:
    registry = vecaccel.BackendRegistry()
    with pytest.raises(ValueError, match="unknown autoreset mode 'Sometimes'"):
        registry.add("mine", lambda env_fns, **kw: None, autoreset_modes=["Sometimes"])
    with pytest.raises(ValueError, match="at least one mode"):
        registry.add("mine", lambda env_fns, **kw: None, autoreset_modes=[])
    registry.add("mine", lambda env_fns, **kw: None)
    assert registry["mine"].autoreset_modes == tuple(AutoresetMode)


def test_unknown_backend_and_options_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        check_backend("nope")
    with pytest.raises(TypeError, match="num_workers"):
        check_backend("shm", num_wrokers=2)
    with pytest.raises(ValueError, match="batch_size"):
        check_backend("async", batch_size=NUM_ENVS + 1)


def test_example_plugin_tests_pass_with_the_kit() -> None:
    """The example plugin's own test suite (``check_backend("example-threads")``) passes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLE_PLUGIN), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            str(EXAMPLE_PLUGIN / "tests"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "3 passed" in completed.stdout


def test_the_backends_guides_example_passes_the_kit_as_written(tmp_path) -> None:
    """The backends guide's example backend, pasted into a script as it stands, ends with
    ``check_backend``."""
    from doc_blocks import block

    code = block("docs/backends.md", "def vecaccel_register_backends(registry):")
    assert 'check_backend("mine")' in code and "(vecaccel.VecEnv)" in code
    script = tmp_path / "plugin.py"
    script.write_text(code)
    completed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
