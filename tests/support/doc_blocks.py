"""The fenced blocks and shell command lines of the pages users read, for the docs tests.

Every Markdown page is covered: ``README.md``, every page under ``docs/``, and the README of each
folder under ``benchmarks/`` and ``examples/``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _doc_files() -> tuple[str, ...]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("benchmarks", "examples"):
        pages += sorted((ROOT / folder).glob("**/README.md"))
    return tuple(str(page.relative_to(ROOT)) for page in pages if page.is_file())


DOC_FILES = _doc_files()
FENCE = re.compile(r"^( *)```(\w*)\s*$")


def _blocks() -> list[tuple[str, int, str, str]]:
    """Every fenced block: (file, line of its first body line, language, body).

    A block indented under a list item has that indentation removed from its body.
    """
    found = []
    for name in DOC_FILES:
        lines = (ROOT / name).read_text().splitlines()
        i = 0
        while i < len(lines):
            match = FENCE.match(lines[i])
            if not match:
                i += 1
                continue
            indent = len(match.group(1))
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                j += 1
            body = [
                line[indent:] if not line[:indent].strip() else line for line in lines[i + 1 : j]
            ]
            found.append((name, i + 2, match.group(2), "\n".join(body) + "\n"))
            i = j + 1
    return found


BLOCKS = _blocks()


def block(doc: str, marker: str, lang: str = "python") -> str:
    hits = [b for b in BLOCKS if b[0] == doc and b[2] == lang and marker in b[3]]
    assert len(hits) == 1, (
        f"expected one ```{lang} block of {doc} containing {marker!r}, found {len(hits)}: "
        "the snippet changed; update this test's marker"
    )
    return hits[0][3]


def _command_lines() -> list[tuple[str, str]]:
    """(doc:line, command) for each shell command of the bash and untyped blocks."""
    commands = []
    for doc, first, lang, body in BLOCKS:
        if lang not in ("bash", ""):
            continue
        pending, start = "", None
        for offset, line in enumerate(body.splitlines()):
            if start is None:
                start = first + offset
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command, pending = pending + line, ""
            if command.strip() and not command.lstrip().startswith("#"):
                commands.append((f"{doc}:{start}", command))
            start = None
    return commands


COMMANDS = _command_lines()
