"""Walking nested batches: tuples, lists, dicts, namedtuples and leaves.

Used by the transport (encode/decode), the numpy converter and the device
stage, so every stage agrees on what a container is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Apply ``fn`` to every leaf, rebuilding containers of the same type.

    >>> tree_map(lambda x: x * 2, {"a": [1, (2, 3)]})
    {'a': [2, (4, 6)]}
    """
    if isinstance(tree, (str, bytes)):
        return fn(tree)
    if isinstance(tree, Mapping):
        items = {k: tree_map(fn, v) for k, v in tree.items()}
        if type(tree) is dict:
            return items
        try:
            return type(tree)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    if is_namedtuple(tree):
        return type(tree)(*(tree_map(fn, v) for v in tree))
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, v) for v in tree)
    if isinstance(tree, list):
        return [tree_map(fn, v) for v in tree]
    return fn(tree)


def leaves(tree: Any) -> list[Any]:
    """All leaves of ``tree`` in the order ``tree_map`` visits them."""
    out: list[Any] = []
    tree_map(out.append, tree)
    return out


def is_sequence(obj: object) -> bool:
    return isinstance(obj, Sequence) and not isinstance(obj, (str, bytes))
