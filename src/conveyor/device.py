"""Device stages: page-locking host batches and moving them to an accelerator.

::

    loader --host batch--> [loading thread: pin if needed -> .to(device, non_blocking) on a
                            side stream -> record an event]
           --(batch, event)--> bounded queue of ``depth``
           --> __next__: the consumer's current stream waits on the event, every CUDA
               tensor of the batch records that stream --> user

``pin`` page-locks a batch with torch's pinned allocator (one host copy).
``SlotPinner`` avoids that copy for the shared-memory transport: each slot is
registered with CUDA once (``cudaHostRegister`` on its mapping), so views over
it are pinned already. ``DevicePrefetcher`` wraps any iterable loader (torch's
or conveyor's) and is the stage behind ``DataLoader(..., device=...)``.

Both stages consume host batches only and hold no checkpoint state of their
own: ``DevicePrefetcher.state_dict()`` is the wrapped loader's state as of the
last batch the *consumer* received. Everything here imports without torch and
without CUDA; without CUDA, pinning is a no-op and the prefetcher is a plain
background thread that calls ``.to(device)``.
"""

from __future__ import annotations

import bisect
import collections
import copy
import dataclasses
import queue
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import _torch
from ._tree import leaves, tree_map

__all__ = [
    "DevicePrefetcher",
    "SlotPinner",
    "cuda_ready",
    "pin",
    "register_pinned",
    "to_device",
    "unregister_pinned",
]

_JOIN = 2.0  # seconds close() waits for the loading thread to leave a slow next()
_LIVENESS = 5.0  # seconds between checks that the loading thread still lives

_cuda: bool | None = None


def cuda_ready(*, import_torch: bool = False) -> bool:
    """True when torch is importable (imported, unless ``import_torch``) and CUDA is usable.

    >>> isinstance(cuda_ready(), bool)
    True
    """
    global _cuda
    if _cuda is None:
        torch = _torch.get() if import_torch else _torch.loaded()
        if torch is None:
            return False
        _cuda = bool(torch.cuda.is_available())
    return _cuda


# -- pinning ------------------------------------------------------------------


def _pin_leaf(obj: Any) -> Any:
    torch = sys.modules["torch"]
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cpu" and not obj.is_pinned():
            return obj.pin_memory()
        return obj
    if isinstance(obj, (str, bytes, type)):
        return obj
    fn = getattr(obj, "pin_memory", None)
    return fn() if callable(fn) else obj


def pin(batch: Any) -> Any:
    """Page-lock every CPU tensor of ``batch`` (and objects with ``pin_memory()``).

    Containers (dicts, lists, tuples, namedtuples) keep their type; other
    leaves are returned as they are. Without CUDA the batch comes back unchanged.

    >>> pin({"x": [1, 2], "name": "a"})
    {'x': [1, 2], 'name': 'a'}
    """
    if not cuda_ready():
        return batch
    return tree_map(_pin_leaf, batch)


def _span(obj: Any) -> tuple[int, int]:
    """(address, size in bytes) of a contiguous buffer: a Segment, mmap, memoryview, array or tensor."""
    torch = _torch.loaded()
    if torch is not None and isinstance(obj, torch.Tensor):
        if not obj.is_contiguous():
            raise ValueError("only a contiguous tensor can be registered")
        return obj.data_ptr(), obj.numel() * obj.element_size()
    import numpy as np

    buf = getattr(obj, "buf", obj)  # a transport Segment exposes its mapping as .buf
    arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if not arr.flags.c_contiguous:
        raise ValueError("only a contiguous array can be registered")
    ptr, size = int(arr.__array_interface__["data"][0]), int(arr.nbytes)
    del arr  # drop the buffer export, so the mapping can still be closed later
    return ptr, size


def _clear_cuda_error(cudart: Any) -> None:
    # A failed runtime call leaves a "last error" that torch would report at its next launch.
    fn = getattr(cudart, "cudaGetLastError", None)
    if fn is not None:
        fn()


def register_pinned(obj: Any) -> int | None:
    """Page-lock ``obj``'s memory in place (``cudaHostRegister``); returns its address.

    ``obj`` is a contiguous buffer: a transport ``Segment``, an ``mmap``, a
    ``memoryview``, a numpy array or a CPU tensor. Returns None without CUDA
    (nothing to do), raises ``RuntimeError`` when CUDA refuses. Undo with
    :func:`unregister_pinned` while the memory is still mapped and no copy
    from it is in flight.

    >>> import numpy as np
    >>> a = np.zeros(1 << 16, dtype=np.uint8)
    >>> ptr = register_pinned(a)  # None on a machine without CUDA
    >>> unregister_pinned(ptr)
    """
    if not cuda_ready(import_torch=True):
        return None
    ptr, size = _span(obj)
    if size == 0:
        return None
    torch = sys.modules["torch"]
    torch.cuda.init()
    cudart = torch.cuda.cudart()
    err = int(cudart.cudaHostRegister(ptr, size, 0))  # 0: cudaHostRegisterDefault
    if err != 0:
        _clear_cuda_error(cudart)
        raise RuntimeError(f"cudaHostRegister of {size} bytes at {ptr:#x} failed with cudaError {err}")
    return ptr


