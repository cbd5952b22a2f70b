"""Griffe extensions of the API reference (``mkdocs.yml``): how the docstrings, written for
``help()`` and editors, read on the site.

- :class:`ExampleSections`: the ``Example:`` heading is Google style's examples section.
- :class:`SphinxRoles`: the docstrings' Sphinx roles (``:class:`~a.b.C```) become links.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import griffe

EXAMPLE_HEADING = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)

#: a role of Sphinx's Python domain, ``:class:`target``` or ``:py:meth:`title <target>```; the
#: target may wrap onto the next line of the docstring
ROLE = re.compile(
    r":(?:py:)?(?P<role>class|func|meth|mod|attr|data|exc|obj|const):`(?P<content>[^`]+)`"
)
#: the roles whose text Sphinx ends with ``()`` (its ``add_function_parentheses``)
CALLABLE_ROLES = frozenset({"func", "meth"})
#: the name of an object, dotted (``a.b.C``), for a role's target
DOTTED_NAME = re.compile(r"\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class ExampleSections(griffe.Extension):
    """Rename each docstring's ``Example:`` heading to ``Examples:`` as the object is loaded,
    so that its doctests render as code blocks rather than as prose."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = EXAMPLE_HEADING.sub(r"\1Examples:", obj.docstring.value)


def convert_roles(text: str, resolve: Callable[[str], str | None]) -> str:
    """``text`` with each Sphinx role written as mkdocs-autorefs' cross-reference.

    The text shown is Sphinx's: an explicit title (``:meth:`title <a.b.C.m>```), else the target
    as written, its last component only with a ``~`` prefix, without a leading ``.``, and with
    ``()`` after a function or method. ``resolve`` gives the full path of a target (``None`` if
    it names nothing known): the reference links it where the site documents that object, and
    shows it as code where it does not (an internal class, another project's), so that such a
    target never fails the strict build. A ``!`` prefix (Sphinx's "no link"), and a target
    that resolves to nothing, is shown as code.
    """

    def replace(match: re.Match[str]) -> str:
        role, content = match["role"], " ".join(match["content"].split())
        titled = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", content)
        if titled:
            title, target = titled["title"], titled["target"].strip()
        else:
            target = content
            title = target.lstrip("!")
            if title.startswith("~"):
                title = title[1:].rpartition(".")[2]
            title = title.lstrip(".")
            if role in CALLABLE_ROLES and not title.endswith("()"):
                title += "()"
        link = not target.startswith("!")
        target = target.lstrip("!~").removesuffix("()")
        path = resolve(target) if link and DOTTED_NAME.fullmatch(target) else None
        code = f"`{title}`"
        if path is None:
            return code
        # optional: autorefs links it if the site documents `path`, else shows the code quietly
        return f'<autoref identifier="{path}" optional>{code}</autoref>'

    return ROLE.sub(replace, text)


def _members(obj: Any) -> dict[str, Any]:
    """The members a name can refer to in ``obj``: a class's inherited ones too."""
    if obj.is_class:
        try:
            return dict(obj.all_members)
        except Exception:  # noqa: BLE001 - a base class griffe cannot resolve
            return dict(obj.members)
    return dict(obj.members)


def _target(obj: Any) -> Any:
    """``obj``, or the object an alias (an import) of it points at, if loaded."""
    if not obj.is_alias:
        return obj
    try:
        return obj.final_target
    except Exception:  # noqa: BLE001 - an alias of a module that is not loaded (another project's)
        return None


def _path(obj: Any) -> str:
    """Where ``obj`` is defined (an alias's target path, even of a module not loaded)."""
    if obj.is_alias:
        target = _target(obj)
        return target.path if target is not None else obj.target_path
    return obj.path


def resolve_in_scope(scope: Any, target: str) -> str | None:
    """The full path of ``target`` as a role in the docstring of ``scope`` names it, with
    Sphinx's search order: the object's members (a class's inherited ones too), then each
    enclosing scope's, then a loaded package by its full path. A target with a leading ``.``
    names the object whose path ends so, the one nearest to ``scope`` if several do."""
    collection = scope.modules_collection
    if target.startswith("."):
        return _nearest(scope, target[1:], _walk(collection.members.values()))
    first, *rest = target.split(".")
    found = None
    here = scope
    while here is not None and found is None:
        found = _members(here).get(first)
        if found is None and here.name == first and not here.is_module:
            found = here
        here = here.parent
    if found is None:
        if first not in collection.members:
            return None
        found = collection.members[first]
    for i, name in enumerate(rest):
        obj = _target(found)
        if obj is None:  # another project's object: its path, for an inventory to link
            return ".".join([found.target_path, *rest[i:]])
        found = _members(obj).get(name)
        if found is None:
            return None
    return _path(found)


def _walk(objects: Iterable[Any]) -> Iterator[Any]:
    for obj in objects:
        if obj.is_alias:
            continue
        yield obj
        yield from _walk(obj.members.values())


def _nearest(scope: Any, suffix: str, objects: Iterable[Any]) -> str | None:
    paths = [obj.path for obj in objects if obj.path.endswith("." + suffix)]
    if not paths:
        return None

    def shared(path: str) -> int:
        return len(_common_prefix(path.split("."), scope.path.split(".")))

    return max(sorted(paths), key=shared)


def _common_prefix(a: list[str], b: list[str]) -> list[str]:
    prefix = []
    for x, y in zip(a, b):
        if x != y:
            break
        prefix.append(x)
    return prefix


def documented_objects(package: Any) -> Iterator[Any]:
    """Every object defined in ``package`` (its modules, classes, functions, attributes and
    their members), aliases left out: what has a docstring of its own."""
    yield package
    yield from _walk(package.members.values())


def convert_package_roles(package: Any) -> None:
    """Convert the roles of every docstring in ``package`` (see :func:`convert_roles`)."""
    for obj in documented_objects(package):
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = convert_roles(
                obj.docstring.value, lambda target, obj=obj: resolve_in_scope(obj, target)
            )


class SphinxRoles(griffe.Extension):
    """Convert the docstrings' Sphinx roles to mkdocs-autorefs' cross-references once the
    package is loaded (names imported anywhere in it are known then); the source keeps the
    roles, which ``help()`` and editors read."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        convert_package_roles(pkg)
