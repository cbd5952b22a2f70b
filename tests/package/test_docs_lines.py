"""The command lines and links of the pages users read, checked without running them.

The ``vecaccel ...`` lines of the bash blocks are parsed by the real command-line parser; the
flags of the ``python benchmarks/*/*.py`` lines are checked against each script's ``--help``; the
``make`` targets named exist; every relative link of the prose resolves, anchor included. A
renamed flag, or a line that cannot be pasted as written, fails. (The lines cheap enough to run
are run by ``test_docs_snippets.py``.)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from doc_blocks import COMMANDS, DOC_FILES, ROOT


def _benchmark_argv(command: str) -> list[str] | None:
    tokens = shlex.split(command, comments=True)
    for i, token in enumerate(tokens):
        if token.startswith("benchmarks/") and token.endswith(".py"):
            return tokens[i:]
    return None


def _vecaccel_argv(command: str) -> list[str] | None:
    tokens = shlex.split(command, comments=True)
    if "vecaccel" not in tokens:  # also `nice ... vecaccel ARGS`, `torchrun ... -m vecaccel ARGS`
        return None
    if _benchmark_argv(command) is not None:  # a benchmark's line (`--arms vecaccel cleanrl`)
        return None
    return tokens[tokens.index("vecaccel") + 1 :]


VECACCEL_LINES = [
    pytest.param(argv, id=where)
    for where, command in COMMANDS
    if (argv := _vecaccel_argv(command)) is not None
    and "..." not in argv
    and "--help" not in argv
    and not any("HOST" in token or token == "NODE" for token in command.split())
]


def test_vecaccel_lines_found():
    assert len(VECACCEL_LINES) >= 10, "the docs' vecaccel command lines were not found"


@contextlib.contextmanager
def _example_algorithm_registered():
    """The example plugin's ``reinforce`` registered, as installing the package would."""
    import vecaccel

    sys.path.insert(0, str(ROOT / "examples" / "vecaccel-example-algorithm"))
    try:
        import vecaccel_example_algorithm
    finally:
        sys.path.pop(0)
    manager = vecaccel.get_plugin_manager()
    manager.register(vecaccel_example_algorithm, name="reinforce")
    try:
        yield
    finally:
        manager.unregister(vecaccel_example_algorithm)


@pytest.mark.parametrize("argv", VECACCEL_LINES)
def test_vecaccel_command_line_parses(argv):
    from vecaccel.cli import build_parser

    err = io.StringIO()
    args, refused = None, None
    plugin = _example_algorithm_registered() if "reinforce" in argv else contextlib.nullcontext()
    try:
        with plugin, contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's usage error
        refused = exc.code
    assert refused is None, (
        f"`vecaccel {shlex.join(argv)}` is refused (exit {refused}):\n{err.getvalue()}"
    )
    assert getattr(args, "handler", None) is not None, f"no command in `vecaccel {argv}`"


#: Runs ``SCRIPT [SUBCOMMAND] --help`` for each pair of its argument (JSON) as ``python SCRIPT``
#: would (as ``__main__``, its folder first on the path) in one interpreter, which the scripts'
#: imports (torch...) then load once; prints {"SCRIPT SUBCOMMAND": [exit code, stdout, stderr]}.
HELP_SCRIPT = """
import contextlib, io, json, os, runpy, sys, traceback

results = {}
for script, subcommand in json.loads(sys.argv[1]):
    sys.argv = [script] + ([subcommand] if subcommand else []) + ["--help"]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
        except BaseException:
            code, _ = 1, traceback.print_exc()
    results[f"{script} {subcommand or ''}"] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


def _help_key(argv: list[str]) -> tuple[str, str | None]:
    script, rest = argv[0], argv[1:]
    return script, rest[0] if rest and not rest[0].startswith("-") else None


@cache
def _helps() -> dict[str, list]:
    """Every benchmark line's ``--help`` (one child interpreter for all of them)."""
    keys = sorted({_help_key(param.values[0]) for param in BENCHMARK_LINES}, key=str)
    keys = [key for key in keys if (ROOT / key[0]).is_file()]
    proc = subprocess.run(
        [sys.executable, "-c", HELP_SCRIPT, json.dumps(keys)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _help(script: str, subcommand: str | None) -> str:
    code, out, err = _helps()[f"{script} {subcommand or ''}"]
    argv = [script] + ([subcommand] if subcommand else []) + ["--help"]
    assert code == 0, f"{shlex.join(argv)} failed:\n{err[-2000:]}"
    return out


BENCHMARK_LINES = [
    pytest.param(argv, id=where)
    for where, command in COMMANDS
    if (argv := _benchmark_argv(command)) is not None
]


def test_benchmark_lines_found():
    assert len(BENCHMARK_LINES) >= 5, "the docs' benchmark command lines were not found"


@pytest.mark.parametrize("argv", BENCHMARK_LINES)
def test_benchmark_command_line_flags_exist(argv):
    script, rest = argv[0], argv[1:]
    assert (ROOT / script).is_file(), f"{script} does not exist"
    text = _help(*_help_key(argv))
    flags = {token.split("=", 1)[0] for token in rest if token.startswith("--")}
    missing = sorted(f for f in flags if not re.search(re.escape(f) + r"\b", text))
    assert not missing, f"{script} has no {missing} (see its --help)"


def test_make_targets_exist():
    wanted = sorted(
        {m.group(1) for _, c in COMMANDS if (m := re.match(r"\s*make (\w+)", c))} | {"bench"}
    )
    assert "run" in wanted and "test" in wanted
    proc = subprocess.run(
        ["make", "-n", *wanted],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    assert proc.returncode == 0, proc.stderr


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, in_code = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"#{1,6} (.+)", line)):
            anchors.add(_anchor(match.group(1)))
    return anchors


def _relative_links() -> list[tuple[str, str]]:
    """(doc, target) for each link of the prose that points into the repository."""
    links = []
    for doc in DOC_FILES:
        prose, in_code = [], False
        for line in (ROOT / doc).read_text().splitlines():
            if line.lstrip().startswith("```"):
                in_code = not in_code
            elif not in_code:
                prose.append(line)
        # joined, so that a link whose text wraps onto the next line is found too
        targets = LINK.findall("\n".join(prose))
        links += [(doc, t) for t in targets if not re.match(r"\w+:", t)]
    return links


@pytest.mark.parametrize("doc, target", _relative_links())
def test_relative_link_resolves(doc, target):
    path, _, anchor = target.partition("#")
    page = (ROOT / doc).parent / path if path else ROOT / doc
    assert page.exists(), f"{doc} links to {target}, but {page.relative_to(ROOT)} does not exist"
    if anchor:
        assert anchor in _anchors(page), (
            f"{doc} links to {target}, but {path or doc} has no heading with that anchor"
        )
