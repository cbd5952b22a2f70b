"""The ``vecaccel`` command line: ``backends``, plugin commands, help, ``python -m vecaccel``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, run_main

import vecaccel
from vecaccel.cli import build_parser, main
from vecaccel.manager import PluginWarning


def test_backends_lists_builtin_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "plugin", "description"]
    serial = next(line for line in lines if line.startswith("serial "))
    assert "vecaccel.plugins.serial" in serial
    assert "reference" in serial


def test_backends_json_matches_list_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == vecaccel.list_backends()


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "backends" in capsys.readouterr().out


def test_plugins_add_commands(
    fresh_plugin_manager: None, capsys: pytest.CaptureFixture[str]
) -> None:
    class HelloPlugin:
        @vecaccel.hookimpl
        def vecaccel_add_commands(self, subparsers: argparse._SubParsersAction) -> None:
            parser = subparsers.add_parser("hello", help="say hello")
            parser.add_argument("--name", default="world")
            parser.set_defaults(handler=lambda args: print(f"hello {args.name}") or 3)

    vecaccel.get_plugin_manager().register(HelloPlugin(), name="test-hello")
    assert main(["hello", "--name", "vecaccel"]) == 3
    assert capsys.readouterr().out == "hello vecaccel\n"


def test_python_dash_m_vecaccel() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vecaccel", "backends"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "vecaccel.plugins.serial" in done.stdout


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vecaccel {vecaccel.__version__}"


def test_plugin_command_clash_warns_naming_the_plugin(
    fresh_plugin_manager: None, capsys: pytest.CaptureFixture[str]
) -> None:
    class TakesTune:
        @vecaccel.hookimpl
        def vecaccel_add_commands(self, subparsers: argparse._SubParsersAction) -> None:
            subparsers.add_parser("tune").set_defaults(handler=lambda args: 7)

    vecaccel.get_plugin_manager().register(TakesTune(), name="test-takes-tune")
    with pytest.warns(PluginWarning, match="'test-takes-tune'.*VECACCEL_DISABLE"):
        parser = build_parser()
    from vecaccel import tune

    assert parser.parse_args(["tune", "CartPole-v1"]).handler is tune.main  # the built-in kept


class AddsBench:
    @vecaccel.hookimpl
    def vecaccel_add_commands(self, subparsers):
        subparsers.add_parser("bench").set_defaults(handler=lambda args: 0)


def test_plugin_command_with_a_taken_name_does_not_break_the_whole_cli(
    fresh_plugin_manager, capsys
):
    """A plugin adding a sub-command named like a built-in one ('bench') is left out with a
    warning naming it; every other command, ``vecaccel backends`` and ``vecaccel --help``
    included, works, rather than dying with "argparse.ArgumentError: argument COMMAND:
    conflicting subparser: bench"."""
    pm = vecaccel.get_plugin_manager()
    pm.register(AddsBench(), name="toy-adds-bench")
    try:
        with pytest.warns(PluginWarning, match="'toy-adds-bench'.*VECACCEL_DISABLE_PLUGINS"):
            code = run_main(["backends"])
    except Exception as exc:  # noqa: BLE001 - any error fails the test with a message
        pytest.fail(
            "expected `vecaccel backends` to work (the clashing command skipped with a warning "
            f"naming 'toy-adds-bench'), got {type(exc).__name__}: {exc}"
        )
    assert code == 0


# ---------------------------------------------------------------------------------------------
# help, and a reader that goes away


def test_every_documented_command_has_working_help(capsys):
    """``--help`` of every command and algorithm exits 0."""
    for argv in (
        [], ["backends"], ["bench"], ["tune"], ["train"], ["eval"],
        ["train", "a2c"], ["train", "ppo"], ["train", "dqn"], ["train", "c51"],
        ["train", "rainbow"],
    ):  # fmt: skip
        assert run_main([*argv, "--help"]) == 0, argv
    capsys.readouterr()


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``vecaccel backends | head -1``: the reader closes the pipe before the command writes.
    It ends quietly with the shell's SIGPIPE status, with no ``BrokenPipeError`` traceback (at
    the write or at interpreter exit)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the command starts: its first write fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "vecaccel", "backends"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141
