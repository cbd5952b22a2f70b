"""Preemption: SIGINT and SIGTERM become a checkpoint and :class:`TrainingInterrupted`."""

from __future__ import annotations

from typing import Any

__all__ = [
    "SignalCheckpoint",
    "TrainingInterrupted",
]


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGINT or SIGTERM after writing a checkpoint (when it has a run dir).

    A ``KeyboardInterrupt``, so code that already handles Ctrl-C handles it too.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
        step: the global env step the checkpoint holds.
    """

    def __init__(self, signal_name: str, step: int) -> None:
        super().__init__(f"training interrupted by {signal_name} at step {step}")
        self.signal_name = signal_name
        self.step = int(step)

    @property
    def exit_code(self) -> int:
        """The shell's exit code for this signal: 128 + its number (130, 143)."""
        import signal

        return 128 + int(getattr(signal, self.signal_name, signal.SIGINT))


class SignalCheckpoint:
    """Within ``with``, SIGINT and SIGTERM set :attr:`requested` instead of killing the process.

    The training loop polls :attr:`requested` after each update, writes a checkpoint (atomically)
    and raises :class:`TrainingInterrupted`, so a preempted job resumes with ``--resume``. A
    second signal while the first is being handled raises ``KeyboardInterrupt`` at once (the
    previous checkpoint file stays intact: writes are atomic). Outside the main thread nothing
    is installed. The previous handlers are restored on exit.

    Example:
        >>> with SignalCheckpoint() as guard:
        ...     guard.requested
        False
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if self.requested:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping now")
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> SignalCheckpoint:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                try:
                    self._previous[signum] = signal.signal(signum, self._handle)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc_info: Any) -> None:
        import signal

        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
