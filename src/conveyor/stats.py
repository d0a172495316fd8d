"""Stage timings, gathered through hooks the loader calls, and their Chrome trace.

::

    worker: Result(start, fetched, end, cpu) --> Stats.result()   (per-worker fetch/collate/busy)
    user:   __next__ asked .. got            --> Stats.handed()   (wait, step, queue depth)
    Stats.snapshot() --> report() (a sentence), Tuner.observe() (a decision), write_trace() (Perfetto)

The loader calls :meth:`Stats.result` for every batch a worker finishes and
:meth:`Stats.handed` each time it hands a batch to the user; from these come
the wait ratio (how much of each training step the consumer spent waiting
for data), per-worker fetch times, throughput, and a Chrome trace. Every
timestamp is ``time.perf_counter()``, which on Linux is CLOCK_MONOTONIC and
so shared by the main process and its workers. The tuner reads these numbers
and nothing else.
"""

from __future__ import annotations

import array
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from .errors import Failure

FAILURES_KEPT = 1000  # failure records stats() lists (failure_count counts every one)

__all__ = ["Incidents", "Shipping", "Stats", "WorkerTimes", "trace_events", "write_trace"]

LOOP = -2  # the "worker" id of the training loop's events
INLINE = -1  # the worker id of batches made in the main process


KINDS = ("fetch", "step", "wait")
_EPOCH_END = (0.0, 0.0, 0.0, 0.0, -1.0)  # a pending record that marks the end of an epoch
_RUN_START = -2.0  # the size of a pending record that marks a new iter(): (gap, 0, 0, 0, -2)
PENDING_MAX = 4096  # lean-path batches kept unfolded (40 bytes each) before Stats.flush
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}


class Trace:
    """Timeline events ``(kind, worker, start, end)``, packed in one flat array.

    A deque of tuples would keep a tuple, two floats and a GC-tracked allocation per event:
    three a batch, up to the limit, enough to set off the cyclic collector every few
    hundred batches and, as they pile up, a full collection of every object of the
    process in the middle of an epoch (docs/decisions/trace-in-flat-arrays.md). Here an
    event is four doubles in one array and no object (one ``extend`` an event instead of an
    append to each of four arrays). Tracing still costs ~3-4 us of the ~100 us the main
    process spends on a batch it makes itself, in the training loop's caches more than
    in its own time. Iterating gives the tuples back. Past ``limit`` events the rest are
    counted in ``dropped``, not kept (a run's first stretch is what a timeline shows best:
    start-up, the tuner's changes).

    >>> t = Trace(limit=2); t.append("fetch", 0, 1.0, 2.0); t.append("wait", -2, 2.0, 2.5)
    >>> t.append("step", -2, 3.0, 4.0); list(t), t.dropped
    ([('fetch', 0, 1.0, 2.0), ('wait', -2, 2.0, 2.5)], 1)
    """

    __slots__ = ("limit", "data", "dropped")

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.data = array.array("d")  # kind code, worker, start, end; event after event
        self.dropped = 0  # events past the limit

    def append(self, kind: str, worker: int, start: float, end: float) -> None:
        if len(self.data) < 4 * self.limit:
            self.data.extend((_KIND_CODE[kind], worker, start, end))
        else:
            self.dropped += 1

    def extend(self, flat: list[float]) -> None:
        """Append events given flat: kind code, worker, start, end, event after event."""
        room = 4 * max(0, self.limit - len(self))
        if len(flat) > room:
            self.dropped += (len(flat) - room) // 4
            flat = flat[:room]
        self.data.fromlist(flat)

    def __len__(self) -> int:
        return len(self.data) // 4

    def __iter__(self) -> Iterator[tuple[str, int, float, float]]:
        d = self.data
        for i in range(0, len(d), 4):
            yield KINDS[int(d[i])], int(d[i + 1]), d[i + 2], d[i + 3]


