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
from .._imports import find_wrapped

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
            _route_torch_worker_info()
        return
    _process_info = info
    torch = _torch.loaded()
    if torch is not None and info is not None:
        # Datasets written for torch ask torch.utils.data.get_worker_info().
        try:
            from torch.utils.data._utils import worker as tworker
        except ImportError:  # pragma: no cover - torch without its data utilities
            return
        _give_torch_info(tworker, info)
    elif info is not None:
        _watch_torch_import()  # a dataset that imports torch once it runs asks torch too


def _give_torch_info(tworker: Any, info: WorkerInfo) -> None:
    try:
        tworker._worker_info = tworker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset)
    except Exception:  # pragma: no cover - torch internals moved
        pass


class _TorchDataImported:
    """An import hook for a worker that started without torch, whose dataset imports it
    later and asks ``torch.utils.data.get_worker_info()`` (to shard a stream, say): right
    after ``torch.utils.data`` has run, a process worker's info is given to torch, and
    thread workers' routing is put in place. Without it each worker heard ``None`` and
    read the whole stream: every sample came once per worker."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch.utils.data":
            return None
        return find_wrapped(self, fullname, path, target, _torch_data_imported)


_torch_hook = _TorchDataImported()
_route_threads = False  # thread workers have started: route torch's get_worker_info


def _watch_torch_import() -> None:
    if _torch_hook not in sys.meta_path:
        sys.meta_path.insert(0, _torch_hook)


def _torch_data_imported(tdata: Any) -> None:
    """``torch.utils.data`` has just run (torch itself may still be importing: nothing here
    waits for it)."""
    tworker = sys.modules.get("torch.utils.data._utils.worker")
    if tworker is None:  # pragma: no cover - torch internals moved
        return
    try:
        if _process_info is not None:
            _give_torch_info(tworker, _process_info)
        if _route_threads:
            _route(tdata, tworker)
    except Exception:  # pragma: no cover - torch internals moved: never fail the user's import
        pass


_routed = threading.Lock()


def _route_torch_worker_info() -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer in thread workers too.

    torch keeps one worker info per process; thread workers share a process, so conveyor
    routes torch's function (once, on the first thread worker): in a thread of conveyor's
    it returns that worker's info, anywhere else exactly what torch's returns. Where torch
    is not imported yet, it is routed the moment it is (``_TorchDataImported``).
    """
    global _route_threads
    torch = _torch.loaded()
    if torch is None:
        _route_threads = True
        _watch_torch_import()
        return
    try:
        import torch.utils.data as tdata
        from torch.utils.data._utils import worker as tworker
    except ImportError:  # pragma: no cover - torch without its data utilities
        return
    _route(tdata, tworker)


def _ask_conveyor() -> Any:
    """The body torch's get_worker_info takes on (``_route``); names resolve in torch's module."""
    return globals()["_conveyor_worker_info"]()  # torch's module globals: set there by _route


def _route(tdata: Any, tworker: Any) -> None:
    """Route torch's get_worker_info to thread workers' infos.

    The usual idiom, ``from torch.utils.data import get_worker_info`` at the top of the
    dataset's module, binds torch's function object before any worker starts: replacing
    the module attribute left that name answering None in every thread worker, so each
    read the whole stream. The function object itself is changed instead: its body, a
    bare ``return _worker_info``, becomes a call of the router, set in torch's module.
    A torch whose function has another body gets the module attribute replaced, as before.
    """
    with _routed:
        if getattr(tworker, "_conveyor_worker_info", None) is not None:
            return
        original = tworker.get_worker_info
        if getattr(original, "_conveyor", False):
            return

        def answer() -> Any:
            info = getattr(_thread_info, "info", None)
            if info is None:
                return tworker._worker_info if plain else original()
            mine = getattr(_thread_info, "torch_info", None)
            if mine is None or mine[0] is not info:
                mine = _thread_info.torch_info = (info, tworker.WorkerInfo(
                    id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset))
            return mine[1]

        code = getattr(original, "__code__", None)
        plain = (code is not None and code.co_names == ("_worker_info",) and code.co_argcount == 0
                 and not code.co_freevars and not code.co_kwonlyargcount)
        if plain:
            tworker._conveyor_worker_info = answer
            original.__code__ = _ask_conveyor.__code__
            return
        answer.__doc__ = original.__doc__
        answer.__wrapped__ = original  # type: ignore[attr-defined]
        answer._conveyor = True  # type: ignore[attr-defined]
        tworker.get_worker_info = answer
        if getattr(tdata, "get_worker_info", None) is original:
            tdata.get_worker_info = answer
