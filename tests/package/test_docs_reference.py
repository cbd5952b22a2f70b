"""The API reference's pages as the site builds them, checked on the package's real docstrings
without a build (``make docs`` builds the site strictly, a minute on two cores):

- the Sphinx roles of the docstrings (``:class:`~a.b.C```) become cross-references
  (``docs/griffe_extensions.py``), and none is left as text.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from doc_blocks import ROOT

griffe = pytest.importorskip("griffe")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = _load("hooks")
EXTENSIONS = _load("griffe_extensions")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The package as the reference reads it: laid out as installed, roles converted."""
    tree = HOOKS.build_package_tree(tmp_path_factory.mktemp("reference") / "package-tree")
    loader = griffe.GriffeLoader(
        search_paths=[tree], extensions=griffe.load_extensions(EXTENSIONS.SphinxRoles())
    )
    return loader.load("vecaccel", try_relative_path=False)


def _ref(path: str, title: str) -> str:
    return f'<autoref identifier="{path}" optional>`{title}`</autoref>'


KNOWN = {
    "SyncRunner": "pkg.runners.SyncRunner",
    "pkg.runners.SyncRunner": "pkg.runners.SyncRunner",
    "pkg.runners.SyncRunner.run": "pkg.runners.SyncRunner.run",
    ".spaces": "pkg.spaces",  # a leading dot: the object whose path ends so
}


@pytest.mark.parametrize(
    "text, expected",
    [
        (":class:`SyncRunner`", _ref("pkg.runners.SyncRunner", "SyncRunner")),
        (":class:`~pkg.runners.SyncRunner`", _ref("pkg.runners.SyncRunner", "SyncRunner")),
        (
            ":class:`pkg.runners.SyncRunner`",
            _ref("pkg.runners.SyncRunner", "pkg.runners.SyncRunner"),
        ),
        (":meth:`~pkg.runners.SyncRunner.run`", _ref("pkg.runners.SyncRunner.run", "run()")),
        (
            ":meth:`SyncRunner.run\n    <pkg.runners.SyncRunner.run>`",
            _ref("pkg.runners.SyncRunner.run", "SyncRunner.run"),
        ),
        (":py:mod:`.spaces`", _ref("pkg.spaces", "spaces")),
        (":func:`!SyncRunner`", "`SyncRunner()`"),
        (":exc:`TimeoutError`", "`TimeoutError`"),
        ("a ``literal`` and :param x: stay", "a ``literal`` and :param x: stay"),
    ],
)
def test_a_role_becomes_a_cross_reference_with_the_text_sphinx_shows(text, expected):
    assert EXTENSIONS.convert_roles(text, KNOWN.get) == expected


def test_no_docstring_of_the_package_keeps_a_sphinx_role(package):
    left = [
        f"{obj.path}: {match.group(0)}"
        for obj in EXTENSIONS.documented_objects(package)
        if obj.docstring is not None
        for match in EXTENSIONS.ROLE.finditer(obj.docstring.value)
    ]
    assert not left, left
    links = [
        path
        for obj in EXTENSIONS.documented_objects(package)
        if obj.docstring is not None
        for path in re.findall(r'<autoref identifier="([^"]+)"', obj.docstring.value)
    ]
    assert len(links) > 500, f"only {len(links)} roles became cross-references"


def test_a_role_links_to_where_its_object_is_defined(package):
    collection = package.modules_collection
    trainers = collection["vecaccel.trainers"].docstring.value
    assert _ref("vecaccel.trainers.runners.sync.SyncRunner", "SyncRunner") in trainers
    assert (
        _ref("vecaccel.trainers.config.registry", "vecaccel.trainers.config.registry") in trainers
    )
    # a role that wraps onto the next line, with an explicit title
    learn = collection["vecaccel.trainers.algos.base.Algorithm.learn"].docstring.value
    assert (
        _ref("vecaccel.trainers.runners.asynchronous.runner.AsyncRunner.run", "AsyncRunner.run")
        in learn
    )
    # an inherited method, named from the subclass
    assert EXTENSIONS.resolve_in_scope(collection["vecaccel.trainers.algos.ppo.PPO"], "learn") == (
        "vecaccel.trainers.algos.base.Algorithm.learn"
    )
