"""The plugin system: built-in backends as plugins, run-time plugins, the block-list, errors, and
the example third-party package installed for real and found through its entry point.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import run_vecaccel

import vecaccel
from vecaccel.manager import DEFAULT_PLUGINS, DISABLE_ENV_VAR, _reset_plugin_manager


class FailingEnv(gym.Wrapper):
    """Raises in ``step`` once the env's ``fail_now`` is set."""

    def step(self, action):
        if self.get_wrapper_attr("fail_now"):
            raise ValueError("boom")
        return super().step(action)


class SlowEnv(gym.Wrapper):
    """Sleeps 0.3 s in every ``step``."""

    def step(self, action):
        time.sleep(0.3)
        return super().step(action)


def broken_plugin_site(root, dist: str, entry_point: str, module: str):
    """A folder to put on ``PYTHONPATH``: an installed distribution ``dist`` whose ``vecaccel``
    entry point ``entry_point`` names ``module``, which raises at import."""
    site = root / "site"
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[vecaccel]\n{entry_point} = {module}\n")
    (site / f"{module}.py").write_text('raise RuntimeError("boom at import")\n')
    return site


torch.set_num_threads(1)

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "vecaccel-example-plugin"


def _serial_backend():
    from vecaccel.manager import get_backend

    return get_backend("serial")


class RuntimeBackendPlugin:
    """A plugin object registered at run time; its backend delegates to ``serial``."""

    def __init__(self, name: str = "runtime-test") -> None:
        self.backend_name = name
        self.calls: list[dict] = []

    def factory(self, env_fns, **options):
        self.calls.append(options)
        return _serial_backend().factory(env_fns, **options)

    @vecaccel.hookimpl
    def vecaccel_register_backends(self, registry: vecaccel.BackendRegistry) -> None:
        registry.add(self.backend_name, self.factory, "registered at run time")


def test_builtin_backends_are_registered_as_plugins() -> None:
    pm = vecaccel.get_plugin_manager()
    backends = vecaccel.list_backends()
    registered_modules = {pm.get_name(plugin) for plugin in pm.get_plugins()}
    assert {"vecaccel.plugins.serial", "vecaccel.plugins.envs"} <= registered_modules
    for module_path in DEFAULT_PLUGINS:
        # only a built-in whose optional dependency (torch) is missing may be left out
        if pm.has_plugin(module_path):
            # the module object itself, under its module path, as a third-party module would be
            assert pm.get_plugin(module_path) is sys.modules[module_path]
        else:
            assert importlib.util.find_spec("torch") is None, module_path
    assert backends["serial"] == {
        "description": backends["serial"]["description"],
        "plugin": "vecaccel.plugins.serial",
    }
    for name, info in backends.items():
        assert info["plugin"] in registered_modules, (name, info)


