"""How the commands report a setup error: one line on stderr and exit code 2, in the flags' terms,
for a missing dependency, an unreadable checkpoint and the errors a bad flag raises."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

from vecaccel.errors import WorkerError
from vecaccel.trainers.checkpoints.format import CheckpointError
from vecaccel.trainers.cli.errors import (
    missing_dependency,
    read_checkpoint,
    setup_errors,
    usage_error,
)

FIXTURES = Path(__file__).parents[2] / "data" / "checkpoints"


def test_a_missing_torch_submodule_asks_for_torch() -> None:
    message = missing_dependency("vecaccel eval", ModuleNotFoundError(name="torch._C"))
    assert message.startswith("error: vecaccel eval needs torch, which is not installed")
    assert "pip install 'vecaccel[torch]'" in message and "\n" not in message


def test_another_missing_module_is_named_with_its_error_and_the_extra() -> None:
    exc = ImportError("libGL.so.1: cannot open shared object file", name="matplotlib.pyplot")
    message = missing_dependency("vecaccel train ppo", exc)
    assert message == (
        "error: vecaccel train ppo needs matplotlib, which cannot be imported (libGL.so.1: "
        "cannot open shared object file): pip install 'vecaccel[train]'"
    )


def test_a_readable_checkpoint_is_returned_in_the_current_layout(capsys) -> None:
    state = read_checkpoint(FIXTURES / "version2" / "ppo" / "checkpoint.pt")
    assert state is not None and state["algorithm"] == "ppo" and state["version"] == 2
    assert capsys.readouterr().err == ""


def test_a_missing_or_corrupt_checkpoint_is_one_line_naming_what_the_command_was_doing(
    tmp_path, capsys
) -> None:
    missing = tmp_path / "nowhere.pt"
    assert read_checkpoint(missing, "cannot resume: ") is None
    assert capsys.readouterr().err == f"error: cannot resume: no checkpoint at {missing}\n"
    corrupt = tmp_path / "checkpoint.pt"
    corrupt.write_bytes(b"not a checkpoint")
    assert read_checkpoint(corrupt) is None
    err = capsys.readouterr().err
    assert err.startswith(f"error: checkpoint {corrupt}") and err.count("\n") == 1


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("num_envs must be positive"),
        TypeError("unknown PPO settings"),
        CheckpointError("checkpoint is corrupt"),
        WorkerError("env 0 raised in reset", env_indices=[0]),
        gym.error.NameNotFound("Environment `CartPol` doesn't exist."),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_the_errors_of_a_bad_flag_env_or_checkpoint_are_setup_errors(exc) -> None:
    assert isinstance(exc, setup_errors())


def test_errors_of_a_running_training_are_not_setup_errors() -> None:
    for exc in (FloatingPointError("update 3: nan"), RuntimeError("the sampler died")):
        assert not isinstance(exc, setup_errors())


def test_a_usage_error_speaks_in_flags_and_exits_2(capsys) -> None:
    exc = CheckpointError("replay file r.npz is missing; load with load_replay=False to go on")
    assert usage_error(exc) == 2
    err = capsys.readouterr().err
    assert err == "error: replay file r.npz is missing; pass --no-replay to go on\n"
