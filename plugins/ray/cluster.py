"""What a shard asks of Ray (its local backend's options, its resources, its actor class), and
what ending its actor and taking its arrays back from Ray involve."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from vecaccel.options import RayOptions

from .shard import ShardActor

if TYPE_CHECKING:
    from .records import Shard

__all__ = [
    "actor_class",
    "actor_options",
    "check_batch_size",
    "concurrency_shares",
    "default_num_shards",
    "import_ray",
    "owned",
    "shard_bundle",
    "shard_options",
    "stop_actors",
]

#: Ray resources a shard reserves unless ``shard_resources`` says otherwise.
DEFAULT_SHARD_RESOURCES = {"num_cpus": 1}


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("backend 'ray' needs Ray: pip install 'vecaccel[ray]'") from exc
    return ray


def default_num_shards(ray: Any) -> int:
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0)]
    return max(1, len(nodes))


def check_batch_size(batch_size: int, num_envs: int, bounds: list[tuple[int, int]]) -> None:
    if batch_size > num_envs:
        raise ValueError(f"batch_size must be at most num_envs={num_envs}, got {batch_size}")
    if batch_size == num_envs:
        return
    sizes = {stop - start for start, stop in bounds}
    if len(sizes) != 1 or batch_size % sizes.pop():
        raise ValueError(
            f"batch_size={batch_size} must be a multiple of the shard size, with every shard "
            f"the same size (shards: {[stop - start for start, stop in bounds]}): recv() "
            "returns whole shards"
        )


def shard_options(options: RayOptions) -> dict[str, Any]:
    """The options of each shard's local backend, checked here before anything starts."""
    from vecaccel.manager import get_backend

    shard = dict(options.shard_options or {})
    backend = get_backend(options.shard_backend)
    names = None if backend.options is None else set(backend.options.option_names())

    def default(name: str, value: Any) -> None:
        if value is not None and (names is None or name in names):
            shard.setdefault(name, value)

    default("num_workers", options.num_workers)
    default("on_worker_failure", options.on_worker_failure)
    default("max_restarts", options.max_restarts)
    # the shard's arrays are serialised into the object store at once: views spare a copy
    default("copy", False)
    if options.max_concurrency is not None and (names is None or "max_concurrency" not in names):
        raise ValueError(
            f"max_concurrency caps each shard's envs through its local backend, and "
            f"shard_backend={options.shard_backend!r} takes no max_concurrency: choose a "
            "process backend (shm, hybrid, async, action_server)"
        )
    if backend.options is not None:
        checked = dict(shard)
        if options.max_concurrency is not None:
            checked["max_concurrency"] = 1
        backend.options.from_kwargs(options.shard_backend, checked)
    return shard


def concurrency_shares(max_concurrency: int | None, num_shards: int) -> list[int | None]:
    """Each shard's share of ``max_concurrency`` (the first ``max_concurrency % num_shards``
    shards one more), or no cap for any.

    Example:
        >>> concurrency_shares(5, 2), concurrency_shares(None, 2)
        ([3, 2], [None, None])

    Raises:
        ValueError: if there are fewer than one per shard.
    """
    if max_concurrency is None:
        return [None] * num_shards
    if max_concurrency < num_shards:
        raise ValueError(
            f"max_concurrency={max_concurrency} is below num_shards={num_shards}: each shard "
            "caps its own envs, so give at least one per shard, or ask for fewer shards"
        )
    size, extra = divmod(max_concurrency, num_shards)
    return [size + (k < extra) for k in range(num_shards)]


_ACTOR_CLASS: dict[int, Any] = {}


def actor_class(ray: Any) -> Any:
    key = id(ray)
    if key not in _ACTOR_CLASS:
        _ACTOR_CLASS[key] = ray.remote(ShardActor)
    return _ACTOR_CLASS[key]


def shard_bundle(resources: Mapping[str, float] | None) -> dict[str, float]:
    """The placement-group bundle of one shard with ``shard_resources`` ``resources``.

    Example:
        >>> shard_bundle({"num_cpus": 2, "sim_node": 1})
        {'CPU': 2, 'sim_node': 1}
    """
    names = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
    resources = dict(resources or DEFAULT_SHARD_RESOURCES)
    return {names.get(key, key): value for key, value in resources.items() if value > 0}


def actor_options(
    resources: Mapping[str, float] | None, placement_group: Any, index: int
) -> dict[str, Any]:
    """The ``.options()`` of shard ``index``'s actor: its resources, in its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    resources = dict(resources or DEFAULT_SHARD_RESOURCES)
    options: dict[str, Any] = {
        "num_cpus": resources.pop("num_cpus", 0),
        "max_restarts": 0,  # restarts are the backend's, with reseeding and truncation
        "max_concurrency": 1,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group, placement_group_bundle_index=index
        ),
    }
    for name in ("num_gpus", "memory"):
        if name in resources:
            options[name] = resources.pop(name)
    if resources:
        options["resources"] = resources
    return options


def stop_actors(ray: Any, shards: list[Shard], timeout_s: float) -> None:
    """Close ``shards``' local backends, then let their actors exit as Ray means them to
    (``__ray_terminate__``), and wait until they have, ``timeout_s`` seconds at most; the
    actors that did are set to ``None``, the others are left for ``ray.kill``. A placement
    group removed under an actor still exiting makes Ray's worker abort with a crash report
    and a C++ stack."""
    deadline = time.monotonic() + timeout_s
    refs = [s.actor.close.remote() for s in shards]
    closed, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    closed = set(closed)
    exits = {}
    for shard, ref in zip(shards, refs):
        if ref in closed:  # an orderly exit: no signal lands in a finaliser
            exits[shard.index] = shard.actor.__ray_terminate__.remote()
    if exits:
        left = max(0.1, deadline - time.monotonic())
        ray.wait(list(exits.values()), num_returns=len(exits), timeout=left)
    for shard in shards:
        ref = exits.get(shard.index)
        if ref is None:
            continue
        try:  # the call never returns: the actor's death is its answer
            ray.get(ref, timeout=0)
        except ray.exceptions.GetTimeoutError:
            continue  # still exiting: killed with the others
        except ray.exceptions.RayError:
            pass
        shard.actor = None


def owned(value: Any) -> Any:
    """``value`` (an env's info) with its arrays the caller's own: arrays that came out of
    Ray's object store are read-only views of it, unlike every other backend's."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            items = np.empty(value.shape, dtype=object)
            for index, item in np.ndenumerate(value):
                items[index] = owned(item)
            return items
        return value if value.flags.writeable else value.copy()
    if isinstance(value, dict):
        return {key: owned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [owned(item) for item in value]
    if isinstance(value, tuple):
        parts = [owned(item) for item in value]
        return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
    return value
