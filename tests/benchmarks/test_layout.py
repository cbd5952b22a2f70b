"""The layout of ``benchmarks/``: every script in a subject folder, standing on the library
alone, documented with its command, and writing the one result format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SUBJECTS = ("throughput", "waiting", "learning", "scale_out", "reliability", "gpu")


SCRIPTS = sorted(BENCHMARKS.glob("**/*.py"))


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
