"""Spaces with leaves of no fixed size: which leaves they are, and how such a space is laid out.

A leaf is *fixed* when :func:`vecaccel.spaces.leaf_specs` knows its type (``Box``,
``Discrete``, ``MultiDiscrete``, ``MultiBinary``, and whatever a plugin registers there); every
other leaf (``Text``, ``Graph``, ``Sequence``, ``OneOf``, any other ``Space`` subclass) is a
*payload* leaf. ``Dict`` and ``Tuple`` are containers, at any depth.

:func:`layout_specs` lays a space out for shared memory with its payload leaves left out: there
the views hold an :class:`~vecaccel.spaces.ItemList` column (one Python object per env) instead
of an array. Process backends carry those columns with their replies (observations) and commands
(actions), pickled; a space with no payload leaf lays out exactly as
:func:`~vecaccel.spaces.leaf_specs` lays it out, and pickles nothing per step.

Where a tensor is required (a batched policy on a device, the ``Sampler``, the trainers), a space
with payload leaves is refused up front: :func:`require_fixed_layout`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gymnasium import spaces

from vecaccel.spaces.shared_memory import ItemList, PayloadLeaf, leaf_specs

__all__ = [
    "batch_view",
    "format_path",
    "is_fixed_leaf",
    "item_columns",
    "layout_specs",
    "payload_leaves",
    "require_fixed_layout",
    "store_items",
    "take_items",
]

Path = tuple[Any, ...]


def is_fixed_leaf(space: spaces.Space) -> bool:
    """Whether ``space`` is a leaf that :func:`~vecaccel.spaces.leaf_specs` lays out.

    Example:
        >>> is_fixed_leaf(spaces.Discrete(3)), is_fixed_leaf(spaces.Text(4))
        (True, False)
    """
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return False
    return leaf_specs.dispatch(type(space)) is not leaf_specs.dispatch(object)


def payload_leaves(space: spaces.Space) -> list[tuple[Path, spaces.Space]]:
    """The leaves of ``space`` with no fixed size, as ``(path, leaf space)`` in layout order.

    A path holds the ``Dict`` keys and ``Tuple`` indices from the root to the leaf; ``()`` is
    the space itself. An empty list means the whole space lives in shared memory.

    Example:
        >>> space = spaces.Dict({"img": spaces.Box(0, 1, (2,)), "cmd": spaces.Text(8)})
        >>> [(path, type(leaf).__name__) for path, leaf in payload_leaves(space)]
        [(('cmd',), 'Text')]
    """
    found: list[tuple[Path, spaces.Space]] = []

    def walk(node: spaces.Space, path: Path) -> None:
        if isinstance(node, spaces.Dict):
            for key, sub in node.spaces.items():
                walk(sub, (*path, key))
        elif isinstance(node, spaces.Tuple):
            for index, sub in enumerate(node.spaces):
                walk(sub, (*path, index))
        elif not is_fixed_leaf(node):
            found.append((path, node))

    walk(space, ())
    return found


def format_path(root: str, path: Path) -> str:
    """``root`` followed by the path's subscripts: ``format_path("obs", ("a", 0)) == "obs['a'][0]"``."""
    return root + "".join(f"[{key!r}]" for key in path)


def require_fixed_layout(space: spaces.Space, what: str, kind: str = "observation") -> None:
    """Raise ``TypeError`` if ``space`` has a leaf with no fixed size, for ``what`` needs tensors.

    Args:
        space: the single (per-env) space.
        what: who needs tensors, for the message (``"the Sampler"``, ``"PPO"``...).
        kind: ``"observation"`` or ``"action"``, for the message.

    Raises:
        TypeError: naming the space, the first such leaf and its path, and the backends that
            run the space.

    Example:
        >>> require_fixed_layout(spaces.Box(0, 1, (3,)), "the Sampler")
        >>> space = spaces.Tuple((spaces.Discrete(2), spaces.Sequence(spaces.Discrete(3))))
        >>> require_fixed_layout(space, "the Sampler")
        Traceback (most recent call last):
        ...
        TypeError: the Sampler needs tensors, but the observation space Tuple(Discrete(2), Sequence(Discrete(3), stack=False)) has a leaf with no fixed size at obs[1]: Sequence(Discrete(3), stack=False). Such spaces run on backend='serial', 'shm', 'hybrid' or 'async'; step them yourself (or flatten the space to Box/Discrete leaves with a wrapper)
    """
    leaves = payload_leaves(space)
    if not leaves:
        return
    path, leaf = leaves[0]
    root = "obs" if kind == "observation" else "action"
    where = f"at {format_path(root, path)}" if path else "(the whole space)"
    more = f" (and {len(leaves) - 1} more such leaves)" if len(leaves) > 1 else ""
    raise TypeError(
        f"{what} needs tensors, but the {kind} space {space} has a leaf with no fixed size "
        f"{where}: {leaf}{more}. Such spaces run on backend='serial', 'shm', 'hybrid' or "
        "'async'; step them yourself (or flatten the space to Box/Discrete leaves with a wrapper)"
    )


def layout_specs(space: spaces.Space, n: int) -> Any:
    """:func:`~vecaccel.spaces.leaf_specs` for any space: a payload leaf's spec is a
    :class:`~vecaccel.spaces.PayloadLeaf` (no bytes; an item column among the views).

    Example:
        >>> layout_specs(spaces.Dict({"a": spaces.Discrete(2), "t": spaces.Text(3)}), 4)
        {'a': ((4,), dtype('int64')), 't': PayloadLeaf(count=4)}
    """
    if isinstance(space, spaces.Dict):
        return {key: layout_specs(sub, n) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(layout_specs(sub, n) for sub in space.spaces)
    if is_fixed_leaf(space):
        return leaf_specs(space, n)
    return PayloadLeaf(n)


def item_columns(views: Any) -> list[ItemList]:
    """The :class:`~vecaccel.spaces.ItemList` columns of a tree of views, in layout order
    (the order of :func:`payload_leaves`); empty for a space that is fixed throughout."""
    if isinstance(views, ItemList):
        return [views]
    if isinstance(views, dict):
        return [column for view in views.values() for column in item_columns(view)]
    if isinstance(views, tuple):
        return [column for view in views for column in item_columns(view)]
    return []


def take_items(columns: Sequence[ItemList], env_indices: Iterable[int]) -> list:
    """``[(env index, [its item in each column])]``: what a reply or a command carries."""
    return [(i, [column[i] for column in columns]) for i in env_indices]


def store_items(columns: Sequence[ItemList], items: Iterable[tuple[int, list]]) -> list[int]:
    """Write what :func:`take_items` made into ``columns``; return the env indices it named."""
    indices = []
    for i, values in items:
        for column, value in zip(columns, values):
            column[i] = value
        indices.append(i)
    return indices


def batch_view(views: Any) -> Any:
    """The batch a tree of views stands for, without copying: arrays as they are, each item
    column as a tuple of its items (``SyncVectorEnv(copy=False)`` shares them too)."""
    if isinstance(views, ItemList):
        return tuple(views)
    if isinstance(views, dict):
        return {key: batch_view(view) for key, view in views.items()}
    if isinstance(views, tuple):
        return tuple(batch_view(view) for view in views)
    return views
