"""The batch former's promises, checked on any backend that declares one.

A backend declares a batch former when its options have ``min_batch_size``,
``max_batch_size`` and ``batch_wait_s`` (:class:`vecaccel.options.AsyncOptions` does).
:func:`check_batch_former` then checks, on :data:`BATCH_ENVS` envs of which env 0 is slow:

- every batch holds between the floor and the ceiling, each env named once in
  ``infos["env_id"]``, and its observations are those envs' own;
- the floor: a floor of every env waits for the slow env;
- the deadline: with a floor of 1 and a deadline longer than the slow env's step, the batch
  holds every env (the slow one arrives before the deadline, and the ceiling returns at once);
- the ceiling: with every env ready, the batch holds exactly the ceiling, however long the
  deadline (``recv``'s timeout ends the check if the backend waits for the deadline instead);
- ``recv(min_batch_size=, max_batch_size=, batch_wait_s=)`` where the backend has ``recv``.

No check measures time: the slow env sleeps a fixed step, and the deadlines are far from it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from vecaccel.make import make_vec
from vecaccel.manager import get_backend
from vecaccel.testing.envs import SleepEnv

__all__ = [
    "BATCH_ENVS",
    "BATCH_FORMER_OPTIONS",
    "check_batch_former",
    "check_declared_batch_former",
    "declares_batch_former",
]

#: Envs each vector env under check holds; env 0 is the slow one.
BATCH_ENVS = 6
#: The options that declare a batch former.
BATCH_FORMER_OPTIONS = ("min_batch_size", "max_batch_size", "batch_wait_s")
#: The slow env's step, and a deadline far beyond it.
_SLOW_S = 0.2
_LONG_WAIT_S = 30.0


def declares_batch_former(name: str) -> bool:
    """Whether backend ``name``'s options have every one of :data:`BATCH_FORMER_OPTIONS`.

    Example:
        >>> declares_batch_former("async"), declares_batch_former("shm")
        (True, False)
    """
    options = get_backend(name).options
    if options is None:
        return False
    fields = {field.name for field in dataclasses.fields(options)}
    return set(BATCH_FORMER_OPTIONS) <= fields


def check_batch_former(name: str, /, **options: Any) -> None:
    """Check the batch former of backend ``name``; raise ``AssertionError`` at the first breach.

    Args:
        name: a registered backend that declares a batch former.
        **options: other options for ``make_vec`` (``num_workers=2``...); batch bounds are
            set by each check.

    Raises:
        AssertionError: naming the promise that broke and how to fix it.
        ValueError: if the backend declares no batch former.

    Example:
        >>> check_batch_former("async", num_workers=2)
    """
    if not declares_batch_former(name):
        raise ValueError(f"backend {name!r} declares no batch former ({BATCH_FORMER_OPTIONS})")
    fns = [functools.partial(SleepEnv, _SLOW_S)] + [SleepEnv] * (BATCH_ENVS - 1)

    def fail(promise: str, detail: str, fix: str) -> AssertionError:
        return AssertionError(
            f"check_batch_former({name!r}): {promise} broke: {detail}. How to fix: {fix}"
        )

    def batches(low: int, high: int, wait_s: float, steps: int) -> list[np.ndarray]:
        envs = make_vec(
            fns,
            backend=name,
            min_batch_size=low,
            max_batch_size=high,
            batch_wait_s=wait_s,
            **options,
        )
        seen: list[np.ndarray] = []
        try:
            obs, infos = envs.reset(seed=0)
            counts = np.zeros(BATCH_ENVS, dtype=np.int64)
            for _ in range(steps):
                ids = np.asarray(infos["env_id"])
                counts[ids] += 1
                obs, _, _, _, infos = envs.step(np.zeros(len(ids), dtype=np.int64))
                returned = np.asarray(infos["env_id"])
                if not low <= len(returned) <= high or len(set(returned.tolist())) != len(returned):
                    raise fail(
                        "the batch bounds",
                        f"a step returned envs {returned.tolist()} with floor {low} and "
                        f"ceiling {high}",
                        "return between min_batch_size and max_batch_size envs, each once",
                    )
                steps_taken = np.asarray(obs).reshape(len(returned), -1)[:, 0]
                if not np.array_equal(steps_taken, counts[returned]):
                    raise fail(
                        'infos["env_id"]',
                        f"envs {returned.tolist()} observed steps {steps_taken.tolist()}, "
                        f"they had taken {counts[returned].tolist()}",
                        "return each env's own observation in the row its env_id names",
                    )
                seen.append(returned)
        finally:
            envs.close()
        return seen

    for returned in batches(BATCH_ENVS, BATCH_ENVS, 0.0, 3):
        if 0 not in returned.tolist():
            raise fail(
                "the floor",
                f"with a floor of every env a step returned {returned.tolist()}",
                "wait until min_batch_size envs are ready",
            )
    for returned in batches(1, BATCH_ENVS, _LONG_WAIT_S, 3):
        if len(returned) != BATCH_ENVS:
            raise fail(
                "the deadline",
                f"with a floor of 1 and batch_wait_s={_LONG_WAIT_S}, a step returned "
                f"{returned.tolist()} before the slow env ({_SLOW_S} s) arrived",
                "after the floor is ready, wait until batch_wait_s has passed since the oldest "
                "ready env finished, or the ceiling is ready",
            )
    _check_ceiling(name, options, fail)


def check_declared_batch_former(name: str, options: dict[str, Any]) -> None:
    """:func:`check_batch_former` for ``check_backend``: on a backend that declares a batch
    former, with ``options`` less the batch bounds (each check sets its own). Its checks step
    single envs; over vectorized slices a batch is whole slices, which the per-env checks of
    the same backend already cover, so ``vectorized=True`` skips them."""
    if declares_batch_former(name) and not options.get("vectorized", False):
        bounds = ("batch_size", *BATCH_FORMER_OPTIONS)
        check_batch_former(name, **{k: v for k, v in options.items() if k not in bounds})


def _check_ceiling(name: str, options: dict[str, Any], fail: Any) -> None:
    """Every env ready and a ceiling below them: exactly the ceiling, without the deadline."""
    ceiling = BATCH_ENVS - 2
    fns = [SleepEnv] * BATCH_ENVS
    envs: Any = make_vec(
        fns,
        backend=name,
        min_batch_size=1,
        max_batch_size=ceiling,
        batch_wait_s=_LONG_WAIT_S,
        **options,
    )
    try:
        _, infos = envs.reset(seed=0)
        for _ in range(3):
            ids = np.asarray(infos["env_id"])
            envs.step_async(np.zeros(len(ids), dtype=np.int64))
            try:
                _, _, _, _, infos = envs.step_wait(timeout=_LONG_WAIT_S / 3)
            except TimeoutError:
                raise fail(
                    "the ceiling",
                    f"with {ceiling} envs ready the step waited for batch_wait_s",
                    "return as soon as max_batch_size envs are ready",
                ) from None
            if len(infos["env_id"]) != ceiling:
                raise fail(
                    "the ceiling",
                    f"with every env ready a step returned {len(infos['env_id'])} envs, not "
                    f"the ceiling {ceiling}",
                    "return max_batch_size envs when that many are ready",
                )
        recv = getattr(envs, "recv", None)
        if recv is not None:
            ids = np.asarray(infos["env_id"])
            envs.send(np.zeros(len(ids), dtype=np.int64), ids)
            _, _, _, _, infos = recv(min_batch_size=2, max_batch_size=2, batch_wait_s=0.0)
            if len(infos["env_id"]) != 2:
                raise fail(
                    "recv's batch bounds",
                    f"recv(min_batch_size=2, max_batch_size=2) returned "
                    f"{len(infos['env_id'])} envs",
                    "let recv's arguments override the options for that call",
                )
    finally:
        envs.close()
