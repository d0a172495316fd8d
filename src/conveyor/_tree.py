"""Walking nested batches: tuples, lists, dicts, namedtuples and leaves.

Used by the transport (encode/decode), the numpy converter and the device
stage, so every stage agrees on what a container is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any


_LEAF, _MAPPING, _NAMEDTUPLE, _TUPLE, _LIST = range(5)
_kinds: dict[type, int] = {}


def _kind(cls: type) -> int:
    """What ``tree_map`` makes of instances of ``cls``, worked out once per type (the
    ``isinstance`` check against ``Mapping`` is an ABC check, a real share of a small batch)."""
    if issubclass(cls, (str, bytes)):
        kind = _LEAF
    elif (hasattr(cls, "items") or hasattr(cls, "__getattr__")) and issubclass(cls, Mapping):
        # ``items`` first (or a ``__getattr__`` that may supply it, as a proxy's does):
        # tree_map reads a Mapping through it, and the ABC check it spares tensors and arrays
        # walks every Mapping subclass in the process (~230 us the first time a
        # torch.Tensor meets it in a freshly forked process)
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
        values = [tree_map(fn, v) for v in tree]
        return values if cls is list else _same_list(tree, values)
    if kind == _TUPLE:
        values = [tree_map(fn, v) for v in tree]
        return tuple(values) if cls is tuple else _same_tuple(tree, values)
    if kind == _MAPPING:
        items = {k: tree_map(fn, v) for k, v in tree.items()}
        return items if cls is dict else _same_mapping(tree, items)
    return cls(*(tree_map(fn, v) for v in tree))  # a namedtuple


# Containers of other types (OrderedDict, defaultdict, a dict subclass with attributes,
# torch.Size, a list subclass) come back as what they were: a copy of the original (its
# type and attributes) holding the new values, as pickling them would give; other
# Mappings are made from the new items. Those that cannot be fall back to the plain
# container.

def _same_mapping(tree: Any, items: dict[Any, Any]) -> Any:
    if isinstance(tree, dict):  # a copy of a dict subclass has storage of its own
        try:
            clone = copy.copy(tree)
            for k, v in items.items():
                clone[k] = v
            return clone
        except Exception:
            pass
    try:  # another Mapping: a shallow copy might share the original's storage
        return type(tree)(items)
    except Exception:
        return items


def _same_list(tree: Any, values: list[Any]) -> Any:
    try:
        clone = copy.copy(tree)
        clone[:] = values
        return clone
    except Exception:
        return values


def _same_tuple(tree: Any, values: list[Any]) -> Any:
    try:
        clone = type(tree)(values)
    except Exception:
        clone = None
    if clone is None or len(clone) != len(values) or any(a is not b for a, b in zip(clone, values)):
        try:  # a constructor that takes the items one by one (or does more): build it bare
            clone = tuple.__new__(type(tree), values)
        except Exception:
            return tuple(values)
    state = getattr(tree, "__dict__", None)
    if state:
        try:
            clone.__dict__.update(state)
        except Exception:
            pass
    return clone


def leaves(tree: Any) -> list[Any]:
    """All leaves of ``tree`` in the order ``tree_map`` visits them."""
    out: list[Any] = []
    tree_map(out.append, tree)
    return out
