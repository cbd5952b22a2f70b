"""The ``vecaccel`` command line: ``backends``, plugin commands, help, ``python -m vecaccel``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, run_main

import vecaccel
from vecaccel.cli import ArgumentParser, Commands, build_parser, main, suggest_flag
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
        def vecaccel_add_commands(self, commands: Commands) -> None:
            parser = commands.add(
                "hello", lambda args: print(f"hello {args.name}") or 3, help="say hello"
            )
            assert isinstance(parser, ArgumentParser)
            parser.add_argument("--name", default="world")

    vecaccel.get_plugin_manager().register(HelloPlugin(), name="test-hello")
    assert main(["hello", "--name", "vecaccel"]) == 3
    assert capsys.readouterr().out == "hello vecaccel\n"


def test_every_command_comes_through_the_hook_built_ins_first() -> None:
    """``backends``, ``bench`` and ``tune`` are added by the built-in plugin ``vecaccel.cli``
    through ``vecaccel_add_commands``, as the trainers add ``train`` and ``eval``."""
    pm = vecaccel.get_plugin_manager()
    adders = [pm.get_name(impl.plugin) for impl in pm.hook.vecaccel_add_commands.get_hookimpls()]
    assert adders[:2] == ["vecaccel.cli", "vecaccel.trainers.cli.commands"], adders
    subparsers = build_parser()._subparsers._group_actions[0]  # argparse keeps them there
    assert list(subparsers.choices)[:5] == ["backends", "bench", "tune", "train", "eval"]


# ---------------------------------------------------------------------------------------------
# flags spelled in full, and a "did you mean" for a misspelling


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["bench", "--num_envs", "4"], "--num-envs"),  # underscores for dashes
        (["bench", "--num-env", "4"], "--num-envs"),  # a prefix: no longer taken
        (["bench", "--num_envs=4"], "--num-envs"),
        (["tune", "CartPole-v1", "--Seconds", "1"], "--seconds"),
        (["train", "ppo", "--num_envs", "4"], "--num-envs"),
        (["train", "ppo", "--total-step", "64"], "--total-timesteps"),
        (["train", "ppo", "--learning_rate", "0.1"], "--learning-rate"),  # a config flag
        (["train", "dqn", "--buffer-siz", "100"], "--buffer-size"),
    ],
)
def test_a_misspelled_flag_is_refused_with_the_flag_it_meant(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(argv) == 2
    error, *rest = capsys.readouterr().err.splitlines()
    # the hint first, then one usage line of the sub-command whose flags the hint comes from,
    # not its page of flags
    prog = "vecaccel " + " ".join(argv[:2] if argv[0] == "train" else argv[:1])
    assert error.startswith(f"{prog}: error: unrecognized arguments: ")
    assert error.endswith(f"; did you mean {meant}?"), error
    assert rest == [f"usage: {prog} [options]; see {prog} --help"], rest


def test_each_misspelled_flag_gets_its_own_hint_and_a_negative_number_is_no_flag() -> None:
    parser = ArgumentParser(prog="demo")
    parser.add_argument("--num-envs", type=int)
    parser.add_argument("--seed", type=int)
    assert parser.unrecognized_message(["--num_envs", "4", "--Seed=1"]) == (
        "unrecognized arguments: --num_envs 4 --Seed=1; did you mean --num-envs for --num_envs, "
        "--seed for --Seed?"
    )
    # values, not flags: no flag is guessed from them
    assert parser.unrecognized_message(["-1", "-0.5"]) == "unrecognized arguments: -1 -0.5"


def test_an_unknown_flag_with_nothing_close_is_refused_without_a_guess(capsys) -> None:
    assert run_main(["bench", "--gpu"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --gpu" in err and "did you mean" not in err


def test_a_misspelled_command_or_choice_gets_a_did_you_mean(capsys) -> None:
    assert run_main(["trian"]) == 2
    assert "did you mean 'train'?" in capsys.readouterr().err
    assert run_main(["train", "ppo2"]) == 2
    assert "did you mean 'ppo'?" in capsys.readouterr().err


def test_every_parser_refuses_prefixes() -> None:
    """``allow_abbrev=False`` everywhere: every parser of the command line, sub-commands and
    algorithms included, takes a flag only as spelled in full."""
    parser = build_parser()
    pending = [parser]
    seen = 0
    while pending:
        current = pending.pop()
        seen += 1
        assert isinstance(current, ArgumentParser) and current.allow_abbrev is False, current.prog
        for action in current._subparsers._group_actions if current._subparsers else ():
            pending.extend(action.choices.values())
    assert seen >= 10  # vecaccel, its 5 commands, train's 5 algorithms


def test_suggest_flag_property() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    known = ["--num-envs", "--total-steps", "--run-dir", "--seed"]

    @given(st.sampled_from(known), st.data())
    def check(flag: str, data: st.DataObject) -> None:
        # any mix of case and of dashes/underscores inside the name is the same flag
        body = flag[2:]
        chars = [
            data.draw(st.sampled_from(["-", "_"]))
            if c == "-"
            else data.draw(st.sampled_from([c, c.upper()]))
            for c in body
        ]
        assert suggest_flag("--" + "".join(chars), known) == flag

    check()


def test_a_handler_s_exit_code_is_main_s_and_ctrl_c_ends_in_one_line(
    fresh_plugin_manager: None, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args):
        raise KeyboardInterrupt("stopped while the workers started")

    class ExitCodes:
        @vecaccel.hookimpl
        def vecaccel_add_commands(self, commands: Commands) -> None:
            commands.add("quiet", lambda args: None, help="returns nothing")
            commands.add("interrupted", interrupted, help="raises KeyboardInterrupt")

    vecaccel.get_plugin_manager().register(ExitCodes(), name="test-exit-codes")
    assert main(["quiet"]) == 0
    assert main(["interrupted"]) == 130
    assert capsys.readouterr().err == "stopped while the workers started\n"


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
        def vecaccel_add_commands(self, commands: Commands) -> None:
            commands.add("tune", lambda args: 7, help="not the built-in one")

    vecaccel.get_plugin_manager().register(TakesTune(), name="test-takes-tune")
    with pytest.warns(PluginWarning, match="'test-takes-tune'.*VECACCEL_DISABLE"):
        parser = build_parser()
    from vecaccel import tune

    assert parser.parse_args(["tune", "CartPole-v1"]).handler is tune.main  # the built-in kept


class AddsBench:
    @vecaccel.hookimpl
    def vecaccel_add_commands(self, commands):
        commands.add("bench", lambda args: 0, help="not the built-in one")


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
        ["train", "rainbow"], ["train", "pqn"],
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
