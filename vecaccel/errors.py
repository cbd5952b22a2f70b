"""Errors raised by vecaccel in the caller's process.

An env's exception inside a worker process reaches the caller as a :class:`WorkerError` whose
``__cause__`` is a :class:`RemoteTraceback` holding the worker's traceback, as
``concurrent.futures`` and ``multiprocessing.pool`` chain theirs: an uncaught error prints the
env's own file and line first, then vecaccel's one-line summary.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence

from gymnasium.error import ClosedEnvironmentError

__all__ = [
    "WorkerError",
    "WorkerTimeoutError",
    "ClosedEnvError",
    "RemoteTraceback",
    "closest_name",
    "did_you_mean",
    "env_error",
]


def _spelling(name: str) -> str:
    return name.lower().replace("_", "-")


def closest_name(
    name: str, known: Iterable[str] | Mapping[str, str], *, cutoff: float = 0.6
) -> str | None:
    """The name of ``known`` that ``name`` most likely meant, or ``None`` where none is close.

    The one rule every "did you mean" of vecaccel follows (backend options, flags, env ids,
    trainer settings): the same spelling up to letter case and ``_`` for ``-`` wins, else the
    closest spelling by ``difflib``'s ratio, if it reaches ``cutoff``.

    Args:
        name: what the user wrote.
        known: the valid names; or a mapping from each accepted spelling (an alias, a short
            form) to the name to suggest for it.
        cutoff: the least ``difflib`` ratio (0 to 1) that counts as close.

    Example:
        >>> closest_name("learning_rat", ["learning_rate", "gamma"])
        'learning_rate'
        >>> closest_name("NUM-ENVS", ["num_envs"]), closest_name("gpu", ["num_envs"]) is None
        ('num_envs', True)
        >>> closest_name("step_timeout", {"step_timeout_s": "step_timeout_s", "timeout": "step_timeout_s"})
        'step_timeout_s'
    """
    answers = dict(known) if isinstance(known, Mapping) else {k: k for k in known}
    spelled = _spelling(name)
    by_spelling: dict[str, str] = {}
    for candidate, answer in answers.items():
        by_spelling.setdefault(_spelling(candidate), answer)
    if spelled in by_spelling:
        return by_spelling[spelled]
    close = difflib.get_close_matches(spelled, list(by_spelling), n=1, cutoff=cutoff)
    return by_spelling[close[0]] if close else None


def did_you_mean(
    name: str, known: Iterable[str] | Mapping[str, str], *, cutoff: float = 0.6
) -> str:
    """``"; did you mean 'NAME'?"`` for :func:`closest_name`'s answer, ``""`` where it has none:
    the clause an error message about ``name`` ends with.

    Example:
        >>> f"unknown setting 'gama'{did_you_mean('gama', ['gamma', 'seed'])}"
        "unknown setting 'gama'; did you mean 'gamma'?"
        >>> did_you_mean("gpu", ["gamma", "seed"])
        ''
    """
    meant = closest_name(name, known, cutoff=cutoff)
    return "" if meant is None else f"; did you mean {meant!r}?"


class RemoteTraceback(Exception):
    """The traceback of an exception raised in another process, as text.

    Set as the ``__cause__`` of a :class:`WorkerError` so that Python prints the worker's
    traceback above the error, as it prints a local cause.

    Attributes:
        traceback: the remote traceback text.

    Example:
        >>> error = WorkerError("env 0 raised ValueError in step: bad", env_indices=[0],
        ...                     remote_traceback="Traceback ...\\nValueError: bad\\n",
        ...                     original_type="ValueError")
        >>> type(error.__cause__).__name__
        'RemoteTraceback'
        >>> error.__cause__.traceback == error.remote_traceback
        True
    """

    def __init__(self, traceback: str) -> None:
        super().__init__(traceback)
        self.traceback = traceback

    def __str__(self) -> str:
        return f'\n"""\n{self.traceback.rstrip()}\n"""'


class WorkerError(RuntimeError):
    """A sub-environment failed inside a worker, or a worker process died.

    Attributes:
        env_indices: indices (into the vector env) of the environments that failed.
        remote_traceback: the worker's traceback text, or ``None`` when the worker died
            without being able to report one (killed by a signal, ``os._exit``...).
        exitcode: the worker's exit code (negative: the signal number) when it died, else ``None``.
        original_type: name of the exception type raised inside the environment, if any.

    An error for an env's exception (``original_type`` and ``remote_traceback`` both given)
    has a :class:`RemoteTraceback` as its ``__cause__``; ``raise ... from`` a local exception
    replaces it, as in the in-process backends, whose cause is the env's exception itself.
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
        if remote_traceback and original_type is not None:
            self.__cause__ = RemoteTraceback(remote_traceback)

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

    from vecaccel.envs.unknown_ids import env_error_message

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return WorkerError(
        f"env {index} raised {type(exc).__name__} in {what}: {env_error_message(exc)}",
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
