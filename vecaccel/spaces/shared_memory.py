"""Per-space work: shared-memory layout, writing one env's item, and checking batched actions.

Every function dispatches on the *single* (per-env) space with :func:`functools.singledispatch`,
the way ``gymnasium.vector.utils`` does, so new space types can be registered by plugins.

A tree of views may hold :class:`ItemList` columns where its space has a leaf with no fixed size
(``Text``, ``Graph``, ``Sequence``, ``OneOf``, a space subclass vecaccel does not know): one
Python object per env, batched as Gymnasium batches them (a tuple). The tree functions below
take them; :mod:`vecaccel.spaces.payload` lays such spaces out.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Callable, Mapping, Sequence
from functools import singledispatch
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, iterate

__all__ = [
    "ALIGNMENT",
    "leaf_specs",
    "views_from_buffer",
    "write_item",
    "read_item",
    "copy_tree",
    "index_tree",
    "check_actions",
    "assign_tree",
    "has_fixed_layout",
    "item_reader",
    "item_writer",
    "nbytes_of",
    "ItemList",
    "PayloadLeaf",
]

#: Byte alignment of every array carved out of a shared buffer (one cache line).
ALIGNMENT = 64


def _align(offset: int) -> int:
    return (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


# ---------------------------------------------------------------------------------------------
# layout


@singledispatch
def leaf_specs(space: spaces.Space, n: int) -> Any:
    """Describe the arrays that hold ``n`` items of ``space``: a tree of ``(shape, dtype)``."""
    raise TypeError(
        f"space {space!r} cannot be laid out in shared memory; supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary and nested Dict/Tuple of them (vecaccel.spaces.payload."
        "layout_specs lays out any space, leaving such leaves to the payload path)"
    )


@leaf_specs.register(spaces.Box)
@leaf_specs.register(spaces.Discrete)
@leaf_specs.register(spaces.MultiDiscrete)
@leaf_specs.register(spaces.MultiBinary)
def _leaf_specs_base(space: spaces.Space, n: int) -> tuple[tuple[int, ...], np.dtype]:
    return ((n, *space.shape), np.dtype(space.dtype))


@leaf_specs.register(spaces.Tuple)
def _leaf_specs_tuple(space: spaces.Tuple, n: int) -> tuple:
    return tuple(leaf_specs(sub, n) for sub in space.spaces)


@leaf_specs.register(spaces.Dict)
def _leaf_specs_dict(space: spaces.Dict, n: int) -> dict:
    return {key: leaf_specs(sub, n) for key, sub in space.spaces.items()}


def has_fixed_layout(space: spaces.Space) -> bool:
    """Whether items of ``space`` fit arrays of a fixed shape (what shared memory needs)."""
    try:
        leaf_specs(space, 1)
    except TypeError:
        return False
    return True


def _is_leaf(spec: Any) -> bool:
    return isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], np.dtype)


class PayloadLeaf(NamedTuple):
    """The spec of a leaf with no fixed size: no bytes in the buffer, an :class:`ItemList` of
    ``count`` items among the views."""

    count: int


def nbytes_of(spec: Any, offset: int = 0) -> int:
    """Return the end offset after laying out ``spec`` from ``offset`` (aligned)."""
    if isinstance(spec, PayloadLeaf):
        return offset
    if _is_leaf(spec):
        shape, dtype = spec
        return _align(offset) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    children = spec.values() if isinstance(spec, dict) else spec
    for child in children:
        offset = nbytes_of(child, offset)
    return offset


def views_from_buffer(spec: Any, buffer: Any, offset: int = 0) -> tuple[Any, int]:
    """Carve numpy views for ``spec`` out of ``buffer`` starting at ``offset``.

    Returns the tree of views and the offset just past them. A :class:`PayloadLeaf` becomes an
    :class:`ItemList` of ``None`` (its items live in the process, not in ``buffer``).
    """
    if isinstance(spec, PayloadLeaf):
        return ItemList([None] * spec.count), offset
    if _is_leaf(spec):
        shape, dtype = spec
        start = _align(offset)
        count = int(np.prod(shape, dtype=np.int64))
        array = np.frombuffer(buffer, dtype=dtype, count=count, offset=start).reshape(shape)
        return array, start + count * dtype.itemsize
    if isinstance(spec, dict):
        out = {}
        for key, child in spec.items():
            out[key], offset = views_from_buffer(child, buffer, offset)
        return out, offset
    items = []
    for child in spec:
        view, offset = views_from_buffer(child, buffer, offset)
        items.append(view)
    return tuple(items), offset


# ---------------------------------------------------------------------------------------------
# per-item access


@singledispatch
def write_item(space: spaces.Space, views: Any, index: int, value: Any) -> None:
    """Write one env's ``value`` of ``space`` into slot ``index`` of ``views``."""
    raise TypeError(f"space {space!r} is not supported in shared memory")


