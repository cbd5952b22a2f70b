"""Pickling env functions for a worker so that its tracebacks and stacks name the user's files.

cloudpickle ships functions and classes defined in ``__main__`` (or in a notebook) by value,
and writes ``"<dynamic-code>"`` as their code's file name to keep its bytes deterministic. A
worker's traceback, and a stuck worker's stack, would then say ``File "<dynamic-code>", line
16`` where the user's env raised or hung. :func:`dumps` pickles code objects with
:mod:`marshal` instead, the format of ``.pyc`` files, which keeps every field, the file name
included. A worker runs the same interpreter as its parent, which marshal needs (cloudpickle's
own code pickles are tied to the interpreter version too).
"""

from __future__ import annotations

import io
import marshal
import types
from collections import ChainMap
from typing import Any

import cloudpickle

__all__ = ["dumps"]


def _code_from_marshal(data: bytes) -> types.CodeType:
    return marshal.loads(data)


def _reduce_code(code: types.CodeType) -> tuple[Any, tuple[bytes]]:
    return _code_from_marshal, (marshal.dumps(code),)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, keeping the file names of the code it pickles by value.

    Load the bytes with ``cloudpickle.loads`` (or ``pickle.loads``).

    Example:
        >>> import cloudpickle
        >>> code = compile("def f():\\n    return 1\\n", "/home/me/train.py", "exec")
        >>> namespace = {"__name__": "__main__"}
        >>> exec(code, namespace)
        >>> cloudpickle.loads(cloudpickle.dumps(namespace["f"])).__code__.co_filename
        '<dynamic-code>'
        >>> cloudpickle.loads(dumps(namespace["f"])).__code__.co_filename
        '/home/me/train.py'
    """
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return buffer.getvalue()
