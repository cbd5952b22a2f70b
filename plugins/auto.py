"""Backend ``auto``: probe one env's step cost, then build ``serial``, ``hybrid`` or ``shm``.

``make_vec(env, n, backend="auto")`` steps one env in the calling process for a few
milliseconds (:func:`vecaccel.backend_choice.probe_step_cost`), picks a backend, a worker count and
an inline share by the rule of :func:`vecaccel.backend_choice.choose_backend`, and returns that
backend's vector env. The choice is in ``envs.metadata["backend"]`` and in one ``INFO`` line on the
``vecaccel.plugins.auto`` logger.

With ``vectorized=True`` (a vector env function, or an EnvPool task through
:func:`vecaccel.adapters.envpool.envpool_vector_fn`) it steps the inner vector env in the caller at
the requested size and at one worker slice's size instead, and keeps it in the caller (``serial``)
unless slicing saves more than twice a worker round trip (the same rule): a cheap batched simulator,
or one whose own threads already use the cores, is not handed to workers that would slow it down.

Options given to ``auto`` are kept: they go to the chosen backend, and a backend that does not
take one is not chosen (``num_workers`` or ``context`` rule out ``serial``).
``on_worker_failure="restart"`` and ``step_timeout_s`` keep every env in a worker process: the
choice is then ``shm``, and no env is stepped in the caller, not even for the probe.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium.vector import AutoresetMode

import vecaccel.backend_choice.env_step_cost as env_step_cost
from vecaccel import BackendRegistry, hookimpl
from vecaccel.backend_choice import Choice, choose_backend
from vecaccel.backend_choice.vector_step_cost import (
    VectorStepCost,
    probe_vector_step_cost,
    slice_size,
    worker_slots,
)
from vecaccel.envs.source import EnvSource
from vecaccel.manager import get_backend
from vecaccel.options import ShmOptions
from vecaccel.worker import usable_cpus

__all__ = ["AutoOptions", "make_auto"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AutoOptions(ShmOptions):
    """The options of the ``auto`` backend: those of ``hybrid``, passed on to the backend it
    chooses, and the step cost if it is known."""

    inline_envs: int | None = None
    """Envs the caller steps; given, the choice is ``hybrid`` (``shm`` for 0) with this share."""
    step_cost_s: float | None = None
    """Seconds one env's step costs; ``None`` measures it by stepping one env in the caller
    for a few milliseconds."""

    #: Options that say nothing about where the envs run: ``serial`` takes them too.
    ANYWHERE: ClassVar[tuple[str, ...]] = ("copy",)

    def __post_init__(self) -> None:
        super().__post_init__()
        cost = self.step_cost_s
        if cost is not None and (
            isinstance(cost, bool) or not isinstance(cost, numbers.Real) or not cost >= 0
        ):
            raise ValueError(f"step_cost_s must be seconds >= 0, got {self.step_cost_s!r}")

    def given(self) -> dict[str, Any]:
        """The options that differ from their defaults, ``step_cost_s`` aside."""
        defaults = type(self)()
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "step_cost_s"
            and getattr(self, field.name) != getattr(defaults, field.name)
        }


def _isolated(options: AutoOptions) -> bool:
    """Whether every env must run in a worker: restart and the step timeout apply only there."""
    return options.on_worker_failure == "restart" or options.step_timeout_s is not None


def _choose(num_envs: int, step_s: float | None, options: AutoOptions) -> Choice:
    given = options.given()
    isolate = _isolated(options)
    workers = any(name not in AutoOptions.ANYWHERE for name in given)
    choice = choose_backend(
        step_s,
        num_envs,
        usable_cpus(),
        isolate=isolate,
        workers=workers,
        num_workers=options.num_workers,
    )
    inline = given.get("inline_envs")
    if inline is not None:  # the user's share decides between hybrid and shm
        backend = "hybrid" if inline > 0 else "shm"
        reason = f"inline_envs={inline} was given; {choice.reason}"
        choice = Choice(backend, {"num_workers": choice.options.get("num_workers")}, reason)
    return choice


def _choose_vectorized(
    env_fns: Sequence[Callable[[], gym.Env]], options: AutoOptions
) -> tuple[Choice, VectorStepCost | None]:
    """Vectorized slices (:mod:`vecaccel.envs.vectorized_slices`): the inner vector env is stepped in the
    caller at the requested size and at one slice's, and :func:`choose_backend` weighs
    the saving against a worker round trip."""
    given = options.given()
    num_envs = len(env_fns)
    cpus = usable_cpus()
    if "inline_envs" in given:
        backend = "hybrid" if given["inline_envs"] > 0 else "shm"
        return Choice(backend, {}, f"inline_envs={given['inline_envs']} was given"), None
    isolate = _isolated(options)
    workers = any(name not in AutoOptions.ANYWHERE for name in given)
    cost = None
    if options.step_cost_s is not None:  # one env's step: the batch costs it per env
        slots = worker_slots(num_envs, cpus, 1.0, options.num_workers)
        per_env = options.step_cost_s
        cost = VectorStepCost(per_env * num_envs, per_env * slice_size(num_envs, slots))
    elif not isolate:
        vector_fn = EnvSource.of(env_fns).vector_env_fn()
        try:
            cost = probe_vector_step_cost(vector_fn, num_envs, cpus, options.num_workers)
        except Exception as exc:
            raise RuntimeError(
                "backend='auto' steps the vector env in the calling process to measure its "
                f"step cost, and that failed: {type(exc).__name__}: {exc} (choose a backend, "
                "or give step_cost_s to skip the probe)"
            ) from exc
    choice = choose_backend(
        cost, num_envs, cpus, isolate=isolate, workers=workers, num_workers=options.num_workers
    )
    return choice, cost


def make_auto(
    env_fns: Sequence[Callable[[], gym.Env]],
    *,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    options: AutoOptions | None = None,
    **kwargs: Any,
) -> gym.vector.VectorEnv:
    """Probe ``env_fns[0]``'s step cost (for vectorized slices, the vector env's) and build
    the backend it calls for.

    Args:
        env_fns: one zero-argument env function per sub-environment.
        autoreset_mode: Gymnasium's autoreset mode.
        options: see :class:`AutoOptions`; a direct call may pass them as keywords instead.

    Returns:
        The chosen backend's vector env, with ``metadata["backend"]`` holding ``name`` (the
        backend), ``options`` (everything it was given), ``step_cost_s``, ``probed`` (whether
        the cost was measured here) and ``reason``; for vectorized slices also
        ``vector_step_cost`` (:class:`vecaccel.backend_choice.VectorStepCost` as a dict), of which
        ``step_cost_s`` is the per-env share.

    Raises:
        RuntimeError: if the env used for the probe cannot be built or stepped in the caller
            (the env's own error is its cause).

    Example:
        >>> import vecaccel
        >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="auto")
        >>> envs.metadata["backend"]["name"]
        'serial'
        >>> envs.close()
    """
    options = AutoOptions.resolve("auto", options, kwargs)
    num_envs = len(env_fns)
    step_s = options.step_cost_s
    # an env that may hang or crash (why a timeout or restarts were asked for) is not stepped
    # in the caller even for the probe: the choice does not depend on its cost then
    vector_cost = None
    vectorized = EnvSource.of(env_fns).vectorized
    if vectorized:
        choice, vector_cost = _choose_vectorized(env_fns, options)
        if vector_cost is not None:
            step_s = vector_cost.step_s / num_envs
    elif step_s is None and not _isolated(options):
        try:
            step_s = env_step_cost.probe_step_cost(env_fns[0]).step_s
        except Exception as exc:
            raise RuntimeError(
                "backend='auto' steps env 0 in the calling process to measure its step cost, "
                f"and that failed: {type(exc).__name__}: {exc} (choose a backend, or give "
                "step_cost_s to skip the probe)"
            ) from exc
    if not vectorized:
        choice = _choose(num_envs, step_s, options)
    chosen = {**choice.options, **options.given()}  # what the user gave is kept as given
    info = get_backend(choice.backend)
    checked = info.options.from_kwargs(choice.backend, chosen)
    envs = info.factory(env_fns, autoreset_mode=autoreset_mode, options=checked)
    record = {
        "name": choice.backend,
        "options": chosen,
        "step_cost_s": step_s,
        "probed": options.step_cost_s is None and step_s is not None,
        "reason": choice.reason,
    }
    if vector_cost is not None:
        record["vector_step_cost"] = dataclasses.asdict(vector_cost)
    envs.metadata = {**envs.metadata, "backend": record}
    logger.info(
        "backend='auto' chose %s(%s) for %d envs: %s",
        choice.backend,
        ", ".join(f"{key}={value!r}" for key, value in chosen.items()),
        num_envs,
        choice.reason,
    )
    return envs


@hookimpl
def vecaccel_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        "auto",
        make_auto,
        "probes one env's step cost and picks serial, hybrid or shm with its settings",
        options=AutoOptions,
    )
