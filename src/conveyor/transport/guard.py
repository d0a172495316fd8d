"""A worker reads a segment still being copied only where its chunks are whole.

    main process (move.Move):  pwrite chunk k ──> fence ──> marks[k] = 1 ... seal ──> fence ──> WHOLE = 1
    worker:                    read marks of the chunks a read touches ──> fence ──> read the data

A segment that the main process is still writing (``move``) reaches a worker with a small
progress map at its tail: a header (whole, failed) and a byte per chunk, set once the
chunk's bytes are written. conveyor's containers check the chunks their rows touch before
reading them (``rows``, waiting for missing ones) and nothing once every segment is whole
(``copying`` is False: one attribute test a read). Any other read of such an array (a
user's dataset holding it, a container's arrays taken whole) waits for the whole segment
(``whole``).
"""

from __future__ import annotations

import bisect
import mmap
import os
import select
import threading
from typing import Any

import numpy as np

__all__ = ["FAILED", "HEADER", "WHOLE", "CopyFailed", "attach", "between", "copying", "fence", "in_range", "rows",
           "spanned", "whole"]

HEADER = 64  # bytes of the progress map before its marks
WHOLE = 0  # header byte: every byte is written and the segment sealed
FAILED = 1  # header byte: the copy failed (the main process raises its error)

copying = False  # some segment this process maps is not whole yet: reads check their chunks
_lock = threading.Lock()
_starts: list[int] = []
_guards: dict[int, _Guard] = {}
_local = threading.local()
waits = 0  # reads that waited for a chunk (tests watch it to know a read is waiting)


def fence() -> None:
    """A full memory barrier. The writer stores a chunk's bytes, then its mark; a reader loads
    the mark, then the bytes. x86 keeps stores in order and loads in order, arm64 keeps
    neither, and Python has no fence of its own: a lock's release then acquire is one (a
    release store then an acquire read-modify-write of the same lock word: RCsc on arm64, a
    locked instruction on x86), so nothing before it moves after it nor after it before."""
    lk = getattr(_local, "lock", None)
    if lk is None:
        lk = _local.lock = threading.Lock()
        lk.acquire()
    lk.release()
    lk.acquire()


class _Guard:
    __slots__ = ("start", "end", "marks", "chunk", "ready", "parent")

    def __init__(self, start: int, end: int, marks: np.ndarray, chunk: int, ready: int) -> None:
        self.start, self.end, self.marks, self.chunk, self.ready = start, end, marks, chunk, ready
        self.parent = os.getppid()

    def chunks_of(self, a: np.ndarray, indices: Any) -> np.ndarray:
        """The chunks the rows ``indices`` of ``a`` lie in (every chunk ``a`` spans where its
        rows are not contiguous runs of bytes)."""
        base = int(a.__array_interface__["data"][0]) - self.start
        c = self.chunk
        if a.ndim == 0 or not a.flags.c_contiguous or a.size == 0 or indices is None:
            span = max(1, a.nbytes)
            return np.arange(base // c, (base + span - 1) // c + 1)
        idx = in_range(indices, len(a))
        row = a.strides[0]
        lo = base + idx * row
        first, last = lo // c, (lo + row - 1) // c
        if row <= c:  # a row lies in at most two chunks
            return np.concatenate((first, last))
        return spanned(first, last)

    def chunks_between(self, a: np.ndarray, lo: Any, hi: Any) -> np.ndarray:
        """The chunks of the elements ``lo[i]:hi[i]`` of the 1-D contiguous ``a``."""
        if a.ndim != 1 or not a.flags.c_contiguous:
            return self.chunks_of(a, None)
        base = int(a.__array_interface__["data"][0]) - self.start
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        keep = hi > lo
        lo, hi = lo[keep], hi[keep]
        n = a.itemsize
        return spanned((base + lo * n) // self.chunk, (base + hi * n - 1) // self.chunk)

    def wait(self, ks: np.ndarray) -> None:
        global waits
        marks = self.marks
        if marks[WHOLE] or marks[HEADER + ks].all():
            fence()
            return
        waits += 1
        poller = select.poll()  # (not select(): a descriptor past 1023 is out of its range)
        poller.register(self.ready, select.POLLIN | select.POLLHUP)
        while not marks[WHOLE]:
            ks = ks[marks[HEADER + ks] == 0]
            if not ks.size:
                break
            if marks[FAILED] or os.getppid() != self.parent:
                raise CopyFailed()
            # the pipe closes once the copy is whole or failed: it wakes us then; until then
            # a chunk is ~1 ms of the copy
            if poller.poll(1) and not marks[WHOLE] and not (marks[HEADER + ks]).all():
                raise CopyFailed()
        fence()


def in_range(indices: Any, n: int) -> np.ndarray:
    """Row numbers ``indices`` of an array of ``n`` rows as int64, negative ones counted from
    the end, out-of-range ones clipped (the read itself raises for those)."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    return np.clip(np.where(idx < 0, idx + n, idx), 0, n - 1)


def spanned(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Every k with first[i] <= k <= last[i] for some i, range after range."""
    count = last - first + 1
    steps = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(first, count) + steps


class CopyFailed(RuntimeError):
    def __init__(self) -> None:
        super().__init__("the main process did not finish copying the dataset's arrays into shared memory "
                         "(its error is raised there)")


def attach(fd: int, size: int, ready: int, layout: tuple[int, int, int]) -> mmap.mmap:
    """Map the segment ``fd`` (copy-on-write) while the main process may still write it;
    ``layout``: where its progress map lies, the chunk size, the number of chunks. Takes
    ``ready`` (the read end of the copy's pipe)."""
    at, chunk, n = layout
    mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE)
    marks = np.frombuffer(mm, dtype=np.uint8, count=HEADER + n, offset=at)
    if marks[WHOLE]:
        os.close(ready)
        fence()
        return mm
    global copying
    start = int(np.frombuffer(mm, dtype=np.uint8, count=1).__array_interface__["data"][0])
    with _lock:
        bisect.insort(_starts, start)
        _guards[start] = _Guard(start, start + at, marks, chunk, ready)
        copying = True
    return mm


def _find(a: Any) -> _Guard | None:
    if not isinstance(a, np.ndarray):
        return None
    lo = int(a.__array_interface__["data"][0])
    with _lock:
        i = bisect.bisect_right(_starts, lo) - 1
        if i < 0:
            return None
        g = _guards[_starts[i]]
    return g if lo < g.end else None


def _prune() -> None:
    """Forget the segments that are whole now (once none is left, reads check nothing)."""
    global copying
    with _lock:
        for start in [s for s, g in _guards.items() if g.marks[WHOLE]]:
            g = _guards.pop(start)
            del _starts[bisect.bisect_left(_starts, start)]
            try:
                os.close(g.ready)
            except OSError:
                pass
        copying = bool(_guards)
    fence()


def rows(arrays: Any, indices: Any) -> None:
    """Wait until the rows ``indices`` of each of ``arrays`` (None: all of it) are written."""
    for a in arrays:
        g = _find(a)
        if g is not None:
            g.wait(g.chunks_of(a, indices))
    _prune()


def between(a: Any, lo: Any, hi: Any) -> None:
    """Wait until the elements ``lo[i]:hi[i]`` of the 1-D ``a`` are written."""
    g = _find(a)
    if g is not None:
        g.wait(g.chunks_between(a, lo, hi))
    _prune()


def whole(arrays: Any) -> None:
    """Wait until every array of ``arrays`` is written."""
    rows(arrays, None)
