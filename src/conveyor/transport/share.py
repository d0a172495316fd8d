"""A dataset's numpy buffers reach spawned and forkserver workers by reference, not by pickle.

    main process: spec ──> ShipPickler ──┬─ array in a shared segment ──> its descriptor + layout
                                         ├─ array mapped from a file  ──> path + offset + layout
                                         ├─ other large array         ──> copied once into a segment
                                         └─ everything else           ──> pickled as usual
    worker:       unpickles ──> maps the segment (or the file) copy-on-write ──> the same arrays

A spawned or forkserver worker receives its dataset pickled, so a dataset of large arrays
pickled as usual goes through a pipe into every worker, one after another (the parent's write
of a start payload blocks until that child has read it): the start grows with the data, and
each worker holds its own copy. Here the arrays travel as a few hundred bytes each.

The segments have no name: memfd_create on Linux (a shm_open'd name unlinked at once
elsewhere). A descriptor travels to each worker as multiprocessing passes descriptors at a
process's start (``DupFd``: inherited under spawn, sent over the fork server's socket under
forkserver). Nothing is ever left in /dev/shm, whatever ends the processes (SIGKILL to the
whole group included): the memory goes with the last mapping and descriptor.

Who holds a segment:
- conveyor's containers (``ArrayDataset``, ``StringArray``, ``TensorDataset``, ...) move their
  arrays into segments of their own the first time they are sent to such workers (``adopt``)
  and keep the shared copy as their data, so the data exists once, for the main process and
  every worker, for as long as the container lives;
- any other array of a dataset (a user's own class holding numpy arrays) is copied into a
  segment held by the pool of workers (``Registry``), once for all its workers, and dropped
  with it: the user's array stays theirs, and a later pool copies it afresh (it may change).

The copy into a segment is written through its descriptor by a thread of its own while the
workers start (``move``): a worker receives the segment at once with the copy's progress map.
A container's arrays travel marked ``Guarded``: the container checks each read's chunks in
the worker (``guard.rows``) and reads whatever is written already; any other array is read
only once its bytes are all written (``guard.whole``). The main process's container reads
its own arrays until the copy is whole, then takes the copy as its data.

Workers map with MAP_PRIVATE: they read the shared pages, and a write (a dataset that edits
its arrays in place) stays private to the worker, as it does in a forked one.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import threading
import time
import warnings
import weakref
from multiprocessing import reduction
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from . import guard, move, spans
from . import segment as segments
from .move import pending, place, settle
from .spans import located

__all__ = ["ship_container", "MIN_BYTES", "Guarded", "Registry", "ShipLog", "Shipped", "adopt", "adopt_one", "located", "pending", "place",
           "revive", "settle"]

# arrays smaller than this are pickled as they are: a mapping per worker (a descriptor, a
# page at least) costs more than copying a few hundred kilobytes
MIN_BYTES = 1 << 20
# distinct segments and files one worker's start may pass: the fork server takes at most
# 256 descriptors a process (multiprocessing.forkserver.MAXFDS_TO_SEND), and each is an open
# file in the worker until it is mapped
MAX_REFS = 64

_warned = False


def _shareable(a: Any) -> bool:
    return type(a) in (np.ndarray, np.memmap) and not a.dtype.hasobject


def _movable(a: Any) -> bool:
    return (_shareable(a) and a.nbytes >= MIN_BYTES and located(a) is None and _file_source(a) is None
            and segments.available())


def _warn_once(why: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"conveyor: the dataset's arrays could not be placed in shared memory ({why}); "
                      "each spawned or forkserver worker receives a pickled copy instead",
                      RuntimeWarning, stacklevel=4)


def adopt_one(a: Any) -> Any:
    """``a`` moved into a segment of its own when it is a large numpy array that spawned workers
    would otherwise receive pickled; anything else (a tensor, a small or file-mapped array, one
    already shared) as it is."""
    if not _movable(a):
        return a
    try:
        return place(a)
    except (OSError, ValueError) as exc:
        _warn_once(str(exc))
        return a


def adopt(arrays: tuple[Any, ...], then: Any = None) -> tuple[Any, ...]:
    """Each of ``arrays`` through ``adopt_one`` (the same tuple when none moved).

    With ``then``, the moves are written in a thread while the workers start: ``arrays``
    come back as they are (the pickler sends each one's copy, ``pending``), and
    ``then(copies)`` runs once every copy is whole (at once where nothing is deferred), for
    the caller to take them as its data: the caller does not assign what comes back (the
    thread may have called ``then`` already)."""
    if then is not None and move.deferrable():
        if _adopt_later(arrays, then):
            return arrays
    out = tuple(adopt_one(a) for a in arrays)
    if all(x is y for x, y in zip(out, arrays)):
        return arrays
    if then is not None:
        then(out)
    return out


def _adopt_later(arrays: tuple[Any, ...], then: Any) -> bool:
    """Start the moves of ``adopt(arrays, then)``; False where nothing is to move now."""
    moves = []
    copies = list(arrays)
    for k, a in enumerate(arrays):
        if pending(a) is not None:
            return True  # moving already (a second start before the first move is whole)
        if not _movable(a):
            continue
        try:
            out, m = move.copy_soon(a)
        except (OSError, ValueError) as exc:
            _warn_once(str(exc))
            continue
        moves.append(m)
        copies[k] = out
    if not moves:
        return False
    for a, out in zip(arrays, copies):
        if out is not a:
            move.track(a, out)
    done = tuple(copies)
    move.start(moves, lambda: then(done), hold=True)
    return True


class Guarded:
    """An array a container sends (``_conveyor_ship_``) whose reads it checks itself in the
    worker (``guard.rows``): while it is still being copied, the worker maps it at once
    instead of waiting for the whole copy. Pickled by any other pickler: the array itself."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (_same, (self.array,))


def _same(a: Any) -> Any:
    return a


def ship_container(owner: Any, name: str, then: Any) -> tuple[Any, ...]:
    """What a container whose rows are the arrays in its attribute ``name`` sends a spawned
    or forkserver worker (``_conveyor_ship_``): the arrays moved, once, into shared memory
    (``adopt``: ``then(copies)`` once they are whole), its other attributes as they are, and
    the arrays marked as read through its own checks while they are being copied."""
    arrays = tuple(getattr(owner, name))
    adopt(arrays, then=then)
    state = dict(owner.__dict__)
    state[name] = tuple(Guarded(a) for a in arrays)
    return (revive, (type(owner), state))


def revive(cls: type, state: dict[str, Any]) -> Any:
    """An object of ``cls`` with ``state`` as its attributes (a container as its
    ``_conveyor_ship_`` sends it)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


# -- arrays mapped from files -------------------------------------------------------------

def _root_map(a: np.ndarray) -> np.memmap | None:
    """The np.memmap ``a`` views (np.load(mmap_mode=...) gives one): the array right over
    the mmap, whose first byte is the file's byte ``offset``."""
    b: Any = a
    while isinstance(b, np.ndarray):
        if isinstance(b, np.memmap) and isinstance(b.base, mmap.mmap):
            return b
        b = b.base
    return None


def _mapped_inode(address: int) -> tuple[int, int] | None:
    """(device, inode) of the file mapped at ``address`` in this process, as the kernel
    tells it (Linux), or None where it cannot tell."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                span, _, _, dev, inode = line.split(None, 5)[:5]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= address < hi:
                    major, minor = (int(x, 16) for x in dev.split(":"))
                    return os.makedev(major, minor), int(inode)
    except (OSError, ValueError):
        return None
    return None


def _file_source(a: np.ndarray) -> tuple[str, int, int, int, tuple[int, int]] | None:
    """(path, offset, length, where ``a`` starts in that span, file identity) when ``a`` views
    a file mapping that a worker can map again and read the same bytes from: read-only or
    written through (mode "r", "r+", "w+"), not copy-on-write ("c": the main process's
    changes are in no file)."""
    root = _root_map(a)
    if root is None or root.mode not in ("r", "r+", "w+") or not root.filename:
        return None
    try:
        st = os.stat(root.filename)
    except OSError:
        return None
    start = spans.address(root)
    mapped = _mapped_inode(start)
    if mapped is not None and mapped != (st.st_dev, st.st_ino):
        return None  # the path names another file now (replaced since it was mapped)
    lo, hi = spans.extent(a)
    if lo < start or hi > start + root.nbytes:
        return None
    return root.filename, int(root.offset), int(root.nbytes), spans.address(a) - start, (st.st_dev, st.st_ino)


# -- what travels ---------------------------------------------------------------------------

class _SegmentRef:
    """One segment as one worker's start passes it: its descriptor, once per pickle (and
    while its bytes are still being written, its move's ``ready`` pipe and progress map)."""

    __slots__ = ("fd", "size", "move")

    def __init__(self, fd: int, size: int, move: Any = None) -> None:
        self.fd, self.size, self.move = fd, size, move

    def __reduce__(self) -> tuple[Any, ...]:
        # registered with the process being started: inherited (spawn) or sent with it
        # (forkserver); outside a start, multiprocessing would serve it from a thread
        m = self.move
        if m is None or m.ready < 0:
            return (_map_segment, (reduction.DupFd(self.fd), self.size))
        return (_map_segment, (reduction.DupFd(self.fd), self.size, reduction.DupFd(m.ready), m.layout()))


class _FileRef:
    __slots__ = ("path", "offset", "length", "ident")

    def __init__(self, path: str, offset: int, length: int, ident: tuple[int, int]) -> None:
        self.path, self.offset, self.length, self.ident = path, offset, length, ident

    def __reduce__(self) -> tuple[Any, ...]:
        return (_map_file, (self.path, self.offset, self.length, self.ident))


def _map_segment(dup: Any, size: int, ready: Any = None, layout: Any = None) -> mmap.mmap:
    fd = dup.detach()
    try:
        if ready is not None:
            # still being copied: mapped at once, read where written (``guard``)
            return guard.attach(fd, size, ready.detach(), layout)
        return segments.Segment.from_fd(fd, size).mm
    finally:
        os.close(fd)


def _map_file(path: str, offset: int, length: int, ident: tuple[int, int]) -> np.ndarray:
    st = os.stat(path)
    if (st.st_dev, st.st_ino) != tuple(ident):
        raise RuntimeError(f"the dataset's array is mapped from {path}, which names another file now "
                           "(replaced since the main process mapped it): the worker cannot read the same data")
    # copy-on-write: the worker reads the file's pages; a write stays its own
    return np.memmap(path, dtype=np.uint8, mode="c", offset=offset, shape=(length,))


def _rebuild(buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...],
             writeable: bool, checked: bool = False) -> np.ndarray:
    a = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset, strides=strides)
    if not writeable:
        a.flags.writeable = False
    if guard.copying and not checked:
        # an array whose reads no container checks: it is read only once all its bytes are
        guard.whole((a,))
    return a


