"""The version is written once, in pyproject.toml: the package and the changelog agree with it."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import vecaccel

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert found, "pyproject.toml has no version line"
    return found.group(1)


def test_version_comes_from_the_package_metadata():
    assert vecaccel.__version__ == importlib.metadata.version("vecaccel") == _pyproject_version()


def test_version_is_written_nowhere_else_in_the_package():
    source = (ROOT / "vecaccel" / "__init__.py").read_text()
    assert f'"{_pyproject_version()}"' not in source


def test_an_uninstalled_checkout_reads_pyproject(monkeypatch):
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert vecaccel._read_version() == _pyproject_version()


def test_the_changelog_has_a_section_for_the_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{_pyproject_version()}]" in changelog
    assert "Deprecation policy" in changelog
