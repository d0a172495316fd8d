"""``worker_type="thread"``: workers are threads of this process.

Cheap to start and share the dataset without copies; right for I/O-bound
datasets and for code that releases the GIL (decoders, numpy, torch ops).
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import time
from typing import Any

from ..errors import Failure, capture
from .base import Event, Executor, Ledger
from .task import Result, Task
from .info import set_info
from .seeding import rng_lock
from .worker import WorkerSpec, start_worker, torch_for

__all__ = ["ThreadExecutor"]

_STOP = None


class _Threads:
    """A control message: fetch ``n`` samples at once from now on."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class ThreadExecutor(Executor):
    kind = "thread"

    def __init__(self, spec: WorkerSpec, num_workers: int) -> None:
        self.spec = spec
        self.num_workers = num_workers
        self.ledger = Ledger(0)
        self.results: queue.SimpleQueue[Result] = queue.SimpleQueue()
        self.queues: list[queue.SimpleQueue[Task | None]] = []
        self.threads: list[threading.Thread] = []
        self.busy: list[bool] = []  # a worker thread is running a task (its result not yet queued)
        self._suspect: dict[int, tuple[float, frozenset[int]]] = {}  # worker -> (since, seqs) (see _bury)
        self.init_failures: dict[int, Failure] = {}  # worker -> why it could not start (it has ended)
        self.hung: set[int] = set()  # workers a timeout found stuck: close() does not wait for them
        self.fetchers: dict[int, Any] = {}  # worker -> its Fetcher (close() looks for stuck fetch threads)
        # A task's fetches start when it is handed over (``submit``), as in a process worker, not
        # when its worker thread gets to it: that thread waits on one batch at a time, and batches
        # of one sample would be fetched one after another whatever the fetch threads. ``scheduled``:
        # per worker, the tasks started so; ``_fetching`` keeps a change of thread count (a new
        # pool) from crossing a fetch being started.
        self.scheduled: list[set[int]] = []
        self._fetching = threading.Lock()
        self.closed = False
        self.pid = os.getpid()
        self.fetch_threads = spec.fetch_threads
        self.num_workers = 0
        torch_for(spec)  # before the threads (a dataset importing torch late: each would read the whole stream)
        self.grow(num_workers)

    def grow(self, n: int) -> None:
        """Start more worker threads, up to ``n`` in all."""
        while self.num_workers < n:
            w = self.num_workers
            q: queue.SimpleQueue[Any] = queue.SimpleQueue()
            t = threading.Thread(target=self._loop, args=(w, q), name=f"conveyor-worker-{w}", daemon=True)
            self.queues.append(q)
            self.threads.append(t)
            self.busy.append(False)
            self.scheduled.append(set())
            self.ledger.held.append({})
            self.num_workers += 1
            t.start()
            if self.fetch_threads != self.spec.fetch_threads:
                q.put(_Threads(self.fetch_threads))

    def set_threads(self, n: int) -> None:
        self.fetch_threads = n
        for q in self.queues:
            q.put(_Threads(n))

    def _loop(self, worker: int, q: queue.SimpleQueue[Task | None]) -> None:
        # Nothing a failure refers to may stay in this frame while it waits: the exception,
        # once raised in the main thread, refers to the loop's frames and through them to the
        # loader, and this live thread would keep the loader from being collected, and with
        # it the finalizer that stops this thread.
        try:
            fetcher = start_worker(self.spec, worker, kind="thread")
            self.fetchers[worker] = fetcher
        except Exception as exc:
            # every task of this worker fails with this, answered by the executor (see
            # submit): the thread ends rather than hold the exception
            self.init_failures[worker] = capture(exc, worker, None, "running worker_init_fn", keep=True)
            del exc
            self._answer_init_failure(worker, q)
            return
        # what was queued before the fetcher was ready, taken off the queue with its fetches
        # started, in order (_STOP last, if it came)
        taken: collections.deque[Task | None] = collections.deque()
        self._take(worker, q, taken, fetcher)
        try:
            while True:
                task = taken.popleft() if taken else q.get()
                if task is _STOP or self.closed:
                    return  # closed: the tasks still queued behind a stuck one are not run
                if type(task) is _Threads:
                    with self._fetching:
                        fetcher.set_threads(task.n)
                    continue
                self._schedule(worker, fetcher, task)
                self.scheduled[worker].discard(task.seq)
                self.busy[worker] = True
                try:
                    result = fetcher.run(task)
                except BaseException as exc:  # noqa: BLE001 - SystemExit and the like: raised where next() was called
                    result = Result(task.seq, worker, failure=capture(exc, worker, task.indices, keep=True))
                self.results.put(result)
                del result, task
                self.busy[worker] = False
        finally:
            fetcher.close()
            set_info(None, thread=True)

    def _take(self, worker: int, q: queue.SimpleQueue[Any], taken: collections.deque[Task | None],
              fetcher: Any) -> None:
        """Move what is queued for a worker to ``taken``, starting the fetches of its tasks (a
        change of thread count applies to the tasks after it; nothing is taken after _STOP)."""
        while not taken or taken[-1] is not _STOP:
            try:
                item = q.get_nowait()
            except queue.Empty:
                return
            if type(item) is _Threads:
                with self._fetching:
                    fetcher.set_threads(item.n)
                continue
            if item is not _STOP:
                self._schedule(worker, fetcher, item)
            taken.append(item)

    def _schedule(self, worker: int, fetcher: Any, task: Task) -> None:
        """Start ``task``'s fetches unless they were (a task made again starts anew)."""
        if task.seq not in self.scheduled[worker]:
            with self._fetching:
                fetcher.schedule(task)
            self.scheduled[worker].add(task.seq)

    def submit(self, worker: int, tasks: list[Task], grouped: bool = False) -> None:
        self.ledger.add(worker, tasks)
        q = self.queues[worker]
        fetcher = self.fetchers.get(worker)  # None until the worker has started: it starts them
        for t in tasks:
            if fetcher is not None and not self.closed:
                self._schedule(worker, fetcher, t)  # (before the task is queued: its thread sees it)
            q.put(t)
        if worker in self.init_failures:
            self._answer_init_failure(worker, q)

    def _answer_init_failure(self, worker: int, q: queue.SimpleQueue[Any]) -> None:
        """Fail every task queued for a worker whose start failed, with that failure."""
        failure = self.init_failures[worker]
        while True:
            try:
                task = q.get_nowait()
            except queue.Empty:
                return
            if task is not _STOP and type(task) is not _Threads:
                self.results.put(Result(task.seq, worker, failure=failure))

    def poll(self, timeout: float | None) -> list[Event]:
        try:
            first = self.results.get(timeout=timeout) if timeout is None or timeout > 0 else self.results.get_nowait()
        except queue.Empty:
            self._bury()
            return []
        out: list[Event] = [first]
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                break
        for r in out:
            assert isinstance(r, Result)
            self.ledger.done(r.worker, r.seq)
        return out

    def _bury(self) -> None:
        """A worker thread that ended while holding tasks (it catches everything its tasks raise,
        so only a fault of its own ends it) fails them, rather than leave next() waiting."""
        if self.closed:
            return
        for w, t in enumerate(self.threads):
            if not t.is_alive() and w in self.init_failures:
                self._answer_init_failure(w, self.queues[w])
            elif not t.is_alive() and self.ledger.count(w):
                exc = RuntimeError(f"thread worker {w} stopped unexpectedly while holding batches")
                for task in self.ledger.take(w):
                    self.results.put(Result(task.seq, w, failure=capture(exc, w, task.indices, keep=True)))
            elif (self.ledger.count(w) and not self.busy[w] and self.queues[w].empty()
                  and self.results.empty()):
                # its tasks are neither queued, running nor answered: their results were taken
                # off the queue and lost on the way (a KeyboardInterrupt in poll()). Seen so
                # twice, half a second apart (a thread between taking a task and marking itself
                # busy looks the same for an instant), they are made again; a result that turns
                # up twice is dropped as one no longer awaited
                held = frozenset(self.ledger.held[w])
                seen = self._suspect.get(w)
                now = time.monotonic()
                if seen is None or seen[1] != held:
                    self._suspect[w] = (now, held)
                elif now - seen[0] >= 0.5:
                    del self._suspect[w]
                    for task in self.ledger.held[w].values():
                        self.queues[w].put(task)
            else:
                self._suspect.pop(w, None)

    def outstanding(self, worker: int) -> int:
        return self.ledger.count(worker)

    def alive(self, worker: int) -> bool:
        return self.threads[worker].is_alive()

    def restart(self, worker: int, wait_s: float = 60.0) -> list[Task]:
        return []

    def release(self, result: Result) -> None:
        pass

    def decode(self, result: Result) -> Any:
        return result.batch

    def close(self, timeout: float = 5.0) -> None:
        if self.closed or os.getpid() != self.pid:
            return
        self.closed = True
        for q in self.queues:
            q.put(_STOP)
        deadline = time.monotonic() + timeout  # one wait for all, not ``timeout`` for each stuck thread
        me = threading.current_thread()
        for w, t in enumerate(self.threads):
            if t is me:
                # closed from one of its own threads (a collection of a dropped loader, set off
                # by a batch this thread allocates): it ends at its _STOP, after this returns
                continue
            # a thread cannot be killed: one a timeout found stuck (a read that never returns)
            # would only hold closing up, ~5 s after the timeout error (it ends with its batch)
            t.join(0.0 if w in self.hung else max(0.0, deadline - time.monotonic()))
        stuck = [w for w, t in enumerate(self.threads) if t.is_alive() and t is not me]
        if stuck:
            rng_lock.abandon(self._idents(stuck))

    def held(self) -> list[dict[int, Task]]:
        return self.ledger.held

    def give_up(self, worker: int) -> None:
        """A timeout found ``worker`` stuck: closing will not wait for it, and a seeded sample
        it is stuck in no longer holds every other seeded loader of the process up."""
        self.hung.add(worker)
        rng_lock.abandon(self._idents([worker]))

    def _idents(self, workers: list[int]) -> set[int]:
        """The threads of these workers: each one's own and its fetch threads'."""
        idents = {self.threads[w].ident for w in workers} - {None}
        for w in workers:
            pool = getattr(self.fetchers.get(w), "pool", None)
            if pool is not None:
                idents |= {t.ident for t in pool.threads} - {None}
        return idents