@write_item.register(spaces.Box)
@write_item.register(spaces.Discrete)
@write_item.register(spaces.MultiDiscrete)
@write_item.register(spaces.MultiBinary)
def _write_base(space: spaces.Space, views: np.ndarray, index: int, value: Any) -> None:
    item_writer(space, views)(index, value)


def _shape_error(space: spaces.Space, value: Any) -> ValueError:
    return ValueError(
        f"an item of shape {np.shape(value)} does not fit {space}, whose items have shape "
        f"{space.shape}"
    )


@write_item.register(spaces.Tuple)
def _write_tuple(space: spaces.Tuple, views: tuple, index: int, value: Any) -> None:
    if len(value) != len(space.spaces):
        raise _shape_error(space, value)
    for sub, view, item in zip(space.spaces, views, value):
        write_item(sub, view, index, item)


@write_item.register(spaces.Dict)
def _write_dict(space: spaces.Dict, views: dict, index: int, value: Any) -> None:
    for key, sub in space.spaces.items():
        write_item(sub, views[key], index, value[key])


def read_item(views: Any, index: int) -> Any:
    """Return slot ``index`` of a tree of views (views, not copies), as Gymnasium's ``iterate``."""
    if isinstance(views, np.ndarray):
        return views[index]
    if isinstance(views, dict):
        return {key: read_item(view, index) for key, view in views.items()}
    if isinstance(views, ItemList):
        return views[index]
    return tuple(read_item(view, index) for view in views)


def copy_tree(views: Any) -> Any:
    """Deep-copy a tree of arrays; an :class:`ItemList` becomes a tuple of copies of its items
    (what ``SyncVectorEnv`` returns for such a leaf)."""
    if isinstance(views, np.ndarray):
        return views.copy()
    if isinstance(views, dict):
        return {key: copy_tree(view) for key, view in views.items()}
    if isinstance(views, ItemList):
        return copy_module.deepcopy(tuple(views))
    return tuple(copy_tree(view) for view in views)


def index_tree(views: Any, indices: Any) -> Any:
    """Select ``indices`` along the batch axis of every leaf (a copy when fancy-indexed); an
    :class:`ItemList` gives a tuple of copies of the items selected."""
    if isinstance(views, np.ndarray):
        return views[indices]
    if isinstance(views, dict):
        return {key: index_tree(view, indices) for key, view in views.items()}
    if isinstance(views, ItemList):
        chosen = np.arange(len(views))[indices].tolist()
        return copy_module.deepcopy(tuple(views[i] for i in chosen))
    return tuple(index_tree(view, indices) for view in views)


def assign_tree(target: Any, indices: Any, values: Any) -> None:
    """Write ``values`` (a batch over ``indices``) into ``target`` along the batch axis."""
    if isinstance(target, np.ndarray):
        target[indices] = values
    elif isinstance(target, dict):
        for key, view in target.items():
            assign_tree(view, indices, values[key])
    elif isinstance(target, ItemList):
        for i, value in zip(np.arange(len(target))[indices].tolist(), values):
            target[i] = value
    else:
        for view, value in zip(target, values):
            assign_tree(view, indices, value)


# ---------------------------------------------------------------------------------------------
# action checking (in the caller, before any worker sees the actions)


