"""Infos in shared memory: a fixed schema learned from the first steps, typed slots per env.

Most envs return an info dict of the same keys every step, holding numbers, bools or small
arrays (ALE: ``lives``, ``episode_frame_number``, ``frame_number``). Pickling such a dict in the
worker and unpickling it in the parent costs more than the rest of a cheap step's reply, so
once the parent has seen a few of them it derives a schema (:class:`InfoSchema`: keys, types,
shapes) and announces it to every worker with the ``INFO_SCHEMA`` command. From then on a
worker writes a conforming info into its env's block of the shared info area and flags the
env with the schema's generation; an info that differs (another key, type or shape, a nested
dict, ``final_info`` at an episode end...) takes the pickled payload path as before, for that
env and that step only.

The parent rebuilds the dicts (or, when every info of a step came through the slots, the
batched arrays directly) exactly as Gymnasium's ``VectorEnv._add_info`` would have batched the
original dicts: a Python ``int`` comes back as an ``int``, an ``np.float32`` as an
``np.float32``, an array as an array of its dtype and shape.

Each env has a block of its own (:data:`INFO_BLOCK_BYTES`), so a schema announced while other
envs are still stepping (the per-env protocol) never overwrites an info not read yet; the
generation in each env's flag says which schema its block holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "INFO_BLOCK_BYTES",
    "InfoField",
    "InfoSchema",
    "InfoSchemaTracker",
    "InfoSlots",
    "info_fields",
]

#: Shared memory per env for the values of an info that fits the schema; an info schema
#: whose values need more is not used (those infos keep the payload path).
INFO_BLOCK_BYTES = 1024

#: How many steps with infos the parent may look at to derive a schema, over the whole life
#: of a vector env: envs whose infos never fit one cost nothing after these.
LEARNING_STEPS = 8

#: A schema that no info has fitted for this many steps in a row (while infos came pickled)
#: is replaced by one learned from the latest infos, while learning steps are left.
STALE_AFTER = 16

_SCALARS = (int, float, bool)
_ARRAY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: what np.zeros batches exactly


class InfoField(NamedTuple):
    """One key of an info schema: the value's exact type, and its dtype and shape in the slot.

    ``kind`` is ``int``, ``float``, ``bool``, a numpy scalar type (``np.float32``...) or
    ``np.ndarray``; the slot's dtype is the one Gymnasium batches that value into.
    """

    key: str
    kind: type
    dtype: str
    shape: tuple[int, ...]


def _field(key: Any, value: Any) -> InfoField | None:
    if type(key) is not str or key.startswith("_") or key == "final_obs":
        return None  # "_key" collides with the masks; final_obs batches as objects
    kind = type(value)
    if kind in _SCALARS:
        return InfoField(key, kind, np.dtype(kind).str, ())
    if kind is np.ndarray:
        if value.dtype.kind not in _ARRAY_KINDS or value.dtype.hasobject:
            return None
        return InfoField(key, kind, value.dtype.str, tuple(value.shape))
    if issubclass(kind, np.number):  # np.bool_ is not one: Gymnasium batches it as objects
        dtype = np.dtype(kind)
        if dtype.kind in _ARRAY_KINDS and type(np.zeros(1, dtype)[0]) is kind:
            return InfoField(key, kind, dtype.str, ())
    return None


def info_fields(info: dict) -> tuple[InfoField, ...] | None:
    """The schema fields ``info`` would have, or ``None`` where a value has no fixed layout.

    Example:
        >>> [f.key for f in info_fields({"lives": 3, "pos": np.zeros(2)})]
        ['lives', 'pos']
        >>> info_fields({"name": "pong"}) is None
        True
    """
    fields = []
    for key, value in info.items():
        field = _field(key, value)
        if field is None:
            return None
        fields.append(field)
    return tuple(fields)


class InfoSchema(NamedTuple):
    """A schema the parent announces: its generation (1-255, the flag value) and fields."""

    generation: int
    fields: tuple[InfoField, ...]

    def offsets(self) -> list[int] | None:
        """Each field's offset in an env's block, or ``None`` if they do not fit in one."""
        offsets, offset = [], 0
        for field in self.fields:
            dtype = np.dtype(field.dtype)
            offset = -(-offset // dtype.alignment) * dtype.alignment
            offsets.append(offset)
            offset += dtype.itemsize * int(np.prod(field.shape, dtype=np.int64))
        return offsets if offset <= INFO_BLOCK_BYTES else None


def _converter(field: InfoField):
    if field.kind in _SCALARS:
        return None  # tolist() gives Python ints, floats and bools
    if field.kind is np.ndarray:
        return lambda column, k: column[k, ...].copy()
    return lambda column, k: column[k]  # the numpy scalar type itself


class InfoSlots:
    """An :class:`InfoSchema` over the shared info area: the same class in parent and workers.

    Args:
        schema: the schema (its fields must fit, see :meth:`InfoSchema.offsets`).
        area: the info area, ``uint8 [num_envs, INFO_BLOCK_BYTES]``.
        flags: ``uint8 [num_envs]``: the generation of the schema each env's block holds for
            its last step, or 0 (its info, if any, took the payload path).
    """

    def __init__(self, schema: InfoSchema, area: np.ndarray, flags: np.ndarray) -> None:
        offsets = schema.offsets()
        if offsets is None:
            raise ValueError(f"info schema {schema.fields} needs more than {INFO_BLOCK_BYTES} B")
        self.schema = schema
        self.generation = schema.generation
        self.flags = flags
        self.keys = tuple(field.key for field in schema.fields)
        self.columns: list[np.ndarray] = []
        num_envs = area.shape[0]
        for field, offset in zip(schema.fields, offsets):
            dtype = np.dtype(field.dtype)
            inner = np.empty(field.shape, dtype).strides
            self.columns.append(
                np.ndarray(
                    (num_envs, *field.shape),
                    dtype,
                    buffer=area,
                    offset=offset,
                    strides=(area.strides[0], *inner),
                )
            )
        # (key, exact type, column, dtype and shape to check for arrays) per field, in order
        self._checks = [
            (f.key, f.kind, column, column.dtype if f.kind is np.ndarray else None, f.shape)
            for f, column in zip(schema.fields, self.columns)
        ]
        self._converters = [_converter(field) for field in schema.fields]

    # -- the writing side (a worker, or the caller's inline envs) ---------------------------

    def store(self, index: int, info: dict) -> bool:
        """Write ``info`` of env ``index`` into its block if it fits the schema; whether it did.

        The caller sets the env's flag (:attr:`generation` if it did, else 0); a write that
        stops half-way leaves values no flag points to.
        """
        if type(info) is not dict or len(info) != len(self._checks):
            return False  # a dict subclass keeps its type on the payload path
        try:
            for (key, value), (name, kind, column, dtype, shape) in zip(info.items(), self._checks):
                if key != name or type(value) is not kind:
                    return False
                if dtype is not None and (value.dtype != dtype or value.shape != shape):
                    return False
                column[index] = value
        except (OverflowError, ValueError, TypeError):  # an int past int64, say
            return False
        return True

    # -- the reading side (the parent) ------------------------------------------------------

    def decode(self, indices: Sequence[int] | np.ndarray) -> list[dict]:
        """The info dicts of envs ``indices``, rebuilt from their blocks with the types the
        envs returned (fresh objects, the caller's to keep)."""
        indices = np.asarray(indices, dtype=np.intp)
        values = []
        for column, convert in zip(self.columns, self._converters):
            taken = column[indices]
            if convert is None:
                values.append(taken.tolist())
            else:
                values.append([convert(taken, k) for k in range(len(indices))])
        keys = self.keys
        return [dict(zip(keys, row)) for row in zip(*values)]

    def batch(self, mask: np.ndarray, indices: np.ndarray | None = None) -> dict[str, Any]:
        """Gymnasium's batched infos (``key`` and ``_key`` per field) of envs ``indices``
        (default: every env), where ``mask`` says which of them hold a slot info: what
        ``VectorEnv._add_info`` makes of their dicts."""
        if not mask.any():
            return {}
        infos: dict[str, Any] = {}
        every = mask.all()
        for key, column in zip(self.keys, self.columns):
            array = column.copy() if indices is None else column[indices]
            if not every:
                array[~mask] = 0
            infos[key] = array
            infos[f"_{key}"] = mask.copy()
        return infos


class InfoSchemaTracker:
    """The parent's side: which schema is current, learning one, and reading the flags.

    Args:
        area: the shared info area, ``uint8 [num_envs, INFO_BLOCK_BYTES]``.
        flags: the per-env flags, ``uint8 [num_envs]``.
    """

    def __init__(self, area: np.ndarray, flags: np.ndarray) -> None:
        self.area, self.flags = area, flags
        self.current: InfoSlots | None = None
        self._by_generation: dict[int, InfoSlots] = {}
        self._learning_left = LEARNING_STEPS
        self._misses = 0

    @property
    def generation(self) -> int:
        """The current schema's generation, or 0 when there is none."""
        return 0 if self.current is None else self.current.generation

    def slots(self, generation: int) -> InfoSlots:
        """The slots of schema ``generation`` (one announced earlier)."""
        return self._by_generation[generation]

    def conforming(self) -> np.ndarray:
        """Per env, whether its last step's info is in its block under the current schema."""
        return self.flags == self.generation

    def observe(self, pairs: Sequence[tuple[int, dict]], in_slots: int) -> InfoSchema | None:
        """Take note of a step: ``pairs``, the infos that came as dicts (pickled, or from
        inline envs), and how many came through the slots.

        Returns a new schema to announce to every env's slice, or ``None``.
        """
        if in_slots:
            self._misses = 0
            return None
        if not pairs or self._learning_left <= 0:
            return None
        if self.current is not None:
            self._misses += 1
            if self._misses < STALE_AFTER:
                return None
        self._learning_left -= 1
        self._misses = 0
        fields = _most_common_fields(pairs)
        if fields is None or (self.current is not None and fields == self.current.schema.fields):
            return None
        schema = InfoSchema(len(self._by_generation) + 1, fields)
        if schema.offsets() is None:
            return None
        self.current = InfoSlots(schema, self.area, self.flags)
        self._by_generation[schema.generation] = self.current
        return schema

    def merge(self, pairs: list[tuple[int, dict]], indices: np.ndarray) -> list[tuple[int, dict]]:
        """``pairs`` with the slot infos of envs ``indices`` (current schema) added, sorted by
        env index: what the step's pairs would have been without slots."""
        decoded = self.current.decode(indices)
        merged = pairs + list(zip(indices.tolist(), decoded))
        merged.sort(key=lambda pair: pair[0])
        return merged


def _most_common_fields(pairs: Sequence[tuple[int, dict]]) -> tuple[InfoField, ...] | None:
    """The fields most of ``pairs``' infos share (the first env's among equals), or ``None``."""
    counts: Counter[tuple[InfoField, ...]] = Counter()
    for _, info in pairs:
        if info:
            fields = info_fields(info)
            if fields is not None:
                counts[fields] += 1
    if not counts:
        return None
    return counts.most_common(1)[0][0]  # ties: the first seen (Counter keeps insertion order)
