"""The layout of ``benchmarks/``: every script in a subject folder, standing on the library
alone, documented with its command, and writing the one result format; the peers' code the
benchmarks run, vendored in ``benchmarks/peers/``, naming where it comes from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SUBJECTS = ("throughput", "waiting", "learning", "scale_out", "reliability", "gpu")


#: third-party scripts the benchmarks run as their peers, kept as their authors wrote them
PEERS = BENCHMARKS / "peers"
SCRIPTS = sorted(path for path in BENCHMARKS.glob("**/*.py") if PEERS not in path.parents)
PEER_SCRIPTS = sorted(PEERS.glob("*.py"))


def test_every_script_lives_in_a_subject_folder():
    assert SCRIPTS
    for script in SCRIPTS:
        subject = script.relative_to(BENCHMARKS).parts
        assert len(subject) == 2 and subject[0] in SUBJECTS, script


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_a_benchmark_stands_on_the_library_alone(script):
    text = script.read_text()
    assert not re.search(r"sys\.path", text), f"{script} edits sys.path"
    assert not re.search(r"^\s*(from|import) tests\b", text, re.M), f"{script} imports tests/"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_script_is_documented_with_its_command(script):
    path = script.relative_to(ROOT).as_posix()
    pages = "".join(page.read_text() for page in (ROOT / "docs" / "benchmarks").glob("*.md"))
    assert f"python {path}" in pages, f"no page of docs/benchmarks/ gives the command of {path}"
    readme = (BENCHMARKS / "README.md").read_text()
    assert f"`{script.name}`" in readme, f"benchmarks/README.md does not list {path}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_script_writes_the_one_result_format(script):
    text = script.read_text()
    assert "RunRecord(" in text, f"{script} does not record its run with vecaccel.bench.RunRecord"
    assert "write_json" not in text, f"{script} writes JSON of its own layout"


@pytest.mark.parametrize("script", PEER_SCRIPTS, ids=lambda p: p.name)
def test_a_vendored_peer_names_its_origin_and_licence_and_stands_alone(script):
    text = script.read_text()
    head = text[: text.index("\n\n")]  # the opening comment block
    assert re.search(r"https://github\.com/\S+/blob/[0-9a-f]{40}/\S+\.py", head), (
        f"{script} does not name the upstream file at a commit"
    )
    assert "License" in text[:4000] and "Copyright" in text[:4000], f"{script} has no licence"
    assert not re.search(r"sys\.path", text), f"{script} edits sys.path"
    assert not re.search(r"^\s*(from|import) (tests|vecaccel)\b", text, re.M), (
        f"{script} imports vecaccel or tests/: a peer runs as its authors run it"
    )
    runner = [path for path in SCRIPTS if script.name in path.read_text()]
    assert runner, f"no benchmark runs {script.name}"
    readme = (BENCHMARKS / "README.md").read_text()
    assert f"`peers/{script.name}`" in readme, f"benchmarks/README.md does not list {script.name}"
