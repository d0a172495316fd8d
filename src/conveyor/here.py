"""A run's side of the batches the main process makes (``Pool.main``, ``executors/inline.py``):
their position, stats and hand-out.

``quick``: a plain batch (no per-sample seeding, no skipping) without the task envelope;
``lean_next``: ``Run.__next__`` itself once nothing else needs doing per batch (nothing in
flight, nothing to skip or drop, no tuner to feed); ``bulk``: in-memory arrays gathered many
batches at once (``MainProcess.gather``), then handed out as views. Batches that need the
envelope (a seed, ``on_error="skip"``) or the probe's timing go through ``Probe.fetch_here``
(``MainProcess.run``) instead.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import capture, rebuild
from .executors.fetcher import Fetcher
from .placement.rules import Mode
from .stats import INLINE

if TYPE_CHECKING:
    from .epoch import Run

__all__ = ["Here", "quick", "made", "go_lean", "lean_next", "bulk"]


class Here:
    """A run's state for the batches the main process makes: the lean path (on once the
    quick path does all there is to do, see ``go_lean``) and its fetch, and the batches of
    one bulk gather waiting to go out."""

    __slots__ = ("lean", "fetch", "ready", "seq")

    def __init__(self) -> None:
        self.lean = False  # __next__ takes the lean path
        self.fetch: Callable[[Any], Any] | None = None  # the fetcher's quick path, on the lean path
        self.ready: collections.deque[Any] = collections.deque()  # (batch, size) of one bulk gather
        self.seq = 0  # seq of the next batch in ``ready``


def quick(run: Run) -> tuple[Any, int]:
    """A batch made in the main process, without the task envelope (the common, cheap case)."""
    pool = run.pool
    indices = next(run.order.batches)  # StopIteration ends the epoch
    run.out_seq = pool.seq
    pool.seq += 1
    run.reorder.next = pool.seq
    fetcher = pool.main.fetcher
    batch, n, start, end = made(run, fetcher.quick, indices)
    run.stats.result(INLINE, start, 0.0, end)
    if not run.here.lean:
        go_lean(run, fetcher)
    return batch, n


def made(run: Run, fetch: Callable[[Any], Any], indices: Any) -> tuple[Any, int, float, float]:
    """Make the batch of ``indices`` here with ``fetch`` (a fetcher's quick path): timed,
    noted, converted and pinned as the loader hands it out. The batch, its size and when
    it was started and made (for the stats, which the caller feeds)."""
    start = time.perf_counter()
    try:
        batch = fetch(indices)
    except Exception as exc:
        # the same shape as a worker's failure: original type, traceback chained, a note
        raise rebuild(capture(exc, None, indices, keep=True))  # noqa: B904 - the exception itself, noted
    end = time.perf_counter()
    run.pool.probe.note(end - start, batch)
    n = len(indices)
    run.budget.seen += n
    return run.dressed(batch), n, start, end


def go_lean(run: Run, fetcher: Fetcher) -> None:
    """Take the lean path from the next batch on if it would do all there is to do."""
    pool = run.pool
    lean = (pool.mode == Mode.INLINE and pool.quick and run.replicas is None
            and run.len_said is None and run.order.positions is None and not run.order.ahead
            and not run.here.ready and run.order.slices is None and not run.inflight
            and not len(run.reorder) and not (pool.tuner is not None and pool.probe.tuning()))
    run.here.lean = lean
    run.here.fetch = fetcher.quick if lean else None


def lean_next(run: Run) -> Any:
    """``__next__`` for batches the main process makes by the quick path, with nothing
    in flight, nothing to skip or drop and no tuner to feed. The general path's checks
    cost a few microseconds a batch, in this loop and in the training step after it
    (whose memory they push out of the caches); the stats take five numbers a batch and
    catch up when read (``Stats.made_here``). See
    docs/decisions/lean-path-for-main-process-batches.md."""
    if run.finished:
        raise StopIteration
    asked = time.perf_counter()
    try:
        indices = next(run.order.batches)
    except StopIteration:
        run._finish()
        raise
    pool = run.pool
    seq = pool.seq
    run.out_seq = seq
    pool.seq = run.reorder.next = seq + 1
    fetch = run.here.fetch
    assert fetch is not None
    batch, n, start, end = made(run, fetch, indices)
    if pool.mode != Mode.INLINE:
        run.here.lean = False  # batches got costly: the workers make the next ones
    run.order.prefix += 1  # in order, none left out: the position is the count
    run.yielded += 1
    run.stats.made_here(start, end, asked, time.perf_counter(), n)
    return batch


def bulk(run: Run) -> tuple[Any, int]:
    """In-memory arrays made in the main process: one gather for many batches, then views."""
    ready = run.here.ready
    if not ready:
        slices = run.order.slices
        assert slices is not None
        main = run.pool.main
        if slices.per_chunk == 0:
            slices.per_chunk = main.batches_a_gather(slices.size)
        indices = slices.chunk(slices.per_chunk)
        if indices is None:
            raise StopIteration
        start = time.perf_counter()
        ready.extend(main.gather(indices, slices.size))
        count = len(ready)
        # one event for the gather, counting its batches (main-process batches, as any)
        run.stats.result(-1, start, 0.0, time.perf_counter(), batches=count)
        run.pool.inline_batches += count
        run.here.seq = run.pool.seq
        run.pool.seq += count
        run.reorder.next = run.pool.seq
    run.out_seq = run.here.seq
    run.here.seq += 1
    if run.pin is not None:
        batch, n = ready.popleft()
        return run.pin(batch), n
    return ready.popleft()
