"""Where "auto" (and the ``adaptive=True`` opt-in) makes batches: the thresholds ``Probe``
decides by, and what it carries from one epoch to the next.

The main process makes the first batches itself and times them (``Mode.PROBE``); batches that
cost less than a trip from a worker stay there (``Mode.INLINE``), costlier ones go to workers
(``Mode.WORKERS``). ``Findings`` carries what one epoch's probe learnt to the next epoch's
pool (workers that do not persist are new every epoch). The thresholds are measured on the
machines in docs/decisions/; tests set them through this module (``probe.py`` reads
them from it).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _torch
from .._tree import tree_map
from ..executors.task import Result
from .machine import ranks_here, usable_cores

__all__ = ["Mode", "Findings", "CpuTimed", "Timed", "Verdict", "verdict", "nbytes", "trip_s", "typical", "estimate",
           "probed_enough", "ranks_words", "start_words"]


# A batch that costs less than this in the main process is cheaper to make there
# than to receive from a worker (pickle, pipe, wake-ups, ~100 us of the main process's
# time a batch, plus ~9 ms to fork each torch-sized worker): adaptive loaders keep it
# (docs/decisions/main-process-batches-under-auto.md).
INLINE_MAX_S = 500e-6


# ... or less than this many trips from a worker, where a trip costs more (a slower machine:
# see trip_s): workers break even near this many trips a batch, as the probe times a batch.
TRIPS = 11


# A batch this slow is clearly worth a worker (two in a row: start them); a probing batch
# still running after this long starts them there and then (five times that: at once).
SLOW_S = 2e-3


# ... except after the very first batch, whose one-time costs (first calls into libraries,
# first touches of the data) pass SLOW_S on their own on a slow host, for batches that cost
# far less after it: workers forked for those make every batch slower
# (docs/decisions/probe-reads-batch-costs-low.md).
FIRST_SLOW_S = 5e-3


# A batch produced faster than this (bytes of arrays per second) is a memory copy: a worker
# would repeat the copy into shared memory and add a trip, so the main process keeps it.
# (Decoding runs far below this rate; copying arrays runs above it, even into fresh pages.)
INLINE_RATE = 1e9


# ... unless the training loop's step between batches is at least this share of a batch's
# cost: then workers make the copies beside the step, where the main process would add each
# to it. A loop that only iterates keeps its copies here.
STEP_HIDES = 0.25


# The first probing batch also pays one-time costs: unless it mostly waits, it starts the
# workers only after this long (later ones after SLOW_S), so they overlap the rest of it.
EARLY_START_S = 0.025


# "auto" reads the stats every this many batches handed out (a snapshot costs ~50 us)
RETUNE_EVERY = 4


# Where the training processes leave no core for workers (tuning.no_core_left), a first batch
# starts them only if it kept the process this little busy: computing batches of ranks that
# share the cores read more busy than this, run-queue waits taken out.
CROWDED_WAITS = 0.2


# Workers that take longer than this many main-process batches, and this long, to start
# (spawned ones import afresh, torch included; forked ones do not) get a head start from
# the main process even with a worker per core: else the training loop stands still for all
# of it, every epoch (docs/decisions/head-start-while-workers-start.md).
SLOW_START_BATCHES = 8


SLOW_START_S = 0.1


def nbytes(batch: Any) -> int:
    """Bytes of array data in a batch (numpy arrays and tensors)."""
    total = 0

    def leaf(obj: Any) -> None:
        nonlocal total
        try:
            n = getattr(obj, "nbytes", None)
        except RuntimeError:  # a sparse torch tensor has no nbytes: left out of the estimate
            return
        if isinstance(n, int):
            total += n

    tree_map(leaf, batch)
    return total


def trip_s(batch: Any, output: str) -> float:
    """Seconds of this machine's CPU a trip from a process worker costs a batch shaped like
    ``batch`` (its envelope: encode, pickle, unpickle, decode), without moving its data (each
    array leaf stands in as one element of its dtype): the best of three. 0.0 for a batch
    it cannot time (what does not pickle is the workers' to report, not this estimate's)."""
    from ..transport import Packed, Views, decode, encode

    def small(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return np.zeros((1,) * obj.ndim, obj.dtype)
        if _torch.is_tensor(obj) and obj.device.type == "cpu":
            return obj.new_zeros((1,) * obj.ndim)
        return obj

    views = Views(None)
    best = math.inf
    try:
        proxy = tree_map(small, batch)
        for _ in range(3):
            t0 = time.perf_counter()
            tree, holes, leaves, blob = encode(proxy, None)
            fields = Result(0, 0, batch=(tree, holes, leaves, (), 0, 0, blob), start=t0, fetched=t0, end=t0).fields()
            back = Result(*pickle.loads(pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL)))
            decode(Packed._make(back.batch), views, output=output)
            best = min(best, time.perf_counter() - t0)
    except Exception:  # noqa: BLE001 - an estimate; the batch itself is fine where it is
        return 0.0
    return best


@dataclasses.dataclass
class Findings:
    """What a loader's adaptive pools found out, for the pools of its later epochs (workers
    that do not persist are new every epoch). Forgotten when a setting changes."""

    # the batches were worth the workers: later pools start them at once instead of probing
    workers_paid: bool = False
    # the dataset draws from the global RNGs: while later pools' workers start, the main
    # process makes no batch (it would draw from the caller's RNGs)
    draws_rngs: bool = False
    batch_s: float | None = None  # what a batch costs the main process, as probing found
    start_s: float | None = None  # from starting the workers to their first batch back
    stop_s: float | None = None  # closing them
    # an epoch ended, the main process making every batch, before the workers were ready
    unready: bool = False
    # the last whole epoch with workers that do not persist: the training loop's time inside
    # next() from their start on (start-up included), and the batches it got meanwhile
    fed_s: float | None = None
    fed_batches: int = 0
    # the last whole epoch made in the main process once such workers had been timed: the
    # loop's time inside next(), and its batches
    here_s: float | None = None
    here_batches: int = 0

    def fed_a_batch(self) -> float | None:
        """The loop's time for a batch from the workers (their stop included), if timed."""
        if self.fed_s is None or self.fed_batches == 0:
            return None
        return (self.fed_s + (self.stop_s or 0.0)) / self.fed_batches

    def made_a_batch(self, cost: float) -> float:
        """The loop's time for a batch made here: ``cost`` (a typical batch as timed here,
        blind to rare slow samples), or what an epoch made here measured, if more."""
        if self.here_s is None or not self.here_batches:
            return cost
        return max(cost, self.here_s / self.here_batches)

    def workers_lose(self, cost: float) -> bool:
        """Did the loop wait longer for the workers' batches than for batches made here?
        Until an epoch made here measures the latter, ``cost`` stands in for it: the next
        epoch is then made here, and measured, and the faster way is kept."""
        fed = self.fed_a_batch()
        return fed is not None and fed >= self.made_a_batch(cost)

    def forget(self) -> None:
        self.__init__()  # type: ignore[misc]

    def slow_start(self) -> bool:
        """Did the workers take longer to start than ``SLOW_START_S``, and than the main
        process takes to make ``SLOW_START_BATCHES`` batches?"""
        return (self.start_s is not None and self.batch_s is not None
                and self.start_s > max(SLOW_START_S, SLOW_START_BATCHES * self.batch_s))

    def workers_s(self) -> float | None:
        """What starting and stopping the workers costs, once both were timed."""
        if self.start_s is None or self.stop_s is None:
            return None
        return self.start_s + self.stop_s