def test_plugin_registered_at_run_time_is_honoured(fresh_plugin_manager: None) -> None:
    plugin = RuntimeBackendPlugin()
    vecaccel.get_plugin_manager().register(plugin, name="test-runtime-plugin")
    backends = vecaccel.list_backends()
    assert backends["runtime-test"] == {
        "description": "registered at run time",
        "plugin": "test-runtime-plugin",
    }
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="runtime-test", copy=False)
    try:
        obs, _ = envs.reset(seed=3)
        assert obs.shape == (2, 4)
        assert isinstance(envs, gym.vector.VectorEnv)
    finally:
        envs.close()
    assert plugin.calls == [{"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP, "copy": False}]

    vecaccel.get_plugin_manager().unregister(plugin)
    assert "runtime-test" not in vecaccel.list_backends()


def test_disable_env_var_blocks_a_builtin_plugin(
    fresh_plugin_manager: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE_ENV_VAR, "vecaccel.plugins.serial")
    _reset_plugin_manager()
    pm = vecaccel.get_plugin_manager()
    assert not pm.has_plugin("vecaccel.plugins.serial")
    assert "serial" not in vecaccel.list_backends()
    with pytest.raises(ValueError, match="unknown backend 'serial'"):
        vecaccel.make_vec("CartPole-v1", 2, backend="serial")

    # the short module name works too
    monkeypatch.setenv(DISABLE_ENV_VAR, " other , serial ")
    _reset_plugin_manager()
    assert "serial" not in vecaccel.list_backends()

    monkeypatch.delenv(DISABLE_ENV_VAR)
    _reset_plugin_manager()
    assert "serial" in vecaccel.list_backends()


def test_disable_env_var_blocks_a_named_plugin(
    fresh_plugin_manager: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DISABLE_ENV_VAR, "test-runtime-plugin")
    _reset_plugin_manager()
    # pluggy refuses a blocked name: register() returns None and the hooks never see it
    assert (
        vecaccel.get_plugin_manager().register(RuntimeBackendPlugin(), "test-runtime-plugin")
        is None
    )
    assert "runtime-test" not in vecaccel.list_backends()


def test_duplicate_backend_name_is_a_clear_error(fresh_plugin_manager: None) -> None:
    vecaccel.get_plugin_manager().register(RuntimeBackendPlugin("serial"), name="test-duplicate")
    with pytest.raises(ValueError, match="'serial' is registered twice") as info:
        vecaccel.list_backends()
    assert "vecaccel.plugins.serial" in str(info.value)
    assert "test-duplicate" in str(info.value)
    # built-ins are asked first, so the note blames the plugin that came second
    assert "in plugin 'test-duplicate'" in " ".join(info.value.__notes__)
    assert f"{DISABLE_ENV_VAR}=test-duplicate" in str(info.value)


def test_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown backend 'no-such-backend'") as info:
        vecaccel.make_vec("CartPole-v1", 2, backend="no-such-backend")
    for name in vecaccel.list_backends():
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "meant"),
    [("shmm", "shm"), ("Async", "async"), ("SERIAL", "serial"), ("hybird", "hybrid")],
)
def test_a_misspelled_backend_gets_a_did_you_mean(name: str, meant: str) -> None:
    """As a misspelled option does: the closest registered name, a different case first."""
    with pytest.raises(ValueError, match=f"unknown backend {name!r}; did you mean {meant!r}?"):
        vecaccel.make_vec("CartPole-v1", 2, backend=name)


def test_a_backend_name_with_nothing_close_gets_no_guess() -> None:
    with pytest.raises(ValueError, match="unknown backend 'quantum'; registered") as info:
        vecaccel.make_vec("CartPole-v1", 2, backend="quantum")
    assert "did you mean" not in str(info.value)


def test_registry_rejects_bad_entries() -> None:
    registry = vecaccel.BackendRegistry()
    with pytest.raises(ValueError, match="non-empty string"):
        registry.add("", lambda env_fns, **options: None)
    with pytest.raises(TypeError, match="callable"):
        registry.add("not-callable", "factory")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# the example third-party package


