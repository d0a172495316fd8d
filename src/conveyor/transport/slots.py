"""Reusable shared-memory slots: the worker's pool and the main process's views.

A process worker collates straight into a slot it owns (see
``conveyor.collate.use_allocator``) and sends only a small description of
where each array leaf lies. The main process maps the slot once, builds
zero-copy views, and ties the slot's lifetime to those views: when the last
view of a batch is garbage collected, a finalizer queues the slot id, and the
next message to that worker carries it back to the pool. A batch the user
keeps is therefore never overwritten; the pool grows while users hold many
batches and drops idle slots again.
"""

from __future__ import annotations

import collections
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .segment import Segment

__all__ = ["Slot", "SlotPool", "Writer", "Views"]

ALIGN = 64
MIN_SLOT = 1 << 16


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


@dataclass(slots=True)
class Slot:
    id: int
    segment: Segment
    free: bool = True

    @property
    def name(self) -> str:
        return self.segment.name

    @property
    def size(self) -> int:
        return self.segment.size


@dataclass
class SlotPool:
    """The slots of one worker incarnation (worker side).

    >>> pool = SlotPool("conveyor_doc_pool_", keep=2)
    >>> slot = pool.acquire(1000); slot.free
    False
    >>> pool.release([slot.id]); pool.close()
    """

    prefix: str
    keep: int = 4
    max_slots: int = 256
    slots: dict[int, Slot] = field(default_factory=dict)
    next_id: int = 0
    hint: int = 0  # bytes the last batches needed
    failed: str | None = None  # why shared memory could not be used
    retired: list[int] = field(default_factory=list)

    def acquire(self, nbytes: int) -> Slot | None:
        best: Slot | None = None
        for slot in self.slots.values():
            if slot.free and slot.size >= nbytes and (best is None or slot.size < best.size):
                best = slot
        if best is None:
            if self.failed is not None or len(self.slots) >= self.max_slots:
                return None
            size = max(MIN_SLOT, nbytes + nbytes // 4, self.hint + self.hint // 4)
            name = f"{self.prefix}{self.next_id}"
            try:
                seg = Segment.create(name, size)
            except OSError as exc:
                self.failed = f"could not create a {size}-byte segment in /dev/shm ({exc})"
                return None
            best = Slot(self.next_id, seg)
            self.slots[self.next_id] = best
            self.next_id += 1
        best.free = False
        return best

    def release(self, ids: list[int]) -> None:
        for i in ids:
            slot = self.slots.get(i)
            if slot is not None:
                slot.free = True
        self._trim()

    def _trim(self) -> None:
        free = [s for s in self.slots.values() if s.free]
        small = [s for s in free if s.size < self.hint]
        extra = sorted(free, key=lambda s: s.size)[: max(0, len(free) - self.keep)]
        for slot in {s.id: s for s in small + extra}.values():
            del self.slots[slot.id]
            slot.segment.unlink()
            slot.segment.close()
            self.retired.append(slot.id)

    def take_retired(self) -> list[int]:
        out, self.retired = self.retired, []
        return out

    def close(self, keep_sent: bool = False) -> None:
        """Unmap every slot and unlink it. ``keep_sent``: a slot not free may hold a batch sent
        to the main process and not yet read there; its name is left for the main process,
        which maps what it still has to read and then sweeps this pool's prefix."""
        for slot in self.slots.values():
            if slot.free or not keep_sent:
                slot.segment.unlink()
            slot.segment.close()
        self.slots.clear()


class Writer:
    """Bump allocation of one batch's leaves across the pool's slots (worker side)."""

    __slots__ = ("pool", "slot", "offset", "used", "placed", "total", "inline_bytes")

    def __init__(self, pool: SlotPool, inline_bytes: int = 1 << 15) -> None:
        self.pool = pool
        self.inline_bytes = max(1, inline_bytes)
        self.slot: Slot | None = None
        self.offset = 0
        self.used: list[Slot] = []
        self.placed: dict[int, tuple[int, int, int]] = {}  # data ptr -> (slot id, offset, nbytes)
        self.total = 0

    def reset(self) -> None:
        """Start the next batch (one Writer serves a worker's batches one after another:
        making one costs a worker ~8 us a batch with a cold cache)."""
        if self.used:
            self.slot = None
            self.offset = 0
            self.used = []
            self.total = 0
        if self.placed:
            self.placed.clear()

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        nbytes = math.prod(shape) * dtype.itemsize  # np.prod on a tuple: ~5 us a leaf
        if nbytes < self.inline_bytes:
            return None  # small leaves travel inside the message: cheaper than a mapping
        slot = self.slot
        if slot is None or self.offset + nbytes > slot.size:
            want = max(nbytes, self.pool.hint - self.total)
            slot = self.pool.acquire(want)
            if slot is None:
                return None
            self.slot = slot
            self.offset = 0
            self.used.append(slot)
        start = self.offset
        self.offset = _align(start + nbytes)
        self.total += nbytes
        arr = np.frombuffer(slot.segment.buf, dtype=np.uint8, count=nbytes, offset=start)
        arr = arr.view(dtype).reshape(shape)
        self.placed[arr.__array_interface__["data"][0]] = (slot.id, start, nbytes)
        return arr

    __call__ = alloc  # the allocator protocol of ``collate.use_allocator``

    @property
    def min_bytes(self) -> int:
        """Leaves smaller than this are refused (they travel in the message): told to collate,
        which then skips its checks for them (~20 us a batch of small tensors, cold)."""
        return self.inline_bytes

    def locate(self, ptr: int, nbytes: int) -> tuple[int, int] | None:
        where = self.placed.get(ptr)
        if where is None or where[2] != nbytes:
            return None
        return where[0], where[1]

    def finish(self) -> list[int]:
        """Slots this batch uses; remembers its size as the next hint."""
        self.pool.hint = max(self.total, (self.pool.hint * 7 + self.total) // 8)
        return [s.id for s in self.used]

    def abandon(self) -> None:
        self.pool.release([s.id for s in self.used])


class Views:
    """Main-side mapping of worker slots, with release-on-garbage-collection."""

    def __init__(self, pinner: Any = None) -> None:
        self.pinner = pinner  # registers each mapped slot with CUDA once (pin_memory=True)
        self.segments: dict[tuple[int, int, int], Segment] = {}  # (worker, gen, slot) -> segment
        self.freed: collections.deque[tuple[int, int, int]] = collections.deque()
        # freed slots held back until a CUDA event passes (SlotPinner.fence): oldest first
        self.fenced: collections.deque[tuple[Any, list[tuple[int, int, int]]]] = collections.deque()
        self.closed = False

    def root(self, key: tuple[int, int, int], name: str) -> np.ndarray:
        seg = self.segments.get(key)
        if seg is None:
            seg = Segment.attach(name)
            self.segments[key] = seg
            if self.pinner is not None:
                self.pinner.register(seg)
        arr = np.frombuffer(seg.buf, dtype=np.uint8)
        weakref.finalize(arr, self.freed.append, key)
        return arr

    def keep(self, key: tuple[int, int, int], name: str) -> None:
        """Map a slot now (if it still exists), so that it can be read after it is unlinked."""
        if key not in self.segments:
            try:
                self.segments[key] = Segment.attach(name)
            except OSError:
                return
            if self.pinner is not None:
                self.pinner.register(self.segments[key])

    def take_freed(self) -> list[tuple[int, int, int]]:
        """Slots whose views are gone and that no queued device copy may still read."""
        out: list[tuple[int, int, int]] = []
        fenced = self.fenced
        while fenced and fenced[0][0].query():
            out += fenced.popleft()[1]
        freed = self.freed
        if freed:
            keys = []
            while freed:
                keys.append(freed.popleft())
            event = self.pinner.fence() if self.pinner is not None else None
            if event is None:
                out += keys
            else:
                fenced.append((event, keys))
        return out

    def retire(self, worker: int, gen: int, ids: list[int]) -> None:
        for i in ids:
            seg = self.segments.pop((worker, gen, i), None)
            if seg is not None:
                self._unmap(seg, sync=False)

    def forget_worker(self, worker: int, gen: int) -> None:
        for key in [k for k in self.segments if k[0] == worker and k[1] == gen]:
            self._unmap(self.segments.pop(key), sync=True)

    def _unmap(self, seg: Segment, *, sync: bool) -> None:
        if self.pinner is not None:
            self.pinner.unregister(seg, sync=sync)
        seg.close()  # stays mapped while the user still holds views

    def close(self) -> None:
        self.closed = True
        self.fenced.clear()  # the unmapping below waits for the device
        for seg in self.segments.values():
            self._unmap(seg, sync=True)
        self.segments.clear()