def ranks_words() -> str:
    """How many training processes share how many cores, in words."""
    return f"{ranks_here()} training processes share this machine's {usable_cores()} cores"


def start_words(findings: Findings, cost: float, batches: int) -> str:
    """Why workers that do not persist are not worth starting, in words."""
    if findings.unready:
        return (f"starting the workers took longer than the epoch's {batches} batches take in the main process "
                f"({cost * batches:.2f} s): it made them all while they started")
    fed = findings.fed_a_batch()
    if fed is not None and findings.workers_lose(cost):
        measured = "" if findings.here_s is None else ", as an epoch of them measured it"
        return (f"the training loop waited {fed * 1e3:.1f} ms a batch for the workers' batches (their start and "
                f"stop included), more than for one made in the main process "
                f"({findings.made_a_batch(cost) * 1e3:.1f} ms{measured})")
    return (f"starting and stopping the workers takes {findings.workers_s() or 0.0:.2f} s an epoch, more than "
            f"the epoch's {batches} batches take in the main process ({cost * batches:.2f} s)")


class CpuTimed:
    """``fn`` called with the CPU seconds this thread spends in it added up (``cpu_s``), read
    on ``clock``: the clock of the batch it runs inside, so that what it takes away from that
    batch is what it added (a fetcher's clock counts the thread's waits for a core too)."""

    def __init__(self, fn: Callable[..., None], clock: Callable[[], float] = time.thread_time) -> None:
        self.fn, self.clock, self.cpu_s = fn, clock, 0.0

    def __call__(self, *args: Any) -> None:
        c0 = self.clock()
        try:
            self.fn(*args)
        finally:
            self.cpu_s += self.clock() - c0