@pytest.fixture(scope="module")
def example_plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Install the example package with pip and yield the folder it was installed into.

    pip installs it with ``--target`` into a folder of its own rather than into the shared venv:
    the package still goes through a real build and install, with its ``entry_points.txt``, and
    a process whose ``sys.path`` holds that folder finds it exactly as it would in
    site-packages. Meanwhile other test processes using the same venv never see a backend appear
    and vanish under them, and nothing is left behind if this run is killed.
    """
    pytest.importorskip("setuptools", reason="building the example package needs setuptools")
    root = tmp_path_factory.mktemp("example-plugin")
    source = root / "src"
    # build from a copy so the repository gets no build/ or *.egg-info folders
    shutil.copytree(
        EXAMPLE_PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    target = root / "site"
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "install",
            "--no-deps", "--no-build-isolation", "--no-cache-dir", "--quiet",
            "--disable-pip-version-check", "--no-warn-script-location",
            "--target", str(target), str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    dist_infos = list(target.glob("vecaccel_example_plugin-*.dist-info"))
    assert len(dist_infos) == 1
    assert "example = vecaccel_example_plugin" in (dist_infos[0] / "entry_points.txt").read_text()
    yield target
    shutil.rmtree(root, ignore_errors=True)


def _run_with_plugin(
    site: Path, code: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(DISABLE_ENV_VAR, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


COMPARE_WITH_SERIAL = """
    import numpy as np
    import vecaccel
    from gymnasium.vector import AutoresetMode

    info = vecaccel.list_backends()["example-threads"]
    assert info["plugin"] == "example", info

    import vecaccel_example_plugin
    assert vecaccel_example_plugin.__file__.startswith({site!r}), vecaccel_example_plugin.__file__

    def assert_same(a, b, where):
        if isinstance(a, dict):
            assert a.keys() == b.keys(), (where, sorted(a), sorted(b))
            for key in a:
                assert_same(a[key], b[key], f"{{where}}[{{key!r}}]")
        elif isinstance(a, tuple):
            assert isinstance(b, tuple) and len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b)):
                assert_same(x, y, f"{{where}}[{{i}}]")
        elif isinstance(a, np.ndarray) and a.dtype == object:
            assert a.shape == b.shape, where
            for i, (x, y) in enumerate(zip(a, b)):
                assert_same(x, y, f"{{where}}[{{i}}]")
        elif a is None:
            assert b is None, where
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)

    for mode in AutoresetMode:
        threads = vecaccel.make_vec(
            "CartPole-v1", 3, backend="example-threads", autoreset_mode=mode, num_threads=2
        )
        serial = vecaccel.make_vec("CartPole-v1", 3, backend="serial", autoreset_mode=mode)
        try:
            assert threads.metadata["autoreset_mode"] is mode
            assert_same(threads.reset(seed=7), serial.reset(seed=7), "reset")
            rng = np.random.default_rng(0)
            episodes_ended = 0
            for t in range(150):
                actions = rng.integers(0, 2, size=3)
                a, b = threads.step(actions), serial.step(actions)
                assert_same(a, b, f"{{mode}} step {{t}}")
                done = a[2] | a[3]
                episodes_ended += int(done.sum())
                if mode is AutoresetMode.DISABLED and done.any():
                    options = {{"reset_mask": done}}
                    assert_same(
                        threads.reset(options=options), serial.reset(options=options), "mask"
                    )
            assert episodes_ended > 3, episodes_ended  # autoresets were exercised
        finally:
            threads.close()
            serial.close()
    print("matched serial")

    from vecaccel.cli import main
    assert main(["backends"]) == 0
"""


def test_example_plugin_is_found_and_matches_serial(example_plugin_path: Path) -> None:
    site = str(example_plugin_path)
    done = _run_with_plugin(example_plugin_path, COMPARE_WITH_SERIAL.format(site=site))
    assert done.returncode == 0, done.stderr
    assert "matched serial" in done.stdout
    # `vecaccel backends` lists it, provided by the plugin named after its entry point
    line = next(line for line in done.stdout.splitlines() if line.startswith("example-threads"))
    assert line.split()[1] == "example"


def test_example_plugin_can_be_disabled(example_plugin_path: Path) -> None:
    code = """
        import vecaccel
        backends = vecaccel.list_backends()
        assert "example-threads" not in backends, backends
        assert "serial" in backends
        import vecaccel_example_plugin  # installed, yet not loaded as a plugin
    """
    done = _run_with_plugin(example_plugin_path, code, {DISABLE_ENV_VAR: "example"})
    assert done.returncode == 0, done.stderr


@pytest.fixture
def example_module(monkeypatch: pytest.MonkeyPatch):
    """The example backend's module imported from the source tree (no entry point involved)."""
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))
    from vecaccel_example_plugin import threads

    return threads


def _cartpole(wrapper=None):
    def make() -> gym.Env:
        env = gym.make("CartPole-v1")
        if wrapper is not None:
            env = wrapper(env)
            env.unwrapped.fail_now = False
        return env

    return make


