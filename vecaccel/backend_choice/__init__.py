"""What a step costs, and the backend that cost calls for: what ``backend="auto"`` and
``vecaccel tune`` decide by.

* :mod:`~vecaccel.backend_choice.env_step_cost`: one env's step cost, stepped in the caller;
* :mod:`~vecaccel.backend_choice.vector_step_cost`: a vector env's step cost, at all the envs
  and at one worker slice of them;
* :mod:`~vecaccel.backend_choice.rule`: the one rule, :func:`choose_backend`, from either cost
  to a backend, a worker count and an inline share.

Example:
    >>> choose_backend(13e-6, 4, 2).backend
    'serial'
"""

from __future__ import annotations

from vecaccel.backend_choice.env_step_cost import PROBE_S, StepCost, probe_step_cost
from vecaccel.backend_choice.rule import (
    HYBRID_ROUND_TRIP_S,
    INLINE_MAX_STEP_S,
    MIN_SAVING_S,
    ROUND_TRIP_S,
    SHM_MIN_SLICE_S,
    SHM_ROUND_TRIP_S,
    Choice,
    choose_backend,
    format_seconds,
)
from vecaccel.backend_choice.vector_step_cost import (
    MULTICORE_RATIO,
    VectorStepCost,
    probe_vector_step_cost,
    slice_size,
    worker_slots,
)

__all__ = [
    "HYBRID_ROUND_TRIP_S",
    "INLINE_MAX_STEP_S",
    "MIN_SAVING_S",
    "MULTICORE_RATIO",
    "PROBE_S",
    "ROUND_TRIP_S",
    "SHM_MIN_SLICE_S",
    "SHM_ROUND_TRIP_S",
    "Choice",
    "StepCost",
    "VectorStepCost",
    "choose_backend",
    "format_seconds",
    "probe_step_cost",
    "probe_vector_step_cost",
    "slice_size",
    "worker_slots",
]
