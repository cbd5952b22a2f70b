"""Which backends a test runs on, and with which options.

Every selection starts from the registry (``vecaccel.list_backends()``) and keeps the backends
whose declared options say they have the property a test needs: the options dataclass each
backend registers (``registry.add(..., options=ShmOptions)``) tells whether it runs its envs in
worker processes (``context``), restarts them (``on_worker_failure``), returns part of its envs
per step (``batch_size``, ``alternating``) or torch tensors (``device``). A newly registered
backend is picked up by every selection it fits, with no options unless :data:`SETUPS` gives it
some; ``tests/contract/test_backend_matrix.py`` checks each property against the running
backend (its ``capabilities``, the processes its envs run in, the type of what it returns).

:data:`SETUPS` is the one table of what is backend-specific in the tests: the options each
backend runs with, and the backends a selection leaves out, with the reason.

Example:
    >>> from backend_matrix import options_for, select
    >>> select(lockstep=True, tensors=False)
    ['serial', 'shm', 'hybrid']
    >>> options_for("async", context="fork", inline_envs=1)  # async has no inline envs
    {'num_workers': 2, 'context': 'fork'}
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

import vecaccel
from vecaccel.manager import get_backend
from vecaccel.options import BackendOptions

__all__ = [
    "DEFAULT_BACKEND",
    "REFERENCE_BACKEND",
    "SETUPS",
    "Backend",
    "Setup",
    "backend_of",
    "backends",
    "contract_params",
    "options_for",
    "partial_batch_options",
    "select",
    "spread_start_methods",
    "start_method_cases",
]


@dataclass(frozen=True)
class Setup:
    """What the tests do with one backend beyond what it declares."""

    options: Mapping[str, Any] = field(default_factory=dict)
    """The options it runs with (keep the workers few: the tests share a few cores)."""
    selections_skip: str | None = None
    """Why the selections by property leave it out (it still runs the step-by-step contract)."""
    left_out: str | None = None
    """Why every shared test leaves it out, the step-by-step contract included (it has tests
    of its own)."""


#: The one table. Worker backends step their envs in two slices: two workers, or (``hybrid``)
#: the caller's equal share and one worker.
SETUPS: dict[str, Setup] = {
    "serial": Setup(),
    "shm": Setup({"num_workers": 2}),
    "hybrid": Setup({"num_workers": 1}),
    "async": Setup({"num_workers": 2}),
    "action_server": Setup({"num_workers": 2, "device": "cpu"}),
    "auto": Setup(
        selections_skip="it builds serial, hybrid or shm as the env's step cost decides, so its "
        "declared worker options do not tell where its envs run; each of those is selected on "
        "its own, and tests/plugins/test_auto.py and tests/vecaccel/backend_choice/test_rule.py "
        "test the choice",
    ),
    "ray": Setup(
        left_out="needs a Ray cluster, which costs seconds to start: "
        "tests/plugins/ray/test_*.py share one per module and run the contract on it",
    ),
}

#: The in-process reference every backend is compared with.
REFERENCE_BACKEND = "serial"

#: The backend ``make_vec`` builds when none is named: the one start-method tests vary.
DEFAULT_BACKEND: str = inspect.signature(vecaccel.make_vec).parameters["backend"].default


@dataclass(frozen=True)
class Backend:
    """A registered backend, as its declared options describe it."""

    name: str
    options_class: type[BackendOptions] | None
    setup: Setup

    def accepts(self, option: str) -> bool:
        """Whether ``option`` is one of the backend's declared options (aliases aside)."""
        return self.options_class is not None and option in self.options_class.option_names()

    def _default(self, option: str) -> Any:
        assert self.options_class is not None
        return next(f.default for f in dataclasses.fields(self.options_class) if f.name == option)

    @property
    def worker_processes(self) -> bool:
        """It runs envs in worker processes (it takes a start method, ``context``)."""
        return self.accepts("context")

    @property
    def envs_in_workers(self) -> bool:
        """Every env runs in a worker process: by default the caller steps none
        (``inline_envs`` is 0 or not an option)."""
        return self.worker_processes and (
            not self.accepts("inline_envs") or self._default("inline_envs") == 0
        )

    @property
    def restarts_workers(self) -> bool:
        """Its workers can be restarted (``on_worker_failure="restart"``)."""
        return self.worker_processes and self.accepts("on_worker_failure")

    @property
    def partial_batches(self) -> bool:
        """A step can return part of its envs, with ``info["env_id"]``: the first ``batch_size``
        to finish, or one of two alternating halves."""
        return self.accepts("batch_size") or self.accepts("alternating")

    @property
    def lockstep(self) -> bool:
        """Each step returns every env, in index order (the contract of ``SyncVectorEnv``)."""
        return not self.partial_batches

    @property
    def tensors(self) -> bool:
        """It takes and returns torch tensors on a ``device``."""
        return self.accepts("device")

    def options(self, **overrides: Any) -> dict[str, Any]:
        """The options of :data:`SETUPS`, updated with those of ``overrides`` the backend
        takes (the others are left out, so one call serves every backend)."""
        unknown = [name for name in overrides if not _declared_anywhere(name)]
        if unknown:
            raise TypeError(f"no registered backend takes the options {unknown}")
        taken = {key: value for key, value in overrides.items() if self.accepts(key)}
        return {**self.setup.options, **taken}


