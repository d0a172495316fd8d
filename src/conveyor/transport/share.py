"""A dataset's numpy buffers reach spawned and forkserver workers by reference, not by pickle.

    main process: spec ──> ShipPickler ──┬─ array in a shared segment ──> its descriptor + layout
                                         ├─ array mapped from a file  ──> path + offset + layout
                                         ├─ other large array         ──> copied once into a segment
                                         └─ everything else           ──> pickled as usual
    worker:       unpickles ──> maps the segment (or the file) copy-on-write ──> the same arrays

A spawned or forkserver worker receives its dataset pickled, so a dataset of large arrays was
copied through a pipe into every worker, one after another (the parent's write of a start
payload blocks until that child has read it): the start grew with the data, and each worker
held its own copy. Here the arrays travel as a few hundred bytes each.

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
workers start (``_Move``): a worker receives the segment at once and maps it only once the
copy has sealed it whole; a container reads its own arrays until then.

Workers map with MAP_PRIVATE: they read the shared pages, and a write (a dataset that edits
its arrays in place) stays private to the worker, as it does in a forked one.
"""

from __future__ import annotations

import bisect
import io
import mmap
import os
import pickle
import threading
import time
import traceback
import warnings
import weakref
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any

import numpy as np

from . import segment as _segment

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["MIN_BYTES", "Registry", "Shipped", "adopt", "adopt_one", "located", "place"]

# arrays smaller than this are pickled as they are: a mapping per worker (a descriptor, a
# page at least) costs more than copying a few hundred kilobytes
MIN_BYTES = 1 << 20
# distinct segments and files one worker's start may pass: the fork server takes at most
# 256 descriptors a process (multiprocessing.forkserver.MAXFDS_TO_SEND), and each is an open
# file in the worker until it is mapped
MAX_REFS = 64

_lock = threading.RLock()  # (weakref callbacks take it: one may run where it is held)
_starts: list[int] = []  # sorted start addresses of the live segments of this process
_spans: dict[int, tuple[int, int]] = {}  # start -> (end, descriptor)
_warned = False
_moving = threading.local()  # seconds this thread spent copying arrays into segments (``place``)


@dataclass
class _Span:
    start: int
    size: int
    fd: int
    ready: int = -1  # while its bytes are still being written: the read end of its _Move's pipe