def test_example_backend_reports_env_errors(example_module) -> None:
    envs = example_module.ThreadVecEnv([_cartpole(), _cartpole(FailingEnv)], num_threads=2)
    try:
        envs.reset(seed=0)
        envs.set_attr("fail_now", [False, True])
        with pytest.raises(vecaccel.WorkerError, match="env 1 raised ValueError") as info:
            envs.step(np.array([0, 1]))
        assert info.value.env_indices == (1,)
        assert "boom" in info.value.remote_traceback
        envs.set_attr("fail_now", False)
        envs.reset(seed=1)
        envs.step(np.array([0, 1]))  # usable again
        with pytest.raises(ValueError, match="env 1"):
            envs.step(np.array([0, 2]))
    finally:
        envs.close()
    envs.close()  # idempotent


def test_example_backend_step_wait_timeout_is_never_stale(example_module) -> None:
    envs = example_module.ThreadVecEnv([_cartpole(SlowEnv)] * 2, num_threads=2)
    try:
        envs.reset(seed=0)
        envs.step_async(np.array([1, 1]))
        with pytest.raises(TimeoutError):
            envs.step_wait(timeout=0.01)
        with pytest.raises(gym.error.AlreadyPendingCallError):
            envs.step_async(np.array([0, 0]))  # the late step is still the pending one
        obs, rewards, *_ = envs.step_wait()
        assert obs.shape == (2, 4) and rewards.tolist() == [1.0, 1.0]
    finally:
        envs.close()


def test_plugin_failing_at_import_is_left_out_with_a_warning(tmp_path: Path) -> None:
    site = broken_plugin_site(tmp_path, "broken-plugin", "broken", "broken_plugin_mod")
    code = """
        import warnings
        import vecaccel
        from vecaccel.manager import PluginWarning
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
            envs.close()
        [warning] = [w for w in caught if issubclass(w.category, PluginWarning)]
        print(warning.message)
    """
    done = _run_with_plugin(site, code)
    assert done.returncode == 0, done.stderr
    assert (
        "plugin 'broken' (dist broken-plugin) failed to import: RuntimeError: boom at import; "
        f"set {DISABLE_ENV_VAR}=broken to skip it"
    ) in done.stdout


# ---------------------------------------------------------------------------------------------
# plugin manager


class NoArgumentPlugin:
    """A valid pluggy plugin: a hookimpl may take any subset of the spec's arguments."""

    def __init__(self) -> None:
        self.calls = 0

    @vecaccel.hookimpl
    def vecaccel_register_backends(self) -> None:
        self.calls += 1


def test_register_backends_hookimpl_taking_no_arguments_is_called_as_pluggy_calls_it(
    fresh_plugin_manager: None,
):
    pm = vecaccel.get_plugin_manager()
    plugin = NoArgumentPlugin()
    assert pm.register(plugin, name="toy-no-arguments") == "toy-no-arguments"
    pm.hook.vecaccel_register_backends(registry=vecaccel.BackendRegistry())  # pluggy: fine
    assert plugin.calls == 1
    try:
        # vecaccel called impl.function(registry=registry): TypeError
        backends = vecaccel.list_backends()
    finally:
        pm.unregister(plugin)
    assert "serial" in backends and plugin.calls == 2


class FailingFactoryPlugin:
    @staticmethod
    def factory(env_fns, **options):
        raise LookupError(f"cannot build {len(env_fns)} envs with {sorted(options)}")

    @vecaccel.hookimpl
    def vecaccel_register_backends(self, registry) -> None:
        registry.add("toy-failing", self.factory, "always fails")