def unregister_pinned(ptr: int | None) -> None:
    """Undo :func:`register_pinned` (given the address it returned); None is a no-op."""
    if ptr is None or not cuda_ready():
        return
    cudart = sys.modules["torch"].cuda.cudart()
    err = int(cudart.cudaHostUnregister(ptr))
    if err != 0:
        _clear_cuda_error(cudart)
        raise RuntimeError(f"cudaHostUnregister at {ptr:#x} failed with cudaError {err}")


class SlotPinner:
    """Pins the transport's shared-memory slots once, so batches viewing them need no copy.

    The transport calls :meth:`register` when it maps a slot in the main
    process and :meth:`unregister` before it unmaps it; the loader calls the
    pinner on every batch: tensors lying inside a registered slot are already
    page-locked and pass through, any other CPU tensor goes through :func:`pin`.
    Without CUDA every method is a no-op and the batch passes unchanged. After
    the first refusal by CUDA (or past ``max_bytes``) registration stops and
    batches fall back to :func:`pin`.

    ``max_bytes`` caps the memory registered. ``fences=False`` makes :meth:`fence`
    return None: for a loader whose device stage (``device=``) copies each batch
    and keeps the host batch until that copy is done, so a slot cannot go back
    to its worker while a copy still reads it.

    >>> pinner = SlotPinner()
    >>> pinner.register(bytearray(4096)) == cuda_ready()  # registered where CUDA is usable
    True
    >>> pinner({"x": 1})
    {'x': 1}
    >>> pinner.close()
    """

    def __init__(self, *, max_bytes: int | None = None, fences: bool = True) -> None:
        self.max_bytes = max_bytes
        self.fences = fences
        self.spans: dict[int, tuple[int, int]] = {}  # id(segment) -> (address, size)
        self.registered_bytes = 0
        self.failed: str | None = None  # why registration was given up
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._lock = threading.Lock()

    def register(self, segment: Any) -> bool:
        """Register one mapped slot; True when its views are now pinned."""
        if self.failed is not None or not cuda_ready(import_torch=True):
            return False
        with self._lock:
            if id(segment) in self.spans:
                return True
            ptr, size = _span(segment)
            if self.max_bytes is not None and self.registered_bytes + size > self.max_bytes:
                return False
            try:
                register_pinned(segment)
            except RuntimeError as exc:
                self.failed = str(exc)
                return False
            self.spans[id(segment)] = (ptr, size)
            self.registered_bytes += size
            self._index()
        return True

    def unregister(self, segment: Any, *, sync: bool = False) -> None:
        """Unregister a slot before it is unmapped; a slot never registered is ignored.

        No copy from the slot may be in flight: true for a slot the transport
        retires (all its views were collected; :class:`DevicePrefetcher` keeps
        each host batch until its copy is done). Where views may still be
        copying (a dead worker's slots, closing), ``sync=True`` waits for the device first.
        """
        with self._lock:
            span = self.spans.pop(id(segment), None)
            if span is None:
                return
            self.registered_bytes -= span[1]
            self._index()
        if sync and cuda_ready():
            sys.modules["torch"].cuda.synchronize()
        unregister_pinned(span[0])

    def fence(self) -> Any:
        """A CUDA event recorded now on the current stream, or None (nothing registered, no CUDA).

        A registered slot whose views were all dropped goes back to its worker only once
        such an event has passed: a ``.to("cuda", non_blocking=True)`` queued from the slot
        on this stream still reads it, and the worker must not write the next batch there
        first. torch's pinned allocator gives its own blocks the same guarantee by
        recording an event on the copy's stream; memory registered with
        ``cudaHostRegister`` gets none from torch. Copies queued on another stream than
        the one current where the loader's ``next()`` runs are not covered.
        """
        if not self.fences or not self.spans or not cuda_ready():
            return None
        event = sys.modules["torch"].cuda.Event()
        event.record()
        return event

    def _index(self) -> None:
        ordered = sorted(self.spans.values())
        self._starts = [p for p, _ in ordered]
        self._ends = [p + n for p, n in ordered]

    def covers(self, ptr: int, nbytes: int) -> bool:
        """True when ``[ptr, ptr + nbytes)`` lies inside one registered slot."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        return i >= 0 and ptr + nbytes <= self._ends[i]

    def __call__(self, batch: Any) -> Any:
        """The batch with every CPU tensor page-locked, copying only those outside the slots."""
        if not cuda_ready():
            return batch
        if not self.spans:
            return tree_map(_pin_leaf, batch)
        torch = sys.modules["torch"]

        def leaf(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                storage = obj.untyped_storage()
                if self.covers(storage.data_ptr(), storage.nbytes()):
                    return obj
            return _pin_leaf(obj)

        return tree_map(leaf, batch)

    pin = __call__

    def close(self) -> None:
        """Unregister every slot (waiting for the device first: copies may still read them)."""
        with self._lock:
            spans, self.spans = list(self.spans.values()), {}
            self.registered_bytes = 0
            self._index()
        if spans and cuda_ready():
            sys.modules["torch"].cuda.synchronize()
        for ptr, _ in spans:
            try:
                unregister_pinned(ptr)
            except RuntimeError:
                pass


# -- moving -------------------------------------------------------------------


def _move_leaf(obj: Any, device: Any, non_blocking: bool) -> Any:
    torch = _torch.loaded()
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (str, bytes, type)) or obj is None:
        return obj
    fn = getattr(obj, "to", None)
    if not callable(fn):
        return obj
    try:
        return fn(device, non_blocking=non_blocking)
    except TypeError:  # a .to() without non_blocking
        return fn(device)


def to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor (and object with ``.to()``) moved to ``device``.

    Containers keep their type; numpy arrays, numbers and strings stay as they
    are. ``device=None`` returns the batch unchanged.

    >>> to_device({"n": 3, "s": "a"}, "cpu")
    {'n': 3, 's': 'a'}
    """
    if device is None:
        return batch
    return tree_map(lambda obj: _move_leaf(obj, device, non_blocking), batch)


