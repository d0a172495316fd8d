"""Worker info: who the current worker is (``get_worker_info``), for every executor.

A process worker's info is the process's; a thread worker's is its thread's. Datasets
written for torch ask ``torch.utils.data.get_worker_info()``: a process worker's info is
given to torch too, and thread workers route torch's function to theirs.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any

from .. import _torch
from .._platform import torch_hooks

__all__ = ["WorkerInfo", "get_worker_info", "set_info", "thread_worker_info"]


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker.

    >>> info = get_worker_info()  # None in the main process
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    kind: str = "process"


_process_info: WorkerInfo | None = None
_thread_info = threading.local()


def get_worker_info() -> WorkerInfo | None:
    """The current worker's id, count, seed and dataset copy; ``None`` in the main process.

    Use it in an ``IterableDataset.__iter__`` to shard work between workers:

    >>> info = get_worker_info()
    >>> start = 0 if info is None else info.id
    """
    info = getattr(_thread_info, "info", None)
    if info is not None:
        return info
    if _process_info is not None:
        return _process_info
    # inside a worker of torch's own DataLoader (a dataset written with conveyor's names,
    # loaded by torch): torch's answer, or each of its workers would read the whole stream
    tworker = sys.modules.get("torch.utils.data._utils.worker")
    return getattr(tworker, "_worker_info", None) if tworker is not None else None


def thread_worker_info() -> WorkerInfo | None:
    """This thread's worker info (a thread worker's, and its fetch threads'); None elsewhere."""
    return getattr(_thread_info, "info", None)


def set_info(info: WorkerInfo | None, *, thread: bool) -> None:
    global _process_info
    if thread:
        _thread_info.info = info
        if info is not None:
            torch_hooks.route_torch_worker_info()
        return
    _process_info = info
    torch = _torch.loaded()
    if torch is not None and info is not None:
        # Datasets written for torch ask torch.utils.data.get_worker_info().
        try:
            from torch.utils.data._utils import worker as tworker
        except ImportError:  # pragma: no cover - torch without its data utilities
            return
        torch_hooks.give_torch_info(tworker, info)
    elif info is not None:
        torch_hooks.watch_torch_import()  # a dataset that imports torch once it runs asks torch too


torch_hooks.serve_from(_thread_info, lambda: _process_info)