@cache
def _registered() -> tuple[Backend, ...]:
    return tuple(
        Backend(name, get_backend(name).options, SETUPS.get(name, Setup()))
        for name in vecaccel.list_backends()
    )


def _declared_anywhere(option: str) -> bool:
    return any(backend.accepts(option) for backend in _registered())


def backends() -> list[Backend]:
    """Every registered backend, in registration order (the built-ins first)."""
    return list(_registered())


def select(**wanted: bool) -> list[str]:
    """The names of the registered backends whose properties (those of :class:`Backend`) have
    the values ``wanted``, in registration order; backends :data:`SETUPS` leaves out of the
    selections are never among them.

    Example:
        >>> select(envs_in_workers=True)
        ['shm', 'async', 'action_server']
    """
    chosen = []
    for backend in _registered():
        if backend.setup.left_out or backend.setup.selections_skip:
            continue
        if all(getattr(backend, prop) == value for prop, value in wanted.items()):
            chosen.append(backend.name)
    return chosen


def backend_of(name: str) -> Backend:
    """The registered backend ``name``, with its properties."""
    for backend in _registered():
        if backend.name == name:
            return backend
    raise ValueError(f"backend {name!r} is not registered")


def options_for(name: str, **overrides: Any) -> dict[str, Any]:
    """The options ``name`` runs with: :data:`SETUPS`'s, updated with those of ``overrides``
    it takes (see :meth:`Backend.options`)."""
    return backend_of(name).options(**overrides)


def partial_batch_options(name: str, num_envs: int) -> dict[str, Any]:
    """The option that makes ``name`` return half of ``num_envs`` per step: ``batch_size``, or
    ``alternating`` halves."""
    backend = backend_of(name)
    if backend.accepts("batch_size"):
        return {"batch_size": num_envs // 2}
    if backend.accepts("alternating"):
        return {"alternating": True}
    raise ValueError(f"backend {name!r} returns every env each step")


def spread_start_methods(names: Iterable[str], contexts: Iterable[str]) -> list[tuple[str, str]]:
    """Each backend under one start method, the start methods taking turns.

    Example:
        >>> spread_start_methods(["shm", "hybrid", "async"], ["spawn", "fork"])
        [('shm', 'spawn'), ('hybrid', 'fork'), ('async', 'spawn')]
    """
    return list(zip(names, itertools.cycle(contexts)))


def start_method_cases(names: Iterable[str], contexts: Iterable[str]) -> list[tuple[str, str]]:
    """Each backend under the first start method, and :data:`DEFAULT_BACKEND` under the
    others too.

    Example:
        >>> start_method_cases(["shm", "async"], ["fork", "spawn"])
        [('shm', 'fork'), ('shm', 'spawn'), ('async', 'fork')]
    """
    first, *others = contexts
    cases = []
    for name in names:
        cases.append((name, first))
        if name == DEFAULT_BACKEND:
            cases.extend((name, context) for context in others)
    return cases


def contract_params() -> list[Any]:
    """One ``pytest.param`` per registered backend for the step-by-step contract (every env
    each step, in index order, as NumPy arrays), skipped with the reason for those out of it."""
    try:
        registered = sorted(_registered(), key=lambda backend: backend.name)
    except Exception as exc:  # noqa: BLE001 - fail the contract tests, not the collection of every test file
        return [pytest.param(exc, id="list_backends-failed")]
    params = []
    for backend in registered:
        reason = backend.setup.left_out
        if reason is None and backend.partial_batches:
            reason = "returns part of its envs per step (info['env_id']); tested by its own suite"
        if reason is None and backend.tensors:
            reason = "returns torch tensors on a device; tested by its own suite"
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(backend.name, marks=marks, id=backend.name))
    return params
