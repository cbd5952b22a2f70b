"""MkDocs hooks of the site (``mkdocs.yml``): the package as installed, links out of ``docs/``,
and a docstring on every public name of the reference.

- The reference reads the package as it is installed, with ``plugins/`` and ``trainers/`` as
  ``vecaccel.plugins`` and ``vecaccel.trainers``: :func:`build_package_tree` copies that layout to
  ``build/package-tree``, where mkdocstrings looks first.
- The pages link to the repository's files with relative paths, which work where the Markdown is
  read (an editor, the forge). The site carries each file so linked (a result, a plot) under
  ``repository/`` and links to its copy, once checked to exist: a link to nothing is a warning,
  and ``mkdocs build --strict`` fails on warnings. A link to a folder shows its path as code.
- :func:`leftover_roles` finds Sphinx roles a page still shows as text (``:class:`X```), which
  ``docs/griffe_extensions.py`` turns into links: each is a warning.
- :func:`missing_docstrings` names every public object of the reference's modules without a
  docstring, each a warning: the strict build fails naming them.
"""

from __future__ import annotations

import logging
import posixpath
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: where the package is laid out as installed, for the reference (mkdocs.yml's handler ``paths``)
PACKAGE_TREE = ROOT / "build" / "package-tree"
#: the modules whose public names the reference documents
REFERENCE_MODULES = (
    "vecaccel",
    "vecaccel.errors",
    "vecaccel.hookspecs",
    "vecaccel.manager",
    "vecaccel.options",
    "vecaccel.testing",
    "vecaccel.testing.envs",
    "vecaccel.testing.leaks",
    "vecaccel.sb3",
    "vecaccel.bench",
    "vecaccel.trainers",
    "vecaccel.trainers.config.registry",
)

log = logging.getLogger("mkdocs.hooks.vecaccel")
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")


def build_package_tree(target: Path = PACKAGE_TREE) -> Path:
    """Copy ``vecaccel/``, ``plugins/`` and ``trainers/`` into ``target`` in the installed
    layout (``vecaccel/plugins``, ``vecaccel/trainers``); the folder holding ``vecaccel``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(ROOT / "vecaccel", target / "vecaccel", ignore=ignore)
    for folder in ("plugins", "trainers"):
        shutil.copytree(ROOT / folder, target / "vecaccel" / folder, ignore=ignore)
    return target


def _documented(obj: Any) -> bool:
    return bool(obj.docstring and obj.docstring.value.strip())


def _inherits_docstring(cls: Any, name: str) -> bool:
    """Whether a base class of ``cls`` (Gymnasium's included) documents its member ``name``."""
    try:
        bases = cls.mro()
    except Exception:  # noqa: BLE001 - a base griffe cannot resolve
        return False
    return any(name in base.members and _documented(base.members[name]) for base in bases)


def _undocumented(obj: Any, owner: str) -> Iterable[str]:
    """``obj``'s path if it has no docstring, then its public members' (classes: their own
    methods and properties, unless a base class documents them)."""
    if obj.is_alias:
        if not obj.target_path.startswith("vecaccel"):
            return  # an external name (Gymnasium's) is documented there
        obj = obj.final_target
    if obj.is_attribute:
        return  # constants: their values speak, and griffe does not read `#:` comments
    if not _documented(obj):
        yield f"{owner} ({obj.path})" if owner != obj.path else obj.path
    if obj.is_class:
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias or member.is_attribute:
                continue
            if not _documented(member) and _inherits_docstring(obj, name):
                continue
            yield from _undocumented(member, f"{owner}.{name}")


def missing_docstrings(
    modules: Iterable[str] = REFERENCE_MODULES, search_path: Path | None = None
) -> list[str]:
    """The public names of ``modules`` (their ``__all__``, else every name without a leading
    underscore) that have no docstring, with the public methods and properties of their classes;
    modules are read from ``search_path`` (default: a fresh :func:`build_package_tree`)."""
    import griffe
    import gymnasium

    # the package first; then where Gymnasium lies, for the bases the backends and envs inherit from
    gymnasium_path = Path(gymnasium.__file__).parent.parent
    loader = griffe.GriffeLoader(search_paths=[search_path or build_package_tree(), gymnasium_path])
    modules = list(modules)
    for top in sorted({name.split(".")[0] for name in modules}):
        loader.load(top, try_relative_path=False)
    loader.load("gymnasium", try_relative_path=False)
    loader.resolve_aliases(external=False, implicit=False)
    missing: list[str] = []
    for module_name in modules:
        module = loader.modules_collection.get_member(module_name)
        if not (module.docstring and module.docstring.value.strip()):
            missing.append(module_name)
        exports = module.exports
        names = (
            sorted(exports)
            if exports is not None
            else sorted(name for name in module.members if not name.startswith("_"))
        )
        for name in names:
            member = module.members.get(name)
            if (
                member is not None
                and member.is_alias
                and not member.target_path.startswith("vecaccel")
            ):
                continue  # an external name (Gymnasium's) is documented there
            if member is None or (member.is_module and exports is None):
                continue  # a lazily loaded name, or a submodule: documented on its own
            missing += _undocumented(member, f"{module_name}.{name}")
    return sorted(set(missing))


def on_startup(command: str, dirty: bool) -> None:
    """Lay the package out as installed before mkdocstrings first looks for it."""
    build_package_tree()


def on_pre_build(config: Any) -> None:
    """Warn of every public name of the reference without a docstring."""
    for name in missing_docstrings(search_path=PACKAGE_TREE):
        log.warning("%s has no docstring; the API reference needs one", name)


#: where the site carries the repository's files that the pages link to
REPOSITORY_DIR = "repository"
#: a role left as text in the prose of a page, whose backticks Markdown made a <code> element
#: (in a code block, where a role is source shown as it is, they stay backticks)
LEFTOVER_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):<code>")


def _outward(page_src_path: str, target: str, docs_dir: Path) -> Path | None:
    """The file or folder of the repository that ``target``, a link of the page at
    ``page_src_path``, points at outside ``docs/`` (``None``: an address, an anchor, a page)."""
    if re.match(r"\w+:", target) or target.startswith(("#", "/")):
        return None
    path = target.partition("#")[0]
    resolved = Path(posixpath.normpath((docs_dir / page_src_path).parent / path))
    return None if resolved.is_relative_to(docs_dir) else resolved


def linked_files(docs_dir: Path) -> list[Path]:
    """The repository's files the pages of ``docs_dir`` link to, each once."""
    found: set[Path] = set()
    for page in docs_dir.rglob("*.md"):
        src_path = page.relative_to(docs_dir).as_posix()
        for match in LINK.finditer(page.read_text()):
            resolved = _outward(src_path, match["target"], docs_dir)
            if resolved is not None and resolved.is_file() and resolved.is_relative_to(ROOT):
                found.add(resolved)
    return sorted(found)


def on_files(files: Any, config: Any) -> Any:
    """Carry the repository's files that the pages link to, under ``repository/``, as they
    are: a Markdown file among them (a result's table) is a file to read, not a page."""
    from mkdocs.structure.files import File

    class RepositoryFile(File):
        def is_documentation_page(self) -> bool:
            return False

    for path in linked_files(Path(config["docs_dir"])):
        uri = f"{REPOSITORY_DIR}/{path.relative_to(ROOT).as_posix()}"
        files.append(RepositoryFile.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Point the links that leave ``docs/`` at the site's copies of the files, warning of any
    that lead nowhere."""
    docs_dir = Path(config["docs_dir"])
    src_path = page.file.src_path

    def outward(match: re.Match[str]) -> str:
        text, target = match["text"], match["target"]
        resolved = _outward(src_path, target, docs_dir)
        if resolved is None:
            return match.group(0)  # an address, an anchor, or a page: mkdocs checks those
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            log.warning("%s links to %s, which does not exist", src_path, target)
            return match.group(0)
        relative = resolved.relative_to(ROOT).as_posix()
        if resolved.is_dir():  # a folder has no page on the site: its path, as code
            return f"{text} (`{relative}/`)"
        anchor = target.partition("#")[2]
        copy = posixpath.relpath(f"{REPOSITORY_DIR}/{relative}", posixpath.dirname(src_path) or ".")
        return f"[{text}]({copy}{'#' + anchor if anchor else ''})"

    return LINK.sub(outward, markdown)


def leftover_roles(html: str) -> list[str]:
    """The Sphinx roles ``html`` shows as text, each with a little of what follows it."""
    return [html[m.start() : m.end() + 40] for m in LEFTOVER_ROLE.finditer(html)]


def on_post_page(output: str, page: Any, config: Any) -> str:
    """Warn of every Sphinx role the page still shows as text."""
    for found in leftover_roles(output):
        log.warning("%s shows a Sphinx role as text: %s", page.file.src_path, found)
    return output
