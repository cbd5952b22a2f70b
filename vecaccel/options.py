"""The typed options of the backends, checked by ``make_vec`` before any worker starts.

Each backend declares one dataclass of options when it registers
(``registry.add(name, factory, description, options=ShmOptions)``). ``make_vec`` turns the
keyword arguments it was given into that dataclass with :meth:`BackendOptions.from_kwargs`:
alias spellings are accepted (``step_timeout`` for ``step_timeout_s``), and a name
that is neither an option nor an alias is a ``TypeError`` naming the backend, the option and
the closest valid name. Durations carry their unit in the name: ``_s`` for seconds, ``_us``
for microseconds.

Example:
    >>> options = ShmOptions.from_kwargs("shm", {"num_workers": 2, "step_timeout": 5})
    >>> options.num_workers, options.step_timeout_s
    (2, 5)
    >>> ShmOptions.from_kwargs("shm", {"num_wrokers": 2})
    Traceback (most recent call last):
    ...
    TypeError: backend 'shm' has no option 'num_wrokers'; did you mean 'num_workers'? ...
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from vecaccel.errors import did_you_mean

__all__ = [
    "FAILURE_POLICIES",
    "ActionServerOptions",
    "AsyncOptions",
    "BackendOptions",
    "BatchFormerOptions",
    "HybridOptions",
    "PLACEMENTS",
    "RayOptions",
    "SerialOptions",
    "ShmOptions",
    "WorkerOptions",
]

#: What a worker pool does when an env raises or a worker dies (``on_worker_failure``).
FAILURE_POLICIES = ("raise", "restart")

#: How the ``ray`` backend places its shard actors on the cluster's nodes (``placement``).
PLACEMENTS = ("SPREAD", "PACK")

OptionsT = TypeVar("OptionsT", bound="BackendOptions")


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What every backend takes. Subclass it to declare a backend's own options.

    A subclass adds fields (with defaults: every option is optional) and may add other
    spellings in ``ALIASES`` (``{alias: field name}``); aliases of the base classes
    apply too.
    """

    copy: bool = True
    """Return copies of observations, rewards and flags (``False``: views the next call rewrites,
    on the backends that can hand out views)."""

    ALIASES: ClassVar[Mapping[str, str]] = {}
    #: Names a user may expect from other backends that this one refuses, with the reason.
    REFUSED: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def aliases(cls) -> dict[str, str]:
        """Every alias of this class and its bases, ``{alias: field name}``."""
        merged: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            merged.update(getattr(klass, "ALIASES", {}))
        return merged

    @classmethod
    def option_names(cls) -> list[str]:
        """The field names, in declaration order."""
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def from_kwargs(cls: type[OptionsT], backend: str, kwargs: Mapping[str, Any]) -> OptionsT:
        """Build the options from keyword arguments, resolving aliases.

        Args:
            backend: the backend's name, for the error message.
            kwargs: the options as given to ``make_vec``.

        Raises:
            TypeError: for a name that is neither an option nor an alias (naming the backend, the
                option and the closest valid name), or an option given under two spellings.
            ValueError: for a value out of range (checked by the dataclass).
        """
        names = cls.option_names()
        aliases = cls.aliases()
        resolved: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        for key, value in kwargs.items():
            name = aliases.get(key, key)
            if key in cls.REFUSED:
                raise TypeError(f"backend {backend!r} has no option {key!r}: {cls.REFUSED[key]}")
            if name not in names:
                raise TypeError(cls._unknown(backend, key, names, aliases))
            if name in resolved:
                raise TypeError(
                    f"backend {backend!r} got option {name!r} twice, as {spelled[name]!r} and "
                    f"{key!r}; give it once, as {name!r}"
                )
            resolved[name] = value
            spelled[name] = key
        return cls(**resolved)

    @classmethod
    def resolve(
        cls: type[OptionsT],
        backend: str,
        options: BackendOptions | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> OptionsT:
        """The options a backend factory was given: ``options`` as checked by ``make_vec``, or
        keyword arguments from a direct call (checked here as ``make_vec`` checks them).

        Example:
            >>> SerialOptions.resolve("serial", None, {"copy": False}).copy
            False

        Raises:
            TypeError: if both are given, ``options`` is not an instance of this class, or a
                keyword is not an option (see :meth:`from_kwargs`).
        """
        if options is None:
            return cls.from_kwargs(backend, kwargs or {})
        if kwargs:
            raise TypeError(
                f"backend {backend!r} got options={options!r} and keyword options "
                f"{sorted(kwargs)}; give one or the other"
            )
        if not isinstance(options, cls):
            raise TypeError(
                f"backend {backend!r} takes {cls.__name__}, got {type(options).__name__}"
            )
        return options

    def check_num_envs(self, num_envs: int) -> None:
        """Refuse options that do not fit ``num_envs`` envs (``make_vec`` calls it once the env
        count is known, before any worker starts); every option fits by default.

        Raises:
            ValueError: naming the option that does not fit.
        """

    @staticmethod
    def _unknown(backend: str, key: str, names: list[str], aliases: dict[str, str]) -> str:
        candidates = {name: name for name in names}
        candidates.update(aliases)  # a near-miss of an alias suggests the field's name
        hint = did_you_mean(key, candidates)
        return f"backend {backend!r} has no option {key!r}{hint} (its options: {', '.join(names)})"


@dataclass(frozen=True, kw_only=True)
class SerialOptions(BackendOptions):
    """The options of the ``serial`` backend (every env in the caller's process)."""


@dataclass(frozen=True, kw_only=True)
class WorkerOptions(BackendOptions):
    """What every backend on worker processes takes (``shm``, ``hybrid``, ``async``,
    ``action_server``)."""

    num_workers: int | None = None
    """Worker processes, each stepping a contiguous slice of the envs (default: the usable CPUs,
    at most one per env)."""
    context: str | None = None
    """Start method: ``"fork"``, ``"spawn"``, ``"forkserver"``, or ``"multiprocess"`` (the
    ``multiprocess`` package's spawn, for closures that only dill can pickle). Default: the
    interpreter's."""
    pin_cpus: bool | Sequence[int] = False
    """``True`` pins worker ``k`` to the ``k``-th usable CPU; a list names the CPUs."""
    spin_us: float | None = None
    """Microseconds the caller spins on shared flags before blocking for the workers' replies
    (default: 0, blocking at once, except on ``hybrid``)."""
    worker_spin_us: float | None = None
    """Microseconds a worker keeps looking for its next command before it sleeps, as long as
    its previous command came within that time (default: 0, except on ``hybrid``). A worker
    that spins through the gap between steps starts the next one without a wake-up, at the
    cost of keeping its core busy that long; after a longer gap it sleeps at once."""
    on_worker_failure: str = "raise"
    """``"raise"``, or ``"restart"``: rebuild failed envs and dead workers, reseed them from
    derived seeds, and report the interrupted episodes as truncated with
    ``info["worker_restarted"]``."""
    max_restarts: float = 100
    """Failures tolerated under ``"restart"`` before the failure is raised (``math.inf``: no
    limit)."""
    step_timeout_s: float | None = None
    """Seconds after which a worker still stepping (or resetting, or running a
    ``call``/``set_attr``) is killed and handled by ``on_worker_failure``; ``None``: never."""
    start_timeout_s: float | None = 120.0
    """Seconds the workers have to build their envs and report ready (``None``: no limit)."""
    worker_threads: int | None = 1
    """Threads each worker lets OpenMP, BLAS, OpenCV and torch use (1: a worker keeps one core
    busy); ``None`` leaves the libraries' defaults."""
    max_concurrency: int | None = None
    """At most this many envs step or reset at one time, whatever ``num_workers`` is (one
    semaphore shared by the workers and held around each env's ``step`` and ``reset``, as
    Gymnasium's ``AsyncVectorEnv(max_concurrency=N)``): for envs that each hold a GPU, a
    licence or a renderer. ``step_timeout_s`` counts from when a step is sent, so a worker's
    wait for a permit counts towards it: give it the capped step's length. ``None``: no cap."""

    ALIASES: ClassVar[Mapping[str, str]] = {
        "step_timeout": "step_timeout_s",
        "start_timeout": "start_timeout_s",
    }

    def __post_init__(self) -> None:
        num_workers = self.num_workers
        if num_workers is not None and (not _is_integer(num_workers) or num_workers < 1):
            raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
        if self.on_worker_failure not in FAILURE_POLICIES:
            raise ValueError(
                f"on_worker_failure must be one of {FAILURE_POLICIES}, "
                f"got {self.on_worker_failure!r}"
            )
        if self.spin_us is not None and not (_is_real(self.spin_us) and self.spin_us >= 0):
            raise ValueError(f"spin_us must be microseconds >= 0, got {self.spin_us!r}")
        # a worker that spins a second or more between commands would hold its core for good
        if self.worker_spin_us is not None and not (
            _is_real(self.worker_spin_us) and 0 <= self.worker_spin_us < 1e6
        ):
            raise ValueError(
                f"worker_spin_us must be microseconds in [0, 1e6), got {self.worker_spin_us!r}"
            )
        if self.step_timeout_s is not None and not _positive(self.step_timeout_s):
            raise ValueError(
                f"step_timeout_s must be positive seconds, got {self.step_timeout_s!r}"
            )
        if self.start_timeout_s is not None and not _positive(self.start_timeout_s):
            raise ValueError(
                f"start_timeout_s must be positive seconds, got {self.start_timeout_s!r}"
            )
        if not _is_real(self.max_restarts) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be a number >= 0, got {self.max_restarts!r}")
        if self.max_concurrency is not None and not (
            _is_integer(self.max_concurrency) and self.max_concurrency >= 1
        ):
            raise ValueError(
                f"max_concurrency must be an integer >= 1 (envs stepping at one time), "
                f"got {self.max_concurrency!r}"
            )


@dataclass(frozen=True, kw_only=True)
class ShmOptions(WorkerOptions):
    """The options of the ``shm`` backend (lock-step workers, per-step data in shared memory)."""

    drain_timeout_s: float = 30.0
    """Seconds a later call waits for a step that timed out (or was interrupted) to finish
    before it gives up."""
    inline_envs: int = 0
    """How many envs (the first ones) the calling process steps itself while the workers step
    the rest. Inline envs share the caller's fate: ``step_timeout_s`` and worker restarts do
    not apply to them (an env that raises is still rebuilt under ``"restart"``)."""

    ALIASES: ClassVar[Mapping[str, str]] = {"drain_timeout": "drain_timeout_s"}


@dataclass(frozen=True, kw_only=True)
class HybridOptions(ShmOptions):
    """The options of the ``hybrid`` backend: ``shm`` with the caller stepping a share of the
    envs. ``None`` picks the defaults described on ``vecaccel.plugins.shm.make_hybrid``."""

    inline_envs: int | None = None
    """Envs the caller steps (default: an equal share, ``num_envs // (num_workers + 1)``)."""


@dataclass(frozen=True, kw_only=True)
class BatchFormerOptions(WorkerOptions):
    """The batch former's options, shared by ``async`` and ``action_server``: a step returns
    once at least ``min_batch_size`` envs are ready and ``batch_wait_s`` has passed since the
    first of them arrived, or at once when ``max_batch_size`` are ready (TorchRL's
    ``AsyncEnvPool``: ``min_get``, ``max_get`` and a timeout from the first result)."""

    min_batch_size: int | None = None
    """The floor: fewest envs a ``step`` returns (default 1 when only a ceiling is given)."""
    max_batch_size: int | None = None
    """The ceiling: most envs a ``step`` returns; it returns at once when this many are ready
    (default: every env)."""
    batch_wait_s: float = 0.0
    """Seconds to wait for more envs after the first ready one arrived, once the floor is
    reached (0: return the envs ready as soon as the floor is)."""

    ALIASES: ClassVar[Mapping[str, str]] = {
        "min_envs": "min_batch_size",
        "max_envs": "max_batch_size",
        "batch_wait": "batch_wait_s",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("min_batch_size", "max_batch_size"):
            value = getattr(self, name)
            if value is not None and (not _is_integer(value) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (_is_real(self.batch_wait_s) and self.batch_wait_s >= 0):
            raise ValueError(f"batch_wait_s must be seconds >= 0, got {self.batch_wait_s!r}")
        low, high = self.min_batch_size, self.max_batch_size
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"min_batch_size={low} is above max_batch_size={high}: the floor must not "
                "exceed the ceiling"
            )
        if self.batch_wait_s and not self.forms_batches:
            raise ValueError(
                f"batch_wait_s={self.batch_wait_s!r} waits for envs beyond a floor, up to a "
                "ceiling, and none is given: every batch is fixed; give min_batch_size or "
                "max_batch_size"
            )

    @property
    def forms_batches(self) -> bool:
        """Whether a floor or a ceiling was given (else every step returns a fixed batch)."""
        return self.min_batch_size is not None or self.max_batch_size is not None

    def batch_bounds(self, num_envs: int) -> tuple[int, int]:
        """``(floor, ceiling)`` of each batch over ``num_envs`` envs."""
        if not self.forms_batches:
            return num_envs, num_envs
        high = num_envs if self.max_batch_size is None else int(self.max_batch_size)
        low = 1 if self.min_batch_size is None else int(self.min_batch_size)
        return low, high

    def check_num_envs(self, num_envs: int) -> None:
        for name in ("min_batch_size", "max_batch_size"):
            value = getattr(self, name)
            if value is not None and value > num_envs:
                raise ValueError(f"{name}={value} is above num_envs={num_envs}")


@dataclass(frozen=True, kw_only=True)
class AsyncOptions(BatchFormerOptions):
    """The options of the ``async`` backend (``recv`` returns whichever envs are ready).

    A batch is formed as TorchRL's ``AsyncEnvPool`` forms one: ``step``/``recv`` return once at
    least ``min_batch_size`` envs are ready and ``batch_wait_s`` has passed since the first of
    them arrived, or at once when ``max_batch_size`` are ready. ``batch_size=B`` is the fixed
    batch ``min_batch_size = max_batch_size = B``.

    Example:
        >>> options = AsyncOptions(min_batch_size=2, max_batch_size=6, batch_wait_s=0.002)
        >>> options.batch_bounds(8)
        (2, 6)
        >>> AsyncOptions(batch_size=4).batch_bounds(8)
        (4, 4)
        >>> AsyncOptions(min_batch_size=5, max_batch_size=3)
        Traceback (most recent call last):
        ...
        ValueError: min_batch_size=5 is above max_batch_size=3: the floor must not exceed the ceiling
    """

    batch_size: int | None = None
    """Envs each ``recv`` returns, a fixed batch (default: all of them unless
    ``min_batch_size``/``max_batch_size`` are given)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        value = self.batch_size
        if value is not None and (not _is_integer(value) or value < 1):
            raise ValueError(f"batch_size must be a positive integer, got {value!r}")
        if value is not None and self.forms_batches:
            raise ValueError(
                "batch_size is the fixed batch min_batch_size = max_batch_size; give either "
                "batch_size or min_batch_size/max_batch_size"
            )

    def batch_bounds(self, num_envs: int) -> tuple[int, int]:
        if self.batch_size is not None:
            return int(self.batch_size), int(self.batch_size)
        return super().batch_bounds(num_envs)

    def check_num_envs(self, num_envs: int) -> None:
        if self.batch_size is not None and self.batch_size > num_envs:
            raise ValueError(f"batch_size={self.batch_size} is above num_envs={num_envs}")
        super().check_num_envs(num_envs)


@dataclass(frozen=True, kw_only=True)
class ActionServerOptions(BatchFormerOptions):
    """The options of the ``action_server`` backend (torch tensors in and out on ``device``).

    Each step serves every env, or one of two fixed halves (``alternating``), or, given a
    ``min_batch_size`` or a ``max_batch_size``, whichever envs have reported when the deadline
    ``batch_wait_s`` after the first of them has passed (at least the floor, at most the
    ceiling).

    Example:
        >>> ActionServerOptions(min_batch_size=4, batch_wait_s=0.001).batch_bounds(16)
        (4, 16)
        >>> ActionServerOptions(alternating=True, max_batch_size=8)
        Traceback (most recent call last):
        ...
        ValueError: alternating=True serves fixed halves; a floor or a ceiling (min_batch_size, max_batch_size) serves whichever envs reported: give one or the other
    """

    device: Any = "cpu"
    """Where observations, rewards and flags are returned (``"cpu"``, ``"cuda"``, a
    ``torch.device``...)."""
    alternating: bool = False
    """Split the envs into two fixed halves (even and odd indices) and serve one half per
    ``step`` while the other simulates."""
    drain_timeout_s: float = 30.0
    """Seconds a later ``step_async`` waits for a step that was given up before it raises."""

    ALIASES: ClassVar[Mapping[str, str]] = {"drain_timeout": "drain_timeout_s"}
    REFUSED: ClassVar[Mapping[str, str]] = {
        "batch_size": "action_server sets its batch itself: all envs, half with alternating, or "
        "between min_batch_size and max_batch_size"
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.alternating and self.forms_batches:
            raise ValueError(
                "alternating=True serves fixed halves; a floor or a ceiling (min_batch_size, "
                "max_batch_size) serves whichever envs reported: give one or the other"
            )


@dataclass(frozen=True, kw_only=True)
class RayOptions(BackendOptions):
    """The options of the ``ray`` backend: contiguous shards of envs, each a Ray actor that
    runs a local backend (``shard_backend``) over its slice on its node."""

    address: str | None = None
    """The Ray cluster to join (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``...).
    ``None``: the Ray this process is already connected to, else ``RAY_ADDRESS`` if set, else a
    local Ray started bound to 127.0.0.1 without dashboard and stopped at ``close()``. A
    cluster with token authentication gets the token Ray's own clients use (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``) when it asks for one."""
    connect_timeout_s: float | None = 15.0
    """Seconds the cluster at ``address`` has to answer before a ``ConnectionError`` naming
    it (``None``: Ray's own retries, which do not give up on an address that never answers)."""
    num_shards: int | None = None
    """Shards (Ray actors), each a contiguous block of envs (default: one per alive node with
    CPUs, at most one per env)."""
    shard_backend: str = "shm"
    """The local backend each shard runs its envs on (any registered backend but ``ray``)."""
    shard_options: Mapping[str, Any] | None = None
    """Options of ``shard_backend`` (e.g. ``{"num_workers": 8, "context": "forkserver"}``),
    checked before anything starts."""
    shard_resources: Mapping[str, float] | None = None
    """Ray resources reserved per shard actor: ``num_cpus``, ``num_gpus``, ``memory`` (bytes)
    and custom resources (``{"num_cpus": 8, "sim_node": 1}``). Default: ``{"num_cpus": 1}``."""
    placement: str = "SPREAD"
    """How the shards' placement group places them: ``"SPREAD"`` across nodes (best effort)
    or ``"PACK"`` onto as few nodes as possible."""
    num_workers: int | None = None
    """Worker processes of each shard's local backend (default: ``shard_options``'s, else the
    local backend's default on the shard's node)."""
    batch_size: int | None = None
    """Envs each ``recv`` returns, a multiple of the shard size (default: all of them);
    below ``num_envs`` the first shards to finish are returned, with ``info["env_id"]``."""
    on_worker_failure: str = "raise"
    """``"raise"``, or ``"restart"``: start a lost shard's actor again, reseed its envs from
    derived seeds and end their episodes as truncated with ``info["worker_restarted"]``; env
    errors are handled by the shard's local backend under the same policy."""
    max_restarts: float = 100
    """Failures tolerated under ``"restart"`` (a lost shard counts one, a rebuilt env one)
    before the failure is raised (``math.inf``: no limit)."""
    step_timeout_s: float | None = None
    """Seconds a shard may take for a step (or reset, or ``call``/``set_attr``) before its
    actor is killed and handled by ``on_worker_failure``; ``None``: never."""
    start_timeout_s: float | None = 120.0
    """Seconds to reserve the shards' resources, start their actors and build their envs
    (``None``: no limit)."""
    max_concurrency: int | None = None
    """At most this many envs step or reset at one time over the whole cluster, with the
    meaning of the process backends' option: split over the shards, each shard's local backend
    capping its own envs at its share (``N // num_shards``, one more for the first
    ``N % num_shards``), so it needs at least one per shard and a shard backend that takes
    ``max_concurrency``. A share a shard leaves idle is not lent to another shard: a cap shared
    through the cluster would cost a round trip per step. ``None``: no cap."""

    ALIASES: ClassVar[Mapping[str, str]] = {
        "step_timeout": "step_timeout_s",
        "start_timeout": "start_timeout_s",
        "connect_timeout": "connect_timeout_s",
    }

    def __post_init__(self) -> None:
        if self.address is not None and not (isinstance(self.address, str) and self.address):
            raise ValueError(f"address must be a non-empty string or None, got {self.address!r}")
        for name in ("num_shards", "num_workers", "batch_size", "max_concurrency"):
            value = getattr(self, name)
            if value is not None and (not _is_integer(value) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.shard_backend, str) or not self.shard_backend:
            raise ValueError(f"shard_backend must be a backend name, got {self.shard_backend!r}")
        if self.shard_backend == "ray":
            raise ValueError("shard_backend cannot be 'ray': a shard runs a local backend")
        if self.shard_options is not None:
            if not isinstance(self.shard_options, Mapping) or not all(
                isinstance(key, str) for key in self.shard_options
            ):
                raise ValueError(
                    f"shard_options must be a dict of option names, got {self.shard_options!r}"
                )
            if "autoreset_mode" in self.shard_options:
                raise ValueError(
                    "shard_options cannot set autoreset_mode: the shards take the vector env's own"
                )
            if self.max_concurrency is not None and "max_concurrency" in self.shard_options:
                raise ValueError(
                    "max_concurrency is given twice, as an option and in shard_options: the "
                    "option caps the envs of every shard together, shard_options' each shard's"
                )
        if self.shard_resources is not None:
            if not isinstance(self.shard_resources, Mapping) or not self.shard_resources:
                raise ValueError(
                    "shard_resources must be a non-empty dict such as {'num_cpus': 1}, got "
                    f"{self.shard_resources!r}"
                )
            for key, value in self.shard_resources.items():
                if not isinstance(key, str) or not _is_real(value) or value < 0:
                    raise ValueError(
                        f"shard_resources[{key!r}] must be a resource name with an amount "
                        f">= 0, got {value!r}"
                    )
            if not any(value > 0 for value in self.shard_resources.values()):
                raise ValueError(
                    f"shard_resources must reserve something, got {dict(self.shard_resources)}"
                )
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.on_worker_failure not in FAILURE_POLICIES:
            raise ValueError(
                f"on_worker_failure must be one of {FAILURE_POLICIES}, "
                f"got {self.on_worker_failure!r}"
            )
        if not _is_real(self.max_restarts) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be a number >= 0, got {self.max_restarts!r}")
        for name in ("step_timeout_s", "start_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if value is not None and not _positive(value):
                raise ValueError(f"{name} must be positive seconds, got {value!r}")


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _positive(value: Any) -> bool:
    return _is_real(value) and value > 0
