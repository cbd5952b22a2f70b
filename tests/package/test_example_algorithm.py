"""The example third-party algorithm (``examples/vecaccel-example-algorithm``): its own tests pass
with the kit, and once installed, ``vecaccel train reinforce`` finds it through its entry point,
on one rank and on two."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vecaccel-example-algorithm"


def _env(site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VECACCEL_DISABLE_PLUGINS", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def test_example_algorithm_tests_pass_with_the_kit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example's own suite (``check_algorithm("reinforce")`` and the CLI) passes: run by
    a pytest run of its own in this process (the example's rootdir and fixtures, not this
    suite's conftest), with the example's source folder importable."""
    monkeypatch.delenv("VECACCEL_DISABLE_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    before = set(sys.modules)
    try:
        code = pytest.main(
            [
                "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                "--basetemp", str(tmp_path / "basetemp"), str(EXAMPLE / "tests"),
            ]
        )  # fmt: skip
    finally:  # the example's modules are unloaded with its run
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("test_reinforce", "vecaccel_example_algorithm"):
                del sys.modules[name]
    output = capsys.readouterr().out
    assert code == 0, output
    assert "3 passed" in output


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example installed with pip into a folder of its own (see test_plugins.py's
    ``example_plugin_path``: a real build and install, with its ``entry_points.txt``)."""
    pytest.importorskip("setuptools", reason="building the example package needs setuptools")
    root = tmp_path_factory.mktemp("example-algorithm")
    source = root / "src"
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    target = root / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--target",
            str(target),
            str(source),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield target
    shutil.rmtree(root, ignore_errors=True)


def test_installed_example_trains_by_name_on_two_ranks(installed: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    listed = subprocess.run(
        [sys.executable, "-m", "vecaccel", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(installed),
    )
    assert listed.returncode == 0 and "reinforce" in listed.stdout, listed.stdout + listed.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vecaccel",
            "train",
            "reinforce",
            "--nproc",
            "2",
            "--env",
            "CartPole-v1",
            "--backend",
            "serial",
            "--num-envs",
            "2",
            "--num-steps",
            "16",
            "--total-timesteps",
            "128",
            "--torch-threads",
            "1",
            "--no-progress",
            "--no-tensorboard",
            "--run-dir",
            str(run_dir),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(installed),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from vecaccel.trainers.checkpoints.format import load_checkpoint

    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["algorithm"] == "reinforce" and state["global_step"] == 128
    assert len(state["rank_rng"]) == 2
