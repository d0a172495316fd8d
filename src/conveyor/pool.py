"""An epoch's workers and the main process's own executor: started lazily, closed once.

A ``Pool`` holds the executor (process or thread workers; without workers, the main
process's ``MainProcess``, which also makes every batch made here), the spec every worker
is made from (dataset, collate_fn, seeds), the task numbers (``seq``, growing across
epochs) and how tasks are grouped. Where it adapts
(``"auto"``, ``adaptive=True``), its ``Probe`` (``placement/probe.py``) decides where batches
are made (``Mode``), and ``apply`` carries out the tuner's choices.
"""

from __future__ import annotations

import dataclasses
import warnings
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _torch
from .executors import inherit
from ._platform.signals import hold_ctrl_c
from .executors.grouping import Grouping
from .executors.inline import MainProcess
from .executors.processes import ProcessExecutor
from .executors.threads import ThreadExecutor
from .executors.fetcher import Fetcher
from .order import reads_ahead_freely
from .placement import rules
from .placement.probe import Probe
from .placement.rules import Mode
from .placement import Tuner
from .placement import cpu_share as _cores

if TYPE_CHECKING:
    from .loader import DataLoader

__all__ = ["Pool", "close_all", "pinner"]


class Pool:
    """The workers of a loader (started lazily), the main process's own executor, and the seed.

    ``mode`` says where batches are made: by the workers, unless the pool adapts
    (``num_workers="auto"``, ``adaptive=True``), where its ``Probe`` decides.
    """

    def __init__(self, loader: DataLoader[Any], base_seed: int) -> None:
        self.spec = loader._spec(base_seed)
        self.base_seed = base_seed
        self.num_workers = loader.num_workers
        self.threads = loader.fetch_threads
        pf = loader.prefetch_factor
        self.prefetch = 2 if pf is None else max(1, pf)
        self.auto = loader._auto
        self.tuner: Any = None
        # a batch made in the main process cannot be timed out: with a timeout, workers make
        # every batch (no probing here; "auto" starts with a worker per core and trims the rest)
        self.timed = loader.timeout > 0
        kept = None
        if self.auto is not None:
            kept = loader._tuner
            self.tuner = loader._tuner = kept or Tuner(
                cpu=_cores(), warmup=rules.RETUNE_EVERY, workers=None if self.auto["num_workers"] else self.num_workers)
            if loader._iterable:
                self.tuner.one_thread("an iterable dataset's worker reads its one iterator: 1 thread")
            if self.auto["num_workers"] and not self.timed:
                self.num_workers = 0
        self.launcher = Launcher(self, loader)
        self.recycler = loader._recycler  # large batches made in this process reuse memory
        self.dead = False
        self.seq = 0  # next task number; grows across epochs
        self.epoch_start = 0  # seq of the current epoch's first batch
        self._holder: list[Any] = []  # the executor, once started
        me = weakref.ref(self)  # (not the pool itself: a dropped pool is freed, and its workers stopped, at once)
        self.main = MainProcess(self.spec, lambda: me()._main_fetcher())  # every batch made in this process
        self.persistent = loader.persistent_workers
        self.launched = False  # workers were started at some point
        self.delivered = False  # a worker has handed back a batch
        self.closer: int | None = None  # the thread that closed this pool
        self.inline_batches = 0
        # batches a process worker's task carries (executors/grouping.py): map-style only, where
        # a worker's task is its batch's indices and nothing hangs on the stream it reads
        self.grouping = Grouping()
        if loader._iterable or self.threads != 1 or not loader._groups_ok or not reads_ahead_freely(loader):
            self.grouping.decided = True
        from .datasets import ArrayDataset

        # ArrayDataset.gather draws no randomness: many batches can be gathered at once, and
        # an in-memory gather is never faster in a worker (which would copy it once more)
        self.bulk = self.spec.gather and isinstance(loader.dataset, ArrayDataset) and loader.on_error == "raise"
        # plain batches (no per-sample seeding, no skipping) need no task envelope in the main process
        self.quick = (self.spec.auto_collation and not self.spec.iterable and self.spec.seed is None
                      and self.spec.on_error == "raise")
        auto_workers = bool(self.auto is not None and self.auto["num_workers"] and not self.timed)
        self.mode = Mode.WORKERS
        self.probe = Probe(self, loader, auto_workers)  # (sets the mode where the main process probes)
        if self.bulk and self.mode == Mode.PROBE:
            self.mode = Mode.INLINE
        if self.bulk and self.tuner is not None and auto_workers:
            self.tuner.pin({"num_workers": 0, "fetch_threads": 1, "prefetch_factor": None,
                            "reason": "in-memory arrays: one gather in the main process beats any worker"})
        if kept is not None and not kept.measuring and not self.bulk:
            self.probe.resume(kept)
        if self.num_workers == 0 and not auto_workers:
            # the main process is the executor: a stream's tasks through the protocol, a map-style
            # dataset's batches by the quick path or with their envelope (Probe.fetch_here)
            self._holder.append(self.main)
            if not loader._iterable:
                self.mode = Mode.INLINE  # no workers: every batch is made here
        self.probe.time_the_epoch()

    def serves_every_epoch(self) -> bool:
        """Is this an "auto" pool that settled on the main process for good (its choice of no
        workers and one thread pinned, no worker ever started)? Such a pool holds nothing an
        epoch must renew, so later epochs share it, as a loader without workers shares its
        own: making and closing one costs "auto" ~100 us an epoch."""
        tuner = self.tuner
        return (self.auto is not None and tuner is not None and tuner.pinned and self.mode == Mode.INLINE
                and self.num_workers == 0 and self.threads == 1 and not self.launched and not self.dead
                and not self._holder)

    @property
    def started(self) -> bool:
        return bool(self._holder)

    @property
    def started_executor(self) -> Any:
        """The executor if it has started, else None (never starts it)."""
        return self._holder[0] if self._holder else None

    def try_start(self) -> bool:
        """Start the executor now (a probing batch found its workers worth starting early).
        On failure it is forgotten, not raised: the error surfaces again, with its context,
        at the next dispatch, which starts it once more."""
        try:
            _ = self.executor
        except Exception:  # noqa: BLE001 - see above
            self._holder.clear()
            self.launcher.closers.clear()
            return False
        return True

    @property
    def executor(self) -> Any:
        if not self._holder:
            if self.dead:
                raise RuntimeError("this DataLoader's workers were shut down")
            if self.tuner is not None:
                # the RAM budget is the memory free before the workers take theirs: read after
                # their start, what they hold would be missing from it and then charged to it again
                _ = self.tuner.ram
            # started and recorded with a Ctrl-C held: one in between would leave an executor nothing
            # closes (its workers ending unjoined, their process objects' pipes open for good)
            with hold_ctrl_c():
                me = weakref.ref(self)
                ex = self.launcher.start(self.spec, lambda: getattr(me(), "spec", None), self.num_workers,
                                         self.probe.loop_stats.shipping)
                self._holder.append(ex)
            if self.dead:  # close() from another thread while they started: nothing else closes them
                ex.close()
                raise RuntimeError("this DataLoader's workers were shut down")
            self.launched = True
            self.probe.fed_from = self.probe.loop_stats.mark()
            if self.tuner is not None:
                self.tuner.workers_run = self.num_workers
            if self.auto is None:
                self.probe.findings.workers_paid = True
        return self._holder[0]

    def depth(self) -> int:
        """Batches each worker holds at once: ``prefetch_factor``, and with fetch threads at
        least enough that the threads never run dry while a finished batch makes its trip
        and waits its turn to be handed out (64 threads and batches of 32: 4 batches)."""
        size = self.spec.batch_size or 1
        if self.threads > 1:
            return max(self.prefetch, -(-self.threads // size) + 2)
        return self.prefetch * self.grouping.size  # (prefetch_factor tasks of grouped batches)

    def bulk_ok(self) -> bool:
        """May the main process gather many batches at once (in-memory arrays, main-process mode)?"""
        return self.bulk and (self.mode == Mode.INLINE or (self.num_workers == 0 and self.tuner is None))

    def starting(self) -> bool:
        """Are some of the workers started still starting (as far as their hellos read)?"""
        if not self.started:
            return False
        ex = self.executor
        return ex.ready < ex.num_workers

    def _main_fetcher(self) -> Fetcher:
        """The main process's fetcher, as ``self.main`` first needs it."""
        if self.num_workers or self.auto:
            self.launcher.mark_files()  # before this process first touches the dataset
        # thread workers share this process's RNGs: its seeded samples take the lock too
        fetcher = Fetcher(self.spec, None, shared_rng=self.launcher.worker_type == "thread")
        fetcher.allocator.alloc = self.recycler
        return fetcher

    def apply(self, workers: int, threads: int, prefetch: int) -> None:
        if workers > 0 and self.mode != Mode.WORKERS or workers > self.num_workers:
            if not self.started:
                self.num_workers = workers
                self.spec = dataclasses.replace(self.spec, fetch_threads=threads, num_workers=workers)
                self.threads = threads
                self.mode = Mode.WORKERS
                _ = self.executor
            else:
                self.executor.grow(workers)
                self.num_workers = workers
                if self.tuner is not None:
                    self.tuner.workers_run = workers
                self.mode = Mode.WORKERS
        if threads != self.threads and self.started:
            self.executor.set_threads(threads)
            self.threads = threads
        self.prefetch = max(1, prefetch)

    def close(self) -> None:
        self.dead = True
        self.closer = threading.get_ident()
        t0 = time.perf_counter()
        self.launcher.finalizer()
        if self.launched:
            self.probe.findings.stop_s = time.perf_counter() - t0
            if not self.delivered:  # the epoch ended before they handed back a batch: at least this
                self.probe.findings.start_s = max(self.probe.findings.start_s or 0.0, t0 - self.launcher.started_at)
        self._holder.clear()  # (the finalizer closed the workers' executor)
        self.main.close()


class Launcher:
    """How a pool's workers start (threads or processes, the multiprocessing context, the
    slot pinner, the files open before this process first touched the dataset) and what
    closes them: every executor started, by the pool's finalizer should it be dropped
    unclosed."""

    def __init__(self, pool: Pool, loader: DataLoader[Any]) -> None:
        self.worker_type = loader.worker_type
        self.context = loader.multiprocessing_context
        self.pinner = loader._slot_pinner
        self.fd_mark = loader._fd_mark  # shared with the loader: noted once, before its first batch here
        self.forked = loader._forked
        # what the finalizer closes holds nothing of the user's (no dataset, no collate_fn):
        # the finalizer registry keeps it reachable, and with it anything it refers to
        self.closers: list[Any] = []  # worker executors
        self.finalizer = weakref.finalize(pool, close_all, self.closers)
        self.started_at = 0.0  # when the workers were started

    def start(self, spec: Any, spec_of: Callable[[], Any], num_workers: int, shipping: Any) -> Any:
        """Start ``num_workers`` workers (``spec_of``: the pool's spec as it is when a process
        worker starts, None once the pool is gone); the finalizer closes them."""
        if self.worker_type == "thread":
            ex: Any = ThreadExecutor(spec, num_workers)
        else:
            mark = self.fd_mark
            # a loader's first workers may collect loaders dropped before in reference cycles
            # (a full collection); its later epochs' pools need not (see _platform.gc_freeze)
            first, self.forked[:] = not self.forked, [True]
            ex = ProcessExecutor(spec_of, num_workers, self.context, pinner=self.pinner,
                                 private_files=lambda: inherit.opened_since(mark[0] if mark else None),
                                 collect=first, shipping=shipping)
        self.closers.append(ex)
        self.started_at = time.perf_counter()
        return ex

    def mark_files(self) -> None:
        """Note the files open now, once a loader, where process workers may come: those the
        dataset opens after are the ones a worker closes (``files_opened``)."""
        if not self.fd_mark and self.worker_type == "process":
            self.fd_mark.append(inherit.open_fds())

    def files_opened(self) -> tuple[int, ...]:
        """The regular files opened since ``mark_files`` (none where it was not called)."""
        return inherit.opened_since(self.fd_mark[0] if self.fd_mark else None)


def close_all(closers: list[Any]) -> None:
    # each is closed, though one is cut short (a Ctrl-C as it waits for its workers): the
    # finalizer that calls this runs once
    stop: BaseException | None = None
    for ex in closers:
        try:
            ex.close()
        except BaseException as e:  # noqa: BLE001 - raised once the others are closed
            stop = stop or e
    closers.clear()
    if stop is not None:
        raise stop


def pinner(loader: DataLoader[Any]) -> Callable[[Any], Any] | None:
    """The SlotPinner of ``pin_memory=True``, or of ``device=`` a CUDA device: batches from
    process workers are then page-locked where they lie, in their registered slots, and the
    device stage copies them without first copying them into pinned memory
    (docs/decisions/fence-registered-slots.md)."""
    torch = _torch.get() if loader.pin_memory or loader._device_args is not None else None
    to_cuda = torch is not None and loader._device_args is not None and is_cuda(torch, loader._device_args[0])
    if not (loader.pin_memory or to_cuda):
        return None
    if loader.pin_memory and loader.pin_memory_device:
        # as torch's: the device is the current accelerator's, whatever was named
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used as the device, "
                      f"ignore pin_memory_device='{loader.pin_memory_device}'.", stacklevel=4)
    if torch is None or not torch.cuda.is_available():
        if loader.pin_memory:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device "
                          "pinned memory won't be used.", stacklevel=4)
        return None  # (device= a CUDA device without CUDA is refused by the device stage)
    from .device import SlotPinner

    # the device stage keeps each host batch until its own copy ends: no fences needed there
    return SlotPinner(fences=loader._device_args is None)


def is_cuda(torch: Any, device: Any) -> bool:
    try:
        return bool(torch.device(device).type == "cuda")
    except (RuntimeError, TypeError, ValueError):
        return False  # the device stage names what is wrong with it

