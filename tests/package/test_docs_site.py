"""The documentation site's own checks (``docs/hooks.py``, ``make docs``), without building it:
``make lint`` builds it strictly."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from doc_blocks import ROOT

pytest.importorskip("griffe")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = _hooks()


def _package(root: Path, source: str) -> Path:
    package = root / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(source))
    return root


def test_a_public_name_without_a_docstring_is_named(tmp_path):
    root = _package(
        tmp_path,
        '''
        """A package."""

        import gymnasium as gym

        __all__ = ["documented", "undocumented", "Thing", "Env"]


        def documented():
            """Here."""


        def undocumented():
            pass


        def _private():
            pass


        class Thing:
            """A thing."""

            def method(self):
                pass

            def _helper(self):
                pass


        class Env(gym.Env):
            """An env: its reset and step are documented by Gymnasium."""

            def reset(self, *, seed=None, options=None):
                pass

            def step(self, action):
                pass
        ''',
    )
    assert HOOKS.missing_docstrings(["fakepkg"], root) == [
        "fakepkg.Thing.method",
        "fakepkg.undocumented",
    ]


def test_the_reference_modules_have_every_docstring(tmp_path):
    tree = HOOKS.build_package_tree(tmp_path / "package-tree")
    assert HOOKS.missing_docstrings(search_path=tree) == []


def _page(name: str):
    config = {"docs_dir": str(ROOT / "docs")}
    page = SimpleNamespace(file=SimpleNamespace(src_path=name))
    return page, config


def test_links_out_of_the_docs_point_at_the_sites_copies(caplog):
    page, config = _page("benchmarks/throughput.md")
    text = (
        "[result](../../benchmarks/results/soak.json) [folder](../../benchmarks/) "
        "[page](../backends.md#spaces) [web](https://gymnasium.farama.org)"
    )
    with caplog.at_level(logging.WARNING):
        out = HOOKS.on_page_markdown(text, page, config, None)
    assert "[result](../repository/benchmarks/results/soak.json)" in out
    assert "folder (`benchmarks/`)" in out
    assert "[page](../backends.md#spaces)" in out and "(https://gymnasium.farama.org)" in out
    assert not caplog.records


def test_the_site_carries_every_file_the_pages_link_to():
    linked = [path.relative_to(ROOT).as_posix() for path in HOOKS.linked_files(ROOT / "docs")]
    assert "benchmarks/results/soak.json" in linked and "benchmarks/README.md" in linked
    assert all((ROOT / path).is_file() for path in linked)
    assert not any(path.startswith("docs/") for path in linked)


def test_a_link_to_a_missing_file_warns_naming_it(caplog):
    page, config = _page("backends.md")
    with caplog.at_level(logging.WARNING):
        HOOKS.on_page_markdown("[gone](../benchmarks/results/gone.json)", page, config, None)
    assert any("gone.json" in record.getMessage() for record in caplog.records)


def test_a_sphinx_role_left_as_text_on_a_page_is_found():
    html = (
        "<p>the :class:<code>SyncRunner</code> runs</p>"
        '<pre><code>"""A :class:`ReinforceConfig`, as the source has it."""</code></pre>'
    )
    [found] = HOOKS.leftover_roles(html)
    assert found.startswith(":class:<code>SyncRunner</code> runs")


def test_make_docs_without_the_docs_extra_names_it(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = subprocess.run(
        ["make", "--no-print-directory", "-s", "docs", f"VENV={venv}", "STAMP="],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "docs extra" in done.stderr and "'.[docs]'" in done.stderr, done.stderr


def test_every_benchmark_page_stays_short():
    for page in sorted((ROOT / "docs" / "benchmarks").glob("*.md")):
        lines = len(page.read_text().splitlines())
        assert lines <= 300, f"{page.relative_to(ROOT)} has {lines} lines: split it by subject"


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        name = page.relative_to(ROOT / "docs").as_posix()
        assert name in nav, f"docs/{name} is not in mkdocs.yml's nav"
