"""The main process's one executor: every batch made in the caller's thread goes through it.

A pool has one (``Pool.main``), whatever its workers; its fetcher is made on first use.
A batch is made here in one of four ways:

- ``fetcher.quick``: a plain batch (no per-sample seeding, no skipping), fetched and
  collated with no task envelope (``here.quick`` and the lean path call it);
- ``run``: a task in its envelope (a loader seed, ``on_error="skip"``, a probing batch),
  a ``Result``, with the caller's RNGs as they were where the samples reseed them;
- ``gather``: many batches of in-memory arrays at once (``ArrayDataset.gather``), split
  into views (``here.bulk``);
- ``submit`` / ``poll``: the ``Executor`` protocol, where the pool has no workers: a
  stream's tasks, run one at a time as the loader polls.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _torch, rng
from .base import Event, Executor
from .seeding import rng_lock
from .task import Result, Task
from .fetcher import Fetcher
from .worker import WorkerSpec

__all__ = ["MainProcess"]


def _torch_split() -> Callable[[Any, int], Any]:
    """``torch.split`` without the Python wrapper around it (a third of its cost on small tensors)."""
    torch = _torch.get()
    assert torch is not None
    return getattr(getattr(torch, "_VF", None), "split", None) or torch.split


class MainProcess(Executor):
    """Makes batches in the caller's thread (see the module's docstring); as the executor of
    a pool without workers, runs each task when the loader polls for it, nothing ahead."""

    kind = "inline"
    num_workers = 1  # one slot for dispatch; get_worker_info() stays None

    def __init__(self, spec: WorkerSpec, make_fetcher: Callable[[], Fetcher]) -> None:
        self.spec = spec  # (its seed and kind of dataset: the fetcher reads the pool's spec as it is then)
        self._make_fetcher = make_fetcher
        self._fetcher: Fetcher | None = None
        self.queue: collections.deque[Task] = collections.deque()
        # A stream is not seeded per sample: it draws on from batch to batch, from its own RNG
        # state, seeded at each epoch's start as a process worker seeds its (so that its draws
        # are those of num_workers=1). Restoring the caller's state alone would make every
        # batch start from the same state, and draw the same.
        self.stream_rng: rng.RngState | None = None
        self.stream_epoch: int | None = None

    @property
    def fetcher(self) -> Fetcher:
        """The main process's fetcher (made on first use: the pool notes the open files first)."""
        fetcher = self._fetcher
        if fetcher is None:
            fetcher = self._fetcher = self._make_fetcher()
        return fetcher

    def run(self, task: Task, watch: tuple[float, Callable[[], float | None]] | None = None) -> Result:
        """Run ``task`` here. With a loader seed its samples reseed the global RNGs: the
        caller's states are put back after the batch, under the RNG lock that thread workers
        seeding meanwhile take too; a stream draws on from its own seeded state instead.
        ``watch`` (a probing batch): after ``watch[0]`` seconds of the batch, call
        ``watch[1]``, and again after the delay it returns (None: no more)."""
        if self.spec.seed is not None and self.spec.iterable:
            return self._run_stream(task)
        saved = None
        if self.spec.seed is not None:
            # saved before the fetch threads start on the task's samples, which seed the RNGs,
            # and not while a thread worker is between seeding a sample and its draws
            with rng_lock:
                saved = rng_lock.save()
        fetcher = self.fetcher
        try:
            fetcher.schedule(task)
            fetcher.watch = watch
            return fetcher.run(task)
        finally:
            fetcher.watch = None
            if saved is not None:
                with rng_lock:
                    rng_lock.restore(saved)

    def _run_stream(self, task: Task) -> Result:
        self.fetcher.schedule(task)
        saved = rng.RngState()
        if self.stream_epoch != task.epoch or self.stream_rng is None:
            assert self.spec.seed is not None
            rng.seed_worker(rng.mix(self.spec.seed, task.epoch, rng.STREAM_SALT) >> 1, 0)
            self.stream_epoch = task.epoch
        else:
            self.stream_rng.restore()
        try:
            return self.fetcher.run(task)
        finally:
            self.stream_rng = rng.RngState()
            saved.restore()

    def batches_a_gather(self, size: int) -> int:
        """How many batches of ``size`` rows one ``gather`` reads: up to 64, within 8 MiB."""
        arrays = getattr(self.spec.dataset, "arrays", ())
        row = sum(a[:1].nbytes if hasattr(a, "nbytes") else a[:1].element_size() * a[:1].numel() for a in arrays)
        return max(1, min(64, (8 << 20) // max(1, row * size)))

    def gather(self, indices: Any, size: int) -> list[Any]:
        """The batches of ``size`` rows (the last may be shorter) of one gather of ``indices``
        from the dataset's arrays, as (batch, rows) pairs of views."""
        cols = self.spec.dataset.gather(indices, output=self.spec.output)
        if self.spec.output == "torch":
            split = _torch_split()
            parts = [split(c, size) for c in cols]
        else:
            cuts = list(range(size, len(indices), size))
            parts = [np.split(c, cuts) for c in cols]
        count = len(parts[0])
        sizes = [size] * count
        sizes[-1] = len(indices) - size * (count - 1)
        return list(zip(map(list, zip(*parts)), sizes))

    # -- the Executor protocol, for a pool without workers ---------------------
    def submit(self, worker: int, tasks: list[Task], grouped: bool = False) -> None:
        self.queue.extend(tasks)

    def poll(self, timeout: float | None) -> list[Event]:
        if not self.queue:
            return []
        return [self.run(self.queue.popleft())]

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

    def close(self) -> None:
        self.queue.clear()
        if self._fetcher is not None:
            self._fetcher.close()
