"""The built-in backends and the example plugin build on the core's public names only.

A built-in backend is an ordinary plugin: whatever it needs from the core, a third-party backend
may need too, so it must be public (no leading underscore, listed in the module's ``__all__``).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILTIN_PLUGINS = sorted((ROOT / "plugins").glob("*.py"))
EXAMPLE_PLUGIN = sorted(
    (ROOT / "examples/vecaccel-example-plugin/vecaccel_example_plugin").glob("*.py")
)


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
    assert {"__init__", "threads"} <= {path.stem for path in EXAMPLE_PLUGIN}


@pytest.mark.parametrize("path", BUILTIN_PLUGINS, ids=lambda path: path.name)
def test_builtin_plugins_import_only_public_core_names(path):
    assert _private_uses(path) == []


@pytest.mark.parametrize("path", EXAMPLE_PLUGIN, ids=lambda path: path.name)
def test_example_plugin_imports_only_public_core_names(path):
    assert _private_uses(path) == []


def test_the_check_catches_a_private_import(tmp_path):
    bad = tmp_path / "bad_plugin.py"
    bad.write_text(
        "from vecaccel.vector import VecEnv, _ResetMaskOnly\n"
        "from vecaccel.spaces import _align\n"
        "from vecaccel.worker import usable_cpus\n"
        "from vecaccel.make import EnvFactory, _env_fns\n"
    )
    assert _private_uses(bad) == [
        "vecaccel.vector._ResetMaskOnly (a private name)",
        "vecaccel.spaces._align (a private name)",
        "vecaccel.make._env_fns (a private name)",
    ]


def test_every_builtin_backend_lives_in_one_module_with_its_hookimpl():
    """Each backend name is registered by the module that defines its vector env class."""
    import vecaccel
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
    import subprocess
    import sys

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