@dataclass
class WorkerTimes:
    """Running totals of one worker (``-1``: batches made in the main process)."""

    batches: int = 0
    fetch_s: float = 0.0
    collate_s: float = 0.0
    busy_s: float = 0.0
    busy_sq: float = 0.0  # sum of squared busy times: the spread of batch cost
    cpu_s: float = 0.0  # CPU seconds the worker reported (0 when it does not)
    cpu_batches: int = 0  # batches that came with a CPU time (or that a reported span covered)
    cpu_wall_s: float = 0.0  # wall seconds the reported spans covered (0: per-batch CPU times only)
    core_s: float = 0.0  # seconds of its core the worker held or waited for over those spans
    rss: int = 0  # the worker's last reported resident set size, bytes (0: unknown)
    work_s: float = 0.0  # lane-seconds of fetches the fetch threads timed ...
    work_batches: int = 0  # ... over this many batches (the rest: busy time alone says)
    since: float | None = None  # when its first batch began: a worker started mid-run lived less
    idle_before: float = 0.0  # the loader's time between runs (Stats.idle_s) before that


@dataclass
class Incidents:
    """What went wrong over a loader's runs: samples skipped under ``on_error="skip"`` (their
    records without the exception object, the first ``FAILURES_KEPT``: a loader skipping bad
    samples for weeks must not keep each one; ``failure_count`` counts all) and worker deaths
    (described; ``restarts``: how many were replaced)."""

    failures: list[Failure] = field(default_factory=list)
    failure_count: int = 0
    deaths: list[str] = field(default_factory=list)
    restarts: int = 0

    def skipped(self, failures: tuple[Failure, ...] | list[Failure]) -> None:
        self.failure_count += len(failures)
        room = FAILURES_KEPT - len(self.failures)
        if room > 0:
            # the text tells what went wrong; the pickled or live exception (its locals, a
            # 20 MB array it holds) is not kept
            self.failures.extend(replace(f, payload=None, original=None) for f in failures[:room])


@dataclass
class Shipping:
    """Spawned and forkserver workers receive the dataset pickled: the main process's time
    pickling it for them, how many starts, the largest pickle, the most array bytes one start
    passed by reference instead, and the time moving arrays into shared memory for that (once
    an array: ``transport.share``); and apart, the copies each pool makes of arrays that are
    no container's (a user's own dataset's), which its workers wait for whole."""

    pickle_s: float = 0.0
    pickle_starts: int = 0
    pickle_bytes: int = 0
    shared_bytes: int = 0
    moved_s: float = 0.0
    copied_s: float = 0.0
    copied_bytes: int = 0
    copies: int = 0

    def shipped(self, seconds: float, nbytes: int, shared: int, moved: float = 0.0) -> None:
        """A start pickled its dataset (and the rest of its spec) in ``seconds``: ``nbytes``
        pickled, ``shared`` bytes of arrays by reference, after ``moved`` seconds moving
        arrays into shared memory."""
        self.moved_s += moved
        self.pickle_s += seconds
        self.pickle_starts += 1
        self.pickle_bytes = max(self.pickle_bytes, nbytes)
        self.shared_bytes = max(self.shared_bytes, shared)

    def copied(self, seconds: float, nbytes: int) -> None:
        """A pool copied ``nbytes`` of a user's arrays into shared memory in ``seconds`` (its
        workers wait for the copy whole: their reads cannot be checked chunk by chunk)."""
        self.copied_s += seconds
        self.copied_bytes += nbytes
        self.copies += 1


