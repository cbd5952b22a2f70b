"""The one interface both runners drive an algorithm through, whatever its family.

A runner (:class:`~vecaccel.trainers.runners.sync.SyncRunner`,
:class:`~vecaccel.trainers.runners.asynchronous.runner.AsyncRunner`) owns the loop and everything
around it, and knows no family: it asks the algorithm to begin a run
(:meth:`Algorithm.begin_run <vecaccel.trainers.algos.base.Algorithm.begin_run>`, which hands back
a :class:`TrainingLoop`) or for the feed of an asynchronous one
(:meth:`Algorithm.async_feed <vecaccel.trainers.algos.base.Algorithm.async_feed>`). What a
collected batch is for, when updates happen, which rows are logged and how the ranks agree on a
stop is the family's, in its :class:`TrainingLoop`, as rlpyt's algorithms take
``optimize_agent(itr, samples)`` and SB3's two bases own their ``collect_rollouts``.
"""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["TrainingLoop"]


class TrainingLoop(abc.ABC):
    """One synchronous run of an algorithm, as its family runs it: collect, optimise, report.

    The :class:`~vecaccel.trainers.runners.sync.SyncRunner` calls :meth:`steps_per_iteration`
    and :meth:`start` once, then, per iteration,
    :meth:`collect`, :meth:`update`, :meth:`report`, then :meth:`callback_metrics`,
    :meth:`restart_due` and :meth:`restart_point`; :meth:`write_checkpoint` where a checkpoint
    is due and :meth:`end` once, however the run ends.

    Attributes:
        horizon: the step the run ends at.
        resume_step: the step a continued run goes on from (its CSV keeps the rows until then),
            or ``None`` for a fresh run.
    """

    horizon: int
    resume_step: int | None

    @abc.abstractmethod
    def start(self, logger: Any) -> None:
        """The run starts logging with ``logger`` (a
        :class:`~vecaccel.trainers.services.logger.RunLogger`)."""

    @abc.abstractmethod
    def collect(self) -> Any:
        """Collect the next experience (the counters advanced); what :meth:`update` takes."""

    @abc.abstractmethod
    def step_locals(self, experience: Any) -> list[dict[str, Any]]:
        """Each vector step's ``rewards``, ``dones`` (and ``actions`` where known) of
        ``experience``, as SB3 callbacks read them."""

    @abc.abstractmethod
    def update(self, experience: Any) -> dict[str, Any]:
        """The updates ``experience`` makes due; their metrics."""

    @abc.abstractmethod
    def report(
        self, metrics: dict[str, Any], stop_requested: bool
    ) -> tuple[dict[str, Any], bool, bool]:
        """The iteration's row (reduced over ranks), whether to log it, and whether every rank
        stops now (``stop_requested``: a signal arrived on this rank)."""

    @abc.abstractmethod
    def callback_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The iteration's metrics as callbacks get them (``global_step`` included)."""

    @abc.abstractmethod
    def restart_due(self) -> bool:
        """Whether the iteration just made ends at a restart point (a periodic checkpoint)."""

    @abc.abstractmethod
    def restart_point(self) -> None:
        """Reset what a resumed run resets at a restart point (the envs, with
        ``reset_envs_at_checkpoint``)."""

    @abc.abstractmethod
    def write_checkpoint(self) -> None:
        """Write the run's checkpoint (every rank calls this at the same point)."""

    def steps_per_iteration(self) -> int | None:
        """The env steps one iteration collects, over all ranks (``None``: not fixed). A run
        ends at the first whole iteration at or past :attr:`horizon`."""
        return None

    def end(self) -> None:  # noqa: B027 - a loop with nothing to keep keeps nothing
        """The run ended (normally, stopped, or in an error): keep what a checkpoint saved later
        needs of it."""
