"""Process-wide: torch's data utilities made to answer conveyor's workers.

- ``route_torch_worker_info``: in a process with thread workers, the body of torch's
  ``get_worker_info`` (its ``__code__``) becomes a call of a router set in torch's worker
  module (``_conveyor_worker_info``); where its body is not the plain one, the module
  attribute is replaced instead.
- ``give_torch_info``: a process worker's info set as torch's ``_worker_info``.
- ``watch_torch_import``: an import hook first on ``sys.meta_path`` that does the above the
  moment ``torch.utils.data`` is imported, in a worker that started without torch.
- ``route_torch_collate``: in a process worker, torch's ``default_collate_fn_map`` entry for
  tensors becomes conveyor's ``collate_tensor_fn``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import _torch
from .imports import find_wrapped, insert_first

__all__ = ["give_torch_info", "route_torch_collate", "route_torch_worker_info", "serve_from",
           "watch_torch_import"]

# where the workers' infos are kept (executors.info, which names them through ``serve_from``)
_thread_info: Any = threading.local()
_process_info_of: Callable[[], Any] = lambda: None


def serve_from(thread_info: Any, process_info: Callable[[], Any]) -> None:
    """Answer torch with these: a thread-local whose ``info`` is a thread worker's, and the
    process worker's info."""
    global _thread_info, _process_info_of
    _thread_info, _process_info_of = thread_info, process_info


def give_torch_info(tworker: Any, info: Any) -> None:
    try:
        tworker._worker_info = tworker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset)
    except Exception:  # pragma: no cover - torch internals moved
        pass


class _TorchDataImported:
    """An import hook for a worker that started without torch, whose dataset imports it
    later and asks ``torch.utils.data.get_worker_info()`` (to shard a stream, say): right
    after ``torch.utils.data`` has run, a process worker's info is given to torch, and
    thread workers' routing is put in place. Without it each worker hears ``None`` and
    reads the whole stream: every sample comes once per worker."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch.utils.data":
            return None
        return find_wrapped(self, fullname, path, target, _torch_data_imported)


_torch_hook = _TorchDataImported()
_route_threads = False  # thread workers have started: route torch's get_worker_info


def watch_torch_import() -> None:
    insert_first(_torch_hook)


def _torch_data_imported(tdata: Any) -> None:
    """``torch.utils.data`` has just run (torch itself may still be importing: nothing here
    waits for it)."""
    tworker = sys.modules.get("torch.utils.data._utils.worker")
    if tworker is None:  # pragma: no cover - torch internals moved
        return
    try:
        info = _process_info_of()
        if info is not None:
            give_torch_info(tworker, info)
        if _route_threads:
            _route(tdata, tworker)
    except Exception:  # pragma: no cover - torch internals moved: never fail the user's import
        pass


_routed = threading.Lock()


def route_torch_worker_info() -> None:
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
        watch_torch_import()
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
    the module attribute would leave that name answering None in every thread worker, so each
    would read the whole stream. The function object itself is changed instead: its body, a
    bare ``return _worker_info``, becomes a call of the router, set in torch's module.
    A torch whose function has another body gets the module attribute replaced.
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


def route_torch_collate(torch: Any) -> None:
    """Make torch's ``default_collate`` stack tensors with conveyor's ``collate_tensor_fn`` in
    this worker process (only here: the process is conveyor's).

    Inside a worker, torch's own version allocates a fresh torch shared-memory segment for
    every batch (it expects torch's pickling to hand it over); a collate_fn that calls it
    would pay for that segment and then for a copy into conveyor's slot. Conveyor's version
    gives the same tensor, written straight into the batch's pre-faulted slot.
    """
    try:
        from torch.utils.data._utils import collate as torch_collate
    except ImportError:  # pragma: no cover - a torch without the module
        return
    table = getattr(torch_collate, "default_collate_fn_map", None)
    # only torch's own entry: a function the user registered there (padding, say) stays
    if isinstance(table, dict) and table.get(torch.Tensor) is getattr(torch_collate, "collate_tensor_fn", None):
        from ..collate import collate_tensor_fn

        table[torch.Tensor] = collate_tensor_fn