def check_actions(space: spaces.Space, actions: Any, num_envs: int, env_ids: Any = None) -> Any:
    """Validate a batch of actions for ``num_envs`` envs of single space ``space``.

    Returns the actions as numpy arrays of the space's dtype (a tree for Dict/Tuple spaces).

    Raises:
        TypeError: naming the space and the shape expected, for an action that is not a batch:
            a scalar, one env's action, or not a dict/tuple where the space is one (Gymnasium's
            vector envs raise ``TypeError`` there too).
        ValueError: naming the space and the env index, for a wrong number of actions or shape,
            a dtype that cannot be cast, or a value out of a Discrete/MultiDiscrete/MultiBinary
            range (Gymnasium does not check ranges; vecaccel does, before any env sees them).

    Example:
        >>> import numpy as np
        >>> from gymnasium.spaces import Discrete
        >>> check_actions(Discrete(2), np.array([0, 1]), 2)
        array([0, 1])
    """
    return _check(space, actions, num_envs, "action", env_ids)


def _env_label(env_ids: Any, position: int) -> int:
    return int(env_ids[position]) if env_ids is not None else position


class ItemList(list):
    """Items of a space without a fixed array layout (``Text``, ``Sequence``, ``Graph``...),
    one per env: a batch of such actions, or such a leaf's column among a tree of views."""


@singledispatch
def _check(space: spaces.Space, value: Any, n: int, where: str, env_ids: Any) -> Any:
    # no fixed layout (only the serial backend runs such spaces): split the batch as
    # SyncVectorEnv does, then check each env's item against the space
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise _unbatched_error(space, value, n, where, f"a tuple of {n} items")
    try:
        items = ItemList(iterate(batch_space(space, n), value))
    except Exception as exc:  # noqa: BLE001 - Gymnasium raises many types here
        raise ValueError(
            f"{where} for {space} cannot be split into {n} envs' items: {exc}"
        ) from None
    if len(items) != n:
        raise ValueError(f"{where} for {space} must hold {n} items (one per env), got {len(items)}")
    for position, item in enumerate(items):
        if not space.contains(item):
            raise ValueError(
                f"{where} for env {_env_label(env_ids, position)} is {item!r}, outside {space}"
            )
    return items


def _as_array(space: spaces.Space, value: Any, n: int, where: str, env_ids: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # NumPy has no bfloat16 (autocast's output)
            value = value.float()
        value = value.numpy()
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where} for {space} cannot be made into an array: {exc}") from None
    expected = (n, *space.shape)
    if array.shape != expected and array.shape == tuple(space.shape or ()):
        raise _unbatched_error(space, value, n, where, f"shape {expected}")
    if array.shape != expected:
        raise ValueError(
            f"{where} for {space} must have shape {expected} ({n} envs x {space.shape}), "
            f"got shape {array.shape}"
        )
    target = np.dtype(space.dtype)
    ok = np.can_cast(array.dtype, target, casting="same_kind")
    if not ok and array.dtype == np.bool_ and target.kind in "iu":
        ok = True
    if not ok and target.kind in "iu" and array.dtype.kind in "iu":
        ok = True  # e.g. uint64 -> int64; ranges are checked below
    if not ok:
        raise ValueError(
            f"{where} for {space} has dtype {array.dtype}, which cannot be cast to {target}"
        )
    if target.kind == "f" or target.kind == "c":
        return array.astype(target, copy=False)
    if target.kind in "iu" and array.dtype.kind in "iu" and array.dtype != target:
        # a narrowing cast would wrap silently in shared memory (300 -> 44 for uint8)
        limits = np.iinfo(target)
        bad = (array < limits.min) | (array > limits.max)
        if bad.any():
            raise _range_error(
                space, array, bad, where, env_ids, f"{limits.min}..{limits.max} for {target}"
            )
    return array.astype(target, copy=False)


def _unbatched_error(space: spaces.Space, value: Any, n: int, where: str, expected: str):
    """A single env's item (or a scalar) where a batch was due: ``TypeError``, as Gymnasium's
    vector envs raise when they try to iterate over it."""
    shape = getattr(value, "shape", None)
    got = f"shape {tuple(shape)}" if shape is not None else type(value).__name__
    return TypeError(
        f"{where} for {space} must be batched, one per env: {expected} for {n} envs; got "
        f"{got}, which is not a batch (one env's {where}? vector envs take a batch, e.g. "
        f"np.array([...]) with {n} entries)"
    )


