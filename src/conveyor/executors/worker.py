"""The one worker loop: from a ``Task`` to a ``Result``, for every executor.

::

    Task(seq, epoch, indices)
      -> fetch: dataset.gather / dataset.__getitems__ / dataset[i] for each i
         (optionally N samples at a time on fetch threads, across batches;
          per-sample RNG seeded from (seed, epoch, index) when the loader has a seed)
      -> collate (into a shared-memory slot for process workers)
      -> Result(seq, batch | failure, timings)

Inline, thread and process executors all call :meth:`Fetcher.run`; the
process executor wraps it in :func:`serve`, which also owns the slot pool.
"""

from __future__ import annotations

import _thread
import contextlib
import copy
import dataclasses
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .. import _torch, rng
from .._imports import find_wrapped
from ..collate import use_allocator
from ..errors import Failure, capture
from . import torchless
from .fetchpool import Batch, FetchPool
from .sched import process_clocks, process_demand, thread_demand
from .task import Doorbell, Hello, Inbox, Order, Readable, Result, Task, send

__all__ = ["WorkerInfo", "WorkerSpec", "Fetcher", "get_worker_info", "serve"]


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker.

    >>> info = get_worker_info()  # None in the main process
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    kind: str = "process"


_process_info: WorkerInfo | None = None
_thread_info = threading.local()
main_rank_world: tuple[int, int] | None = None  # a process worker's main process's (rank, world size)


def get_worker_info() -> WorkerInfo | None:
    """The current worker's id, count, seed and dataset copy; ``None`` in the main process.

    Use it in an ``IterableDataset.__iter__`` to shard work between workers:

    >>> info = get_worker_info()
    >>> start = 0 if info is None else info.id
    """
    info = getattr(_thread_info, "info", None)
    if info is not None:
        return info
    if _process_info is not None:
        return _process_info
    # inside a worker of torch's own DataLoader (a dataset written with conveyor's names,
    # loaded by torch): torch's answer, or each of its workers would read the whole stream
    tworker = sys.modules.get("torch.utils.data._utils.worker")
    return getattr(tworker, "_worker_info", None) if tworker is not None else None


def _set_info(info: WorkerInfo | None, *, thread: bool) -> None:
    global _process_info
    if thread:
        _thread_info.info = info
        if info is not None:
            _route_torch_worker_info()
        return
    _process_info = info
    torch = _torch.loaded()
    if torch is not None and info is not None:
        # Datasets written for torch ask torch.utils.data.get_worker_info().
        try:
            from torch.utils.data._utils import worker as tworker
        except ImportError:  # pragma: no cover - torch without its data utilities
            return
        _give_torch_info(tworker, info)
    elif info is not None:
        _watch_torch_import()  # a dataset that imports torch once it runs asks torch too


def _give_torch_info(tworker: Any, info: WorkerInfo) -> None:
    try:
        tworker._worker_info = tworker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset)
    except Exception:  # pragma: no cover - torch internals moved
        pass


class _TorchDataImported:
    """An import hook for a worker that started without torch, whose dataset imports it
    later and asks ``torch.utils.data.get_worker_info()`` (to shard a stream, say): right
    after ``torch.utils.data`` has run, a process worker's info is given to torch, and
    thread workers' routing is put in place. Without it each worker heard ``None`` and
    read the whole stream: every sample came once per worker."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch.utils.data":
            return None
        return find_wrapped(self, fullname, path, target, _torch_data_imported)


_torch_hook = _TorchDataImported()
_route_threads = False  # thread workers have started: route torch's get_worker_info


def _watch_torch_import() -> None:
    if _torch_hook not in sys.meta_path:
        sys.meta_path.insert(0, _torch_hook)


def _torch_data_imported(tdata: Any) -> None:
    """``torch.utils.data`` has just run (torch itself may still be importing: nothing here
    waits for it)."""
    tworker = sys.modules.get("torch.utils.data._utils.worker")
    if tworker is None:  # pragma: no cover - torch internals moved
        return
    try:
        if _process_info is not None:
            _give_torch_info(tworker, _process_info)
        if _route_threads:
            _route(tdata, tworker)
    except Exception:  # pragma: no cover - torch internals moved: never fail the user's import
        pass


_routed = threading.Lock()


def _route_torch_worker_info() -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer in thread workers too.

    torch keeps one worker info per process; thread workers share a process, so conveyor
    routes torch's function (once, on the first thread worker): in a thread of conveyor's
    it returns that worker's info, anywhere else exactly what torch's returns. Where torch
    is not imported yet, it is routed the moment it is (``_TorchDataImported``).
    """
    global _route_threads
    torch = _torch.loaded()
    if torch is None:
        _route_threads = True
        _watch_torch_import()
        return
    try:
        import torch.utils.data as tdata
        from torch.utils.data._utils import worker as tworker
    except ImportError:  # pragma: no cover - torch without its data utilities
        return
    _route(tdata, tworker)


def _ask_conveyor() -> Any:
    """The body torch's get_worker_info takes on (``_route``); names resolve in torch's module."""
    return globals()["_conveyor_worker_info"]()  # torch's module globals: set there by _route


