"""Per-space work, dispatched on the single (per-env) space as ``gymnasium.vector.utils`` does.

* :mod:`~vecaccel.spaces.shared_memory`: the shared-memory layout of a space, writing and
  reading one env's item, copying and indexing trees of views, and checking batched actions;
* :mod:`~vecaccel.spaces.payload`: spaces with leaves of no fixed size (``Text``, ``Graph``,
  ``Sequence``...): which leaves they are, and how such a space is laid out without them.

Both modules' public names are importable from here (``from vecaccel.spaces import
leaf_specs``), and plugins register new space types on the dispatching functions.

Example:
    >>> from gymnasium import spaces
    >>> has_fixed_layout(spaces.Box(0, 1, (3,))), has_fixed_layout(spaces.Text(5))
    (True, False)
"""

from __future__ import annotations

from vecaccel.spaces.payload import (
    batch_view,
    format_path,
    is_fixed_leaf,
    item_columns,
    layout_specs,
    payload_leaves,
    require_fixed_layout,
    store_items,
    take_items,
)
from vecaccel.spaces.shared_memory import (
    ALIGNMENT,
    ItemList,
    PayloadLeaf,
    assign_tree,
    check_actions,
    copy_tree,
    has_fixed_layout,
    index_tree,
    item_reader,
    item_writer,
    leaf_specs,
    nbytes_of,
    read_item,
    views_from_buffer,
    write_item,
)

__all__ = [
    "ALIGNMENT",
    "ItemList",
    "PayloadLeaf",
    "assign_tree",
    "batch_view",
    "check_actions",
    "copy_tree",
    "format_path",
    "has_fixed_layout",
    "index_tree",
    "is_fixed_leaf",
    "item_columns",
    "item_reader",
    "item_writer",
    "layout_specs",
    "leaf_specs",
    "nbytes_of",
    "payload_leaves",
    "read_item",
    "require_fixed_layout",
    "store_items",
    "take_items",
    "views_from_buffer",
    "write_item",
]
