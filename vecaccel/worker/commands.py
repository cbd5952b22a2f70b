"""The control commands of a worker pool: ``reset``, ``call`` and ``set_attr``.

They are rare, so their arguments and results are pickled on the ``data`` channel; each waits
for every worker it was sent to before it returns or raises, so that no reply is left for a
later command to take as its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import cloudpickle
import numpy as np

from vecaccel.errors import WorkerError
from vecaccel.worker.protocol import Command, Status

if TYPE_CHECKING:
    from vecaccel.worker.handle import WorkerHandle

__all__ = ["ControlCommands"]


class ControlCommands:
    """The control commands of :class:`vecaccel.worker.WorkerPool`, which mixes this class in.

    They rely on the pool's ``workers``, ``send_many``, ``wait``, ``recv_payload``,
    ``error_from_reports``, ``worker_of``, ``restart``, ``last_seeds`` and ``broken``.
    """

    workers: list[WorkerHandle]
    last_seeds: list[int | None]
    restart: bool
    broken: str | None
    _broken_envs: tuple[int, ...]
    _control_in_flight: bool

    def _by_worker(self, indices: Sequence[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for index in indices:
            groups.setdefault(self.worker_of(index).index, []).append(index)
        return groups

    def _command(
        self, messages: list[tuple[WorkerHandle, int, Any]], what: str
    ) -> tuple[dict[int, Any], dict[int, dict]]:
        """Send a control command and wait for its replies; raise the env errors reported.

        Returns ``(payloads by worker index, {env index: restart info})``: under the restart
        policy a worker that died (before or during the command) is started again, and its
        envs, reset from derived seeds, did not run the command.
        """
        workers = [worker for worker, _, _ in messages]
        self._control_in_flight = True
        try:
            self.send_many(messages)
            results = self.wait(workers, None, what=what, restartable=self.restart, timed=True)
            payloads, errors, restarted = {}, [], {}
            for worker in workers:
                status = results[worker.index]
                if status[0] == Status.ERROR:
                    errors.extend(self.recv_payload(worker))
                elif status[0] == Status.OK_DATA:
                    payloads[worker.index] = self.recv_payload(worker)
                elif status[0] == Status.RESTARTED:
                    restarted.update(status[1])
        except Exception:
            self._control_in_flight = False
            raise
        except BaseException:
            # KeyboardInterrupt: replies may still come, and the next command would take them
            # for its own; nothing can tell them apart, so the pool stops here
            self.broken = (
                f"{what} was interrupted before every worker had answered; this vector env "
                "cannot continue: close() it"
            )
            self._broken_envs = tuple(i for w in workers for i in w.env_indices)
            raise
        self._control_in_flight = False
        if errors:
            raise self.error_from_reports(errors)
        return payloads, restarted

    def _finish_command(self, messages: list[tuple[WorkerHandle, int, Any]], what: str) -> dict:
        payloads, restarted = self._command(messages, what)
        if restarted:
            envs = sorted(restarted)
            reason = restarted[envs[0]].get("restart_reason", "it died")
            raise WorkerError(
                f"envs {envs} did not run {what}: their worker died ({reason}) and was "
                "restarted, and they start over from a reset",
                env_indices=envs,
            )
        return payloads

    def reset(
        self, seeds: Sequence[int | None], options: dict | None, mask: np.ndarray | None
    ) -> list[tuple[int, dict]]:
        """Reset the envs (those in ``mask``, if given); return ``(env index, info)`` pairs."""
        workers, messages = [], []
        for worker in self.workers:
            part = None if mask is None else mask[worker.start : worker.stop]
            if part is not None and not part.any():
                continue
            for i in worker.env_indices:
                if (part is None or part[i - worker.start]) and seeds[i] is not None:
                    self.last_seeds[i] = seeds[i]
            payload = (list(seeds[worker.start : worker.stop]), options, part, False)
            messages.append((worker, Command.RESET, payload))
            workers.append(worker)
        payloads, restarted = self._command(messages, "reset")
        while restarted:  # a dead worker was started again: reset its envs as asked after all
            again = [
                (self.workers[worker.index], command, payload)
                for worker, command, payload in messages
                if worker.start in restarted
            ]
            more, restarted = self._command(again, "reset")
            payloads.update(more)
        pairs = [pair for worker in workers for pair in payloads.get(worker.index, [])]
        return sorted(pairs, key=lambda pair: pair[0])

    def call(self, name: Any, indices: Sequence[int], args: tuple, kwargs: dict) -> list[Any]:
        """Call ``name`` on the envs at ``indices``; results in the order of ``indices``."""
        groups = self._by_worker(indices)
        workers = [self.workers[k] for k in groups]
        messages = []
        for worker in workers:
            local = [i - worker.start for i in groups[worker.index]]
            messages.append((worker, Command.CALL, (name, local, args, kwargs)))
        payloads = self._finish_command(messages, f"call({name!r})")
        by_index: dict[int, list[Any]] = {}
        for k, group in groups.items():
            for index, value in zip(group, cloudpickle.loads(payloads[k])):
                by_index.setdefault(index, []).append(value)
        return [by_index[index].pop(0) for index in indices]

    def set_attr(self, name: str, indices: Sequence[int], values: Sequence[Any]) -> None:
        """Set attribute ``name`` to ``values`` on the envs at ``indices``."""
        pairs: dict[int, list[tuple[int, Any]]] = {}
        for index, value in zip(indices, values):
            worker = self.worker_of(index)
            pairs.setdefault(worker.index, []).append((index - worker.start, value))
        workers = [self.workers[k] for k in pairs]
        messages = [(w, Command.SET_ATTR, (name, pairs[w.index])) for w in workers]
        self._finish_command(messages, f"set_attr({name!r})")