def _tensors(batch: Any, depth: int = 2) -> Iterator[Any]:
    """Every tensor of a batch, looking one level into plain objects (dataclass-like batches)."""
    torch = _torch.loaded()
    if torch is None:
        return
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor):
            yield leaf
        elif depth > 0 and not isinstance(leaf, (str, bytes, type)):
            attrs = getattr(leaf, "__dict__", None)
            if attrs is None and dataclasses.is_dataclass(leaf):
                attrs = {f.name: getattr(leaf, f.name) for f in dataclasses.fields(leaf)}
            if attrs:
                yield from _tensors(list(attrs.values()), depth - 1)


# -- prefetching ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Item:
    batch: Any
    event: Any  # torch.cuda.Event recorded after the copy, or None off CUDA
    host: Any  # the host batch the copy reads: kept alive until the event completes
    state: Any  # the wrapped loader's state right after this batch was pulled


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


@dataclass(frozen=True, slots=True)
class _NoState:
    error: BaseException


_END = object()


@dataclass
class _Shared:
    """What the loading thread and the consumer share: never the consumer itself."""

    queue: queue.Queue[Any]
    stop: threading.Event = field(default_factory=threading.Event)
    retiring: collections.deque[tuple[Any, Any]] = field(default_factory=collections.deque)


def _snapshot(state_fn: Callable[[], Any] | None) -> Any:
    if state_fn is None:
        return None
    try:
        return state_fn()
    except Exception as exc:  # a loader that cannot checkpoint: say so when asked
        return _NoState(exc)


def _close_source(source: Any) -> None:
    """End an iterator abandoned mid-epoch (its workers, for a loader that has them). A torch
    iterator with persistent workers is the loader's own, reused every epoch: left alone."""
    if getattr(source, "_persistent_workers", False):
        return
    fn = getattr(source, "close", None) or getattr(source, "_shutdown_workers", None)
    if callable(fn):
        try:
            fn()
        except Exception:
            pass


def _load(source: Iterator[Any], shared: _Shared, stage: Callable[[Any], tuple[Any, Any, Any]],
          state_fn: Callable[[], Any] | None) -> None:
    """The loading thread: pull, move, hand over, until the epoch ends or ``stop`` is set."""
    q, stop = shared.queue, shared.stop
    ended = False
    try:
        while not stop.is_set():
            try:
                batch = next(source)
            except StopIteration:
                ended = True  # the iterator finished its epoch itself: nothing to close
                q.put(_END)
                return
            if stop.is_set():
                return
            state = _snapshot(state_fn)
            out, event, host = stage(batch)
            del batch
            q.put(_Item(out, event, host, state))
            del out, event, host
    except BaseException as exc:
        if not stop.is_set():
            q.put(_Failed(exc))
    finally:
        if not ended:
            _close_source(source)


