"""Optional torch: conveyor's core runs on numpy alone.

Everything that touches torch asks this module first, so a machine without
torch imports conveyor and gets numpy batches.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from types import ModuleType

_available: bool | None = None


def available() -> bool:
    """True when torch can be imported (without importing it)."""
    global _available
    if _available is None:
        if "torch" in sys.modules:  # None there blocks its import
            _available = sys.modules["torch"] is not None
        else:
            _available = importlib.util.find_spec("torch") is not None
    return _available


def get() -> ModuleType | None:
    """The torch module, imported on first use, or None without torch."""
    if not available():
        return None
    import torch

    return torch


def import_s() -> float | None:
    """Import torch now, if installed and not imported yet: the seconds that took (None:
    nothing to import). Waits for an import under way in another thread."""
    if not available():
        return None
    if "torch" in sys.modules:
        loaded()
        return None
    t0 = time.perf_counter()
    get()
    return time.perf_counter() - t0


_ready: ModuleType | None = None  # torch, once seen whole


def loaded() -> ModuleType | None:
    """torch if the process has imported it, else None (never starts an import).

    torch is in ``sys.modules`` from the moment its import starts, ~1 s before it has
    ``Tensor`` or ``random``. A thread that finds it there while another thread imports it
    (a spawned worker's first collate, while its fetch threads seed the next samples) waits
    for that import to end instead of reading a half-made module."""
    mod = sys.modules.get("torch")
    if mod is None or mod is _ready:
        return mod
    return _whole()


def _whole() -> ModuleType:
    global _ready
    import torch  # returns at once when done; waits for an import under way in another thread

    if not getattr(getattr(torch, "__spec__", None), "_initializing", False):
        _ready = torch  # (still partial only in the thread importing it, if that asked)
    return torch


def is_tensor(obj: object) -> bool:
    torch = loaded()
    return torch is not None and isinstance(obj, torch.Tensor)


def is_generator(obj: object) -> bool:
    torch = loaded()
    return torch is not None and isinstance(obj, torch.Generator)


def is_datapipe(obj: object) -> bool:
    """Is ``obj`` one of torch's IterDataPipes (deprecated in torch, still accepted by its loader)?"""
    mod = sys.modules.get("torch.utils.data.datapipes.datapipe")
    pipe = getattr(mod, "IterDataPipe", None) if mod is not None else None
    return pipe is not None and isinstance(obj, pipe)


def shard_datapipe(pipe: object, worker_id: int, num_workers: int) -> None:
    """Apply a worker's sharding to its copy of ``pipe``, as torch's loader does in its workers:
    across the ranks of torch.distributed first, then across the workers of each rank."""
    torch = get()
    assert torch is not None
    from torch.utils.data import graph_settings

    world, rank = 1, 0
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    graph_settings.apply_sharding(pipe, num_workers * world, worker_id * world + rank)


def seed_datapipe(pipe: object, seed: int) -> None:
    """Seed ``pipe``'s random operations (its shuffles) alike in every worker of an epoch, so
    that the shards are cut from one order, as torch's loader does."""
    torch = get()
    assert torch is not None
    from torch.utils.data import graph_settings

    graph_settings.apply_random_seed(pipe, torch.Generator().manual_seed(seed))
