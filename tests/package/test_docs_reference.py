"""The API reference's pages as the site builds them, checked on the package's real docstrings
without a build (``make docs`` builds the site strictly, a minute on two cores):

- the Sphinx roles of the docstrings (``:class:`~a.b.C```) become cross-references
  (``docs/griffe_extensions.py``), and none is left as text;
- each page lists its module's exported names, entry points first, and the ``Algorithm`` page
  every member a user or an algorithm's author calls.
"""

from __future__ import annotations

import importlib.util
import re
import textwrap

import pytest
from doc_blocks import ROOT

griffe = pytest.importorskip("griffe")
yaml = pytest.importorskip("yaml")


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


def _directives(page: str) -> list[tuple[str, dict]]:
    """(identifier, options) of each ``::: identifier`` of a reference page."""
    found, lines = [], (ROOT / "docs" / "reference" / page).read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("::: "):
            block = []
            for following in lines[i + 1 :]:
                if following.strip() and not following.startswith("    "):
                    break
                block.append(following)
            options = (yaml.safe_load(textwrap.dedent("\n".join(block))) or {}).get("options", {})
            found.append((line[4:].strip(), options))
    return found


PAGES = sorted(path.name for path in (ROOT / "docs" / "reference").glob("*.md"))
#: exported names no page documents, each with the reason
NOT_ON_A_PAGE = {"vecaccel.AutoresetMode": "Gymnasium's enum, documented there"}


@pytest.mark.parametrize("page", [p for p in PAGES if p != "index.md"])
def test_a_reference_page_documents_every_name_its_modules_export(package, page):
    collection = package.modules_collection
    directives = _directives(page)
    shown = set()
    for identifier, options in directives:
        obj = collection[identifier]
        names = options.get("members")
        if names is not None:
            missing = [name for name in names if name not in obj.members]
            assert not missing, f"{page}: {identifier} has no {missing}"
        shown |= {identifier, *(f"{identifier}.{name}" for name in names or obj.members)}
        if obj.is_alias:
            shown.add(obj.target_path)
    for identifier, _ in directives:
        obj = collection[identifier]
        if not obj.is_module or not obj.exports:
            continue
        for name in obj.exports:
            member = obj.members.get(name)
            where = member.target_path if member is not None and member.is_alias else None
            if f"{identifier}.{name}" in NOT_ON_A_PAGE or f"{identifier}.{name}" in shown:
                continue
            if member is None:  # loaded lazily (the module's __getattr__): a directive of its own
                assert any(path.rpartition(".")[2] == name for path in shown), (
                    f"{page}: {identifier}.{name} is exported but not documented"
                )
                continue
            # documented by another directive of the page, under the module that defines it
            assert where is not None and (where in shown or where.rpartition(".")[0] in shown), (
                f"{page}: {identifier}.{name} is exported but not listed: add it to the page's "
                "members (entry points first)"
            )


#: what the runners and the families' loops call on an agent, which neither a user nor an
#: algorithm's author calls: left out of the Algorithm page
RUNNERS_OWN = {
    "set_budget",
    "set_target_steps",
    "adaptive_threads",
    "record_progress",
    "start_logging",
    "end_run",
    "reset_counters",
    "set_run_mode",
    "write_checkpoint",
}


def test_the_algorithm_page_lists_every_member_but_the_runners_own(package):
    [listed] = [
        options["members"]
        for identifier, options in _directives("trainers.md")
        if identifier == "vecaccel.trainers.Algorithm"
    ]
    algorithm = package.modules_collection["vecaccel.trainers.algos.base.Algorithm"]
    public = {name for name in algorithm.members if not name.startswith("_")}
    assert len(listed) == len(set(listed))
    assert set(listed) | RUNNERS_OWN == public, (
        f"not on the page: {sorted(public - set(listed) - RUNNERS_OWN)}; "
        f"gone from the class: {sorted((set(listed) | RUNNERS_OWN) - public)}"
    )
    assert not set(listed) & RUNNERS_OWN
    assert listed[:4] == ["learn", "predict", "save", "load"]
