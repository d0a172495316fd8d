"""Walking nested batches: tuples, lists, dicts, namedtuples and leaves.

Used by the transport (encode/decode), the numpy converter and the device
stage, so every stage agrees on what a container is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


_LEAF, _MAPPING, _NAMEDTUPLE, _TUPLE, _LIST = range(5)
_kinds: dict[type, int] = {}


def _kind(cls: type) -> int:
    """What ``tree_map`` makes of instances of ``cls``, worked out once per type (the
    ``isinstance`` check against ``Mapping`` is an ABC check, a real share of a small batch)."""
    if issubclass(cls, (str, bytes)):
        kind = _LEAF
    elif issubclass(cls, Mapping):
        kind = _MAPPING
    elif issubclass(cls, tuple):
        kind = _NAMEDTUPLE if hasattr(cls, "_fields") else _TUPLE
    elif issubclass(cls, list):
        kind = _LIST
    else:
        kind = _LEAF
    if len(_kinds) > 4096:  # types made on the fly: keep the table small
        _kinds.clear()
    _kinds[cls] = kind
    return kind


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf, rebuilding containers of the same type.

    >>> tree_map(lambda x: x * 2, {"a": [1, (2, 3)]})
    {'a': [2, (4, 6)]}
    """
    cls = type(tree)
    kind = _kinds.get(cls)
    if kind is None:
        kind = _kind(cls)
    if kind == _LEAF:
        return fn(tree)
    if kind == _LIST:
        return [tree_map(fn, v) for v in tree]
    if kind == _TUPLE:
        return tuple(tree_map(fn, v) for v in tree)
    if kind == _MAPPING:
        items = {k: tree_map(fn, v) for k, v in tree.items()}
        if cls is dict:
            return items
        try:
            return cls(items)
        except TypeError:
            return items
    return cls(*(tree_map(fn, v) for v in tree))  # a namedtuple


def leaves(tree: Any) -> list[Any]:
    """All leaves of ``tree`` in the order ``tree_map`` visits them."""
    out: list[Any] = []
    tree_map(out.append, tree)
    return out
