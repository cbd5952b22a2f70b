"""A Griffe extension for the API reference (``mkdocs.yml``): the docstrings' ``Example:``
heading is read as Google style's examples section, as ``Examples:`` is, so that their doctests
render as code blocks rather than as prose."""

from __future__ import annotations

import re
from typing import Any

import griffe

EXAMPLE_HEADING = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename each docstring's ``Example:`` heading to ``Examples:`` as the object is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = EXAMPLE_HEADING.sub(r"\1Examples:", obj.docstring.value)
