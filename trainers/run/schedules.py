"""Schedules of the training loop: a value annealed linearly over env steps."""

from __future__ import annotations

__all__ = ["linear_schedule"]


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """``start`` moving linearly to ``end`` over ``duration`` steps, then ``end``.

    Example:
        >>> linear_schedule(1.0, 0.1, 100, 50)
        0.55
    """
    if duration <= 0:
        return end
    return end + (start - end) * max(0.0, 1.0 - t / duration)
