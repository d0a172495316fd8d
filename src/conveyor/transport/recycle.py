"""Reusable buffers for large batches made in the main process.

A batch collated in the main process (``num_workers=0``, or a batch the adaptive
loader keeps there) is a fresh allocation. For a batch of megabytes, glibc
often hands back pages it just returned to the kernel (it trims the heap's top
and unmaps large chunks), so every batch pays its page faults again, and fresh
pages cost more than the copy into them (docs/decisions/recycle-large-batch-memory.md).
The recycler keeps the memory of batches the user has dropped and hands it out
again, already faulted in, the way worker slots are reused.

::

    collate -> alloc(shape, dtype) -> a view of a kept buffer (or a new one)
    user drops every view of the batch -> finalizer -> buffer back on the free list
"""

from __future__ import annotations

import collections
import threading
import time
import weakref

import numpy as np

from .._platform import malloc

__all__ = ["Recycler"]

PAGE = 4096  # a buffer's data starts on a page (see Recycler.alloc)


class Recycler:
    """An allocator (``use_allocator``) of private buffers, returned when their views die.

    Leaves under ``min_bytes`` are left to the usual allocator (None). A kept
    buffer serves a leaf it fits within 25%; at most ``keep`` idle buffers are
    held (the oldest go first), so batches whose sizes keep changing hold little.

    >>> r = Recycler(min_bytes=64)
    >>> a = r.alloc((4, 32), np.dtype(np.float32)); a.shape
    (4, 32)
    >>> addr = a.__array_interface__["data"][0]; del a
    >>> r.alloc((4, 30), np.dtype(np.float32)).__array_interface__["data"][0] == addr
    True
    """

    def __init__(self, min_bytes: int = 1 << 20, keep: int = 4) -> None:
        self.min_bytes = min_bytes
        self.keep = keep
        self.free: list[bytearray] = []  # idle buffers, oldest first
        # filled by finalizers, at most ``keep`` (the oldest go): trimmed only where batches are
        # made, it would otherwise hold every batch the user dropped while no batch is made
        self.returned: collections.deque[bytearray] = collections.deque(maxlen=keep)
        self.lock = threading.Lock()  # thread workers of one process share it
        # seconds spent faulting in new buffers: a one-time cost that says nothing of how
        # fast batches are made once memory is reused (the adaptive probe leaves it out)
        self.fresh_s = 0.0
        self.created = 0  # buffers made (the rest of the allocations reused one)
        self.asked = 0  # leaves of min_bytes or more asked for (a fetcher skips it while none come)

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        nbytes = dtype.itemsize
        for d in shape:
            nbytes *= d
        if nbytes < self.min_bytes:
            return None
        mem = None
        with self.lock:
            # counted under the lock: thread workers share one Recycler, and a free-threaded
            # build interleaves the read and the write of ``+=``
            self.asked += 1
            self._take_returned()
            best = -1
            for i, kept in enumerate(self.free):
                room = len(kept) - PAGE  # a page of each buffer aligns it
                if nbytes <= room <= nbytes + nbytes // 4 and (best < 0 or len(kept) < len(self.free[best])):
                    best = i
            if best >= 0:
                mem = self.free.pop(best)
        if mem is None:
            t0 = time.perf_counter()
            mem = bytearray(nbytes + PAGE)  # zero-filled: faulted in once, here
            malloc.as_if_freed(nbytes + PAGE)
            self.fresh_s += time.perf_counter() - t0
            self.created += 1
        # the root is a view of a non-array buffer, so every view made from it keeps the root
        # (numpy collapses chains of views only down to the first array that owns its memory).
        # It starts on a page: a bytearray's data starts 16 bytes past one, and every 64-byte
        # store of a copy into it then straddles two cache lines, which slows the copy
        skip = -np.frombuffer(mem, dtype=np.uint8, count=1).__array_interface__["data"][0] % PAGE
        root = np.frombuffer(mem, dtype=np.uint8, count=nbytes, offset=skip)
        weakref.finalize(root, self.returned.append, mem)
        return root.view(dtype).reshape(shape)

    __call__ = alloc  # the allocator protocol of ``use_allocator`` (with ``min_bytes``)

    def _take_returned(self) -> None:
        returned, free = self.returned, self.free
        while returned:
            free.append(returned.popleft())
        if len(free) > self.keep:
            del free[: len(free) - self.keep]

    def clear(self) -> None:
        """Drop every idle buffer (batches the user still holds keep theirs)."""
        with self.lock:
            self.returned.clear()
            self.free.clear()
