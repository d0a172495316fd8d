"""The one worker loop: from a ``Task`` to a ``Result``, for every executor.

::

    Task(seq, epoch, indices)
      -> fetch: dataset.gather / dataset.__getitems__ / dataset[i] for each i
         (optionally N samples at a time on fetch threads, across batches;
          per-sample RNG seeded from (seed, epoch, index) when the loader has a seed)
      -> collate (into a shared-memory slot for process workers)
      -> Result(seq, batch | failure, timings)

Inline, thread and process executors all call :meth:`Fetcher.run`; the
process executor wraps it in :func:`serve.serve`, which also owns the slot pool.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _torch, rng
from ..collate import use_allocator
from ..errors import Failure, capture
from .fetchpool import Batch, FetchPool
from .info import set_info, thread_worker_info
from .sched import thread_demand
from .seeding import SeededFetch, rng_lock
from .task import Result, Task

if TYPE_CHECKING:
    from .worker import WorkerSpec

__all__ = ["Fetcher", "fetches_batches"]

# the main process's Recycler is left out after this many batches in a row that gave it no
# leaf, and tried again on one batch in ALLOC_RECHECK (see ``LeafAllocator.collate``)
ALLOC_IDLE = 16
ALLOC_RECHECK = 64


def fetches_batches(dataset: Any) -> bool:
    """Does ``dataset`` fetch a batch in one call of its own (``__getitems__``)?

    torch's ``Subset`` (what ``random_split`` returns) and ``StackDataset`` define one that
    only loops over ``dataset[i]`` when what they wrap has none: those give the same samples
    one index at a time, and are fetched so, concurrently when there are fetch threads
    (otherwise a ``random_split`` of data on slow storage fetches each batch one sample after
    another whatever ``fetch_threads`` says). As torch, ``__getitems__ = None`` means none."""
    if not getattr(dataset, "__getitems__", None):
        return False
    tdata = sys.modules.get("torch.utils.data")
    if tdata is None or "__getitems__" in getattr(dataset, "__dict__", {}):
        return True
    kind = type(dataset).__getitems__
    if kind is getattr(getattr(tdata, "Subset", None), "__getitems__", None):
        return fetches_batches(dataset.dataset)
    if kind is getattr(getattr(tdata, "StackDataset", None), "__getitems__", None):
        parts = dataset.datasets
        return any(fetches_batches(d) for d in (parts.values() if isinstance(parts, dict) else parts))
    return True


class Fetcher:
    """Runs tasks for one worker: fetching, seeding, collating, timing."""

    def __init__(self, spec: WorkerSpec, worker_id: int | None, *, shared_rng: bool = False,
                 cpu_clock: Callable[[], float] | None = None,
                 span_clocks: Callable[[], tuple[float, float]] | None = None) -> None:
        self.spec = spec
        self.worker_id = worker_id
        # a failure raised in this very process (the main process, a thread worker) is raised as
        # itself; skipped ones are kept as records only (their frames would hold their samples)
        self.keep = (worker_id is None or shared_rng) and spec.on_error == "raise"
        self.shared_rng = shared_rng
        self.dataset = spec.dataset
        self.stream = Stream(spec, worker_id, shared_rng) if spec.iterable else None  # its iterator, epoch by epoch
        # as torch, only batches call ``__getitems__`` (batch_size=None: ``dataset[i]``)
        self.has_getitems = spec.auto_collation and not spec.iterable and fetches_batches(spec.dataset)
        self.gather = getattr(spec.dataset, "gather", None) if spec.gather else None
        # batches of ``dataset[i]`` for each index and nothing else (no seeding, skipping or
        # gather): ``run`` fetches them inline when no fetch threads or watch are on
        self.plain = (spec.auto_collation and not spec.iterable and self.gather is None and not self.has_getitems
                      and spec.seed is None and spec.on_error != "skip")
        # threads of one process share the global RNGs: seeding must hold a lock
        self.lock = rng_lock if (shared_rng or spec.fetch_threads > 1) and spec.seed is not None else None
        self.seeded = SeededFetch(rng_lock, shared=shared_rng) if worker_id is not None else None
        # CPU time plus time waiting for a core (``sched``): on a busy machine a computing
        # fetch must not read as one waiting on storage
        self.cpu_clock = cpu_clock or thread_demand
        # over a span: (CPU demand, seconds of its core the worker held or waited for); the
        # two differ where many threads wait for a core at once (``sched.process_clocks``)
        self.span_clocks = span_clocks or self._clock_twice
        self.runs = 0
        # a worker reports CPU time over spans of batches, idle time included: with fetch threads
        # a batch's samples are fetched before and between runs, so one run's interval says
        # little. (cpu clock, wall clock, runs, core clock) where the current span began;
        # None: not yet. With fetch threads the first span is as long as the rest: threads
        # started with the worker fetch ahead, so its first batches are drawn from what they
        # fetched before the span began, and a short first span reads as a full core: "fewer
        # threads would do" (docs/decisions/tuner-reads-lane-time-and-core-share.md).
        # The main process, which trains between its batches, times each sampled batch alone.
        self.spans = worker_id is not None
        self.span_mark: tuple[float, float, int, float] | None = None
        self.pool: FetchPool | None = None
        self.threads = 1
        self.pending: dict[int, Batch] = {}
        self.work: float | None = None  # lane-seconds of the batch being made, when threads fetched it
        # (seconds, callback): called once when a batch takes longer (the main process
        # starts its workers early when a probing batch turns out slow)
        self.watch: tuple[float, Callable[[], float | None]] | None = None
        self.alone_s: float | None = None  # seconds a fetch took with no other running (a watched batch's)
        self.allocator = LeafAllocator()  # where collate puts large leaves (its executor says)
        # a thread worker's info is its thread's: its fetch threads are told it too
        self.info = thread_worker_info() if worker_id is not None else None
        self.set_threads(spec.fetch_threads)

    def set_threads(self, n: int) -> None:
        """Fetch ``n`` samples at once from now on (tasks already scheduled keep theirs)."""
        n = max(1, int(n))
        if n == self.threads or self.spec.iterable:
            return
        old = self.pool
        info = self.info
        self.pool = FetchPool(n, init=None if info is None else lambda: set_info(info, thread=True)) if n > 1 else None
        self.threads = n
        if self.spec.seed is not None and n > 1:
            self.lock = rng_lock
        if old is not None:
            old.close(wait=False)  # its queued fetches still finish

    # -- fetching ---------------------------------------------------------
    def _one(self, index: int, epoch: int) -> Any:
        seed = self.spec.seed
        if seed is None:
            return self.dataset[index]
        if self.lock is None:
            rng.seed_all(rng.sample_seed(seed, epoch, index))
            return self.dataset[index]
        if self.seeded is not None:
            return self.seeded(self.dataset, index, rng.sample_seed(seed, epoch, index))
        with self.lock:
            rng.seed_all(rng.sample_seed(seed, epoch, index))
            return self.dataset[index]

    def _guarded(self, index: int, epoch: int) -> Any:
        try:
            return self._one(index, epoch)
        except Exception as exc:
            return _Skipped(capture(exc, self.worker_id, [index]))

    def schedule(self, task: Task) -> None:
        """Start fetching the samples of ``task`` on the fetch threads, if any."""
        if self.pool is None or task.indices is None or self.gather is not None or self.has_getitems:
            return
        # without auto-collation a failing sample fails its batch whatever on_error says (the
        # loader skips that batch): ``_one``, whose exception the batch's results raise
        fn = self._guarded if self.spec.on_error == "skip" and self.spec.auto_collation else self._one
        self.pending[task.seq] = self.pool.submit(fn, task.indices, task.epoch)

    def _samples(self, task: Task) -> tuple[list[Any], list[Failure]]:
        indices = task.indices
        assert indices is not None
        fetching = self.pending.pop(task.seq, None)
        watch, self.watch = self.watch, None
        if fetching is not None:
            delay, call = watch or (None, None)
            while delay is not None and call is not None and not fetching.wait(delay):
                delay = call()
            samples = fetching.results()
            self.work = fetching.spent
        elif watch is not None:
            samples = self._watched(indices, task.epoch, watch)
        elif self.spec.on_error == "skip":
            samples = [self._guarded(i, task.epoch) for i in indices]
        elif self.spec.seed is None:
            ds = self.dataset
            samples = [ds[i] for i in indices]
        else:
            samples = [self._one(i, task.epoch) for i in indices]
        if self.spec.on_error != "skip":
            return samples, []  # only ``_guarded`` (on_error="skip") stands in for a sample
        skipped = [s.failure for s in samples if type(s) is _Skipped]
        if skipped:
            samples = [s for s in samples if type(s) is not _Skipped]
        return samples, skipped

    def quick(self, indices: list[int]) -> Any:
        """Fetch and collate a batch with no envelope: no seeding, skipping, timing or capture.

        The main process's fast path for plain batches; errors propagate as they are.
        """
        if self.gather is not None:
            return self.gather(indices, output=self.spec.output)
        ds = self.dataset
        if self.has_getitems:
            samples = ds.__getitems__(indices)
        elif self.pool is not None:
            samples = self.pool.map(ds.__getitem__, indices)
        else:
            samples = [ds[i] for i in indices]
        fn = self.spec.collate_fn
        return self.allocator.collate(fn, samples) if fn is not None else samples

    def _watched(self, indices: list[int], epoch: int,
                 watch: tuple[float, Callable[[], float | None]]) -> list[Any]:
        """Fetch one by one; once the batch has taken ``watch[0]`` seconds, call ``watch[1]``,
        and again after the delay it returns, until it returns None."""
        fn = self._guarded if self.spec.on_error == "skip" else self._one
        delay, call = watch
        t0 = time.perf_counter()
        deadline: float | None = t0 + delay
        out = []
        for k, i in enumerate(indices):
            out.append(fn(i, epoch))
            if deadline is not None and (now := time.perf_counter()) > deadline:
                self.alone_s = (now - t0) / (k + 1)  # one by one so far: for the callback to read
                again = call()
                deadline = None if again is None else time.perf_counter() + again
                if again is None and self.pool is not None and k + 1 < len(indices):
                    # the callback gave this fetcher threads: the rest of the batch uses them
                    rest = self.pool.submit(fn, indices[k + 1:], epoch)
                    return out + rest.results()
        return out

    def _batch_seed(self, task: Task) -> None:
        if self.spec.seed is not None and task.indices:
            if self.shared_rng and self.worker_id is not None:
                rng_lock.keep_found()  # (held: ``self.lock`` is it)
            rng.seed_all(rng.mix(self.spec.seed, task.epoch, task.indices[0], len(task.indices)) >> 1)

    def _fetch_map(self, task: Task, given: Any = None) -> tuple[Any, list[Failure], bool]:
        """Returns (batch or samples, skipped, collated already); ``given``: the indices as
        the batch sampler gave them, for ``__getitems__``."""
        indices = task.indices
        assert indices is not None
        spec = self.spec
        if not spec.auto_collation:
            if task.seq in self.pending:  # fetched by the fetch threads (it was fetched twice)
                return self._samples(task)[0][0], [], False
            return self._one(indices[0], task.epoch), [], False
        if self.gather is not None:
            with self.lock or contextlib.nullcontext():
                self._batch_seed(task)
                return self.gather(indices, output=spec.output), [], True
        if self.has_getitems:
            try:
                with self.lock or contextlib.nullcontext():
                    self._batch_seed(task)
                    return self.dataset.__getitems__(indices if given is None else given), [], False
            except Exception:
                if spec.on_error != "skip":
                    raise
                # one bad sample fails the whole call: each sample alone, so that only the bad
                # ones are left out (unless the dataset has no __getitem__ of its own)
                alone = [self._guarded(i, task.epoch) for i in indices]
                skipped = [s.failure for s in alone if type(s) is _Skipped]
                if len(skipped) == len(alone) and skipped[0].type_name == "builtins.NotImplementedError":
                    raise
                return [s for s in alone if type(s) is not _Skipped], skipped, False
        samples, skipped = self._samples(task)
        return samples, skipped, False

    # -- the task ---------------------------------------------------------
    def run(self, task: Task) -> Result:
        """Fetch and collate ``task`` (large leaves into ``self.allocator.alloc``'s buffers, when set)."""
        start = time.perf_counter()
        # CPU clocks are system calls here (~10 us): read them once in eight batches, never
        # over the first (it also pays one-time costs, which would make waiting look like computing)
        self.runs += 1
        cpu0 = None
        if self.runs == 2 and self.spans:
            cpu_now, core_now = self.span_clocks()
            self.span_mark = (cpu_now, start, 1, core_now)
        elif self.runs & 7 == 2 and not self.spans:
            cpu0 = self.cpu_clock()
        spec = self.spec
        self.work = None
        given = task.indices
        if given is not None and type(given) is not list:
            # a batch sampler's array, tuple or range (a bucketing sampler's numpy indices):
            # a dataset's __getitems__ gets it as it came, as under torch; the rest a list
            task = task._replace(indices=list(given))
        try:
            if spec.iterable:
                skipped: list[Failure] = []
                try:
                    data = self.stream.batch(task, skipped)  # type: ignore[union-attr]
                except StopIteration:
                    died = self.stream.died and spec.on_error == "skip"  # type: ignore[union-attr]
                    return Result(task.seq, self._wid(), exhausted=2 if died else 1, skipped=tuple(skipped),
                                  start=start, end=time.perf_counter())
                done = False
            elif self.plain and self.pool is None and self.watch is None:
                ds = self.dataset
                data, skipped, done = [ds[i] for i in task.indices], (), False  # type: ignore[union-attr]
            else:
                data, skipped, done = self._fetch_map(task, given)
            fetched = time.perf_counter()
            # a custom batch sampler's batches, an epoch's short last one, a stream's: counted
            if not spec.auto_collation:
                n = 1
            elif spec.iterable:
                n = len(data) + len(skipped)
            else:
                n = len(task.indices)  # type: ignore[arg-type]
            if spec.auto_collation and not done and not data and skipped:
                # every sample failed: all ``n`` count as seen (a batch sampler's batches have
                # no batch_size to count them by)
                return Result(task.seq, self._wid(), empty=True, skipped=tuple(skipped),
                              start=start, fetched=fetched, end=fetched, samples=n)
            if not done and spec.collate_fn is not None:
                try:
                    data = self.allocator.collate(spec.collate_fn, data)
                except Exception as exc:  # not a bad sample: on_error="skip" does not skip it
                    return Result(task.seq, self._wid(), start=start, end=time.perf_counter(),
                                  failure=capture(exc, self.worker_id, task.indices, "collating", keep=self.keep))
            end = time.perf_counter()
            cpu = None if cpu0 is None else self.cpu_clock() - cpu0
            span = None
            mark = self.span_mark
            if mark is not None and self.runs - mark[2] >= (3 if mark[2] == 1 and self.pool is None else 8):
                # the first span ends after three batches, for the tuner's first decisions
                now, core = self.span_clocks()
                self.span_mark = (now, end, self.runs, core)
                cpu, span = now - mark[0], (self.runs - mark[2], end - mark[1], core - mark[3])
            return Result(task.seq, self._wid(), batch=data, skipped=tuple(skipped) if skipped else (),
                          start=start, fetched=fetched, end=end, cpu=cpu, cpu_span=span, samples=n,
                          work=self.work)
        except Exception as exc:
            indices = task.indices
            return Result(task.seq, self._wid(), failure=capture(exc, self.worker_id, indices, keep=self.keep),
                          start=start, end=time.perf_counter())

    def _clock_twice(self) -> tuple[float, float]:
        now = self.cpu_clock()
        return now, now

    def _wid(self) -> int:
        return -1 if self.worker_id is None else self.worker_id

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the fetch threads, waiting ``wait_s`` seconds at most: one stuck in a fetch
        that never returns (a hung network read) would hold close() for ever, a Ctrl-C too.
        Such a thread is left (a daemon) and no longer holds up seeded fetches elsewhere."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            stuck = pool.close(wait=True, cancel=True, timeout=wait_s)
            if stuck:
                rng_lock.abandon({t.ident for t in stuck} - {None})


class Stream:
    """An iterable dataset's stream in one worker: the iterator of the epoch it reads, and
    how it ended (``exhausted``; ``died``: right after an item raised)."""

    __slots__ = ("spec", "dataset", "worker_id", "reseeds", "iterator", "epoch", "exhausted", "died")

    def __init__(self, spec: WorkerSpec, worker_id: int | None, shared_rng: bool) -> None:
        self.spec = spec
        self.dataset = spec.dataset
        self.worker_id = worker_id
        # threads of one process share its global RNGs: only a process worker reseeds them
        self.reseeds = spec.seed is not None and worker_id is not None and not shared_rng
        self.iterator: Any = None
        self.epoch: int | None = None
        self.exhausted = False
        self.died = False  # the stream ended right after an item raised

    def batch(self, task: Task, skipped: list[Failure]) -> Any:
        """The next batch (an item, without auto-collation) of ``task``'s epoch, which a new
        epoch starts afresh; raises StopIteration at the stream's end. Items that raise
        under on_error="skip" go to ``skipped``."""
        if self.epoch != task.epoch:
            if self.reseeds:
                # a process worker's stream draws from its global RNGs: with a seed, each epoch
                # starts them from (seed, epoch), so an epoch's draws do not depend on the epochs
                # this worker made before (persistent or not), and a resumed epoch repeats them
                rng.seed_worker(rng.mix(self.spec.seed, task.epoch, rng.STREAM_SALT) >> 1, self.worker_id)
            if _torch.is_datapipe(self.dataset):
                # every worker's shuffles alike within an epoch: the shards come from one order
                base = self.spec.seed if self.spec.seed is not None else self.spec.base_seed
                seed = task.seed if task.seed is not None else rng.mix(base, task.epoch, 0xD1E) >> 1
                _torch.seed_datapipe(self.dataset, seed)
            self.iterator = iter(self.dataset)
            self.epoch = task.epoch
            self.exhausted = False
            self.died = False
        if self.exhausted:
            raise StopIteration
        spec = self.spec
        if not spec.auto_collation:
            try:
                item = next(self.iterator)
            except StopIteration:
                self.exhausted = True
                raise
            except Exception:
                self.died = True  # until an item comes: a StopIteration next says the stream died
                raise
            self.died = False
            return item
        assert spec.batch_size is not None
        out: list[Any] = []
        it = self.iterator
        if spec.on_error != "skip":
            try:
                for _ in range(spec.batch_size):
                    out.append(next(it))
            except StopIteration:
                self.exhausted = True
        else:
            # an item that raises is left out and the stream asked for the next one, until the
            # batch is full (an iterator that survives goes on; a generator is over once it
            # has raised). A run of failures that long ends the batch as it is.
            failed = 0
            while len(out) < spec.batch_size and failed < max(64, spec.batch_size):
                try:
                    out.append(next(it))
                    failed = 0
                except StopIteration:
                    self.exhausted = True
                    self.died = failed > 0  # ended right after an item raised: a generator's end
                    break
                except Exception as exc:
                    skipped.append(capture(exc, self.worker_id, None))
                    failed += 1
            if not out and not self.exhausted:
                return out  # nothing but failures: an empty batch, the stream goes on
        if not out or (spec.drop_last and len(out) < spec.batch_size):
            self.exhausted = True
            raise StopIteration
        return out


class LeafAllocator:
    """Where collate puts a batch's large leaves (``alloc``: a process worker's slot Writer,
    the main process's Recycler; None: where collate will), and whether a Recycler is still
    worth asking (``idle``: batches in a row that asked it for nothing)."""

    __slots__ = ("alloc", "idle")

    def __init__(self) -> None:
        self.alloc: Callable[[tuple[int, ...], Any], Any] | None = None
        self.idle = 0

    def collate(self, fn: Callable[[Any], Any], samples: Any) -> Any:
        alloc = self.alloc
        if alloc is None:
            return fn(samples)
        # The main process's Recycler only takes leaves of ``min_bytes`` (1 MiB) or more. Batches
        # that give it none pay to set it up and to check each leaf against it, for nothing
        # (docs/decisions/recycle-large-batch-memory.md). After ALLOC_IDLE such batches in a
        # row it is left out, but for one batch in ALLOC_RECHECK, which brings it back if
        # batches have grown. (Only a Recycler's batches ever count as idle.)
        idle = self.idle
        if idle >= ALLOC_IDLE and idle % ALLOC_RECHECK:
            self.idle = idle + 1
            return fn(samples)
        asked = getattr(alloc, "asked", None)  # a Recycler counts the leaves big enough for it
        if asked is None:
            with use_allocator(alloc):
                return fn(samples)
        with use_allocator(alloc):
            out = fn(samples)
        self.idle = 0 if alloc.asked != asked else idle + 1  # type: ignore[attr-defined]
        return out


class _Skipped:
    __slots__ = ("failure",)

    def __init__(self, failure: Failure) -> None:
        self.failure = failure
