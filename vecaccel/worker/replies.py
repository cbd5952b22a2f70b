"""Waiting for the workers' replies, and turning failures into errors.

The parent polls the ``done`` pipes *and* the process sentinels together, so a worker that dies
is noticed at once, never as a bare ``EOFError`` and never as a hang; a worker that overruns
``step_timeout_s`` is killed, and its sentinel then reports it.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from vecaccel.errors import RemoteTraceback, WorkerError
from vecaccel.spaces import ItemList
from vecaccel.spaces.payload import store_items
from vecaccel.worker.handle import MAIN_GUARD_EXIT_CODE, MAIN_GUARD_HINT, describe_exit
from vecaccel.worker.protocol import ErrorReport, ObsItems, SharedViews, Status
from vecaccel.worker.stacks import describe_stacks, reached_worker_code, request_stacks

if TYPE_CHECKING:
    from vecaccel.worker.handle import WorkerHandle

__all__ = ["Replies"]


class Replies:
    """How :class:`vecaccel.worker.WorkerPool`, which mixes this class in, waits for replies.

    It relies on the pool's poller and descriptor tables, ``views``, ``spin_seconds``,
    ``step_timeout_s``, ``restart`` and ``respawn``; a worker found dead outside the restart
    policy marks the pool ``broken``.
    """

    views: SharedViews
    obs_columns: list[ItemList]
    spin_seconds: float
    step_timeout_s: float | None
    restart: bool
    broken: str | None
    _broken_envs: tuple[int, ...]
    _poller: select.poll
    _fd_to_worker: dict[int, WorkerHandle]
    _sentinel_to_worker: dict[int, WorkerHandle]
    respawn: Callable[[WorkerHandle], dict[int, dict]]
    _forget: Callable[[WorkerHandle], None]

    def _spin(self, workers: list[WorkerHandle], seqs: dict[int, int]) -> None:
        """Spin up to ``spin_seconds`` until every worker's ``done_seq`` moved past ``seqs``."""
        deadline = time.perf_counter() + self.spin_seconds
        done_seq = self.views.done_seq
        while time.perf_counter() < deadline:
            if all(done_seq[w.index] != seqs[w.index] for w in workers):
                return

    def kill_stuck(self, workers: Sequence[WorkerHandle], what: str = "step") -> None:
        """Kill ``workers`` for overrunning ``step_timeout_s`` in ``what``; their sentinels then
        report them, and the failure policy handles them. Their stacks are taken first, for
        the error."""
        workers = [w for w in workers if w.process.is_alive() and w.killed_for is None]
        request_stacks(workers)
        for worker in workers:
            if worker.process.is_alive() and worker.killed_for is None:
                worker.killed_for = (
                    f"worker {worker.index} (envs {list(worker.env_indices)}) exceeded "
                    f"step_timeout_s={self.step_timeout_s} s in {what} and was killed"
                )
                worker.process.kill()

    def wait(
        self,
        workers: list[WorkerHandle],
        timeout: float | None,
        what: str = "step",
        seqs: dict[int, int] | None = None,
        restartable: bool = True,
        timed: bool | None = None,
    ) -> dict[int, tuple[int, ...]]:
        """Wait for one status byte from each of ``workers``.

        Returns ``{worker index: (status,)}``; a worker that died and was started again (under
        the restart policy) answers ``(Status.RESTARTED, infos)``. Raises :class:`WorkerError`
        if a worker dies otherwise, :class:`TimeoutError` (with ``.pending``, the workers still
        running, and ``.results``) once ``timeout`` passes.
        """
        pending = {w.done_fd: w for w in workers}
        results: dict[int, tuple[Any, ...]] = {}
        if self.spin_seconds and seqs is not None:
            self._spin(workers, seqs)
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        kill_at = None
        # step_timeout_s kills a worker stuck in a step, or (timed) in a reset or call
        if self.step_timeout_s is not None and (what == "step" if timed is None else timed):
            kill_at = now + self.step_timeout_s
        try:
            self._wait_loop(pending, results, deadline, kill_at, timeout, what, restartable)
        except KeyboardInterrupt as interrupt:
            # what the caller needs to finish the step later: the replies already taken
            interrupt.pending = list(pending.values())  # type: ignore[attr-defined]
            interrupt.results = results  # type: ignore[attr-defined]
            raise
        return results

    def _wait_loop(self, pending, results, deadline, kill_at, timeout, what, restartable):
        while pending:
            ends = [t for t in (deadline, kill_at) if t is not None]
            wait_ms = None if not ends else max(0.0, (min(ends) - time.monotonic()) * 1000)
            events = self._poller.poll(wait_ms)
            dead: list[WorkerHandle] = []
            for fd, _ in events:
                worker = pending.get(fd)
                if worker is not None:
                    byte = os.read(fd, 1)
                    if byte:
                        results[worker.index] = (byte[0],)
                        del pending[fd]
                    elif worker not in dead:
                        dead.append(worker)
                elif fd in self._sentinel_to_worker:
                    candidate = self._sentinel_to_worker[fd]
                    if candidate.done_fd in pending and candidate not in dead:
                        dead.append(candidate)
            for worker in dead:
                # a worker may exit right after replying; take a reply that is already there
                if worker.done.poll(0):
                    byte = os.read(worker.done_fd, 1)
                    if byte:
                        results[worker.index] = (byte[0],)
                        del pending[worker.done_fd]
                        continue
                del pending[worker.done_fd]
                if self.restart and restartable:
                    results[worker.index] = (Status.RESTARTED, self.respawn(worker))
                else:
                    self._declare_dead(worker)
            now = time.monotonic()
            if pending and kill_at is not None and now >= kill_at:
                self.kill_stuck(list(pending.values()), what)
                kill_at = None  # their sentinels report them on the next poll
            if pending and deadline is not None and now >= deadline:
                error = TimeoutError(
                    f"{what} did not finish within {timeout} s; envs still running: "
                    f"{sorted(i for w in pending.values() for i in w.env_indices)}"
                )
                error.pending = list(pending.values())  # type: ignore[attr-defined]
                error.results = results  # type: ignore[attr-defined]
                raise error

    def wait_bytes(
        self, timeout: float | None
    ) -> tuple[list[tuple[WorkerHandle, bytes]], list[WorkerHandle]]:
        """Wait until any worker has written to its ``done`` pipe or died.

        Used by the per-env (``STEP_MASKED``) protocol, where each byte names one env that
        finished. Returns ``(arrived, dead)``: what each worker wrote, and the workers that died
        (after taking whatever they wrote before dying). Both are empty on timeout.
        """
        arrived: list[tuple[WorkerHandle, bytes]] = []
        events = self._poller.poll(None if timeout is None else max(0.0, timeout * 1000))
        dead: list[WorkerHandle] = []
        for fd, _ in events:
            worker = self._fd_to_worker.get(fd)
            if worker is not None:
                data = os.read(fd, 4096)
                if data:
                    arrived.append((worker, data))
                elif worker not in dead:
                    dead.append(worker)
            elif fd in self._sentinel_to_worker:
                worker = self._sentinel_to_worker[fd]
                if worker not in dead:
                    dead.append(worker)
        for worker in dead:
            if worker.done.poll(0):
                data = os.read(worker.done_fd, 4096)
                if data:
                    arrived.append((worker, data))
        return arrived, dead

    def recv_payload(self, worker: WorkerHandle, timeout: float = 60.0) -> Any:
        """Receive the payload that follows a status byte, noticing a worker that dies.

        Observation items that came with it (:class:`~vecaccel.worker.protocol.ObsItems`) are
        stored in the views' item columns, and the payload is returned without them.
        """
        length = int(self.views.payload_len[worker.index])
        if length >= 0:  # in shared memory, complete before the status byte was written
            self.views.payload_len[worker.index] = -1
            payload = worker.loads(self.views.payload_slab[worker.index, :length].tobytes())
        else:
            payload = self._recv_from_pipe(worker, timeout)
        if type(payload) is ObsItems:
            store_items(self.obs_columns, payload.items)
            return payload.payload
        return payload

    def _recv_from_pipe(self, worker: WorkerHandle, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not worker.data.poll(0.05):
            if not worker.process.is_alive() and not worker.data.poll(0):
                self._declare_dead(worker)
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"worker {worker.index} (envs {list(worker.env_indices)}) sent no payload "
                    f"within {timeout} s",
                    env_indices=worker.env_indices,
                )
        try:
            return worker.data.recv()
        except (EOFError, OSError):
            self._declare_dead(worker)

    def declare_dead(self, worker: WorkerHandle) -> None:
        """Raise the :class:`WorkerError` for a worker that died (and mark the pool broken)."""
        self._declare_dead(worker)

    def _declare_dead(self, worker: WorkerHandle) -> None:
        worker.process.join(0.5)
        exitcode = worker.process.exitcode
        self._forget(worker)
        envs = list(worker.env_indices)
        message = worker.killed_for or (
            f"worker {worker.index} (pid {worker.process.pid}, envs {envs}) "
            f"{describe_exit(exitcode)}"
        )
        if exitcode == MAIN_GUARD_EXIT_CODE and not reached_worker_code(worker):
            message += f" while it imported the main script: {MAIN_GUARD_HINT}"
        self.broken = f"{message}; this vector env cannot continue: close() it"
        self._broken_envs = tuple(envs)
        stack = describe_stacks([worker]) if worker.killed_for else ""
        if stack:
            message = f"{message}; where it was stuck:\n\n{stack}"
        raise WorkerError(
            message, env_indices=envs, exitcode=exitcode, remote_traceback=stack or None
        )

    def error_from_reports(self, reports: Sequence[ErrorReport]) -> WorkerError:
        """One :class:`WorkerError` for the error reports of one or more envs."""
        reports = sorted(reports)
        index, type_name, text, _, what = reports[0]
        more = f" (and {len(reports) - 1} more envs failed)" if len(reports) > 1 else ""
        error = WorkerError(
            f"env {index} raised {type_name} in {what}: {text}{more}",
            env_indices=[r[0] for r in reports],
            remote_traceback="\n".join(r[3] for r in reports),
            original_type=type_name,
        )
        if len(reports) > 1:  # the first env's traceback is printed; every one stays readable
            others = f"env{'s' if len(reports) > 2 else ''} " + ", ".join(
                str(r[0]) for r in reports[1:]
            )
            error.__cause__ = RemoteTraceback(
                f"{reports[0][3].rstrip()}\n\n(env {index}'s traceback; {others} failed too, "
                "and the error's remote_traceback holds every env's)"
            )
        return error