def test_a_failing_backend_factory_reaches_the_caller_and_leaves_the_others_usable(
    fresh_plugin_manager: None,
):
    pm = vecaccel.get_plugin_manager()
    plugin = FailingFactoryPlugin()
    pm.register(plugin, name="toy-failing-plugin")
    try:
        assert vecaccel.list_backends()["toy-failing"]["plugin"] == "toy-failing-plugin"
        with pytest.raises(LookupError, match=r"cannot build 2 envs with \['autoreset_mode'"):
            vecaccel.make_vec("CartPole-v1", 2, backend="toy-failing")
        with pytest.raises(ValueError, match="toy-failing") as info:
            vecaccel.make_vec("CartPole-v1", 2, backend="toy-missing")
        assert "serial" in str(info.value)
        with vecaccel.make_vec("CartPole-v1", 2, backend="serial") as envs:
            assert envs.reset(seed=0)[0].shape == (2, 4)
    finally:
        pm.unregister(plugin)
    assert "toy-failing" not in vecaccel.list_backends()


# ---------------------------------------------------------------------------------------------
# plugins that collide or fail at import


class ClaimsShm:
    @vecaccel.hookimpl
    def vecaccel_register_backends(self, registry):
        registry.add("shm", lambda env_fns, **options: None, "a third-party shm")


def test_duplicate_backend_error_blames_the_plugin_that_came_second(fresh_plugin_manager):
    """A third-party plugin registered after the built-ins that reuses the name 'shm': the
    error's note names the newcomer, not the built-in ``vecaccel.plugins.shm``, although the
    hook implementations are collected newest first (``reversed(get_hookimpls())``)."""
    pm = vecaccel.get_plugin_manager()
    pm.register(ClaimsShm(), name="toy-claims-shm")
    with pytest.raises(ValueError, match="'shm' is registered twice") as info:
        vecaccel.list_backends()
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "in plugin 'toy-claims-shm'" in notes, (
        f"expected the note to name the newcomer 'toy-claims-shm', got {notes!r} "
        f"(message: {info.value})"
    )


def _broken_plugin_dir(root: Path) -> Path:
    return broken_plugin_site(root, "toy-broken", "toy-broken", "toy_broken_mod")


def test_plugin_failing_at_import_is_reported_clearly(tmp_path):
    """An installed package whose ``vecaccel`` entry point raises at import does not take the
    library down with a raw traceback: ``vecaccel backends`` lists the built-ins (the broken
    plugin skipped with a warning), or fails with one error line naming the entry point and
    VECACCEL_DISABLE_PLUGINS."""
    site = _broken_plugin_dir(tmp_path)
    done = run_vecaccel(["backends"], tmp_path, {"PYTHONPATH": str(site)})
    listed_builtins = done.returncode == 0 and "serial" in done.stdout
    clear_error = (
        done.returncode != 0
        and "Traceback" not in done.stderr
        and "toy-broken" in done.stderr
        and DISABLE_ENV_VAR in done.stderr
    )
    assert listed_builtins or clear_error, (
        "expected the built-ins listed (the broken plugin skipped with a warning) or one error "
        "line naming entry point 'toy-broken' and VECACCEL_DISABLE_PLUGINS; got exit "
        f"{done.returncode}, stderr tail: {done.stderr[-400:]!r}"
    )


def test_disable_env_var_skips_a_plugin_that_fails_at_import(tmp_path):
    """Naming the entry point in VECACCEL_DISABLE_PLUGINS is the way out."""
    site = _broken_plugin_dir(tmp_path)
    done = run_vecaccel(
        ["backends", "--json"],
        tmp_path,
        {"PYTHONPATH": str(site), DISABLE_ENV_VAR: "toy-broken"},
    )
    assert done.returncode == 0, done.stderr
    assert {"serial", "shm"} <= set(json.loads(done.stdout))


# ---------------------------------------------------------------------------------------------
# backends build on the core's public names only: whatever a built-in needs from the core, a
# third-party backend may need too (no leading underscore, listed in the module's __all__)


BUILTIN_PLUGINS = sorted((Path(__file__).resolve().parents[2] / "plugins").glob("*.py"))
EXAMPLE_PLUGIN_MODULES = sorted((EXAMPLE_PLUGIN / "vecaccel_example_plugin").glob("*.py"))