def _forget(start: int, fd: int) -> None:
    """A segment's last view is gone (its mmap collected): close its descriptor."""
    with _lock:
        move = _moves.pop(start, None)
        if move is not None:
            move.close()
        if _spans.pop(start, None) is not None:
            i = bisect.bisect_left(_starts, start)
            if i < len(_starts) and _starts[i] == start:
                del _starts[i]
    try:
        os.close(fd)
    except OSError:
        pass


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _extent(a: np.ndarray) -> tuple[int, int]:
    """The lowest and one past the highest byte address ``a`` reads (any strides)."""
    lo = hi = _address(a)
    if a.size == 0:
        return lo, lo
    for n, s in zip(a.shape, a.strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + a.itemsize


def located(a: np.ndarray) -> _Span | None:
    """The live segment ``a``'s memory lies in, if it lies in one of ours."""
    lo, hi = _extent(a)
    with _lock:
        i = bisect.bisect_right(_starts, lo) - 1
        if i < 0:
            return None
        start = _starts[i]
        end, fd = _spans[start]
    if hi <= end and lo >= start:
        move = _moves.get(start)
        # a worker waits on any move not finished well (under way, or failed: it stops then)
        waits = move is not None and (not move.done.is_set() or move.error is not None)
        return _Span(start, end - start, fd, move.ready if waits else -1)
    return None


def _anonymous(size: int, fill: Any = None, move: _Move | None = None) -> _segment.Segment:
    seg = _segment.Segment.anonymous(size, fill) if move is None else _sealable(size)
    start = _address(np.frombuffer(seg.buf, dtype=np.uint8, count=1))
    with _lock:
        bisect.insort(_starts, start)
        _spans[start] = (start + seg.size, seg.fd)
        if move is not None:
            move.fd, move.start = seg.fd, start
            _moves[start] = move
    weakref.finalize(seg.mm, _forget, start, seg.fd)
    seg.fd = -1  # the finalizer closes it, once nothing maps the memory any more
    return seg


def _shareable(a: Any) -> bool:
    return type(a) in (np.ndarray, np.memmap) and not a.dtype.hasobject


def place(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` in a new segment (same shape, dtype, memory order and writability);
    raises OSError where shared memory cannot be had."""
    t0 = time.perf_counter()
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    seg = _anonymous(max(1, a.nbytes), lambda fd: _write(fd, a, order))
    out = np.ndarray(a.shape, dtype=a.dtype, buffer=seg.buf, order=order)
    _moving.s = getattr(_moving, "s", 0.0) + time.perf_counter() - t0
    if not a.flags.writeable:
        out.flags.writeable = False
    return out


WRITE_CHUNK = 64 << 20  # bytes a write() passes at once (the kernel takes at most ~2 GB a call)


def _write(fd: int, a: np.ndarray, order: str) -> None:
    """Write ``a``'s elements to ``fd`` from offset 0, in ``order``, as the bytes of an
    array of that order would lie."""
    if a.size == 0:
        return
    if a.flags.c_contiguous or a.flags.f_contiguous:
        chunks: Any = [a.reshape(-1, order=order).view(np.uint8)]  # (a view: a is contiguous so)
    else:
        # a strided view (every other row, a column): made contiguous a slice at a time
        rows = max(1, WRITE_CHUNK // max(1, a[0].nbytes)) if a.ndim > 1 else max(1, WRITE_CHUNK // a.itemsize)
        chunks = (np.ascontiguousarray(a[i:i + rows]).reshape(-1).view(np.uint8) for i in range(0, len(a), rows))
    offset = 0
    for flat in chunks:
        view = memoryview(flat)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:done + WRITE_CHUNK], offset + done)
        offset += done


# -- moves written while the workers start -------------------------------------------------

def _deferrable() -> bool:
    return (fcntl is not None and hasattr(os, "memfd_create") and hasattr(os, "MFD_ALLOW_SEALING")
            and hasattr(fcntl, "F_ADD_SEALS")
            and hasattr(fcntl, "F_SEAL_GROW"))


def _sealable(size: int) -> _segment.Segment:
    """A memfd sized (not filled) that a finished move seals: the seal says its bytes are whole."""
    size = max(_segment.PAGE, -(-size // _segment.PAGE) * _segment.PAGE)
    fd = os.memfd_create("conveyor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return _segment.Segment("", size, mm, fd)


_DONE_SEALS = 0
if _deferrable():
    _DONE_SEALS = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


def _whole(fd: int) -> bool:
    """Have the bytes of the segment ``fd`` all been written (its move sealed it)?"""
    return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _DONE_SEALS)


class _Move:
    """A copy of arrays into new segments, written by a thread of its own while the workers
    it is for start (a spawned worker imports for ~0.5-1.5 s, the copy is ~0.5 ms a MB).

    A worker receives a segment's descriptor at once, with the read end of this move's pipe
    (``ready``); it maps the segment only once the segment is sealed (``_whole``), and it
    wakes when the write end closes: after the last byte and the seal, or on an error (no
    seal: the worker stops, and the main process raises the error itself, ``failure``).
    ``then(copies)`` runs once every copy is whole: a container takes the copies as its data
    there, never before (until then it reads its own arrays, whose bytes are whole)."""

    def __init__(self) -> None:
        self.ready, self.write_end = os.pipe()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.fd = -1
        self.start = 0

    def close(self) -> None:
        for fd in (self.ready, self.write_end):
            try:
                os.close(fd)
            except OSError:
                pass
        self.ready = self.write_end = -1

    def finish(self, error: BaseException | None) -> None:
        if error is None:
            try:
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _DONE_SEALS)
            except OSError as exc:
                error = exc
        self.error = error
        self.done.set()
        try:
            os.close(self.write_end)  # every waiting worker wakes (EOF)
        except OSError:
            pass
        self.write_end = -1


_moves: dict[int, _Move] = {}  # segment start -> its move, while the segment lives
# id(a) -> (a, its copy), for a container's array moved while workers start: the pickler sends
# the copy wherever the array is met (the container takes the copy once it is whole). Weak
# both ways: the pair goes with either.
_sources: dict[int, tuple[weakref.ref[Any], weakref.ref[Any]]] = {}
_failed: list[BaseException] = []  # moves that failed: the main process raises them (failure())
_threads: set[threading.Thread] = set()


def _move_soon(pairs: list[tuple[np.ndarray, np.ndarray, str, _Move]], then: Any) -> None:
    """Write each source into its copy's segment in a thread, seal it, then ``then()``."""

    def run() -> None:
        try:
            for a, out, order, move in pairs:
                try:
                    _write(move.fd, a, order)
                except BaseException as exc:  # noqa: BLE001 - reaches the user through failure()
                    for _, _, _, m in pairs:
                        if not m.done.is_set():
                            m.finish(exc)
                    # kept without its frames (they hold the copies, whose segments must go):
                    # where it was raised goes into a note
                    where = "".join(traceback.format_tb(exc.__traceback__))
                    exc.add_note(f"raised in conveyor's thread copying the dataset's arrays into shared memory:\n{where}")
                    with _lock:
                        _failed.append(exc.with_traceback(None))
                    del exc
                    return
                move.finish(None)
            if then is not None:
                then()
        finally:
            with _lock:
                _threads.discard(threading.current_thread())

    t = threading.Thread(target=run, name="conveyor-share-move", daemon=True)
    with _lock:
        _threads.add(t)
    t.start()


def _copy_soon(a: np.ndarray) -> tuple[np.ndarray, _Move]:
    """A segment sized for ``a`` and the array over it, its bytes still to be written."""
    t0 = time.perf_counter()
    order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
    move = _Move()
    try:
        seg = _anonymous(max(1, a.nbytes), move=move)
    except BaseException:
        move.close()
        raise
    out = np.ndarray(a.shape, dtype=a.dtype, buffer=seg.buf, order=order)
    if not a.flags.writeable:
        out.flags.writeable = False
    # (the start's share of the move: the bytes are written in a thread, while workers start)
    _moving.s = getattr(_moving, "s", 0.0) + time.perf_counter() - t0
    return out, move


def pending(a: np.ndarray) -> np.ndarray | None:
    """The copy being written of ``a`` (a container's array, adopted), if one is."""
    with _lock:
        held = _sources.get(id(a))
    if held is not None and held[0]() is a:
        return held[1]()
    return None


def _unsource(key: int, ref: Any) -> None:
    with _lock:
        held = _sources.get(key)
        if held is not None and (held[0] is ref or held[1] is ref):
            del _sources[key]


def settle(timeout: float | None = None) -> bool:
    """Wait for the moves under way (tests, and a process about to end); True if none is left."""
    with _lock:
        threads = list(_threads)
    for t in threads:
        t.join(timeout)
    return not any(t.is_alive() for t in threads)


def failure() -> BaseException | None:
    """The error of a move that failed, if any (the first; all are taken: said once)."""
    with _lock:
        first = _failed[0] if _failed else None
        _failed.clear()
        return first


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
    if not _shareable(a) or a.nbytes < MIN_BYTES or located(a) is not None or _file_source(a) is not None:
        return a
    if not _segment.available():
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
    if then is not None and _deferrable():
        if _adopt_later(arrays, then) is not None:
            return arrays
    out = tuple(adopt_one(a) for a in arrays)
    if all(x is y for x, y in zip(out, arrays)):
        return arrays
    if then is not None:
        then(out)
    return out


def _adopt_later(arrays: tuple[Any, ...], then: Any) -> list[Any] | None:
    """Start the moves of ``adopt(arrays, then)``; None where nothing is to move now."""
    pairs = []
    copies = list(arrays)
    for k, a in enumerate(arrays):
        if pending(a) is not None:
            return []  # moving already (a second start before the first move is whole)
        if not _shareable(a) or a.nbytes < MIN_BYTES or located(a) is not None or _file_source(a) is not None:
            continue
        if not _segment.available():
            continue
        try:
            out, move = _copy_soon(a)
        except (OSError, ValueError) as exc:
            _warn_once(str(exc))
            continue
        order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
        pairs.append((a, out, order, move))
        copies[k] = out
    if not pairs:
        return None
    with _lock:
        for a, out, _, _ in pairs:
            key = id(a)
            _sources[key] = (weakref.ref(a, lambda r, key=key: _unsource(key, r)),
                             weakref.ref(out, lambda r, key=key: _unsource(key, r)))
    done = tuple(copies)
    _move_soon(pairs, lambda: then(done))
    return pairs


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
    start = _address(root)
    mapped = _mapped_inode(start)
    if mapped is not None and mapped != (st.st_dev, st.st_ino):
        return None  # the path names another file now (replaced since it was mapped)
    lo, hi = _extent(a)
    if lo < start or hi > start + root.nbytes:
        return None
    return root.filename, int(root.offset), int(root.nbytes), _address(a) - start, (st.st_dev, st.st_ino)


# -- what travels ---------------------------------------------------------------------------

class _SegmentRef:
    """One segment as one worker's start passes it: its descriptor, once per pickle (and
    while its bytes are still being written, its move's ``ready`` pipe)."""

    __slots__ = ("fd", "size", "ready")

    def __init__(self, fd: int, size: int, ready: int = -1) -> None:
        self.fd, self.size, self.ready = fd, size, ready

    def __reduce__(self) -> tuple[Any, ...]:
        # registered with the process being started: inherited (spawn) or sent with it
        # (forkserver); outside a start, multiprocessing would serve it from a thread
        ready = reduction.DupFd(self.ready) if self.ready >= 0 else None
        return (_map_segment, (reduction.DupFd(self.fd), self.size, ready))


class _FileRef:
    __slots__ = ("path", "offset", "length", "ident")

    def __init__(self, path: str, offset: int, length: int, ident: tuple[int, int]) -> None:
        self.path, self.offset, self.length, self.ident = path, offset, length, ident

    def __reduce__(self) -> tuple[Any, ...]:
        return (_map_file, (self.path, self.offset, self.length, self.ident))


def _map_segment(dup: Any, size: int, ready: Any = None) -> mmap.mmap:
    fd = dup.detach()
    try:
        if ready is not None:
            _wait_whole(fd, ready.detach())
        return _segment.Segment.from_fd(fd, size).mm
    finally:
        os.close(fd)


def _wait_whole(fd: int, ready: int) -> None:
    """Wait (a worker, unpickling its dataset) until the main process has written the whole
    segment ``fd``: its move seals it, then closes the pipe whose read end is ``ready``."""
    import select

    parent = os.getppid()
    poller = select.poll()  # (not select(): a descriptor past 1023 is out of its range)
    poller.register(ready, select.POLLIN | select.POLLHUP)
    try:
        while not _whole(fd):
            # the seal is the word; the pipe only wakes us (a child the main process forked
            # meanwhile may hold its write end open: then the seal is seen within a second)
            woke = poller.poll(1000)
            if _whole(fd):
                return
            if woke or os.getppid() != parent:
                raise RuntimeError("the main process did not finish copying the dataset's arrays into shared "
                                   "memory (its error is raised there)")
    finally:
        os.close(ready)


def _map_file(path: str, offset: int, length: int, ident: tuple[int, int]) -> np.ndarray:
    st = os.stat(path)
    if (st.st_dev, st.st_ino) != tuple(ident):
        raise RuntimeError(f"the dataset's array is mapped from {path}, which names another file now "
                           "(replaced since the main process mapped it): the worker cannot read the same data")
    # copy-on-write: the worker reads the file's pages; a write stays its own
    return np.memmap(path, dtype=np.uint8, mode="c", offset=offset, shape=(length,))


def _rebuild(buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...],
             writeable: bool) -> np.ndarray:
    a = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset, strides=strides)
    if not writeable:
        a.flags.writeable = False
    return a


class Registry:
    """The copies of a pool's arrays that are no container's (a user's dataset holding numpy
    arrays): made the first time a worker of the pool is started, kept for its later workers
    (a replacement, "auto" adding one), dropped with the pool. Also counts what was sent."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref[Any], np.ndarray]] = {}
        self._lock = threading.Lock()
        self.starts = 0  # worker starts that pickled a spec here
        self.pickle_s = 0.0  # the main process's time pickling them
        self.pickle_bytes = 0  # the largest pickle a worker got
        self.shared_bytes = 0  # the most array bytes one start passed by reference

    def copy_of(self, a: np.ndarray) -> np.ndarray | None:
        key = id(a)
        with self._lock:
            held = self._copies.get(key)
            if held is not None and held[0]() is a:
                return held[1]
        try:
            if _deferrable():
                # written while the workers start; they wait for it to be whole
                out, move = _copy_soon(a)
                order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
                _move_soon([(a, out, order, move)], None)
            else:
                out = place(a)
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

    def note(self, seconds: float, nbytes: int, shared: int) -> None:
        self.starts += 1
        self.pickle_s += seconds
        self.pickle_bytes = max(self.pickle_bytes, nbytes)
        self.shared_bytes = max(self.shared_bytes, shared)

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

    def _array(self, a: np.ndarray) -> Any:
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
            if self.registry is not None and len(self.refs) < MAX_REFS and _segment.available():
                copy = self.registry.copy_of(a)
                if copy is not None:
                    a = copy
                    span = located(a)
        if span is None:
            return NotImplemented
        ref = self._ref(span.start, lambda: _SegmentRef(span.fd, span.size, span.ready))
        if ref is None:
            return NotImplemented
        self.kept.append(a)
        self.shared += a.nbytes
        return (_rebuild, (ref, _address(a) - span.start, a.shape, a.dtype, a.strides, bool(a.flags.writeable)))


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
        moved = getattr(_moving, "s", 0.0)
        t0 = time.perf_counter()
        buf = io.BytesIO()
        pickler = ShipPickler(buf, self.registry)
        pickler.dump(self.spec)
        data = buf.getvalue()
        self.moved_s = getattr(_moving, "s", 0.0) - moved
        self.seconds = max(0.0, time.perf_counter() - t0 - self.moved_s)
        self.nbytes = len(data)
        self.shared = pickler.shared
        self.kept = pickler.kept
        if self.registry is not None:
            self.registry.note(self.seconds, self.nbytes, self.shared)
        return (_unship, (data,))


def _unship(data: bytes) -> Any:
    return pickle.loads(data)