def _route(tdata: Any, tworker: Any) -> None:
    """Route torch's get_worker_info to thread workers' infos.

    The usual idiom, ``from torch.utils.data import get_worker_info`` at the top of the
    dataset's module, binds torch's function object before any worker starts: replacing
    the module attribute left that name answering None in every thread worker, so each
    read the whole stream. The function object itself is changed instead: its body, a
    bare ``return _worker_info``, becomes a call of the router, set in torch's module.
    A torch whose function has another body gets the module attribute replaced, as before.
    """
    with _routed:
        if getattr(tworker, "_conveyor_worker_info", None) is not None:
            return
        original = tworker.get_worker_info
        if getattr(original, "_conveyor", False):
            return

        def answer() -> Any:
            info = getattr(_thread_info, "info", None)
            if info is None:
                return tworker._worker_info if plain else original()
            mine = getattr(_thread_info, "torch_info", None)
            if mine is None or mine[0] is not info:
                mine = _thread_info.torch_info = (info, tworker.WorkerInfo(
                    id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset))
            return mine[1]

        code = getattr(original, "__code__", None)
        plain = (code is not None and code.co_names == ("_worker_info",) and code.co_argcount == 0
                 and not code.co_freevars and not code.co_kwonlyargcount)
        if plain:
            tworker._conveyor_worker_info = answer
            original.__code__ = _ask_conveyor.__code__
            return
        answer.__doc__ = original.__doc__
        answer.__wrapped__ = original  # type: ignore[attr-defined]
        answer._conveyor = True  # type: ignore[attr-defined]
        tworker.get_worker_info = answer
        if getattr(tdata, "get_worker_info", None) is original:
            tdata.get_worker_info = answer


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable for spawn."""

    dataset: Any
    collate_fn: Callable[[Any], Any] | None
    auto_collation: bool
    batch_size: int | None
    drop_last: bool
    iterable: bool
    num_workers: int
    base_seed: int
    seed: int | None = None
    worker_init_fn: Callable[[int], None] | None = None
    fetch_threads: int = 1
    on_error: str = "raise"
    gather: bool = False
    output: str = "torch"
    default_collate: bool = False
    # RNG states a worker takes over from batches the main process made in its name
    rng_states: dict[int, Any] | None = None
    # the main process's (rank, world size): a spawned worker has no process group, and a
    # launcher need not set RANK/WORLD_SIZE (torch.multiprocessing.spawn), yet shards by them
    rank_world: tuple[int, int] | None = None


class RngLock:
    """The process's lock on its global RNGs, held while a sample is seeded and fetched and
    while the main process saves or restores them, wherever threads of one process share
    them (thread workers, fetch threads).

    Fetches that draw nothing from them hold it shared (``shared``): many at once, but
    never while a thread holds it whole (see ``SeededFetch``).

    A thread cannot be stopped: one stuck in a sample (a read that never returns) would hold
    the lock, and every seeded loader of the process after it would hang. A loader that gives
    such threads up hands the lock on (``abandon``): its later users take a fresh one, and
    the stuck thread, should it ever return, releases the one it took.

    Thread workers seed the RNGs of the process the training loop runs in. The states they
    found before their first seeding are kept (``keep_found``) and put back at an epoch's
    start and end (``put_back``): a sampler drawing its order from a global RNG (one without
    a generator) drew each epoch's from wherever the sample fetched last in wall time had
    left them, and two runs with one seed could shuffle differently (on 2 cores busy with 2
    other loops, 2 of 8 runs of the resume tests). A snapshot and a restore cost ~200 us
    (numpy's ``get_state`` and ``set_state``): too much to pay around every sample."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._took = threading.local()  # the lock this thread holds
        self._readers: set[int] = set()  # threads that hold it shared
        self._left = threading.Condition(threading.Lock())  # a reader let go
        self.found: rng.RngState | None = None  # the RNGs as thread workers found them

    def _take(self) -> threading.Lock:
        while True:
            lock = self._lock
            if lock.acquire(timeout=0.5):
                if lock is self._lock:
                    return lock
                lock.release()  # handed on while this thread waited: take the new one

    def __enter__(self) -> None:
        self.take()

    def take(self, unless: Callable[[], bool] | None = None) -> bool:
        """Hold the lock whole (``with lock`` does), once shared holders let go. With
        ``unless``: if it holds once this thread's turn comes, give the turn up and return
        False, without waiting for the shared holders."""
        lock = self._take()
        if unless is not None and unless():
            lock.release()
            return False
        self._took.lock = lock
        self._owner = threading.get_ident()
        left = self._left
        with left:
            while self._readers:
                left.wait(0.5)
        return True

    def __exit__(self, *exc: object) -> None:
        lock = self._took.lock
        if lock is self._lock:
            self._owner = None
        lock.release()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock alongside other shared holders (for fetches that draw nothing)."""
        me = threading.get_ident()
        lock = self._take()  # none start while a thread holds it whole, or waits to
        try:
            with self._left:
                self._readers.add(me)
        finally:
            lock.release()
        try:
            yield
        finally:
            left = self._left
            with left:
                self._readers.discard(me)
                left.notify_all()

    def keep_found(self) -> None:
        """Before a thread worker seeds the RNGs, holding the lock whole: note how it found
        them, unless a seeding since the last ``put_back`` already did."""
        if self.found is None:
            self.found = rng.RngState()

    def put_back(self) -> None:
        """The global RNGs as thread workers found them, if they seeded them since the last
        call (the main thread's, at an epoch's start and end; see the class)."""
        if self.found is None:
            return
        with self:
            found, self.found = self.found, None
            if found is not None:
                found.restore()

    def save(self) -> rng.RngState:
        """Holding the lock whole: the RNGs' states, which the main process puts back
        (``restore``) after a batch it makes, seeding them. Thread workers seeding meanwhile
        found them so: were they noted only by a worker's first seeding, one between two of
        that batch's samples took a sample's seeded states for the loop's, and ``put_back``
        set those at the epoch's end."""
        state = rng.RngState()
        if self.found is None:
            self.found = state
        return state

    def restore(self, state: rng.RngState) -> None:
        """Holding the lock whole: put back what ``save`` returned."""
        state.restore()
        if self.found is state:
            self.found = None  # as found: no thread worker's seeding is left in them

    def abandon(self, idents: set[int]) -> None:
        """Hand the lock on if one of these (stuck, given up) threads holds it."""
        with self._left:
            if self._readers & idents:
                self._readers -= idents
                self._left.notify_all()
        if self._owner is not None and self._owner in idents:
            self._lock, self._owner = threading.Lock(), None

    def _after_fork(self) -> None:
        # a child forked while another thread held the lock would wait for it forever
        self._lock, self._owner = threading.Lock(), None
        self._took = threading.local()
        self._readers = set()
        self._left = threading.Condition(threading.Lock())
        self.found = None  # a process worker's RNGs are its own


FREE_AFTER = 2  # checked fetches that did not depend on the global RNGs, before fetches go unseeded
_FLIP = 0x5EEDF11D  # another seed for a checked fetch's second try


class SeededFetch:
    """Fetches samples seeded from their own seeds, on the fetch threads of a worker, which
    share its global RNGs.

    Seeding and fetching must be done in turn (under ``RngLock``), or a thread's draws would
    mix with another's seeding: with slow reads (5 ms), 8 fetch threads fetched one at a
    time, 2.73 s against 0.34 s without a seed. Yet most datasets draw nothing from the
    global RNGs, and what they give does not depend on the seed. So the first fetches, in
    turn, are checked: seeded, fingerprinted (``rng.fingerprint``), fetched, fingerprinted
    again, then seeded otherwise and fetched again (a sample that reads the RNGs without
    moving them, as ``torch.initial_seed()`` or a draw inside ``torch.random.fork_rng`` do,
    comes out otherwise). Once FREE_AFTER such fetches showed no dependence, fetches go
    unseeded and at once (holding the lock shared), each between two fingerprints. One whose
    fingerprints differ (it drew, or anything else in the worker did meanwhile) is not used:
    it is fetched again in turn, seeded, and so is every fetch from then on. A fetch in turn
    never runs beside an unseeded one, so what it draws is its own. One that raises with its
    fingerprints unmoved raises as it is: a seeded fetch would have, the RNGs being no part
    of it.

    Only worker fetchers (``Fetcher.worker_id`` set) do this: the main process puts its own
    RNG state back after each batch it makes, and a collate_fn drawing there would start
    every batch from that one state where no sample seeded the RNGs."""

    def __init__(self, lock: RngLock, *, shared: bool = False) -> None:
        self.lock = lock
        self.shared = shared  # a thread worker's: the RNGs it seeds are the training loop's too
        self.draws = False  # a fetch depended on the global RNGs: every fetch is seeded, in turn
        self.free = False  # fetches go unseeded, at once
        self.quiet = 0  # checked fetches that did not depend on the RNGs

    def _unseeded(self, dataset: Any, index: int) -> Any:
        """Fetch at once, unseeded; ``_FAILED`` where the fetch must be made again, seeded."""
        with self.lock.shared():
            if not self.free:
                return _FAILED
            before = rng.fingerprint()
            try:
                out = dataset[index]
            except Exception:
                if rng.fingerprint() == before:
                    raise  # as a seeded fetch would have: the RNGs were no part of it
                out = _FAILED
            if out is not _FAILED and rng.fingerprint() == before:
                return out
            self.free, self.draws = False, True
            return _FAILED

    def __call__(self, dataset: Any, index: int, seed: int) -> Any:
        if self.free:
            out = self._unseeded(dataset, index)
            if out is not _FAILED:
                return out
            with self.lock:
                return self._in_turn(dataset, index, seed, check=False)
        if not self.lock.take(unless=lambda: self.free):
            return self(dataset, index, seed)  # switched while this thread waited its turn
        try:
            return self._in_turn(dataset, index, seed, check=True)
        finally:
            self.lock.__exit__()

    def _in_turn(self, dataset: Any, index: int, seed: int, *, check: bool) -> Any:
        """Seed and fetch, holding the lock whole; with ``check``, check the fetch (see above)."""
        if self.shared:
            self.lock.keep_found()
        rng.seed_all(seed)
        if not check or self.draws or self.free:
            return dataset[index]
        before = rng.fingerprint()
        out = dataset[index]
        if rng.fingerprint() != before:
            self.draws = True
            return out
        rng.seed_all(seed ^ _FLIP)
        try:
            again = dataset[index]
        except Exception:
            again = _FAILED
        if again is _FAILED or not _same(out, again):
            self.draws = True
            return out
        self.quiet += 1
        if self.quiet >= FREE_AFTER:
            self.free = True
        return out


def _same(a: Any, b: Any) -> bool:
    """Are two samples equal, leaf by leaf? (False where that cannot be told: NaN, objects
    without equality.)"""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    torch = _torch.loaded()
    try:
        if torch is not None and isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
        if hasattr(a, "__array__") and not isinstance(a, (str, bytes)):
            import numpy as np

            x, y = np.asarray(a), np.asarray(b)
            return x.dtype == y.dtype and x.shape == y.shape and bool(np.array_equal(x, y))
        return bool(a == b)
    except Exception:
        return False


_FAILED = object()


rng_lock = RngLock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=rng_lock._after_fork)
WORKER_NICE = int(os.environ.get("CONVEYOR_WORKER_NICE", "5"))
# MB of freed heap a process worker keeps instead of handing it back to the kernel (0: glibc's
# own heuristics). See ``steady_malloc``.
WORKER_HEAP_KEEP_MB = int(os.environ.get("CONVEYOR_WORKER_HEAP_KEEP_MB", "64"))
# a group's results (executors/grouping.py) go back at once when they have waited this long
# for the rest of their group: a preempted worker must not hold a batch the loop waits for
GROUP_HOLD_S = 2e-3
# the main process's Recycler is left out after this many batches in a row that gave it no
# leaf, and tried again on one batch in ALLOC_RECHECK (see ``Fetcher._collate``)
ALLOC_IDLE = 16
ALLOC_RECHECK = 64