def _drain(q: queue.Queue[Any]) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def _shutdown(shared: _Shared, thread: threading.Thread) -> None:
    shared.stop.set()
    _drain(shared.queue)  # unblocks a put() on a full queue
    if thread is not threading.current_thread() and thread.ident is not None:
        thread.join(_JOIN)
        if thread.is_alive():
            warnings.warn(f"DevicePrefetcher: the loading thread is still inside the loader's next() after "
                          f"{_JOIN:.0f} s; it will end when that call returns", RuntimeWarning, stacklevel=2)
    _drain(shared.queue)
    while shared.retiring:  # copies of batches already handed out must finish reading their host memory
        event, _host = shared.retiring.popleft()
        event.synchronize()


class _Epoch:
    """One pass of a :class:`DevicePrefetcher`: what ``iter(prefetcher)`` returns."""

    def __init__(self, owner: DevicePrefetcher, source: Iterator[Any]) -> None:
        self.owner = owner
        self.device = owner.device
        self.depth = owner.depth
        self.done = False
        self.consumed = 0
        self.shared = _Shared(queue.Queue(maxsize=owner.depth))
        state_fn = owner._state_fn if owner.track_state else None
        owner._state = _snapshot(state_fn) if state_fn is not None else None
        self.thread = threading.Thread(target=_load, args=(source, self.shared, owner._stage, state_fn),
                                       name="conveyor-device", daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, self.shared, self.thread)
        self.thread.start()

    def __iter__(self) -> _Epoch:
        return self

    def __len__(self) -> int:
        return len(self.owner)

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        item = self._get()
        if item is _END:
            self.owner._state = None  # the wrapped loader's live state is right again
            self._end()
            raise StopIteration
        if isinstance(item, _Failed):
            self._end()
            err = item.error
            err.add_note("(raised in the DevicePrefetcher's loading thread)")
            raise err
        self.consumed += 1
        if self.owner.track_state:
            self.owner._state = item.state
        if item.event is not None:
            self._handoff(item)
        return item.batch

    def _get(self) -> Any:
        q = self.shared.queue
        while True:
            try:
                return q.get(timeout=_LIVENESS)
            except queue.Empty:
                if not self.thread.is_alive() and q.empty():
                    self._end()
                    raise RuntimeError("DevicePrefetcher: the loading thread ended without a result") from None

    def _handoff(self, item: _Item) -> None:
        torch = sys.modules["torch"]
        current = torch.cuda.current_stream(self.device)
        current.wait_event(item.event)  # the consumer's work starts after the copy, on the GPU
        for t in _tensors(item.batch):
            if t.is_cuda:
                t.record_stream(current)  # memory allocated on the side stream is used here too
        retiring = self.shared.retiring
        retiring.append((item.event, item.host))
        while retiring and (len(retiring) > self.depth + 1 or retiring[0][0].query()):
            event, _host = retiring.popleft()
            event.synchronize()

    def _end(self) -> None:
        self.done = True
        self._finalizer()

    def close(self) -> None:
        """Stop the loading thread and close the wrapped iterator. Idempotent."""
        self._end()


