"""Which of this process's memory lies in conveyor's anonymous shared segments.

    register(segment[, move]) ──> start address -> (end, descriptor, move)   (sorted by start)
    located(array)            ──> the segment the array's bytes lie in, or None

The pickler (``share``) asks ``located`` of each array it meets: an array in one of these
segments travels as the segment's descriptor and the array's place in it. A segment leaves
the registry, and its descriptor closes, once nothing maps its memory any more.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import segment as segments

__all__ = ["Span", "address", "extent", "located", "register"]

lock = threading.RLock()  # (weakref callbacks take it: one may run where it is held)
_starts: list[int] = []  # sorted start addresses of the live segments of this process
_spans: dict[int, tuple[int, int, Any]] = {}  # start -> (end, descriptor, move or None)


@dataclass
class Span:
    start: int
    size: int
    fd: int
    move: Any = None  # while its bytes are still being written (or failed): its move (``move.Move``)


def address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def extent(a: np.ndarray) -> tuple[int, int]:
    """The lowest and one past the highest byte address ``a`` reads (any strides)."""
    lo = hi = address(a)
    if a.size == 0:
        return lo, lo
    for n, s in zip(a.shape, a.strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + a.itemsize


def _forget(start: int, fd: int) -> None:
    """A segment's last view is gone (its mmap collected): close its descriptor."""
    import os

    with lock:
        held = _spans.pop(start, None)
        if held is not None:
            i = bisect.bisect_left(_starts, start)
            if i < len(_starts) and _starts[i] == start:
                del _starts[i]
    if held is not None and held[2] is not None:
        held[2].close()
    try:
        os.close(fd)
    except OSError:
        pass


def register(seg: segments.Segment, move: Any = None) -> int:
    """Record ``seg`` (its descriptor now closes with its last mapping); its start address."""
    start = address(np.frombuffer(seg.buf, dtype=np.uint8, count=1))
    with lock:
        bisect.insort(_starts, start)
        _spans[start] = (start + seg.size, seg.fd, move)
    weakref.finalize(seg.mm, _forget, start, seg.fd)
    seg.fd = -1  # the finalizer closes it, once nothing maps the memory any more
    return start


def located(a: np.ndarray) -> Span | None:
    """The live segment ``a``'s memory lies in, if it lies in one of ours."""
    lo, hi = extent(a)
    with lock:
        i = bisect.bisect_right(_starts, lo) - 1
        if i < 0:
            return None
        start = _starts[i]
        end, fd, move = _spans[start]
    if hi <= end and lo >= start:
        # a worker waits on a move not finished well (under way, or failed: it stops then)
        waits = move is not None and not move.whole()
        return Span(start, end - start, fd, move if waits else None)
    return None


def live() -> dict[int, tuple[int, int]]:
    """start -> (end, descriptor) of every live segment (tests compare them)."""
    with lock:
        return {start: (end, fd) for start, (end, fd, _) in _spans.items()}
