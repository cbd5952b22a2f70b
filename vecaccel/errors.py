"""Errors raised by vecaccel in the caller's process."""

from __future__ import annotations

from collections.abc import Sequence

from gymnasium.error import ClosedEnvironmentError

__all__ = ["WorkerError", "WorkerTimeoutError", "ClosedEnvError", "env_error"]


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


class WorkerTimeoutError(WorkerError, TimeoutError):
    """Worker processes were still starting when ``start_timeout_s`` ran out.

    Both a :class:`WorkerError` and a ``TimeoutError``. The message names each stuck worker and
    its envs and shows its Python stack at that moment (every thread, most recent call first),
    so the line an env constructor blocks on is in the error; ``remote_traceback`` holds the
    stacks alone. The workers are killed.

    Attributes:
        worker_indices: the workers that were still starting.
    """

    def __init__(self, message: str, *, worker_indices: Sequence[int] = (), **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.worker_indices: tuple[int, ...] = tuple(int(i) for i in worker_indices)

    def __reduce__(self):
        return (
            _rebuild_timeout_error,
            (str(self), self.worker_indices, self.env_indices, self.remote_traceback),
        )


def _rebuild_timeout_error(message, worker_indices, env_indices, remote_traceback):
    return WorkerTimeoutError(
        message,
        worker_indices=worker_indices,
        env_indices=env_indices,
        remote_traceback=remote_traceback,
    )


class ClosedEnvError(RuntimeError, ClosedEnvironmentError):
    """An operation was attempted on a vector environment after ``close()``.

    Also a ``gymnasium.error.ClosedEnvironmentError``, what ``AsyncVectorEnv`` raises there, so
    code written for Gymnasium's vector envs catches it.
    """
