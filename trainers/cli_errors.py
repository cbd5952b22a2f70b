"""How the commands report a setup error: one line and exit code 2, not a traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["read_checkpoint", "setup_errors", "usage_error"]


def read_checkpoint(path: Path, doing: str = "") -> dict[str, Any] | None:
    """The checkpoint at ``path``, or ``None`` after printing why it cannot be read.

    Args:
        path: the checkpoint file.
        doing: what the command was about to do, for the message (``"cannot resume: "``).
    """
    from vecaccel.trainers.checkpoint import CheckpointError, load_checkpoint

    try:
        return load_checkpoint(path)
    except (CheckpointError, FileNotFoundError) as exc:
        print(f"error: {doing}{exc}", file=sys.stderr)
        return None


def setup_errors() -> tuple[type[BaseException], ...]:
    """What a bad flag, env or checkpoint raises while a trainer is set up: reported as a
    usage error (exit 2, one line), not a traceback. Errors once training runs are not."""
    import gymnasium as gym

    from vecaccel.errors import WorkerError
    from vecaccel.trainers.checkpoint import CheckpointError

    return (ValueError, TypeError, CheckpointError, WorkerError, gym.error.Error)


#: What a replay-file error tells a Python caller to do, and its command-line equivalent.
_REPLAY_HINT = ("load with load_replay=False", "pass --no-replay")


def usage_error(exc: BaseException) -> int:
    """Print ``exc`` as a command-line error (in the flags' terms); the exit code, 2."""
    print(f"error: {str(exc).replace(*_REPLAY_HINT)}", file=sys.stderr)
    return 2