def _range_error(space, array, bad, where, env_ids, valid):
    positions = np.argwhere(bad)
    first = tuple(positions[0])
    env_position = first[0]
    value = array[first]
    value = value.item() if hasattr(value, "item") else value
    element = f" (element {first[1:]})" if len(first) > 1 else ""
    return ValueError(
        f"{where} for env {_env_label(env_ids, env_position)} is {value!r}{element}, "
        f"outside {space} (valid {valid})"
    )


@_check.register(spaces.Box)
def _check_box(space: spaces.Box, value: Any, n: int, where: str, env_ids: Any) -> np.ndarray:
    return _as_array(space, value, n, where, env_ids)


#: Up to this many envs, a batch of integer actions is range-checked as a Python list: each
#: NumPy call costs microseconds when its code is cold in the CPU's caches, as it is right
#: after a policy's forward pass (19 µs for the NumPy checks of 16 actions, 3 µs this way).
_SMALL_BATCH = 64


@_check.register(spaces.Discrete)
def _check_discrete(space: spaces.Discrete, value: Any, n: int, where: str, env_ids: Any):
    low, high = int(space.start), int(space.start) + int(space.n)
    if (
        type(value) is np.ndarray
        and value.shape == (n,)
        and value.dtype == space.dtype
        and 0 < n <= _SMALL_BATCH
    ):  # the common case, fast: checked as a list, the array returned as it is
        items = value.tolist()
        if low <= min(items) and max(items) < high:
            return value
    array = _as_array(space, value, n, where, env_ids)
    if array.dtype.kind not in "iub":
        raise ValueError(f"{where} for {space} must be integers, got dtype {array.dtype}")
    bad = (array < low) | (array >= high)
    if bad.any():
        raise _range_error(space, array, bad, where, env_ids, f"{low}..{high - 1}")
    return array.astype(space.dtype, copy=False)


@_check.register(spaces.MultiDiscrete)
def _check_multi_discrete(space: spaces.MultiDiscrete, value: Any, n: int, where, env_ids):
    array = _as_array(space, value, n, where, env_ids)
    if array.dtype.kind not in "iub":
        raise ValueError(f"{where} for {space} must be integers, got dtype {array.dtype}")
    bad = (array < space.start) | (array >= space.start + space.nvec)
    if bad.any():
        raise _range_error(space, array, bad, where, env_ids, "start <= a < start + nvec")
    return array.astype(space.dtype, copy=False)


@_check.register(spaces.MultiBinary)
def _check_multi_binary(space: spaces.MultiBinary, value: Any, n: int, where, env_ids):
    array = _as_array(space, value, n, where, env_ids)
    if array.dtype.kind not in "iub":
        raise ValueError(f"{where} for {space} must be 0/1 integers, got dtype {array.dtype}")
    bad = (array != 0) & (array != 1)
    if bad.any():
        raise _range_error(space, array, bad, where, env_ids, "0 or 1")
    return array.astype(space.dtype, copy=False)


@_check.register(spaces.Tuple)
def _check_tuple(space: spaces.Tuple, value: Any, n: int, where: str, env_ids: Any) -> tuple:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes, np.ndarray)):
        raise TypeError(
            f"{where} for {space} must be a tuple of {len(space.spaces)} batches, got "
            f"{type(value).__name__}"
        )
    if len(value) != len(space.spaces):
        raise ValueError(
            f"{where} for {space} must have {len(space.spaces)} parts, got {len(value)}"
        )
    return tuple(
        _check(sub, item, n, f"{where}[{i}]", env_ids)
        for i, (sub, item) in enumerate(zip(space.spaces, value))
    )


@_check.register(spaces.Dict)
def _check_dict(space: spaces.Dict, value: Any, n: int, where: str, env_ids: Any) -> dict:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} for {space} must be a dict, got {type(value).__name__}")
    missing = [key for key in space.spaces if key not in value]
    extra = [key for key in value if key not in space.spaces]
    if missing or extra:
        raise ValueError(f"{where} for {space}: missing keys {missing}, unexpected keys {extra}")
    return {
        key: _check(sub, value[key], n, f"{where}[{key!r}]", env_ids)
        for key, sub in space.spaces.items()
    }


