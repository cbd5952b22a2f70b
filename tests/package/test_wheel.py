"""The package as users install it: the sdist and wheel that ``python -m build`` makes, installed into
fresh virtual environments outside the checkout.

One environment takes its dependencies (torch among them) from this interpreter's site-packages
through a ``.pth`` line, so nothing is downloaded, while vecaccel itself comes only from the
wheel; the example plugin's wheel goes in beside it. A second takes only the core dependencies
(``pip install vecaccel`` without extras), linked one distribution at a time, so torch is not
importable there. Every command runs from a temporary folder with no ``PYTHONPATH``, and checks
that ``vecaccel`` was imported from the environment, never from the checkout.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from doc_blocks import block
from helpers import REPO

from vecaccel import list_backends

#: what never goes into the copy that is built: environments, caches, earlier builds and runs
NOT_BUILT = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "site", "*.egg-info", "__pycache__", ".pytest_cache",
    ".ruff_cache", ".mypy_cache", ".hypothesis", "runs", "bench-results",
)  # fmt: skip

#: the distributions ``pip install vecaccel`` brings: the core requirements and theirs
CORE = ("gymnasium", "numpy", "pluggy", "cloudpickle")


def run(argv: list[str], cwd: Path, timeout: float = 240) -> str:
    """Run ``argv`` without ``PYTHONPATH``; its output, after checking that it succeeded."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build(source: Path, outdir: Path, *flags: str) -> None:
    """``python -m build`` with the build requirements this interpreter already has."""
    run(
        [sys.executable, "-m", "build", "--no-isolation", *flags, "--outdir", str(outdir), "."],
        source,
    )


def make_venv(path: Path, wheels: list[Path], dependencies: list[str]) -> Path:
    """A fresh environment at ``path`` holding ``wheels`` (without their dependencies), whose
    ``sys.path`` also reaches the folders ``dependencies``; its interpreter."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)], path.parent)
    python = path / "bin" / "python"
    site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            path.parent,
        ).strip()
    )
    (site / "dependencies.pth").write_text("".join(f"{folder}\n" for folder in dependencies))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    run([*pip, "--no-deps", "--no-index", *map(str, wheels)], path.parent)
    return python


def core_closure() -> list[importlib.metadata.Distribution]:
    """The installed distributions that the core requirements need, without extras."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = list(CORE)
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a marker-only requirement of another platform or Python
        seen[name] = dist
        todo += [req for req in dist.requires or [] if "extra ==" not in req and _marker_holds(req)]
    return list(seen.values())


def _marker_holds(requirement: str) -> bool:
    from packaging.requirements import Requirement

    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({"extra": ""})