def typical(costs: Sequence[float]) -> float:
    """What a main-process batch costs: a low quantile, since a busy machine preempts some
    batches, which says nothing of their cost."""
    return sorted(costs)[len(costs) // 4]


def estimate(costs: Sequence[float]) -> float:
    """What a main-process batch costs, for a loader whose count of workers is set: the
    cheapest of the first probing batches, the low quartile once there are more.

    The first batches read high (one-time costs, cold caches, and each probing batch's RNG
    bookkeeping), and the two mistakes do not cost alike: workers started for batches that
    are cheaper here stay, while batches kept here are timed again by the quick path
    (``Probe.note``, every 16) and go to the workers if they are costly after all
    (docs/decisions/probe-reads-batch-costs-low.md)."""
    return min(costs) if len(costs) <= 4 else typical(costs)


def probed_enough(costs: Sequence[float]) -> bool:
    """Have the probing batches said enough to choose? After four, or as soon as two cost
    at most ``INLINE_MAX_S``: the low quartile of four is then at most that whatever the
    other two cost, so the choice is the one four would make. With tiny samples each
    probing batch pays ~0.15 ms of RNG bookkeeping, a real share of a short run."""
    return len(costs) >= 4 or sum(c <= INLINE_MAX_S for c in costs) >= 2


class Verdict(enum.Enum):
    """What a batch timed in the main process says to do next (``verdict``)."""

    KEEP = "keep"  # go on as now
    HERE = "here"  # the main process makes the batches ("auto": and pins no workers)
    WORKERS = "workers"  # probed enough: the user's workers are worth their trips
    WORKERS_NOW = "workers now"  # clearly worth a worker (slow, or only a worker makes it right)
    JUMP = "jump"  # "auto", no workers yet: a batch this costly needs a worker per core now
    REOPEN = "reopen"  # "auto" settled here, and a whole window of batches got costly since


@dataclasses.dataclass(frozen=True)
class Timed:
    """What the probe knows once a batch made in the main process is timed."""

    costs: tuple[float, ...]  # the window of main-process batch costs, this batch's last
    rate: float  # bytes a second this batch was made at
    copying: bool  # batches are made at memory-copy speed, the training step hiding no copy
    waits: bool  # this batch's CPU time was under half its wall time (it waited)
    auto: bool  # "auto" chooses the worker count (else the user set it)
    probing: bool  # the pool has not chosen yet (``Mode.PROBE``)
    workers: int  # workers the pool runs now
    window_end: bool  # the 16th batch made here since the window was last read whole
    rng_sensitive: bool  # the dataset draws from the global RNGs: only a worker makes its batches right
    no_core_left: bool  # the training processes leave no core for a worker that computes


def verdict(t: Timed, start_outweighs: Callable[[float], bool], worth: Callable[[float], bool],
            reopenable: Callable[[], bool]) -> tuple[Verdict, float | None, bool]:
    """The probe's decision after a timed batch: observations in, a decision out.

    ``start_outweighs(cost)``: would starting the workers cost more than they save at that
    cost a batch; ``worth(cost)``: is a batch of that cost worth a trip from a worker (it may
    time a trip once, so it is asked only where the answer matters); ``reopenable()``: may
    an "auto" pool settled here start workers after all. Returns the verdict, the cost a
    batch was judged to have (the window's low quartile, where one was read) and whether that
    cost is what later epochs go by (a whole window read, ``Findings.batch_s``).

    One slow batch may be the machine's doing (preemption, a page fault): a moderately slow
    one must be seen twice, one five times ``SLOW_S`` (not a memory copy) once.
    """
    cost = t.costs[-1]
    slow_twice = len(t.costs) >= 2 and min(t.costs[-2:]) > SLOW_S
    if t.auto:
        if (t.workers == 0 and cost > SLOW_S and not t.copying and not start_outweighs(cost)
                and (t.waits or slow_twice and not t.no_core_left)):
            return Verdict.JUMP, None, False
        if t.window_end and len(t.costs) >= 16 and not t.copying and reopenable():
            low = typical(t.costs)
            return (Verdict.REOPEN if worth(low) else Verdict.KEEP), low, True
        if t.probing and (t.copying or probed_enough(t.costs)):
            low = typical(t.costs)
            return (Verdict.HERE if t.copying or not worth(low) else Verdict.KEEP), low, False
        return Verdict.KEEP, None, False
    if t.rng_sensitive or (not t.copying and not start_outweighs(cost)
                           and (cost > 5 * SLOW_S and t.rate < INLINE_RATE or slow_twice)):
        return Verdict.WORKERS_NOW, None, False
    if probed_enough(t.costs):
        return (Verdict.WORKERS if not t.copying and worth(estimate(t.costs)) else Verdict.HERE), None, False
    return Verdict.KEEP, None, False


class Mode(enum.Enum):
    """Where a pool makes its batches."""

    PROBE = "probe"  # the main process makes them and times them, to choose ("auto", ``adaptive``)
    INLINE = "inline"  # the main process makes them
    WORKERS = "workers"  # the workers make them (after a head start, where one is allowed)

