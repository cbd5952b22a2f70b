"""Load a script of ``benchmarks/`` as a module, for the tests of its pieces."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script_path(name: str) -> str:
    """The path of ``benchmarks/<subject>/<name>.py`` from ``"<subject>/<name>"``."""
    return os.path.join(ROOT, "benchmarks", *name.split("/")) + ".py"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<subject>/<name>.py`` as a fresh module (the scripts are not a package).

    Its folder leads ``sys.path`` while it loads, as when Python runs it as a script, so that a
    script may import a neighbour of its own subject.
    """
    path = script_path(name)
    spec = importlib.util.spec_from_file_location(f"{name.replace('/', '_')}_bench", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(os.path.dirname(path))
    return module


def run_benchmark(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``benchmarks/<subject>/<name>.py`` as a script (as under spawn, where its functions
    must be importable by the children), its output captured."""
    return subprocess.run(
        [sys.executable, script_path(name), *args], capture_output=True, text=True, timeout=timeout
    )