# ---------------------------------------------------------------------------------------------
# precompiled per-env access for the workers' hot loop (no dispatch per call)


def item_writer(space: spaces.Space, views: Any) -> Any:
    """Return ``write(index, value)`` storing one env's ``value`` of ``space`` into ``views``.

    Equivalent to ``write_item(space, views, index, value)``, with the dispatch done once.

    Example:
        >>> import numpy as np
        >>> from gymnasium.spaces import Box
        >>> views = np.zeros((2, 3), np.float32)
        >>> item_writer(Box(0, 1, (3,)), views)(1, [1, 0, 1])
        >>> views[1].tolist()
        [1.0, 0.0, 1.0]
    """
    if isinstance(views, np.ndarray):
        # numpy would broadcast a scalar or a 1-element array into the whole slot silently,
        # and cast 300.7 into a uint8 slot as 44: Gymnasium's concatenate refuses both
        shape, setitem = views.shape[1:], views.__setitem__
        castable = _castable_to(space, views.dtype)
        if shape == ():

            def write_scalar(index: int, value: Any) -> None:
                if getattr(value, "shape", ()) != ():  # Python numbers have no shape
                    raise _shape_error(space, value)
                castable(value)
                setitem(index, value)

            return write_scalar

        def write_array(index: int, value: Any) -> None:
            if getattr(value, "shape", None) != shape and np.shape(value) != shape:
                raise _shape_error(space, value)
            castable(value)
            setitem(index, value)

        return write_array
    if isinstance(views, ItemList):  # a leaf with no fixed size: the item itself is kept
        return views.__setitem__
    if isinstance(space, spaces.Dict):
        writers = [(key, item_writer(sub, views[key])) for key, sub in space.spaces.items()]

        def write_dict(index: int, value: Any) -> None:
            for key, write in writers:
                write(index, value[key])

        return write_dict
    writers_t = [item_writer(sub, view) for sub, view in zip(space.spaces, views)]

    def write_tuple(index: int, value: Any) -> None:
        if len(value) != len(writers_t):  # zip would keep the last step's missing parts
            raise _shape_error(space, value)
        for write, item in zip(writers_t, value):
            write(index, item)

    return write_tuple


def _castable_to(space: spaces.Space, target: np.dtype) -> Callable[[Any], None]:
    """Return ``check(value)``, raising ``TypeError`` unless ``value`` casts into ``target``
    within its kind (NumPy's ``same_kind``, as Gymnasium's ``concatenate``): floats do not go
    into an integer slot. The answer is kept per type or dtype, so the hot path is a lookup."""
    known: dict[Any, bool] = {}

    def check(value: Any) -> None:
        key = getattr(value, "dtype", None)
        if key is None:
            key = type(value)
        ok = known.get(key)
        if ok is None:
            ok = bool(np.can_cast(np.asarray(value).dtype, target, casting="same_kind"))
            if not isinstance(value, (list, tuple)):  # a list's dtype depends on its items
                known[key] = ok
        if not ok:
            raise TypeError(
                f"an item of dtype {np.asarray(value).dtype} does not fit {space} without a "
                f"lossy cast to {target}"
            )

    return check


def item_reader(views: Any, copy: bool = False) -> Any:
    """Return ``read(index)``, the same as ``read_item(views, index)`` with the dispatch done once.

    With ``copy``, array items are copies: an env that keeps its action (to penalise the next
    one's change, say) must not see it change when the shared buffer takes the next step's.
    """
    if isinstance(views, ItemList) or (isinstance(views, np.ndarray) and views.ndim < 2):
        return views.__getitem__  # a scalar item: NumPy hands out a copy anyway
    if isinstance(views, np.ndarray):
        return (lambda index: views[index].copy()) if copy else views.__getitem__
    if isinstance(views, dict):
        readers = [(key, item_reader(view, copy)) for key, view in views.items()]
        return lambda index: {key: read(index) for key, read in readers}
    readers_t = [item_reader(view, copy) for view in views]
    return lambda index: tuple(read(index) for read in readers_t)
