"""Worker processes that step slices of environments straight into shared memory.

The machinery every backend on worker processes shares, in small modules:

* :mod:`~vecaccel.worker.protocol`: the command and status bytes, the shared-memory layout,
  error reports and the startup message;
* :mod:`~vecaccel.worker.env_slice`: the envs of one worker, stepped, reset and rebuilt in place;
* :mod:`~vecaccel.worker.vector_env_slice`: a worker's slice as one batched vector env
  (:mod:`vecaccel.envs.vectorized_slices`), and :func:`make_env_slice`, which picks the kind of
  slice;
* :mod:`~vecaccel.worker.info_schema`: step infos of a fixed schema in shared memory;
* :mod:`~vecaccel.worker.process`: the worker process's loop;
* :mod:`~vecaccel.worker.pool`: the parent's side: start, send, kill, restart, close; waiting
  for replies is in :mod:`~vecaccel.worker.replies`, the control commands in
  :mod:`~vecaccel.worker.commands`, the per-worker handle in :mod:`~vecaccel.worker.handle`;
* :mod:`~vecaccel.worker.cpus`: CPU and thread helpers;
* :mod:`~vecaccel.worker.process_vec_env`: :class:`ProcessVecEnv`, the ``VecEnv`` base of such backends.

A backend (built-in or third-party) imports what it needs from here.

Example:
    >>> from vecaccel.worker import usable_cpus
    >>> usable_cpus() >= 1
    True
"""

from __future__ import annotations

from vecaccel.worker.cpus import (
    TorchThreadsWarning,
    current_cpu,
    usable_cpus,
    warn_if_torch_oversubscribes,
)
from vecaccel.worker.env_slice import (
    ENV_ERRORS,
    EnvMakeError,
    EnvSlice,
    FailureCounter,
    derived_seed,
    restarted_info,
)
from vecaccel.worker.handle import WorkerHandle, get_context
from vecaccel.worker.info_schema import INFO_BLOCK_BYTES, InfoSchema, InfoSchemaTracker, InfoSlots
from vecaccel.worker.pool import WorkerPool
from vecaccel.worker.process_vec_env import ProcessVecEnv
from vecaccel.worker.protocol import (
    ENV_PAYLOAD_FLAG,
    PARENT_CHECK_INTERVAL,
    PAYLOAD_SLAB_BYTES,
    Command,
    ErrorReport,
    SharedLayout,
    SharedViews,
    Status,
    error_report,
)
from vecaccel.worker.vector_env_slice import VectorSlice, make_env_slice

__all__ = [
    "ENV_ERRORS",
    "ENV_PAYLOAD_FLAG",
    "INFO_BLOCK_BYTES",
    "PARENT_CHECK_INTERVAL",
    "PAYLOAD_SLAB_BYTES",
    "Command",
    "EnvMakeError",
    "EnvSlice",
    "FailureCounter",
    "ErrorReport",
    "InfoSchema",
    "InfoSchemaTracker",
    "InfoSlots",
    "ProcessVecEnv",
    "SharedLayout",
    "SharedViews",
    "Status",
    "TorchThreadsWarning",
    "VectorSlice",
    "WorkerHandle",
    "WorkerPool",
    "current_cpu",
    "derived_seed",
    "error_report",
    "get_context",
    "make_env_slice",
    "restarted_info",
    "usable_cpus",
    "warn_if_torch_oversubscribes",
]
