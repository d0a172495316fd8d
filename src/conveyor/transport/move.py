"""Copies of arrays into new shared segments, written by a thread while the workers start.

    start(pairs) ──> thread: for each chunk (the chunks wanted first, then in order):
                       pwrite the chunk ──> fence ──> its mark in the segment's progress map
                     each segment whole: seal it ──> fence ──> WHOLE ──> close the pipe
                     all whole: then(copies)  (a container takes its copies as its data)

A spawned worker spends its start importing, while the copy goes on
(docs/decisions/copy-while-workers-start.md): the workers receive a segment's descriptor at
once, and read a chunk as soon as its mark is set (``guard``). The main process knows the
rows of the first tasks before it sends them: ``prefer`` moves their chunks to the head of
the copy, so a worker's first batch waits for its own rows only, in any order. Until a
worker has started, a container's copy writes only those chunks (``HOLD_S`` at most): the
starting workers keep the cores. A failed copy (ENOSPC) sets FAILED and closes the pipe:
the workers waiting stop, and the main process raises the error (``failure``).
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import time
import traceback
import weakref
from typing import Any, Callable

import numpy as np

from . import guard, spans
from . import segment as segments

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CHUNK", "Move", "active", "copy_soon", "deferrable", "failed", "failure", "on_chunk", "pending",
           "place", "prefer", "rows_first", "settle", "started", "workers_started", "start", "want", "want_bytes", "write"]

# bytes a chunk: a worker waits for the chunks its rows lie in, no more (2 GB: 1,024 marks)
CHUNK = 2 << 20
WRITE_CHUNK = 64 << 20  # bytes a write() passes at once (the kernel takes at most ~2 GB a call)
# a test's hook: on_chunk(move, k, wanted) runs in the copying thread before chunk k is written
# (``wanted``: a task reads it); False puts the chunk off (the next one is chosen afresh)
on_chunk: Callable[[Move, int, bool], bool] | None = None
active = 0  # moves under way in this process (the dispatcher tells them its tasks' rows then)
# a container's copy writes only the chunks tasks want until a worker has started, for at most
# this long: on a machine with few cores the copy would take a core from the starting workers
# within the first batch's wait, and what the first batches read is wanted and copied meanwhile
HOLD_S = 1.0
_started = threading.Event()  # a worker has started since the last container's copy began
_nudge = threading.Event()  # a chunk is wanted, or a worker has started

_lock = threading.Lock()
_timing = threading.local()  # seconds this thread spent copying arrays into segments
_sources: dict[int, tuple[weakref.ref[Any], weakref.ref[Any]]] = {}
_failed: list[BaseException] = []  # moves that failed: the main process raises them (failure())
_threads: set[threading.Thread] = set()

_SEALS = 0


def deferrable() -> bool:
    return (fcntl is not None and hasattr(os, "memfd_create") and hasattr(os, "MFD_ALLOW_SEALING")
            and hasattr(fcntl, "F_ADD_SEALS") and hasattr(fcntl, "F_SEAL_GROW"))


if deferrable():
    _SEALS = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


def spent() -> float:
    """Seconds this thread has spent moving arrays into segments (a start's share of it)."""
    return getattr(_timing, "s", 0.0)


def _spend(seconds: float) -> None:
    _timing.s = spent() + seconds


def order_of(a: np.ndarray) -> str:
    return "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"


def _pieces(a: np.ndarray, order: str, lo: int = 0, hi: int | None = None) -> Any:
    """``a``'s bytes ``lo:hi`` as an array of ``order`` would hold them, in contiguous pieces."""
    hi = a.nbytes if hi is None else hi
    if a.flags.c_contiguous or a.flags.f_contiguous:
        yield a.reshape(-1, order=order).view(np.uint8)[lo:hi]  # (a view: a is contiguous so)
        return
    # a strided view (every other row, a column): made contiguous a slice of rows at a time
    row = a[0].nbytes if a.ndim > 1 else a.itemsize
    step = max(1, WRITE_CHUNK // max(1, row))
    for r in range(lo // row, -(-hi // row), step):
        flat = np.ascontiguousarray(a[r:r + step]).reshape(-1).view(np.uint8)
        yield flat[max(0, lo - r * row):max(0, hi - r * row)]


def write(fd: int, a: np.ndarray, order: str, lo: int = 0, hi: int | None = None) -> None:
    """Write ``a``'s bytes ``lo:hi`` (as an array of ``order`` holds them) to ``fd`` at ``lo``."""
    if a.size == 0:
        return
    offset = lo
    for flat in _pieces(a, order, lo, hi):
        view = memoryview(flat)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:done + WRITE_CHUNK], offset + done)
        offset += done


def place(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` in a new segment, written now (same shape, dtype, memory order and
    writability); raises OSError where shared memory cannot be had."""
    t0 = time.perf_counter()
    order = order_of(a)
    seg = segments.Segment.anonymous(max(1, a.nbytes), lambda fd: write(fd, a, order))
    spans.register(seg)
    out = np.ndarray(a.shape, dtype=a.dtype, buffer=seg.buf, order=order)
    _spend(time.perf_counter() - t0)
    if not a.flags.writeable:
        out.flags.writeable = False
    return out


class Move:
    """The copy of one array into its segment: the bytes, then past them a progress map
    (``guard``: a header and a byte per chunk) that the workers read too."""

    def __init__(self, a: np.ndarray) -> None:
        self.source: Any = a
        self.order = order_of(a)
        self.nbytes = a.nbytes
        self.chunk = CHUNK
        self.nchunks = max(1, -(-self.nbytes // self.chunk))
        self.map_at = max(segments.PAGE, -(-self.nbytes // segments.PAGE) * segments.PAGE)
        self.size = self.map_at + -(-(guard.HEADER + self.nchunks) // segments.PAGE) * segments.PAGE
        self.ready, self.write_end = os.pipe()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.fd = -1
        self.marks: np.ndarray | None = None  # the progress map, in this process's mapping
        self.copied = np.zeros(self.nchunks, dtype=bool)
        self.left = self.nchunks  # chunks not written yet
        self.cursor = 0  # chunks before it are written (or wanted and written)
        self.wanted: collections.deque[int] = collections.deque()

    def layout(self) -> tuple[int, int, int]:
        return self.map_at, self.chunk, self.nchunks

    def whole(self) -> bool:
        return self.done.is_set() and self.error is None

    def close(self) -> None:
        for fd in (self.ready, self.write_end):
            try:
                os.close(fd)
            except OSError:
                pass
        self.ready = self.write_end = -1

    def want_bytes(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Copy the chunks of the byte ranges ``lo[i]:hi[i]`` (of the copy) next."""
        if self.done.is_set() or not len(lo):
            return
        c = self.chunk
        lo = np.asarray(lo, dtype=np.int64)
        first = lo // c
        last = np.minimum((np.maximum(np.asarray(hi, dtype=np.int64), lo + 1) - 1) // c, self.nchunks - 1)
        ks = np.unique(guard.spanned(first, np.maximum(last, first)))  # every chunk of every range, in order
        with _lock:
            self.wanted.extend(int(k) for k in ks if not self.copied[k])
        _nudge.set()

    def want_rows(self, rows: Any) -> None:
        """Copy the chunks of the rows ``rows`` next (all of them lie anywhere in an array of
        Fortran order: nothing to prefer there)."""
        source = self.source
        if self.order != "C" or not self.nbytes or source is None:
            return
        shape = source.shape
        idx = guard.in_range(rows, shape[0])
        row = self.nbytes // shape[0]
        self.want_bytes(idx * row, idx * row + row)

    def next_chunk(self, wanted_only: bool = False) -> tuple[int, bool] | None:
        with _lock:
            while self.wanted:
                k = self.wanted.popleft()
                if not self.copied[k]:
                    return k, True
        if wanted_only:
            return None
        while self.cursor < self.nchunks and self.copied[self.cursor]:
            self.cursor += 1
        return (self.cursor, False) if self.cursor < self.nchunks else None

    def copy(self, k: int) -> None:
        lo = k * self.chunk
        write(self.fd, self.source, self.order, lo, min(self.nbytes, lo + self.chunk))
        guard.fence()  # the bytes before their mark (pwrite's stores, then ours)
        assert self.marks is not None
        self.marks[guard.HEADER + k] = 1
        self.copied[k] = True
        self.left -= 1

    def finish(self, error: BaseException | None) -> None:
        global active
        if error is None:
            try:
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
            except OSError as exc:
                error = exc
        self.error = error
        if self.marks is not None:
            guard.fence()
            self.marks[guard.FAILED if error is not None else guard.WHOLE] = 1
        self.marks = None  # (it maps the segment: the segment goes with its copy's last view)
        self.source = None
        self.done.set()
        with _lock:
            active -= 1
        try:
            os.close(self.write_end)  # every waiting worker wakes (EOF)
        except OSError:
            pass
        self.write_end = -1


def copy_soon(a: np.ndarray) -> tuple[np.ndarray, Move]:
    """A segment sized for ``a`` and the array over it, its bytes still to be written by
    ``start``."""
    global active
    t0 = time.perf_counter()
    move = Move(a)
    try:
        fd = os.memfd_create("conveyor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, move.size)
            mm = mmap.mmap(fd, move.size)
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        move.close()
        raise
    seg = segments.Segment("", move.size, mm, fd)
    move.fd = fd
    move.marks = np.frombuffer(seg.buf, dtype=np.uint8, count=guard.HEADER + move.nchunks, offset=move.map_at)
    spans.register(seg, move)
    out = np.ndarray(a.shape, dtype=a.dtype, buffer=seg.buf, order=move.order)
    if not a.flags.writeable:
        out.flags.writeable = False
    with _lock:
        active += 1
    _spend(time.perf_counter() - t0)  # (the start's share: the bytes are written in a thread)
    return out, move


def _next(moves: list[Move], wanted_only: bool = False) -> tuple[Move, int, bool] | None:
    """The next chunk to write: one a task wants, else (not ``wanted_only``) the first left."""
    for m in moves:
        if m.wanted and not m.done.is_set():
            got = m.next_chunk(wanted_only)
            if got is not None and got[1]:
                return m, got[0], True
    if wanted_only:
        return None
    for m in moves:
        if not m.done.is_set():
            got = m.next_chunk()
            if got is not None:
                return m, got[0], got[1]
    return None


def started() -> None:
    """A worker has started: a container's copy under way takes every chunk now."""
    _started.set()
    _nudge.set()


def workers_started() -> bool:
    """Has a worker started since the last container's copy began?"""
    return _started.is_set()


def _hold(moves: list[Move], until: float) -> None:
    """Wait until a chunk is wanted, a worker has started, or ``until``."""
    while not _started.is_set() and not any(m.wanted for m in moves):
        left = until - time.monotonic()
        if left <= 0:
            return
        _nudge.wait(left)
        _nudge.clear()


def start(moves: list[Move], then: Callable[[], None] | None, hold: bool = False) -> None:
    """Write each move's source into its segment in a thread, seal each, then ``then()``.
    ``hold``: chunks no task wants wait for a worker's start (``HOLD_S`` at most): only
    reads that check their chunks (a container's) can go on before the copy is whole."""
    if hold:
        _started.clear()
    until = time.monotonic() + HOLD_S

    def run() -> None:
        try:
            while True:
                holding = hold and not _started.is_set() and time.monotonic() < until
                if holding:
                    _hold(moves, until)
                    holding = not _started.is_set() and time.monotonic() < until
                job = _next(moves, holding)
                if job is None:
                    if holding:
                        continue
                    break
                m, k, wanted = job
                try:
                    if on_chunk is not None and on_chunk(m, k, wanted) is False:
                        continue  # (a test holding the copy: the chunk comes again)
                    m.copy(k)
                    if not m.left:
                        m.finish(None)
                except BaseException as exc:  # noqa: BLE001 - reaches the user through failure()
                    # kept without its frames (they hold the copies, whose segments must go):
                    # where it was raised goes into a note. Recorded before the workers learn
                    # of it: the failure one of them sends finds the cause here
                    where = "".join(traceback.format_tb(exc.__traceback__))
                    exc.add_note(f"raised in conveyor's thread copying the dataset's arrays into shared memory:\n{where}")
                    with _lock:
                        _failed.append(exc.with_traceback(None))
                    for other in moves:
                        if not other.done.is_set():
                            other.finish(exc)
                    del exc
                    return
            if then is not None and all(m.whole() for m in moves):
                then()
        finally:
            with _lock:
                _threads.discard(threading.current_thread())

    t = threading.Thread(target=run, name="conveyor-share-move", daemon=True)
    with _lock:
        _threads.add(t)
    t.start()


def track(a: np.ndarray, out: np.ndarray) -> None:
    """Remember ``out`` as the copy being written of ``a`` (a container's array): the pickler
    sends the copy wherever ``a`` is met. Weak both ways: the pair goes with either."""
    key = id(a)
    with _lock:
        _sources[key] = (weakref.ref(a, lambda r, key=key: _untrack(key, r)),
                         weakref.ref(out, lambda r, key=key: _untrack(key, r)))


def _untrack(key: int, ref: Any) -> None:
    with _lock:
        held = _sources.get(key)
        if held is not None and (held[0] is ref or held[1] is ref):
            del _sources[key]


def pending(a: Any) -> np.ndarray | None:
    """The copy being written of ``a`` (a container's array, adopted), if one is."""
    with _lock:
        held = _sources.get(id(a))
    if held is not None and held[0]() is a:
        return held[1]()
    return None


def _move_of(a: Any) -> Move | None:
    copy = pending(a)
    span = spans.located(copy) if copy is not None else None
    return span.move if span is not None else None


def want(a: Any, rows: Any) -> None:
    """Copy the rows ``rows`` of ``a`` (a container's array being moved) next."""
    m = _move_of(a)
    if m is not None:
        m.want_rows(rows)


def want_bytes(a: Any, lo: Any, hi: Any) -> None:
    """Copy the bytes ``lo[i]:hi[i]`` of ``a`` (a flat array being moved) next."""
    m = _move_of(a)
    if m is not None:
        m.want_bytes(np.asarray(lo, dtype=np.int64) * a.itemsize, np.asarray(hi, dtype=np.int64) * a.itemsize)


def prefer(dataset: Any, tasks: Any) -> None:
    """The dispatcher is about to send ``tasks`` (their ``indices``) while a copy is under
    way: their rows of ``dataset`` are copied next, where the dataset says where they lie
    (``_conveyor_first_(indices)``: conveyor's containers)."""
    for t in tasks:  # (task by task: the first task's chunks come first)
        if t.indices is not None and len(t.indices):
            rows_first(dataset, t.indices)


def rows_first(dataset: Any, indices: list[int]) -> None:
    """Copy the bytes of ``dataset``'s items ``indices`` next, where it says where they lie."""
    first = getattr(type(dataset), "_conveyor_first_", None)
    if first is not None:
        first(dataset, indices)


def settle(timeout: float | None = None) -> bool:
    """Wait for the moves under way (tests, and a process about to end); True if none is left."""
    started()  # (nothing holds them back any more)
    with _lock:
        threads = list(_threads)
    for t in threads:
        t.join(timeout)
    return not any(t.is_alive() for t in threads)


def failed() -> bool:
    """Has a move failed whose error is not taken yet (``failure``)?"""
    with _lock:
        return bool(_failed)


def failure() -> BaseException | None:
    """The error of a move that failed, if any (the first; all are taken: said once)."""
    with _lock:
        first = _failed[0] if _failed else None
        _failed.clear()
        return first