@dataclass
class Stats:
    """Running totals for one loader (all its epochs).

    >>> s = Stats()
    >>> s.result(0, 1.0, 1.2, 1.3)
    >>> s.handed(1.0, 1.3, 32, 0)
    >>> round(s.snapshot()["workers"][0]["mean_batch_s"], 3)
    0.3
    """

    trace_limit: int = 100_000
    batches: int = 0
    samples: int = 0
    steps: int = 0  # intervals between two handed batches of one epoch
    epochs: int = 0
    wait_s: float = 0.0  # consumer time spent inside __next__
    first_waits_s: float = 0.0  # of which for each epoch's first batch (workers starting up)
    step_s: float = 0.0  # consumer time between batches (training)
    first_batch_s: float | None = None
    # seconds the first iter() spent importing torch, before the clock started (None: torch
    # was there already, or is not needed): a one-time cost of the process, not the loader's
    torch_import_s: float | None = None
    workers: dict[int, WorkerTimes] = field(default_factory=dict)
    incidents: Incidents = field(default_factory=lambda: Incidents())  # skipped samples, worker deaths
    started: float = field(default_factory=time.perf_counter)
    began: bool = False  # ``begin`` was called: the first iter()
    last_handed: float | None = None
    # time between runs (from an epoch's end, or the last batch of one left early, to the
    # next iter()): not the loader's, so out of elapsed_s, throughput and busy fractions
    idle_s: float = 0.0
    paused_at: float | None = None  # when the loader went idle (an epoch ended), until the next iter()
    events: Trace = field(init=False)
    queue_depth_sum: int = 0
    batch_bytes: int = 0  # sum of reported batch sizes in bytes
    sized_batches: int = 0  # batches that came with a byte size
    shipping: Shipping = field(default_factory=lambda: Shipping())  # datasets pickled for spawned workers
    # batches the main process made and handed out by the lean path, five doubles each
    # (start, end, asked, got, samples), not yet in the totals or the trace: see ``made_here``
    pending: array.array = field(init=False)

    def __post_init__(self) -> None:
        self.events = Trace(self.trace_limit)
        self.pending = array.array("d")

    @property
    def trace(self) -> Trace:
        """The timeline so far (every event, the lean path's included)."""
        self.flush()
        return self.events

    def made_here(self, start: float, end: float, asked: float, got: float, size: int) -> None:
        """The main process made a batch in ``start..end`` and handed it out (asked at ``asked``,
        got at ``got``) with nothing else going on: ``result(INLINE, ...)`` then ``handed``,
        folded in later.

        Bookkeeping a batch as it goes costs as much again in the training step after it,
        whose memory it pushes out of the caches: one ``extend`` here, and the totals and
        the trace catch up on the next read, or every ``PENDING_MAX`` batches
        (docs/decisions/lean-path-for-main-process-batches.md)."""
        pending = self.pending
        pending.extend((start, end, asked, got, size))
        if len(pending) >= 5 * PENDING_MAX:
            self.flush()

    def flush(self) -> None:
        """Fold the lean path's batches into the totals and the trace, in the order they came:
        what ``result(INLINE, ...)`` and ``handed`` record batch by batch, in one loop over
        local sums (an epoch's first batch asks for it: through those two calls it would cost
        ~3.6 us a batch, all in that ``next()``; numpy over so few rows costs more;
        docs/decisions/lean-path-for-main-process-batches.md)."""
        pending = self.pending
        if not pending:
            return
        self.pending = array.array("d")  # empty again first: result() and handed() flush nothing
        wt = self.workers.get(INLINE)
        since, idle_before = (None, 0.0) if wt is None else (wt.since, wt.idle_before)
        last, idle, epochs = self.last_handed, self.idle_s, 0
        first = self.first_batch_s
        batches = steps = samples = 0
        busy_s = busy_sq = wait_s = step_s = first_waits_s = 0.0
        events: list[float] = []  # (kind code, worker, start, end), as handed() appends them
        fetch, step, wait = (float(_KIND_CODE[k]) for k in KINDS)
        for i in range(0, len(pending), 5):
            start, end, asked, got, size = pending[i:i + 5]
            if size < 0:
                last = None
                if size == _RUN_START:  # a new iter() after a gap of ``start`` seconds
                    idle += start
                else:  # an epoch ended here
                    epochs += 1
                continue
            if since is None:
                since, idle_before = start, idle
            if first is None:
                first = got - self.started
            busy = end - start
            busy_s += busy
            busy_sq += busy * busy
            batches += 1
            samples += int(size)
            waited = got - asked
            wait_s += waited
            events += (fetch, INLINE, start, end)
            if last is not None:
                steps += 1
                step_s += max(0.0, asked - last)
                events += (step, LOOP, last, asked)
            else:
                first_waits_s += waited
            if waited > 1e-5:
                events += (wait, LOOP, asked, got)
            last = got
        self.last_handed, self.idle_s, self.first_batch_s = last, idle, first
        self.epochs += epochs
        if batches:
            if wt is None:
                wt = self.workers[INLINE] = WorkerTimes()
            wt.since, wt.idle_before = since, idle_before
            wt.batches += batches
            wt.busy_s += busy_s
            wt.busy_sq += busy_sq
            self.batches += batches
            self.samples += samples
            self.steps += steps
            self.wait_s += wait_s
            self.step_s += step_s
            self.first_waits_s += first_waits_s
            self.events.extend(events)

    def result(self, worker: int, start: float, fetched: float, end: float, *,
               cpu: float | None = None, nbytes: int | None = None, rss: int | None = None,
               batches: int = 1, cpu_span: tuple[int, float, float] | None = None,
               work: float | None = None) -> None:
        """A worker finished a batch: fetched in ``start..fetched``, collated until ``end``.

        ``cpu`` is the CPU time the worker spent on it (``time.process_time()``
        delta in a process, ``time.thread_time()`` in a thread; with ``cpu_span``, the
        (batches, wall seconds) it covers, idle time included, and the seconds of its
        core the worker held or waited for meanwhile), ``nbytes`` the
        batch's size, ``rss`` the worker's resident memory and ``work`` the wall seconds
        its fetches took added up (fetch threads time them), each when known.
        """
        if self.pending:
            self.flush()
        wt = self.workers.get(worker)
        if wt is None:
            wt = self.workers[worker] = WorkerTimes()
        wt.batches += batches  # (more than one: a gather of many batches at once)
        if wt.since is None:
            wt.since = start
            wt.idle_before = self.idle_s
        if fetched:
            wt.fetch_s += fetched - start
            wt.collate_s += end - fetched
        busy = end - start
        wt.busy_s += busy
        wt.busy_sq += busy * busy / batches  # a gather's batches taken as equal in cost
        if cpu is not None:
            wt.cpu_s += cpu
            if cpu_span is None:
                wt.cpu_batches += 1
            else:
                wt.cpu_batches += cpu_span[0]
                wt.cpu_wall_s += cpu_span[1]
                wt.core_s += cpu_span[2]
        if rss:
            wt.rss = rss
        if work is not None:
            wt.work_s += work
            wt.work_batches += batches
        if nbytes:
            self.batch_bytes += nbytes
            self.sized_batches += 1
        self.events.append("fetch", worker, start, end)

    def begin(self) -> None:
        """The loader's first iter(): the clocks start (nothing was recorded before)."""
        self.began = True
        if self.first_batch_s is None and not self.batches:
            self.started = time.perf_counter()

    def run_start(self) -> None:
        """An iter() after an earlier one: the time since the last epoch ended, or since the
        last batch handed out of one left early (a ``break`` for validation), is neither a
        training step nor the loader's time: counted as one step, it would swell the mean
        step, and report() would find the workers idle
        (docs/decisions/clock-stops-between-epochs.md)."""
        paused = self.paused_at if self.paused_at is not None else self._last_got()
        if paused is None:
            return  # nothing handed out yet
        self.paused_at = None
        gap = max(0.0, time.perf_counter() - paused)
        if self.pending:
            # after lean-path batches: a mark among them (they fold in in order)
            self.pending.extend((gap, 0.0, 0.0, 0.0, _RUN_START))
        else:
            self.idle_s += gap
            self.last_handed = None

    def pause(self) -> None:
        """No run is left to hand out batches (an epoch left early, its iterator gone): the
        loader's clock stops at the last batch handed out, and stats() read later holds."""
        if self.paused_at is None:
            self.paused_at = self._last_got()

    def _last_got(self) -> float | None:
        """When the last batch was handed out (None: none since the last epoch's end)."""
        pending = self.pending
        if pending:
            return pending[-2] if pending[-1] >= 0 else None
        return self.last_handed

    def handed(self, asked: float, got: float, size: int, ready: int) -> None:
        """The consumer asked at ``asked`` and got a batch of ``size`` at ``got``."""
        if self.pending:
            self.flush()
        self.batches += 1
        self.samples += size
        self.wait_s += got - asked
        self.queue_depth_sum += ready
        if self.first_batch_s is None:
            self.first_batch_s = got - self.started
        if self.last_handed is not None:
            self.steps += 1
            self.step_s += max(0.0, asked - self.last_handed)
            self.events.append("step", LOOP, self.last_handed, asked)
        else:
            self.first_waits_s += got - asked
        if got - asked > 1e-5:
            self.events.append("wait", LOOP, asked, got)
        self.last_handed = got

    def handed_now(self, size: int) -> None:
        """A batch that was ready in the main process (no wait): counted, timed as a step."""
        if self.pending:
            self.flush()
        now = time.perf_counter()
        self.batches += 1
        self.samples += size
        last = self.last_handed
        if last is not None:
            self.steps += 1
            self.step_s += now - last  # (not traced: ~0.4 us, a tenth of such a batch's cost)
        self.last_handed = now

    def mark(self) -> tuple[float, int]:
        """The loop's time inside ``__next__`` so far and the batches handed out (the lean
        path's batches folded in first): two marks' difference times a stretch of batches."""
        self.flush()
        return self.wait_s, self.batches

    def since(self, mark: tuple[float, int]) -> tuple[float, int]:
        """The loop's time inside ``__next__`` and the batches handed out since ``mark``."""
        waited, handed = self.mark()
        return waited - mark[0], handed - mark[1]

    def epoch_end(self, at: float | None = None) -> None:
        """The epoch ended (its iterator raised StopIteration) ``at`` (default: now); the
        loader is idle until the next iter()."""
        self.paused_at = time.perf_counter() if at is None else at
        if self.pending:
            # after lean-path batches: a mark among them, folded in with them (a fold here
            # would cost a share of every short epoch)
            self.pending.extend(_EPOCH_END)
            if len(self.pending) >= 5 * PENDING_MAX:
                self.flush()
            return
        self.last_handed = None
        self.epochs += 1

    def snapshot(self) -> dict[str, Any]:
        """Plain numbers (JSON-able): what ``loader.stats()`` returns, before the loader's settings."""
        self.flush()
        # the loader's clock: from the first iter() to now, or to where it went idle (an
        # epoch's end), less the time between runs; read after a run it holds still (else it
        # falls with the seconds since, and report() finds the workers idle)
        now = self.paused_at if self.paused_at is not None else time.perf_counter()
        elapsed = max(1e-9, now - self.started - self.idle_s)
        total = self.wait_s + self.step_s
        workers: dict[int, dict[str, Any]] = {}
        for w, t in sorted(self.workers.items()):
            mean = t.busy_s / t.batches if t.batches else 0.0
            var = max(0.0, t.busy_sq / t.batches - mean * mean) if t.batches else 0.0
            workers[w] = {
                "batches": t.batches, "fetch_s": t.fetch_s, "collate_s": t.collate_s,
                "busy_s": t.busy_s, "mean_batch_s": mean, "std_batch_s": math.sqrt(var),
                "cpu_s": t.cpu_s if t.cpu_batches else None,
                "cpu_batches": t.cpu_batches,
                "cpu_wall_s": t.cpu_wall_s or None,
                "core_s": t.core_s if t.cpu_wall_s else None,
                "work_s": t.work_s if t.work_batches else None,
                "work_batches": t.work_batches,
                # of the time since its first batch began (or the clocks started): a worker
                # the tuner adds late would read as idle, and report() would blame the data ("uneven")
                "busy_fraction": min(1.0, t.busy_s / max(1e-9, now - max(self.started, t.since or 0.0)
                                                          - (self.idle_s - t.idle_before))),
                "rss": t.rss or None,
            }
        return {
            "batches": self.batches,
            "samples": self.samples,
            "steps": self.steps,
            "epochs": self.epochs,
            "elapsed_s": elapsed,
            "wait_s": self.wait_s,
            "first_waits_s": self.first_waits_s,
            "step_s": self.step_s,
            "wait_fraction": (self.wait_s / total) if total > 0 else 0.0,
            "wait_per_batch_s": self.wait_s / self.batches if self.batches else 0.0,
            "step_per_batch_s": self.step_s / self.steps if self.steps else None,
            "first_batch_s": self.first_batch_s,
            "torch_import_s": self.torch_import_s,
            "throughput_batches_s": self.batches / elapsed,
            "throughput_samples_s": self.samples / elapsed,
            "mean_ready_batches": self.queue_depth_sum / self.batches if self.batches else 0.0,
            "mean_batch_bytes": self.batch_bytes / self.sized_batches if self.sized_batches else None,
            "workers": workers,
            "failures": [
                {"index": (f.indices[0] if isinstance(f.indices, list) and len(f.indices) == 1 else f.indices),
                 "worker": f.worker_id, "error": f.summary()}
                for f in self.incidents.failures
            ],
            "failure_count": self.incidents.failure_count,
            "deaths": list(self.incidents.deaths),
            "restarts": self.incidents.restarts,
            "dataset_pickle_s": self.shipping.pickle_s,
            "dataset_pickles": self.shipping.pickle_starts,
            "dataset_pickle_bytes": self.shipping.pickle_bytes,
            "dataset_shared_bytes": self.shipping.shared_bytes,
            "dataset_moved_s": self.shipping.moved_s,
            "dataset_copied_s": self.shipping.copied_s,
            "dataset_copied_bytes": self.shipping.copied_bytes,
            "dataset_copies": self.shipping.copies,
        }


