"""Load a script of ``benchmarks/`` as a module, for the tests of its pieces."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a fresh module (the scripts are not a package)."""
    path = os.path.join(ROOT, "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"{name}_bench", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_benchmark(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``benchmarks/<name>.py`` as a script (as under spawn, where its functions must be
    importable by the children), its output captured."""
    script = os.path.join(ROOT, "benchmarks", f"{name}.py")
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, timeout=timeout
    )