class ShipLog(Protocol):
    """What hears of a pool's starts (``stats.Shipping``): each start's pickle, and each copy
    of an array that is no container's."""

    def shipped(self, seconds: float, nbytes: int, shared: int, moved: float = 0.0) -> None: ...

    def copied(self, seconds: float, nbytes: int) -> None: ...


class Registry:
    """The copies of a pool's arrays that are no container's (a user's dataset holding numpy
    arrays): made the first time a worker of the pool is started, kept for its later workers
    (a replacement, "auto" adding one), dropped with the pool. ``copied`` hears of each copy
    (``stats.Shipping``, which hears of each start's pickle from the executor)."""

    def __init__(self, copied: Callable[[float, int], None] | None = None) -> None:
        self._copies: dict[int, tuple[weakref.ref[Any], np.ndarray]] = {}
        self.copied = copied  # hears each copy once it is whole: (seconds, bytes)
        self._lock = threading.Lock()

    def copy_of(self, a: np.ndarray) -> np.ndarray | None:
        key = id(a)
        with self._lock:
            held = self._copies.get(key)
            if held is not None and held[0]() is a:
                return held[1]
        t0 = time.perf_counter()
        heard = self.copied
        try:
            if move.deferrable():
                # written while the workers start; they wait for it to be whole
                out, m = move.copy_soon(a)
                n = a.nbytes
                move.start([m], None if heard is None else lambda: heard(time.perf_counter() - t0, n))
            else:
                out = place(a)
                if heard is not None:
                    heard(time.perf_counter() - t0, a.nbytes)
        except (OSError, ValueError) as exc:
            _warn_once(str(exc))
            return None
        try:
            ref = weakref.ref(a, lambda _, key=key: self._drop(key))
        except TypeError:
            return None
        with self._lock:
            self._copies[key] = (ref, out)
        return out

    def _drop(self, key: int) -> None:
        with self._lock:
            self._copies.pop(key, None)

    def close(self) -> None:
        """Drop the copies (the workers' mappings keep theirs until they exit), once the moves
        under way are written (no thread outlives the pool that started it)."""
        settle()
        with self._lock:
            self._copies.clear()