# -- Chrome trace -------------------------------------------------------------
def _track(worker: int) -> tuple[int, str]:
    """The trace thread id and name of a worker's track (the loop first, then inline, then workers)."""
    if worker == LOOP:
        return 1, "training loop"
    if worker == INLINE:
        return 2, "main process"
    return 3 + worker, f"worker {worker}"


def stats_of(source: Any) -> Stats:
    """The :class:`Stats` of ``source``: a Stats itself, or a conveyor DataLoader's.

    >>> s = Stats(started=0.0); stats_of(s) is s
    True
    """
    if isinstance(source, Stats):
        return source
    inner = getattr(source, "_stats", None)  # a DataLoader
    if isinstance(inner, Stats):
        return inner
    raise TypeError(f"expected a Stats or a conveyor DataLoader, got {type(source).__name__}")


def trace_events(stats: Stats | Any) -> list[dict[str, Any]]:
    """Chrome trace events (``ph`` "X" spans in microseconds) of a :class:`Stats` or a loader.

    >>> s = Stats(started=0.0); s.result(0, 0.001, 0.002, 0.003)
    >>> [e["name"] for e in trace_events(s) if e["ph"] == "X"]
    ['fetch']
    """
    st = stats_of(stats)
    pid = os.getpid()
    t0 = st.started
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "conveyor DataLoader"}},
    ]
    seen: set[int] = set()
    counts: dict[int, int] = {}
    for kind, worker, start, end in list(st.trace):
        tid, name = _track(worker)
        if tid not in seen:
            seen.add(tid)
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
        args: dict[str, Any] = {}
        if kind == "fetch":
            counts[worker] = counts.get(worker, 0) + 1
            args["batch"] = counts[worker]
        events.append({
            "name": kind, "cat": "loop" if worker == LOOP else "worker", "ph": "X", "pid": pid, "tid": tid,
            "ts": round((start - t0) * 1e6, 3), "dur": round(max(0.0, end - start) * 1e6, 3), "args": args,
        })
    return events


def write_trace(stats: Stats | Any, path: str | os.PathLike[str]) -> Path:
    """Write a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing).

    One track per worker with its fetches, one for the training loop with its
    steps and waits. ``stats`` is a :class:`Stats` or a conveyor DataLoader. The
    trace keeps a loader's first 100,000 events (about 30,000 batches: a fetch, a
    wait and a step each): past them the file says how many were left out
    (``otherData.dropped_events``) and a warning says so.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     write_trace(Stats(), os.path.join(folder, "trace.json")).name
    'trace.json'
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    st = stats_of(stats)
    other: dict[str, Any] = {"clock": "time.perf_counter (CLOCK_MONOTONIC)", "generator": "conveyor"}
    dropped = st.trace.dropped
    if dropped:
        # (else a long run's trace ends before the run does, without a word)
        other["dropped_events"] = dropped
        other["note"] = f"the first {st.trace_limit} events are kept; {dropped} later ones were left out"
        warnings.warn(f"the trace holds the run's first {st.trace_limit} events; {dropped} later ones were "
                      "left out", stacklevel=2)
    doc = {"traceEvents": trace_events(st), "displayTimeUnit": "ms", "otherData": other}
    out.write_text(json.dumps(doc))
    return out
