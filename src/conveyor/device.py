"""Device stages: pinning host batches and moving them to an accelerator.

Both consume host batches only and hold no checkpoint state.
"""

from __future__ import annotations

import sys
from typing import Any

from ._tree import tree_map

__all__ = ["pin"]


def pin(batch: Any) -> Any:
    """Page-lock every CPU tensor of ``batch`` (objects with ``pin_memory()`` too)."""
    torch = sys.modules.get("torch")

    def leaf(obj: Any) -> Any:
        if torch is not None and isinstance(obj, torch.Tensor):
            return obj.pin_memory() if obj.device.type == "cpu" and not obj.is_pinned() else obj
        fn = getattr(obj, "pin_memory", None)
        return fn() if callable(fn) else obj

    return tree_map(leaf, batch)