class ShipPickler(reduction.ForkingPickler):
    """multiprocessing's pickler (torch's tensors go to shared memory through its reducers),
    with numpy arrays passed by reference (see the module's doc)."""

    def __init__(self, file: Any, registry: Registry | None) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.registry = registry
        self.refs: dict[Any, Any] = {}  # segment start / file -> its ref, once per pickle
        self.shared = 0  # array bytes passed by reference
        # the arrays over the segments passed: their descriptors stay open until the start
        # has passed them (a copy no one else holds yet would close them when collected)
        self.kept: list[np.ndarray] = []

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        if t is np.ndarray or t is np.memmap:
            return self._array(obj)
        if t is Guarded:
            a = obj.array
            return self._array(a, checked=True) if type(a) in (np.ndarray, np.memmap) else (_same, (a,))
        ship = getattr(t, "_conveyor_ship_", None)
        if ship is not None and callable(ship):
            return ship(obj)
        return NotImplemented

    def _ref(self, key: Any, make: Any) -> Any:
        ref = self.refs.get(key)
        if ref is None:
            if len(self.refs) >= MAX_REFS:
                return None
            ref = self.refs[key] = make()
        return ref

    def _array(self, a: np.ndarray, checked: bool = False) -> Any:
        if a.dtype.hasobject:
            return NotImplemented
        span = located(a)
        if span is None:
            copy = pending(a)  # a container's array on its way into a segment: that segment
            if copy is not None:
                a = copy
                span = located(a)
        if span is None and a.nbytes >= MIN_BYTES:
            source = _file_source(a)
            if source is not None:
                path, offset, length, delta, ident = source
                ref = self._ref(("file", path, offset, length), lambda: _FileRef(path, offset, length, ident))
                if ref is not None:
                    self.shared += a.nbytes
                    return (_rebuild, (ref, delta, a.shape, a.dtype, a.strides, bool(a.flags.writeable)))
            if self.registry is not None and len(self.refs) < MAX_REFS and segments.available():
                copy = self.registry.copy_of(a)
                if copy is not None:
                    a = copy
                    span = located(a)
        if span is None:
            return NotImplemented
        ref = self._ref(span.start, lambda: _SegmentRef(span.fd, span.size, span.move))
        if ref is None:
            return NotImplemented
        self.kept.append(a)
        self.shared += a.nbytes
        args = (ref, spans.address(a) - span.start, a.shape, a.dtype, a.strides, bool(a.flags.writeable))
        return (_rebuild, args + (True,) if checked and span.move is not None else args)


