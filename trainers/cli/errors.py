"""How the commands report a setup error: one line and exit code 2, not a traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["missing_dependency", "read_checkpoint", "setup_errors", "usage_error"]


def missing_dependency(command: str, exc: ImportError) -> str:
    """The one line saying that ``command`` cannot run without the module ``exc`` names, and
    the extra that installs it.

    Example:
        >>> missing_dependency("vecaccel train ppo", ModuleNotFoundError(name="torch"))
        "error: vecaccel train ppo needs torch, which is not installed: pip install 'vecaccel[train]' (torch with TensorBoard, matplotlib and tqdm) or pip install 'vecaccel[torch]'"
    """
    module = (exc.name or "").split(".")[0]
    if module in ("", "torch"):
        return (
            f"error: {command} needs torch, which is not installed: pip install "
            "'vecaccel[train]' (torch with TensorBoard, matplotlib and tqdm) or pip install "
            "'vecaccel[torch]'"
        )
    return (
        f"error: {command} needs {module}, which cannot be imported ({exc}): pip install "
        "'vecaccel[train]'"
    )


def read_checkpoint(path: Path, doing: str = "") -> dict[str, Any] | None:
    """The trainer checkpoint at ``path`` in the current layout (an older one converted), or
    ``None`` after printing why it cannot be read.

    Args:
        path: the checkpoint file.
        doing: what the command was about to do, for the message (``"cannot resume: "``).
    """
    from vecaccel.trainers.checkpoints.format import CheckpointError
    from vecaccel.trainers.checkpoints.reader import read_checkpoint as read_trainer_checkpoint

    try:
        return read_trainer_checkpoint(path)
    except (CheckpointError, FileNotFoundError) as exc:
        print(f"error: {doing}{exc}", file=sys.stderr)
        return None


def setup_errors() -> tuple[type[BaseException], ...]:
    """What a bad flag, env or checkpoint raises while a trainer is set up: reported as a
    usage error (exit 2, one line), not a traceback. Errors once training runs are not."""
    import gymnasium as gym

    from vecaccel.errors import WorkerError
    from vecaccel.trainers.checkpoints.format import CheckpointError

    return (ValueError, TypeError, CheckpointError, WorkerError, gym.error.Error)


#: What a replay-file error tells a Python caller to do, and its command-line equivalent.
_REPLAY_HINT = ("load with load_replay=False", "pass --no-replay")


def usage_error(exc: BaseException) -> int:
    """Print ``exc`` as a command-line error (in the flags' terms); the exit code, 2."""
    print(f"error: {str(exc).replace(*_REPLAY_HINT)}", file=sys.stderr)
    return 2