class DevicePrefetcher:
    """Batches of any loader, copied to ``device`` ahead of time by a background thread.

    On CUDA the thread pins each batch that is not page-locked yet, copies it
    with ``non_blocking=True`` on a side stream and records an event; ``next()``
    makes the caller's current stream wait on that event and records the
    batch's tensors on it, so the copy overlaps the previous step and the
    caching allocator never reuses the memory early. At most ``depth`` batches
    wait on the device (plus one in the thread's hands). Off CUDA (``"cpu"``,
    other devices, or ``device=None``) it is a plain prefetch thread calling
    ``.to(device)``.

    ``len``, ``sampler``, ``dataset``, ``batch_size`` and other public
    attributes are the wrapped loader's. ``state_dict()`` is the wrapped
    loader's state as of the last batch the consumer received: the thread
    snapshots ``loader.state_dict()`` after every batch it pulls. A loader whose
    ``state_dict()`` does not change as it yields (or has none) gets no such
    guarantee; ``track_state=False`` skips the snapshots and passes the live
    state through, which runs up to ``depth + 1`` batches ahead.

    >>> loader = [{"x": i} for i in range(3)]
    >>> with DevicePrefetcher(loader, "cpu") as batches:
    ...     [b["x"] for b in batches]
    [0, 1, 2]
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: Any = "cuda",
        depth: int = 2,
        non_blocking: bool = True,
        *,
        pin_memory: bool = True,
        pinner: Callable[[Any], Any] | None = None,
        track_state: bool | None = None,
        state_fn: Callable[[], Any] | None = None,
    ) -> None:
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be a positive int, but got depth={depth!r}")
        self.loader = loader
        self.depth = depth
        self.non_blocking = non_blocking
        self.device: Any = None
        self.cuda = False
        if device is not None:
            torch = _torch.get()
            if torch is None:
                if str(device) != "cpu":
                    raise ValueError(f"device={device!r} needs torch; without it only device='cpu' or None works")
            else:
                dev = torch.device(device)
                if dev.type == "cuda":
                    if not torch.cuda.is_available():
                        raise RuntimeError(f"device={device!r} but CUDA is not available here; use device='cpu'")
                    if dev.index is None:
                        dev = torch.device("cuda", torch.cuda.current_device())
                    self.cuda = True
                self.device = dev
        self.pin_memory = pin_memory and self.cuda
        self.pinner = pinner if pinner is not None else pin
        self._state_fn = state_fn if state_fn is not None else getattr(loader, "state_dict", None)
        if track_state is None:
            track_state = callable(self._state_fn)
        if track_state and not callable(self._state_fn):
            raise ValueError("track_state=True needs a loader with state_dict() or a state_fn")
        self.track_state = bool(track_state)
        self._state: Any = None  # snapshot for the consumer's position; None: ask the loader
        self._stream: Any = None
        self._epochs: weakref.WeakSet[_Epoch] = weakref.WeakSet()  # the epochs running
        self._closed = False

    # -- iteration ------------------------------------------------------------
    def __iter__(self) -> _Epoch:
        """A new epoch (the previous one of this prefetcher is closed first)."""
        return self.wrap(iter(self.loader))

    def wrap(self, source: Iterator[Any], *, exclusive: bool = True) -> _Epoch:
        """Prefetch from an iterator already made (how ``DataLoader(device=...)`` uses it);
        ``exclusive``: close the epochs this prefetcher is running first (else they go on, as
        two live iterators of a loader without persistent workers do).

        >>> [b for b in DevicePrefetcher([], "cpu").wrap(iter([1, 2]))]
        [1, 2]
        """
        if self._closed:
            _close_source(source)
            raise RuntimeError("this DevicePrefetcher is closed")
        if exclusive:
            self._close_epoch()
        if self.cuda and self._stream is None:
            self._stream = sys.modules["torch"].cuda.Stream(device=self.device)
        epoch = _Epoch(self, source)
        self._epochs.add(epoch)
        return epoch

    def _stage(self, batch: Any) -> tuple[Any, Any, Any]:
        """(device batch, event or None, host batch): runs in the loading thread."""
        if not self.cuda:
            return to_device(batch, self.device), None, None
        torch = sys.modules["torch"]
        stream = self._stream
        with torch.cuda.stream(stream):
            host = self.pinner(batch) if self.pin_memory else batch
            out = to_device(host, self.device, self.non_blocking)
            event = torch.cuda.Event()
            event.record(stream)
        return out, event, host

    def _close_epoch(self) -> None:
        for epoch in list(self._epochs):
            epoch.close()
        self._epochs.clear()

    # -- what passes through ----------------------------------------------------
    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def sampler(self) -> Any:
        return self.loader.sampler  # type: ignore[attr-defined]

    @property
    def dataset(self) -> Any:
        return self.loader.dataset  # type: ignore[attr-defined]

    @property
    def batch_size(self) -> Any:
        return self.loader.batch_size  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def state_dict(self) -> Any:
        """The wrapped loader's state as of the last batch the consumer received."""
        state = self._state
        if state is None:
            if self._state_fn is None:
                raise TypeError(f"{type(self.loader).__name__} has no state_dict()")
            return self._state_fn()
        if isinstance(state, _NoState):
            raise state.error
        return copy.deepcopy(state)

    def reset(self) -> None:
        """Close the running epoch and forget its position: the loader's own state counts again."""
        self._close_epoch()
        self._state = None

    def load_state_dict(self, state: Any) -> None:
        """Close the running epoch and hand ``state`` to the wrapped loader."""
        self.reset()
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]

    # -- shutdown ---------------------------------------------------------------
    def close(self) -> None:
        """Stop the loading thread, close the wrapped iterator. Idempotent; the loader stays open."""
        self._closed = True
        self._close_epoch()

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
