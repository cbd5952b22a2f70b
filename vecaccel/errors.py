"""Errors raised by vecaccel in the caller's process."""

from __future__ import annotations

from collections.abc import Sequence

from gymnasium.error import ClosedEnvironmentError

__all__ = ["WorkerError", "ClosedEnvError", "env_error"]


class WorkerError(RuntimeError):
    """A sub-environment failed inside a worker, or a worker process died.

    Attributes:
        env_indices: indices (into the vector env) of the environments that failed.
        remote_traceback: the worker's traceback text, or ``None`` when the worker died
            without being able to report one (killed by a signal, ``os._exit``...).
        exitcode: the worker's exit code (negative: the signal number) when it died, else ``None``.
        original_type: name of the exception type raised inside the environment, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        env_indices: Sequence[int] = (),
        remote_traceback: str | None = None,
        exitcode: int | None = None,
        original_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.env_indices: tuple[int, ...] = tuple(int(i) for i in env_indices)
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode
        self.original_type = original_type

    def __reduce__(self):  # keep the attributes when the error crosses a process boundary
        return (
            _rebuild_worker_error,
            (
                str(self),
                self.env_indices,
                self.remote_traceback,
                self.exitcode,
                self.original_type,
            ),
        )


def env_error(exc: BaseException, index: int, what: str) -> WorkerError:
    """The :class:`WorkerError` for exception ``exc`` raised by env ``index`` during ``what``.

    Example:
        >>> env_error(ValueError("bad"), 3, "step").env_indices
        (3,)
    """
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return WorkerError(
        f"env {index} raised {type(exc).__name__} in {what}: {exc}",
        env_indices=[index],
        remote_traceback=text,
        original_type=type(exc).__name__,
    )


def _rebuild_worker_error(message, env_indices, remote_traceback, exitcode, original_type):
    return WorkerError(
        message,
        env_indices=env_indices,
        remote_traceback=remote_traceback,
        exitcode=exitcode,
        original_type=original_type,
    )


class ClosedEnvError(RuntimeError, ClosedEnvironmentError):
    """An operation was attempted on a vector environment after ``close()``.

    Also a ``gymnasium.error.ClosedEnvironmentError``, what ``AsyncVectorEnv`` raises there, so
    code written for Gymnasium's vector envs catches it.
    """