def fetches_batches(dataset: Any) -> bool:
    """Does ``dataset`` fetch a batch in one call of its own (``__getitems__``)?

    torch's ``Subset`` (what ``random_split`` returns) and ``StackDataset`` define one that
    only loops over ``dataset[i]`` when what they wrap has none: those give the same samples
    one index at a time, and are fetched so, concurrently when there are fetch threads (a
    ``random_split`` of data on slow storage otherwise fetched each batch one sample after
    another whatever ``fetch_threads`` said). As torch, ``__getitems__ = None`` means none."""
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
        self.iterator: Any = None
        self.iter_epoch: int | None = None
        self.exhausted = False
        self.died = False  # the stream ended right after an item raised
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
        # fetched before the span began (a worker of 64 threads made 3 batches in 2.2 ms of
        # wall and 2.3 ms of CPU: a full core, read as "fewer threads would do").
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
        # where collate puts large leaves: a process worker's slot Writer, the main process's Recycler
        self.alloc: Callable[[tuple[int, ...], Any], Any] | None = None
        self.alloc_idle = 0  # batches in a row that asked a Recycler ``alloc`` for nothing
        # a thread worker's info is its thread's: its fetch threads are told it too
        self.info = getattr(_thread_info, "info", None) if worker_id is not None else None
        self.set_threads(spec.fetch_threads)

    def set_threads(self, n: int) -> None:
        """Fetch ``n`` samples at once from now on (tasks already scheduled keep theirs)."""
        n = max(1, int(n))
        if n == self.threads or self.spec.iterable:
            return
        old = self.pool
        info = self.info
        self.pool = FetchPool(n, init=None if info is None else lambda: _set_info(info, thread=True)) if n > 1 else None
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
        return self._collate(fn, samples) if fn is not None else samples

    def _collate(self, fn: Callable[[Any], Any], samples: Any) -> Any:
        alloc = self.alloc
        if alloc is None:
            return fn(samples)
        # The main process's Recycler only takes leaves of ``min_bytes`` (1 MiB) or more. Batches
        # that give it none (diabetes: 1 KiB) paid ~1 us a batch to set it up and to check each
        # leaf against it, and 2-5 us of next() in a training loop. After ALLOC_IDLE such
        # batches in a row it is left out, but for one batch in ALLOC_RECHECK, which brings it
        # back if batches have grown. (Only a Recycler's batches ever count as idle.)
        idle = self.alloc_idle
        if idle >= ALLOC_IDLE and idle % ALLOC_RECHECK:
            self.alloc_idle = idle + 1
            return fn(samples)
        asked = getattr(alloc, "asked", None)  # a Recycler counts the leaves big enough for it
        if asked is None:
            with use_allocator(alloc):
                return fn(samples)
        with use_allocator(alloc):
            out = fn(samples)
        self.alloc_idle = 0 if alloc.asked != asked else idle + 1  # type: ignore[attr-defined]
        return out

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

    def _fetch_iter(self, task: Task, skipped: list[Failure]) -> Any:
        if self.iter_epoch != task.epoch:
            if self.spec.seed is not None and self.worker_id is not None and not self.shared_rng:
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
            self.iter_epoch = task.epoch
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

    # -- the task ---------------------------------------------------------
    def run(self, task: Task) -> Result:
        """Fetch and collate ``task`` (large leaves into ``self.alloc``'s buffers, when set)."""
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
                    data = self._fetch_iter(task, skipped)
                except StopIteration:
                    return Result(task.seq, self._wid(), exhausted=2 if self.died and self.spec.on_error == "skip" else 1, skipped=tuple(skipped),
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
                    data = self._collate(spec.collate_fn, data)
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
        that never returns (a hung network read) held close() for ever, a Ctrl-C too. Such a
        thread is left (a daemon) and no longer holds up seeded fetches elsewhere."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            stuck = pool.close(wait=True, cancel=True, timeout=wait_s)
            if stuck:
                rng_lock.abandon({t.ident for t in stuck} - {None})


class _Skipped:
    __slots__ = ("failure",)

    def __init__(self, failure: Failure) -> None:
        self.failure = failure


def torch_for(spec: WorkerSpec) -> Any:
    """torch if imported, or imported now where the workers' batches are tensors (their
    collate would import it anyway). Workers start after: a spawned worker's first collate
    imported it under its fetch threads, too late for the worker's torch setup, and thread
    workers route torch's ``get_worker_info()`` only when torch is there as they start."""
    torch = _torch.loaded()
    if torch is None and spec.default_collate and spec.output == "torch":
        torch = _torch.get()
    return torch


def start_worker(spec: WorkerSpec, worker_id: int, *, kind: str) -> Fetcher:
    """Seed, publish worker info, run ``worker_init_fn``; the worker's fetcher."""
    global main_rank_world
    thread = kind == "thread"
    seed = rng.worker_seed(spec.base_seed, worker_id)
    if thread and spec.iterable and not _torch.is_datapipe(spec.dataset):
        # a stream's copy of its own, as a process worker has: torch's documented pattern
        # narrows get_worker_info().dataset.start/end in worker_init_fn, and state set in
        # __iter__ is the worker's. One object shared by every thread lost data silently.
        # (Shallow: the data it refers to is still shared.)
        try:
            spec = dataclasses.replace(spec, dataset=copy.copy(spec.dataset))
        except Exception:  # noqa: BLE001 - an object that cannot be copied is shared, as before
            pass
    if not thread:
        main_rank_world = spec.rank_world
        rng.seed_worker(spec.base_seed, worker_id)
        if spec.rng_states and worker_id in spec.rng_states:
            spec.rng_states[worker_id].restore()
    _set_info(WorkerInfo(worker_id, spec.num_workers, seed, spec.dataset, kind), thread=thread)
    if not thread and spec.iterable and _torch.is_datapipe(spec.dataset):
        _torch.shard_datapipe(spec.dataset, worker_id, spec.num_workers)  # this process's copy
    if spec.worker_init_fn is not None:
        spec.worker_init_fn(worker_id)
    return Fetcher(spec, worker_id, shared_rng=thread, cpu_clock=thread_demand if thread else process_demand,
                   span_clocks=None if thread else process_clocks)


# -- the process worker's loop ----------------------------------------------

def serve(spec: WorkerSpec, worker_id: int, gen: int, tasks: Any, results: Any,
          parent_pid: int, prefix: str, private_files: tuple[int, ...] = (), bell: Doorbell | None = None,
          quick_exit: bool = False) -> None:
    """Entry point of a process worker: read ``Order``s, answer ``Result``s. With a ``bell``
    (see ``Doorbell``) it sleeps on that, never on the order pipe.

    With ``quick_exit`` (a spawned worker) a worker that ends as told leaves without tearing
    its interpreter down. A forked worker (and a forkserver's) leaves with ``os._exit``, but
    a spawned one ran ``sys.exit``: the teardown of everything it imported, ~0.5 s with torch,
    which the main process waited for in ``close()`` at the end of every epoch of workers
    that do not persist (spawn, 2 workers: 0.52 s of a 1.87 s epoch)."""
    _serve(spec, worker_id, gen, tasks, results, parent_pid, prefix, private_files, bell)
    if quick_exit:
        _leave()


def _leave() -> None:
    """End this process as a forked worker ends, but with its own exit handlers run: they
    were registered here (a spawned worker imports afresh) and would have run at its exit.
    What is skipped is the teardown: modules cleared, objects finalized one by one."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to save
                pass
        os._exit(0)


def _serve(spec: WorkerSpec, worker_id: int, gen: int, tasks: Any, results: Any,
           parent_pid: int, prefix: str, private_files: tuple[int, ...], bell: Doorbell | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    if private_files:
        from .inherit import reopen_private

        reopen_private(private_files)  # files the main process opened through the dataset
    steady_malloc()
    # batches gathered as numpy need no torch here: imported only if something asks for it
    lean = torchless.defer(spec, _set_up_torch)
    torch = None if lean else torch_for(spec)
    if torch is not None:
        _set_up_torch(torch)
    stack_at = stack_path(prefix, worker_id, gen)
    from ..transport import SlotPool, Writer, encode
    from ..transport import segment as _segment

    pool: SlotPool | None = None
    parent = ParentWatch(parent_pid)

    def cleanup() -> None:
        try:
            os.unlink(stack_at)
        except OSError:
            pass
        if pool is not None:
            # the main thread may be using the pool: the last thing done before exiting
            if parent.going():
                pool.close()
                # a segment being created when the signal landed is in /dev/shm but not yet in
                # the pool: every name of this worker's goes
                _segment.sweep(pool.prefix)
            else:
                # only this worker ends (``kill PID``, earlyoom, a sample's sys.exit()): the
                # main process replaces it and still reads the batches it sent, so their slots
                # stay; it sweeps this worker's names once it has mapped them
                pool.close(keep_sent=True)

    def on_term(signum: int, frame: Any) -> None:
        # SIGTERM/SIGHUP to the whole process group (timeout, systemd, SLURM's scancel, a
        # closed terminal) ends the main process before it can sweep: each worker removes its
        # own slots and stack file, then dies of the signal as it would have
        cleanup()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        # a signal the main process ignores (``nohup``: SIGHUP) stays ignored here too: the
        # closed terminal that ends nothing else must not end the workers either. Installed
        # before the stack file is made: a SIGTERM in between left it in /tmp (3 of 40 trials)
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, on_term)
    stack_file = _install_stack_dump(stack_at)
    pool = SlotPool(f"{prefix}w{worker_id}g{gen}_") if _segment.available() else None
    _watchdog(parent, cleanup)
    try:
        try:
            fetcher = start_worker(spec, worker_id, kind="process")
        except Exception as exc:
            results.send(Hello(worker_id, os.getpid(), capture(exc, worker_id, None, "running worker_init_fn")))
            return
        if lean and fetcher.gather is not None:
            fetcher.gather = torchless.gather_later(fetcher.gather)
        results.send(Hello(worker_id, os.getpid()))
        queue: list[Task] = []
        rss = _Rss()
        slots_writer = Writer(pool) if pool is not None else None
        readable = Readable(tasks)
        inbox = Inbox(tasks)
        warned = False
        done = 0
        rss_read: int | None = None  # the memory reading the next result carries
        grouped: set[int] = set()  # tasks whose results wait for the rest of their group
        held: list[tuple[Any, ...]] = []  # those results, in the order made
        held_ctx: list[Any] = []  # each held result's (result, batch, task, slots), should its send fail

        drain = Drain(results, inbox, parent)
        os.set_blocking(results.fileno(), False)  # (see Drain)

        def take() -> bool:
            """Apply the orders waiting (the pipe is readable, or orders were read while a result
            waited for room); False: stop, or the main process is gone."""
            orders = inbox.take() if not drain.parked else drain.parked + (
                inbox.take() if bell is not None or readable() else [])
            drain.parked = []
            if inbox.eof:
                return False
            return all(accept(order) for order in orders)

        def accept(order: Order | tuple[Any, ...]) -> bool:
            """Apply an order; False when it says stop."""
            if type(order) is tuple:
                # the order of each batch, sent as plain tuples (processes.submit): (tasks, freed),
                # and True after them for a group whose results go back together
                tasks, freed = order[0], order[1]
                if pool is not None and freed:
                    pool.release(list(freed))
                for t in tasks:
                    task = Task._make(t)
                    queue.append(task)
                    fetcher.schedule(task)
                if len(order) > 2 and len(tasks) > 1:
                    grouped.update(t[0] for t in tasks[:-1])  # held until the group's last is made
                return True
            if order.stop:
                return False
            if pool is not None and order.freed:
                pool.release(list(order.freed))
            if order.threads:
                fetcher.set_threads(order.threads)
            if order.rng is not None:
                order.rng.restore()
            queue.extend(order.tasks)
            for t in order.tasks:
                fetcher.schedule(t)
            return True

        if bell is not None:
            # sleeping is the bell's business: the pipe is read without waiting (one read
            # where a poll and a read were)
            os.set_blocking(tasks.fileno(), False)
        while True:
            if not queue:
                if bell is not None:
                    if not take():
                        return
                    # part of a message read: the rest comes through the pipe, and the bell
                    # rings only once a piece is whole (task.send), so wait on the pipe then
                    if not queue and not _wait(readable if inbox.buf else bell.wait, parent):
                        return
                    continue  # rung: the orders are in the pipe (or were taken with earlier ones)
                if not _wait(readable, parent) or not take():
                    return
                continue
            task = queue.pop(0)
            if pool is not None and pool.failed is None:
                writer = slots_writer
                writer.reset()
            else:
                writer = None
            fetcher.alloc = writer  # collate into the slot (None: no shared memory)
            result = fetcher.run(task)
            batch = result.batch
            used = None
            if batch is not None:
                try:
                    tree, holes, leaves, blob = encode(batch, writer)
                except Exception as exc:
                    if writer is not None:
                        writer.abandon()
                    name_unpicklable(exc, batch, task, spec)
                    result = Result(task.seq, worker_id, failure=capture(exc, worker_id, task.indices, "sending"))
                else:
                    used = writer.finish() if writer is not None else None
                    names = tuple((i, pool.slots[i].name) for i in used) if used and pool is not None else ()
                    # a Packed's fields as a plain tuple (see codec): the main process makes it a Packed
                    result.batch = (tree, holes, leaves, names, gen, worker_id, blob)
                    result.nbytes = (writer.total if writer is not None else 0) + (len(blob) if blob else 0)
            elif writer is not None:
                writer.abandon()
            if pool is not None:
                if pool.retired:
                    result.retired = tuple(pool.take_retired())
                if pool.failed is not None and not warned:
                    warned = True
                    result.warning = pool.failed
            done += 1
            if rss_read is not None:
                result.rss, rss_read = rss_read, None
            msg: Any = result.fields()  # plain tuples only: cheap to pickle (see Result.fields)
            ctx = (result, batch, task, used)
            ctxs = [ctx]
            if task.seq in grouped:
                grouped.discard(task.seq)
                held.append(msg)
                held_ctx.append(ctx)
                msg = None
                # (a group that runs long goes back as it is: its first batch waits for it)
                if not queue or result.end - held[0][7] > GROUP_HOLD_S:
                    msg, held, ctxs, held_ctx = held, [], held_ctx, []
            elif held:
                held.append(msg)
                held_ctx.append(ctx)
                msg, held, ctxs, held_ctx = held, [], held_ctx, []
            if msg is not None:
                _deliver(results, msg, ctxs, drain, pool, spec, worker_id)
            batch = ctx = ctxs = None  # type: ignore[assignment]
            if done % 16 == 1:
                # read after the send, for the next result: the kernel walks the page tables
                # for it (a fork of a 225 MB training process: 4 ms of CPU, up to ~95 ms on a
                # loaded host), and the first batch, which the loop waits for, waited as long
                rss_read = rss()
            if done == 1 and WORKER_NICE:
                try:
                    # loading fills the cores the training loop leaves idle; where both want the
                    # same core, the training step (the critical path) goes first. Not before
                    # the first batch is out: the loop has no step to run until it comes, and
                    # a worker started at nice 5 among other jobs waited ~3x longer for a core
                    # at each turn (first diabetes batch ~170 ms on a 2-core host at load 14)
                    os.nice(WORKER_NICE)
                except OSError:
                    pass
            # take any orders that arrived meanwhile, without blocking
            if (drain.parked or bell is not None or readable()) and not take():
                return
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return
    finally:
        if pool is not None:
            # told to stop, or leaving on a sample's sys.exit(): a main process that is still
            # there reads what was sent and sweeps the rest (see cleanup)
            pool.close(keep_sent=not parent.going())
        if stack_file is not None:
            stack_file.close()
            try:
                os.unlink(stack_at)  # also when the main process is gone and cannot sweep it
            except OSError:
                pass


def _deliver(results: Any, msg: Any, ctxs: list[Any], drain: Any, pool: Any, spec: WorkerSpec,
             worker_id: int) -> None:
    """Send one result, or a group of them (``msg`` a list, ``ctxs`` each one's (result, batch,
    task, slots)). A batch that cannot be pickled (a lock, a lambda, a generator in a sample)
    is sent as its failure, at once: the worker died of it, and each replacement died again
    on the same batch. Pickling fails before anything is written; a group that fails is sent
    one result at a time, so that only the batch that cannot be pickled fails."""
    try:
        send(results, msg, full=drain)
    except (OSError, EOFError):
        raise
    except Exception as exc:  # noqa: BLE001 - pickling failed: nothing was written
        if len(ctxs) > 1:
            for one, ctx in zip(msg, ctxs):
                _deliver(results, one, [ctx], drain, pool, spec, worker_id)
            return
        result, batch, task, used = ctxs[0]
        if used and pool is not None:
            pool.release(used)
        name_unpicklable(exc, batch, task, spec)
        send(results, Result(task.seq, worker_id, failure=capture(exc, worker_id, task.indices, "sending"),
                             retired=result.retired, warning=result.warning).fields(), full=drain)


def name_unpicklable(exc: BaseException, batch: Any, task: Task, spec: WorkerSpec) -> None:
    """Note on ``exc`` (pickling a batch failed) which sample holds what could not be pickled,
    and where in it: ``sample['meta'][2]``. A process worker sends a batch by pickling what
    is not an array; the error itself names only a type."""
    found = _unpicklable(batch, "")
    if found is None:
        return
    path, kind = found
    indices = task.indices if isinstance(task.indices, list) else None
    where = f"the batch at batch{path}"
    if indices is not None and not spec.auto_collation:
        where = f"sample {indices[0]} at sample{path}"  # the batch is the sample
    elif indices is not None and not spec.iterable:
        # the batch's shape is the collate_fn's: ask the samples themselves, one by one
        for i in indices:
            try:
                inner = _unpicklable(spec.dataset[i], "")
            except Exception:  # noqa: BLE001 - the sample cannot be read again: say what is known
                break
            if inner is not None:
                path, kind = inner
                where = f"sample {i} at sample{path}"
                break
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    exc.add_note(f"A process worker sends each batch to the main process by pickling what is not an array, and "
                 f"{where} holds a {name}, which cannot be pickled. Return plain data "
                 "from the dataset (or drop that field in a collate_fn), or use worker_type='thread'.")


def _unpicklable(obj: Any, path: str, depth: int = 0) -> tuple[str, type] | None:
    """The path of the innermost part of ``obj`` that cannot be pickled, and its type; None when
    ``obj`` pickles. Containers are looked into (their first 1,000 items, 20 levels deep)."""
    import pickle

    try:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return None
    except Exception:  # noqa: BLE001 - whatever pickling raises, this is the part that fails
        pass
    if depth < 20:
        if isinstance(obj, dict):
            parts: list[tuple[str, Any]] = [(f"[{k!r}]", v) for k, v in list(obj.items())[:1000]]
        elif isinstance(obj, (list, tuple)):
            parts = [(f"[{i}]", v) for i, v in enumerate(obj[:1000])]
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            parts = [(f".{f.name}", getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
        elif hasattr(obj, "__dict__") and not callable(obj) and isinstance(getattr(obj, "__dict__", None), dict):
            parts = [(f".{k}", v) for k, v in list(vars(obj).items())[:1000]]
        else:
            parts = []
        for step, part in parts:
            inner = _unpicklable(part, path + step, depth + 1)
            if inner is not None:
                return inner
    return path, type(obj)


def steady_malloc(keep_mb: int = WORKER_HEAP_KEEP_MB) -> bool:
    """Keep glibc from returning freed batch memory to the kernel in this process (a worker).

    A collate_fn that calls ``torch.stack`` itself allocates each batch with malloc. Left to its
    dynamic thresholds, glibc sometimes hands the freed batch back to the kernel (a trim, or an
    mmap'd chunk) and faults every page of the next batch in again, and sometimes reuses it:
    which one depends on the heap's history, so whole runs split in two (detection, batch 16
    of 3x256x256: 0.06 s or 0.25 s for 256 batches with 2 workers). Fixing the thresholds at
    the values glibc's own heuristic may reach (mmap above ``keep_mb``/2, at most 32 MB; trim
    above ``keep_mb``) makes the reuse certain, for at most ``keep_mb`` of idle heap per worker.
    Only in conveyor's own worker processes, never the user's; a malloc the user tuned through
    the environment is left as it is. True when the thresholds were set."""
    if keep_mb <= 0 or "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ \
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own allocator stays
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    keep = keep_mb << 20
    return bool(mallopt(m_mmap_threshold, min(keep // 2, 32 << 20))) and bool(mallopt(m_trim_threshold, keep))


def _set_up_torch(torch: Any) -> None:
    """A process worker's torch: one thread (the workers are the parallelism), conveyor's collate."""
    torch.set_num_threads(1)
    _route_torch_collate(torch)


def _route_torch_collate(torch: Any) -> None:
    """Make torch's ``default_collate`` stack tensors with conveyor's ``collate_tensor_fn`` in
    this worker process (only here: the process is conveyor's).

    Inside a worker, torch's own version allocates a fresh torch shared-memory segment for
    every batch (it expects torch's pickling to hand it over); a collate_fn that calls it
    would pay for that segment and then for a copy into conveyor's slot. Conveyor's version
    gives the same tensor, written straight into the batch's pre-faulted slot.
    """
    try:
        from torch.utils.data._utils import collate as torch_collate
    except ImportError:  # pragma: no cover - a torch without the module
        return
    table = getattr(torch_collate, "default_collate_fn_map", None)
    # only torch's own entry: a function the user registered there (padding, say) stays
    if isinstance(table, dict) and table.get(torch.Tensor) is getattr(torch_collate, "collate_tensor_fn", None):
        from ..collate import collate_tensor_fn

        table[torch.Tensor] = collate_tensor_fn


class _Rss:
    """``rss()``: the memory this process adds, in bytes (Linux), or None: its private pages
    (``/proc/self/smaps_rollup``), not its resident set. A forked worker's resident set counts
    every page of the training process it shares copy-on-write (a parent of 3 GB: each worker
    read 3 GB, and "auto" capped a 32-core machine at 5 workers on memory). The file stays open
    and is read again from its start (one system call); the kernel walks the page tables for it
    (~1 ms a GB), so it is read at most every ``every`` seconds, and the last reading given
    between. Where there is no such file, the resident set (``/proc/self/statm``)."""

    def __init__(self, every: float = 1.0) -> None:
        self.every, self.at, self.last = every, -math.inf, None
        self.rollup = True
        try:
            self.fd: int | None = os.open("/proc/self/smaps_rollup", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.rollup = False
            try:
                self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.fd = None
        try:
            self.page = os.sysconf("SC_PAGE_SIZE")
        except (ValueError, AttributeError, OSError):
            self.fd = None

    def __call__(self) -> int | None:
        if self.fd is None:
            return None
        now = time.monotonic()
        if now - self.at < self.every:
            return self.last
        self.at = now
        try:
            if not self.rollup:
                self.last = int(os.pread(self.fd, 128, 0).split()[1]) * self.page
                return self.last
            kb = 0
            for line in os.pread(self.fd, 4096, 0).splitlines():
                if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
                    kb += int(line.split()[1])
            self.last = kb * 1024
        except (OSError, ValueError, IndexError):
            self.last = None
        return self.last


class ParentWatch:
    """Is the main process (``pid``) still there? Not always this process's parent: a
    forkserver worker's parent is the fork server. A pidfd (Linux 5.3+) says so exactly and
    can be waited on; elsewhere the pid is probed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None  # no pidfd here (or the process is gone already: alive() says so)

    def alive(self) -> bool:
        if self.fd is not None:
            return not self._poll(0)
        if os.getppid() == self.pid:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True

    def going(self) -> bool:
        """Is the main process gone, or ending now of a signal (one sent to the whole process
        group, say)? A main process that is ending leaves nobody to sweep this worker's slots.
        Read from its pending signals (Linux): a fatal signal stays pending, and the kernel adds
        SIGKILL to each of its threads while it exits; elsewhere, wait briefly for it to end."""
        if not self.alive():
            return True
        try:
            with open(f"/proc/{self.pid}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            pending = int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16)
            handled = int(fields[b"SigCgt"], 16) | int(fields[b"SigIgn"], 16)
            state = fields[b"State"].split()[0]
        except (OSError, KeyError, ValueError, IndexError):
            if self.fd is not None:
                return self._poll(200)
            time.sleep(0.2)
            return not self.alive()
        if state in (b"Z", b"X"):
            return True
        fatal = 0
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT,
                    getattr(signal, "SIGQUIT", None), getattr(signal, "SIGALRM", None)):
            if sig is not None:
                fatal |= 1 << (sig - 1)
        fatal &= ~handled  # one the main process handles (or ignores) does not end it
        fatal |= 1 << (signal.SIGKILL - 1)
        return bool(pending & fatal)

    def _poll(self, timeout_ms: int | None) -> bool:
        import select  # poll, not select: a worker may hold more than 1024 descriptors

        p = select.poll()
        assert self.fd is not None
        p.register(self.fd, select.POLLIN)
        return bool(p.poll(timeout_ms))

    def wait_gone(self) -> None:
        """Block until the main process has ended."""
        if self.fd is not None:
            self._poll(None)
            return
        while self.alive():
            time.sleep(0.5)


class Drain:
    """What a worker does while its results pipe is full: read its orders, keeping them
    (``parked``) for the loop to apply.

    The main process writes an order with a blocking write and reads no result meanwhile;
    an order larger than the room left in the pipe (the indices of a batch of ~16k shuffled
    rows, ~80 KB) to a worker busy with a batch whose result is larger too (a 128 KB side
    leaf) left each waiting on the other for ever, ``timeout`` included. Called as
    ``send``'s ``full``: the results pipe is non-blocking."""

    def __init__(self, results: Any, inbox: Inbox, parent: ParentWatch) -> None:
        self.inbox, self.parent = inbox, parent
        self.parked: list[Any] = []
        self.poller = select.poll()  # poll, not select: a worker may hold more than 1024 descriptors
        self.poller.register(inbox.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self.poller.register(results.fileno(), select.POLLOUT | select.POLLERR)

    def __call__(self) -> None:
        got = self.poller.poll(500)
        if any(fd == self.inbox.fd for fd, _ in got):
            self.parked += self.inbox.take()
            if self.inbox.eof:
                raise BrokenPipeError("the main process closed the order pipe")
            if any(type(o) is Order and o.stop for o in self.parked):
                # closing: it reads no more results, and waited 5 s for this one's room
                raise BrokenPipeError("told to stop while a result waited for room")
        elif not got and not self.parent.alive():
            raise BrokenPipeError("the main process is gone")


def _wait(readable: Callable[[float], bool], parent: ParentWatch) -> bool:
    """Block until ``readable`` (the order pipe, or the bell) says so; False when the main
    process is gone."""
    while not readable(0.5):
        if not parent.alive():
            return False
    return True


def _watchdog(parent: ParentWatch, cleanup: Callable[[], None]) -> None:
    """A thread of each process worker: when the main process ends (killed, say) while this
    worker is inside a slow or stuck sample, free its shared memory and stack file and exit
    now, rather than stay behind until the sample returns."""
    def run() -> None:
        parent.wait_gone()
        try:
            cleanup()
        finally:
            os._exit(1)

    # a bare thread: threading's start() waits until the new thread runs, and a worker started
    # among other jobs waited 6-21 ms for it before saying hello (0.4 ms of CPU)
    _thread.start_new_thread(run, ())


def stack_path(prefix: str, worker: int, gen: int) -> str:
    """Where a process worker writes its Python stack when sent SIGUSR1."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"{prefix or 'conveyor_'}w{worker}g{gen}.stack")


def _install_stack_dump(path: str) -> Any:
    """SIGUSR1 writes every thread's Python stack to ``path`` (read when a worker hangs)."""
    try:
        import faulthandler

        f = open(path, "w")
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
        return f
    except (AttributeError, ValueError, RuntimeError, OSError):  # pragma: no cover - not on this OS
        return None
