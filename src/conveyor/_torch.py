"""Optional torch: conveyor's core runs on numpy alone.

Everything that touches torch asks this module first, so a machine without
torch imports conveyor and gets numpy batches.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

_available: bool | None = None


def available() -> bool:
    """True when torch can be imported (without importing it)."""
    global _available
    if _available is None:
        _available = "torch" in sys.modules or importlib.util.find_spec("torch") is not None
    return _available


def get() -> ModuleType | None:
    """The torch module, imported on first use, or None without torch."""
    if not available():
        return None
    import torch

    return torch


def loaded() -> ModuleType | None:
    """torch if the process already imported it, else None (never imports)."""
    return sys.modules.get("torch")


def is_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_generator(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Generator)