class Shipped:
    """A worker's spec as its start pickles it: the spec through ``ShipPickler``, its arrays by
    reference. Only meaningful while multiprocessing starts a process (the descriptors are
    registered with that process)."""

    __slots__ = ("spec", "registry", "seconds", "moved_s", "nbytes", "shared", "kept")

    def __init__(self, spec: Any, registry: Registry | None = None) -> None:
        self.spec = spec
        self.registry = registry
        self.seconds = 0.0  # pickling, the moves into shared memory left out
        self.moved_s = 0.0  # moving arrays into shared memory (once for each array)
        self.nbytes = 0
        self.shared = 0
        self.kept: list[np.ndarray] = []  # (ShipPickler.kept, for as long as the start lasts)

    def __reduce__(self) -> tuple[Any, ...]:
        moved = move.spent()
        t0 = time.perf_counter()
        buf = io.BytesIO()
        pickler = ShipPickler(buf, self.registry)
        pickler.dump(self.spec)
        data = buf.getvalue()
        self.moved_s = move.spent() - moved
        self.seconds = max(0.0, time.perf_counter() - t0 - self.moved_s)
        self.nbytes = len(data)
        self.shared = pickler.shared
        self.kept = pickler.kept
        return (_unship, (data,))


def _unship(data: bytes) -> Any:
    return pickle.loads(data)
