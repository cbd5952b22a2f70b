"""``vecaccel.trainers`` hands out its names lazily, from the registry; the imports that checkers
and editors read (under ``TYPE_CHECKING``) and ``__all__`` name exactly the same objects."""

from __future__ import annotations

import ast

import vecaccel.trainers
from vecaccel.trainers.config.registry import exports


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(open(vecaccel.trainers.__file__).read())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.unparse(statement)
                for alias in statement.names:
                    found[alias.asname or alias.name] = f"{statement.module}:{alias.name}"
    return found


def test_the_checkers_imports_are_the_registry_exports():
    assert _type_checking_imports() == exports(), (
        "the TYPE_CHECKING imports of trainers/__init__.py differ from the registry's exports: "
        "add or remove the import there"
    )


def test_all_is_the_registry_exports():
    assert sorted(vecaccel.trainers.__all__) == sorted(exports())


def test_every_name_resolves_to_the_registry_object():
    for name, path in exports().items():
        module, _, attribute = path.partition(":")
        assert getattr(vecaccel.trainers, name).__module__ == module, name
        assert getattr(vecaccel.trainers, name).__name__ == attribute, name
