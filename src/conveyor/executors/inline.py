"""``num_workers=0``: tasks run in the caller's thread, one at a time, on demand."""

from __future__ import annotations

import collections
from typing import Any

from .. import rng
from .base import Event, Executor
from .seeding import rng_lock
from .task import Result, Task
from .fetcher import Fetcher
from .worker import WorkerSpec

__all__ = ["InlineExecutor", "run_here"]


def run_here(fetcher: Fetcher, task: Task, seeded: bool) -> Result:
    """Run ``task`` in this thread with ``fetcher``. ``seeded`` (a loader seed): the samples
    reseed the global RNGs, and the caller's states are put back after the batch, under
    the RNG lock that thread workers seeding meanwhile take too."""
    if not seeded:
        fetcher.schedule(task)
        return fetcher.run(task)
    # saved before the fetch threads start on the task's samples, which seed the RNGs, and
    # not while a thread worker is between seeding a sample and its draws
    with rng_lock:
        saved = rng_lock.save()
    try:
        fetcher.schedule(task)
        return fetcher.run(task)
    finally:
        with rng_lock:
            rng_lock.restore(saved)


class InlineExecutor(Executor):
    """Runs each task when the loader polls for it; nothing is fetched ahead."""

    kind = "inline"
    num_workers = 1  # one slot for dispatch; get_worker_info() stays None

    def __init__(self, spec: WorkerSpec, fetcher: Fetcher) -> None:
        self.fetcher = fetcher  # the pool's own (Pool.local_fetcher): one fetcher in the main process
        self.queue: collections.deque[Task] = collections.deque()
        # With a loader seed, samples reseed the global RNGs; the user's state
        # is put back after each batch so the main thread's RNG is not disturbed.
        self.restore_rng = spec.seed is not None
        # A stream is not seeded per sample: it draws on from batch to batch, from its own RNG
        # state, seeded at each epoch's start as a process worker seeds its (so that its draws
        # are those of num_workers=1). Restoring the caller's state alone made every batch
        # start from the same state, and draw the same.
        self.spec = spec
        self.stream_rng: rng.RngState | None = None
        self.stream_epoch: int | None = None

    def submit(self, worker: int, tasks: list[Task], grouped: bool = False) -> None:
        self.queue.extend(tasks)

    def poll(self, timeout: float | None) -> list[Event]:
        if not self.queue:
            return []
        task = self.queue.popleft()
        if not (self.restore_rng and self.spec.iterable):
            return [run_here(self.fetcher, task, self.restore_rng)]
        self.fetcher.schedule(task)
        saved = rng.RngState()
        if self.stream_epoch != task.epoch or self.stream_rng is None:
            assert self.spec.seed is not None
            rng.seed_worker(rng.mix(self.spec.seed, task.epoch, rng.STREAM_SALT) >> 1, 0)
            self.stream_epoch = task.epoch
        else:
            self.stream_rng.restore()
        try:
            return [self.fetcher.run(task)]
        finally:
            self.stream_rng = rng.RngState()
            saved.restore()

    def set_threads(self, n: int) -> None:
        self.fetcher.set_threads(n)

    def grow(self, n: int) -> None:
        pass

    def outstanding(self, worker: int) -> int:
        return len(self.queue)

    def alive(self, worker: int) -> bool:
        return True

    def restart(self, worker: int, wait_s: float = 60.0) -> list[Task]:
        return []

    def release(self, result: Result) -> None:
        pass

    def decode(self, result: Result) -> Any:
        return result.batch

    def close(self) -> None:
        self.queue.clear()
        self.fetcher.close()