def link_distributions(dists: list[importlib.metadata.Distribution], folder: Path) -> None:
    """Symlink each distribution's top-level entries (modules, packages, dist-info) into
    ``folder``."""
    folder.mkdir()
    for dist in dists:
        base = Path(dist.locate_file(""))
        for top in {
            file.parts[0] for file in dist.files or [] if not file.parts[0].startswith("..")
        }:
            if top != "__pycache__" and (base / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(base / top)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and wheel of a copy of the checkout, and the example plugin's wheel."""
    root = tmp_path_factory.mktemp("built")
    source = root / "source"
    shutil.copytree(REPO, source, ignore=NOT_BUILT)
    build(source, root / "dist")
    build(source / "examples" / "vecaccel-example-plugin", root / "plugin", "--wheel")
    (wheel,) = (root / "dist").glob("vecaccel-*.whl")
    (sdist,) = (root / "dist").glob("vecaccel-*.tar.gz")
    (plugin,) = (root / "plugin").glob("*.whl")
    return {"root": root, "wheel": wheel, "sdist": sdist, "plugin": plugin}


@pytest.fixture(scope="module")
def installed(built: dict[str, Path]) -> Path:
    """The interpreter of an environment with the wheel, the example plugin and every
    dependency of this one."""
    dependencies = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    return make_venv(built["root"] / "venv", [built["wheel"], built["plugin"]], dependencies)


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder outside the checkout."""
    return tmp_path_factory.mktemp("elsewhere")


def test_twine_accepts_the_sdist_and_the_wheel(built):
    out = run(
        [
            sys.executable,
            "-m",
            "twine",
            "check",
            "--strict",
            str(built["sdist"]),
            str(built["wheel"]),
        ],
        REPO,
    )
    assert out.count("PASSED") == 2, out


def test_the_wheel_holds_the_package_and_nothing_else(built):
    names = zipfile.ZipFile(built["wheel"]).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"vecaccel", f"vecaccel-{importlib.metadata.version('vecaccel')}.dist-info"}, (
        tops
    )
    for needed in (
        "vecaccel/py.typed",
        "vecaccel/plugins/shm.py",
        "vecaccel/plugins/ray/vec_env.py",
        "vecaccel/trainers/algos/ppo.py",
        "vecaccel/trainers/runners/asynchronous/runner.py",
        "vecaccel/testing/__init__.py",
    ):
        assert needed in names, f"{needed} is missing from the wheel"
    strays = [
        name
        for name in names
        if {"tests", "benchmarks", "results", "examples", "docs"} & set(name.split("/"))
        or name.endswith((".json", ".csv", ".png", ".md"))
    ]
    assert not strays, f"the wheel holds files that are not the package: {strays}"
    # every folder of the source tree with modules is a package of the wheel
    for folder in ("vecaccel", "plugins", "trainers"):
        for module in (REPO / folder).rglob("*.py"):
            inside = module.relative_to(REPO / folder)
            prefix = "vecaccel" if folder == "vecaccel" else f"vecaccel/{folder}"
            assert f"{prefix}/{inside.as_posix()}" in names, (
                f"{folder}/{inside} is not in the wheel"
            )


def test_the_package_comes_from_the_wheel_not_the_checkout(installed, elsewhere):
    out = run(
        [str(installed), "-c", "import vecaccel; print(vecaccel.__file__, vecaccel.__version__)"],
        elsewhere,
    )
    where, version = out.split()
    assert Path(where).is_relative_to(installed.parent.parent), where
    assert not Path(where).is_relative_to(REPO), where
    assert version == importlib.metadata.version("vecaccel")


def test_the_readme_quick_start_runs(installed, elsewhere):
    quick_start = block("README.md", 'vecaccel.make_vec("CartPole-v1", 64, backend="shm")')
    # 50 of its 1,000 steps: the workers start, step every env and close as in the whole loop
    assert "range(1000)" in quick_start, quick_start
    run([str(installed), "-c", quick_start.replace("range(1000)", "range(50)")], elsewhere)


def test_vecaccel_backends_lists_the_built_ins_and_the_example_plugin(installed, elsewhere):
    out = run([str(installed.parent / "vecaccel"), "backends"], elsewhere)
    for name in [*list_backends(), "example-threads"]:
        assert re.search(rf"^\s*{re.escape(name)}\b", out, re.MULTILINE), (
            f"{name} not listed:\n{out}"
        )


def test_the_trainers_and_plugins_import(installed, elsewhere):
    run([str(installed), "-c", "import vecaccel.trainers, vecaccel.plugins"], elsewhere)


def test_vecaccel_train_runs(installed, elsewhere):
    pytest.importorskip("torch")
    command = [str(installed.parent / "vecaccel"), "train", "ppo", "--env", "CartPole-v1"]
    run([*command, "--total-timesteps", "2048", "--no-progress"], elsewhere, timeout=280)
    (run_dir,) = (elsewhere / "runs").iterdir()
    assert (run_dir / "checkpoint.pt").is_file()


#: what a user of ``pip install vecaccel`` (no extras) can do
CORE_ONLY = """
import importlib.util
import vecaccel

assert importlib.util.find_spec("torch") is None, "torch is importable"
with vecaccel.make_vec("CartPole-v1", 4, backend="shm", num_workers=2) as envs:
    obs, _ = envs.reset(seed=0)
    for _ in range(10):
        obs, rewards, terminated, truncated, _ = envs.step(envs.action_space.sample())
assert obs.shape == (4, 4)
print(vecaccel.__file__)
"""


def test_without_extras_the_core_steps_a_shm_env_without_torch(built, elsewhere):
    folder = built["root"] / "core-dependencies"
    link_distributions(core_closure(), folder)
    python = make_venv(built["root"] / "core-venv", [built["wheel"]], [str(folder)])
    where = run([str(python), "-c", CORE_ONLY], elsewhere).strip()
    assert Path(where).is_relative_to(python.parent.parent), where


#: what an editor shows a user of ``vecaccel.trainers``: the classes, not ``Any``
REVEAL = """
import vecaccel
import vecaccel.trainers

reveal_type(vecaccel.trainers.PPO)
reveal_type(vecaccel.trainers.SyncRunner)
reveal_type(vecaccel.make_vec)
"""

#: mypy reads torch, matplotlib and SB3 as ``Any``: vecaccel imports them for training, plots
#: and the SB3 adapter, and no type of theirs reaches the two files checked, while following
#: them is most of mypy's work (torch alone is over half the modules it would analyse)
MYPY_CONFIG = """
[mypy]

[mypy-torch.*,matplotlib.*,stable_baselines3.*]
follow_imports = skip
"""


def test_the_typed_example_checks_against_the_installed_package(installed, elsewhere, tmp_path):
    """``mypy --strict`` on ``examples/typed_user.py``, with the package as installed from the
    wheel (its ``py.typed``); the trainers' lazily loaded names have their real types."""
    shutil.copy(REPO / "examples" / "typed_user.py", elsewhere / "typed_user.py")
    (elsewhere / "reveal.py").write_text(REVEAL)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    mypy = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(tmp_path / "mypy.ini")]
    mypy += ["--python-executable", str(installed)]
    out = run(
        [*mypy, "--cache-dir", str(tmp_path / "cache"), "typed_user.py", "reveal.py"],
        elsewhere,
        timeout=280,
    )
    assert "Success: no issues found in 2 source files" in out, out
    assert (
        'Revealed type is "def (env: builtins.str' in out
        or "vecaccel.trainers.algos.ppo.PPO" in out
    ), out
    assert "vecaccel.trainers.runners.sync.SyncRunner" in out, out
    assert '"Any"' not in out, out
