"""Load a script of ``benchmarks/`` as a module, for the tests of its pieces."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def runs_in_this_process(
    monkeypatch, name: str, in_child_too: Callable[[dict], bool] = lambda kwargs: False
) -> Iterator[ModuleType]:
    """``benchmarks/<subject>/<name>.py`` loaded with the runs it hands to ``run_in_child``
    (its own and those ``vecaccel.bench.seeds.run_seeds`` starts) called in this process, their
    arguments and results through JSON as a child takes and gives them: a child's start-up
    (torch, SB3, the simulators' imports) costs more than a test's tiny run. The children
    themselves are the harness's to test (``tests/vecaccel/bench/test_seeds.py``). A run whose
    ``kwargs`` ``in_child_too`` accepts still goes to its child. torch's thread count, which a
    run sets, is put back after."""
    import torch

    from vecaccel.bench import seeds

    bench = load_benchmark(name)
    in_child = seeds.run_in_child

    def here(script, function, kwargs=None, **options):
        if in_child_too(kwargs or {}):
            return in_child(script, function, kwargs, **options)
        called = getattr(bench, function)(**json.loads(json.dumps(kwargs or {})))
        return json.loads(json.dumps(called))

    if hasattr(bench, "run_in_child"):
        monkeypatch.setattr(bench, "run_in_child", here)
    monkeypatch.setattr(seeds, "run_in_child", here)
    threads = torch.get_num_threads()
    try:
        yield bench
    finally:
        torch.set_num_threads(threads)
