"""Fetch threads: the samples of a batch fetched N at a time, with one wake-up per batch.

``fetch_threads=N`` makes a worker fetch N samples at once. A
``concurrent.futures.ThreadPoolExecutor`` would do, but costs a Future, a
condition variable and a notify per sample; with samples that wait on storage
the threads wake together and queue for the GIL, so that cost is paid in
series. Here a batch is one object, each thread writes its sample into the
batch's list and the last one sets a single event
(docs/decisions/fetch-pool-one-event-per-batch.md).

::

    pool.submit(fn, items, epoch) --> Batch   (items queued in order, FIFO across batches)
    thread: item --> fn(item, epoch) --> batch.out[k]; the last one sets batch.done
    batch.wait(timeout) / batch.results()  (the first failure, in item order, is raised)
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from time import perf_counter
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Batch", "FetchPool"]


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Batch:
    """The samples of one batch, filled in by the fetch threads."""

    __slots__ = ("out", "left", "lock", "done", "spent")

    def __init__(self, n: int) -> None:
        self.out: list[Any] = [None] * n
        self.left = n
        self.spent = 0.0  # wall seconds its fetches took, added up (lane-seconds)
        self.lock = threading.Lock()
        self.done = threading.Event()
        if n == 0:
            self.done.set()

    def _put(self, k: int, value: Any, spent: float = 0.0) -> None:
        self.out[k] = value
        with self.lock:
            self.spent += spent
            self.left -= 1
            last = self.left == 0
        if last:
            self.done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once every sample is in (False: ``timeout`` passed first)."""
        return self.done.wait(timeout)

    def results(self) -> list[Any]:
        """The samples in item order; raises the first failure (its original exception)."""
        self.done.wait()
        for value in self.out:
            if type(value) is _Failed:
                raise value.exc
        return self.out


class FetchPool:
    """``n`` daemon threads running ``fn(item, epoch)`` for the items of submitted batches.

    >>> pool = FetchPool(4)
    >>> pool.submit(lambda i, e: i * 10 + e, [1, 2, 3], 0).results()
    [10, 20, 30]
    >>> pool.close()  # the threads still running after the join: none here
    []
    """

    def __init__(self, n: int, name: str = "conveyor-fetch", init: Callable[[], None] | None = None) -> None:
        self.n = n
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._flags = _Flags()
        # the threads hold the queue, not the pool: a pool nobody holds (its fetcher dropped
        # with a loader in a reference cycle) is collected, and its finalizer ends them
        self.threads = [threading.Thread(target=_serve, args=(self.queue, self._flags, init),
                                         name=f"{name}_{i}", daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()
        self._finalizer = weakref.finalize(self, _release, self.queue, n)

    @property
    def closed(self) -> bool:
        return self._flags.closed

    def submit(self, fn: Callable[[Any, Any], Any], items: Sequence[Any], epoch: Any = None) -> Batch:
        """Queue ``fn(item, epoch)`` for every item; returns the batch they fill."""
        batch = Batch(len(items))
        put = self.queue.put
        for k, x in enumerate(items):
            put((batch, k, fn, x, epoch))
        return batch

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``[fn(x) for x in items]``, run on the threads."""
        return self.submit(lambda x, _: fn(x), items).results()

    def close(self, wait: bool = True, cancel: bool = False, timeout: float | None = None) -> list[threading.Thread]:
        """Stop the threads once the queue is drained (``cancel``: drop what is still queued).
        With ``wait``, join them, for at most ``timeout`` seconds in all: returns those still
        running then (a fetch that never returns: a read of storage that hangs)."""
        self._flags.closed = self._flags.closed or cancel
        if self._finalizer.detach() is not None:
            _release(self.queue, self.n)
        if not wait:
            return []
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return [t for t in self.threads if t.is_alive()]


class _Flags:
    __slots__ = ("closed",)

    def __init__(self) -> None:
        self.closed = False  # cancelled: queued fetches are failed, not run


def _release(q: queue.SimpleQueue[Any], n: int) -> None:
    for _ in range(n):
        q.put(None)


def _serve(q: queue.SimpleQueue[Any], flags: _Flags, init: Callable[[], None] | None) -> None:
    """A fetch thread: run queued fetches until a ``None`` arrives."""
    if init is not None:
        init()
    get = q.get
    while True:
        item = get()
        if item is None:
            return
        batch, k, fn, x, epoch = item
        if flags.closed:  # cancelled: the batch is abandoned, nobody waits on it
            batch._put(k, _Failed(RuntimeError("fetch pool closed")))
            continue
        t0 = perf_counter()
        try:
            value = fn(x, epoch)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever collects the batch
            value = _Failed(exc)
        batch._put(k, value, perf_counter() - t0)
        del item, batch, fn, x, value