def _core_imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` for every name the file imports from the ``vecaccel`` package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            if root == "vecaccel":
                found.extend((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "vecaccel":
                    found.append((alias.name, ""))
    return found


def _private_uses(path: Path) -> list[str]:
    problems = []
    for module, name in _core_imports(path):
        if any(part.startswith("_") for part in module.split(".")):
            problems.append(f"{module} (a private module)")
        if not name:
            continue
        if name.startswith("_"):
            problems.append(f"{module}.{name} (a private name)")
            continue
        public = getattr(importlib.import_module(module), "__all__", None)
        if public is not None and name not in public:
            problems.append(f"{module}.{name} (not in {module}.__all__)")
    return problems


def test_the_files_are_found():
    names = {path.stem for path in BUILTIN_PLUGINS}
    assert {"serial", "shm", "asynchronous", "action_server", "envs"} <= names
    assert {"__init__", "threads"} <= {path.stem for path in EXAMPLE_PLUGIN_MODULES}


@pytest.mark.parametrize("path", BUILTIN_PLUGINS, ids=lambda path: path.name)
def test_builtin_plugins_import_only_public_core_names(path):
    assert _private_uses(path) == []


@pytest.mark.parametrize("path", EXAMPLE_PLUGIN_MODULES, ids=lambda path: path.name)
def test_example_plugin_imports_only_public_core_names(path):
    assert _private_uses(path) == []


CORE_MODULES = sorted((Path(__file__).resolve().parents[2] / "vecaccel").rglob("*.py"))


@pytest.mark.parametrize(
    "path", CORE_MODULES, ids=lambda path: str(path.relative_to(path.parents[1]))
)
def test_core_modules_import_no_private_name_of_another(path):
    """What one module of the core needs from another is public and documented there."""
    private = [use for use in _private_uses(path) if "(a private" in use]
    assert [use for use in private if ".__" not in use] == []  # a dunder is public


def test_the_check_catches_a_private_import(tmp_path):
    bad = tmp_path / "bad_plugin.py"
    bad.write_text(
        "from vecaccel.vec_env import VecEnv, _ResetMaskOnly\n"
        "from vecaccel.spaces import _align\n"
        "from vecaccel.worker import usable_cpus\n"
        "from vecaccel.make import make_vec, _env_fns\n"
    )
    assert _private_uses(bad) == [
        "vecaccel.vec_env._ResetMaskOnly (a private name)",
        "vecaccel.spaces._align (a private name)",
        "vecaccel.make._env_fns (a private name)",
    ]


def test_every_builtin_backend_lives_in_one_module_with_its_hookimpl():
    """Each backend name is registered by the module that defines its vector env class."""
    from vecaccel.manager import get_backend

    expected = {
        "serial": ("vecaccel.plugins.serial", "SerialVecEnv"),
        "shm": ("vecaccel.plugins.shm", "ShmVecEnv"),
        "hybrid": ("vecaccel.plugins.shm", "ShmVecEnv"),
        "async": ("vecaccel.plugins.asynchronous", "AsyncVecEnv"),
        "action_server": ("vecaccel.plugins.action_server", "ActionServerVecEnv"),
    }
    backends = vecaccel.list_backends()
    for name, (module, class_name) in expected.items():
        assert backends[name]["plugin"] == module
        assert get_backend(name).factory.__module__ == module
        assert hasattr(importlib.import_module(module), class_name)


def test_import_vecaccel_loads_no_backend_and_no_torch():
    """``import vecaccel`` stays light; building the plugin manager (as every spawned worker
    does) imports the built-in backends but still not torch."""
    code = (
        "import sys, vecaccel\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('vecaccel.plugins.'))\n"
        "assert not loaded, loaded\n"
        "vecaccel.list_backends()\n"
        "assert 'vecaccel.plugins.action_server' in sys.modules\n"
        "assert 'torch' not in sys.modules, 'the plugin manager imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
