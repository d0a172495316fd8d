"""Picks ``num_workers``, ``fetch_threads`` and ``prefetch_factor`` from stats alone.

::

    loader.stats() every N batches --> Tuner.observe(snapshot)
        window = difference from the previous snapshot (per-batch busy, CPU, step, wait)
        estimates = running means over windows
    Tuner.decision() --> Decision(num_workers, fetch_threads, prefetch_factor, reason, settled)
        the loader applies it at an epoch boundary (or adds workers on the fly)

The model: a batch costs ``busy`` wall seconds in a worker, ``cpu`` of them on
a core, and the training loop consumes one batch every ``step`` seconds. A
worker with ``T`` fetch threads splits a batch's samples over them, so
``work = busy * T`` is what a batch costs one fetch at a time ("lane-seconds",
the batch size times a sample's latency), and to hide loading ``work / step``
fetches must run at once ("lanes"). ``cpu / work`` is the share of a fetch
spent computing: CPU-bound work (>= 0.5) gets one process per lane, never more
than the CPU budget. I/O-bound work gets just enough processes for its CPU
share and ``fetch_threads`` for the rest: threads wait on storage as well as
processes do, at a fraction of the memory, up to what keeps a worker's core
busy (the share of its core a worker used with ``T`` threads is its CPU time
over the wall time of spans of its batches; a worker near a full core is
offered fewer threads, each cut checked by :class:`ThreadSteer`). Memory caps
the worker count: every worker costs the private memory it adds (not what it
shares with the training process since the fork) plus ``prefetch_factor``
batches in flight.

When workers do not report CPU time, the tuner assumes CPU-bound work (more
processes hide latency too), and switches to threads once it has seen that
running more fetches than there are cores did not slow each fetch down, which
only happens when fetches wait rather than compute.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from . import machine

__all__ = ["Decision", "Observations", "ThreadSteer", "Tuner", "Window"]

IO_BOUND = 0.5  # cpu/work below this: the fetch mostly waits
HALF_WAITING = 0.8  # cpu/work below this: a CPU-bound fetch still waits enough for a second thread
# windows of observations kept: the model reads the last few, the I/O probe the early ones
WINDOWS_KEPT = 256
MAX_PREFETCH = 64  # batches in flight a worker: enough for one sample a batch and 64 threads
SATURATED = 0.9  # a worker's core share above this: its threads keep the core busy
CROWDED = 2.0  # fetches this many times slower than one alone: the threads crowd each other
CROWD_MARGIN = 2.0  # threads kept beyond what crowding says would fetch as much
SPED_UP = 0.85  # a cut of crowding threads stands if each fetch then takes at most this share
MAX_THREADS = 64


@dataclass(frozen=True)
class Decision:
    """The settings the tuner recommends, why, and whether it has stopped changing its mind.

    >>> d = Decision(2, 8, 2, "I/O-bound", True)
    >>> Decision.from_dict(d.to_dict()) == d
    True
    """

    num_workers: int
    fetch_threads: int = 1
    prefetch_factor: int | None = 2
    reason: str = ""
    settled: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        workers = int(data["num_workers"])
        pf = data.get("prefetch_factor", 2)
        return cls(
            num_workers=workers,
            fetch_threads=int(data.get("fetch_threads", 1)),
            prefetch_factor=None if workers == 0 or pf is None else int(pf),
            reason=str(data.get("reason", "")),
            settled=bool(data.get("settled", True)),
        )

    def loader_kwargs(self) -> dict[str, Any]:
        """The DataLoader arguments this decision stands for."""
        return {"num_workers": self.num_workers, "fetch_threads": self.fetch_threads,
                "prefetch_factor": self.prefetch_factor if self.num_workers else None}


@dataclass(frozen=True)
class Window:
    """Per-batch means between two snapshots."""

    batches: int
    busy: float  # wall seconds a worker spends on one batch
    busy_std: float
    cpu: float | None  # CPU seconds of one batch, when workers report it
    step: float | None  # consumer seconds between two batches
    wait: float  # consumer seconds waiting per batch
    lanes: int  # fetches that could run at once (workers x fetch_threads)
    workers: int
    use: float | None = None  # share of its core a worker kept busy (CPU over wall of its spans)
    samples: float = 0.0  # samples a batch, on average (0: not told)
    measured: float | None = None  # lane-seconds a batch, as fetch threads timed its fetches

    @property
    def threads(self) -> int:
        """Fetch threads a worker ran with."""
        return max(1, self.lanes // max(1, self.workers))

    @property
    def work(self) -> float:
        """Lane-seconds of one batch: as fetch threads timed its fetches, else its wall time
        in a worker times the fetches that ran at once on it, the worker's threads or its
        samples, whichever are fewer. (Threads fetch the batches a worker holds ahead of
        their turn, so with one sample a batch among many threads a batch's own wall time can
        be near nothing, and the work would read as CPU-bound.)"""
        if self.measured is not None:
            return self.measured
        threads = self.threads
        if self.samples >= 1:
            threads = min(threads, max(1, round(self.samples)))
        return self.busy * threads


def _totals(snap: dict[str, Any]) -> tuple[int, float, float, float, int, float, float]:
    """Sums over workers: batches, busy seconds, squared busy, CPU seconds and the batches
    they cover, and (workers that report spans) the seconds of a core they held over the
    wall seconds spanned."""
    n = busy = sq = cpu = span_cpu = span_wall = 0.0
    cpu_n = 0
    for w in snap.get("workers", {}).values():
        b = w.get("batches", 0)
        n += b
        busy += w.get("busy_s", 0.0)
        std = w.get("std_batch_s", 0.0) or 0.0
        mean = w.get("mean_batch_s", 0.0) or 0.0
        sq += b * (std * std + mean * mean)
        if w.get("cpu_s") is not None:
            cpu += w["cpu_s"]
            cpu_n += w.get("cpu_batches", b)
            if w.get("cpu_wall_s"):
                # the seconds of its core a worker held or waited for, where it says (its
                # threads' waits for a core added up overlap: see ``sched.process_clocks``)
                span_cpu += w["core_s"] if w.get("core_s") is not None else w["cpu_s"]
                span_wall += w["cpu_wall_s"]
    return int(n), busy, sq, cpu, cpu_n, span_cpu, span_wall


def _work_totals(snap: dict[str, Any]) -> tuple[float, int]:
    """Sums over workers: lane-seconds the fetch threads timed, and over how many batches."""
    work = 0.0
    n = 0
    for w in snap.get("workers", {}).values():
        if w.get("work_s") is not None:
            work += w["work_s"]
            n += w.get("work_batches", 0)
    return work, n


class ThreadSteer:
    """Moves the fetch-thread count toward what the model asks, checked by throughput.

    The model reads a window's CPU time against its busy time, and a window can mislead:
    a new thread pool's start-up, a busy machine, and the GIL overhead of many threads
    all read as CPU work. So threads drop only when two decisions in a row ask for fewer,
    at most by half, and changes under a quarter are not worth a new pool. Every cut is a
    trial: if the next window hands out batches 15% slower, the cut is undone and no cut
    goes below that count again (``floor``).

    Threads that crowd each other (``crowded``: each fetch took many times what one took
    alone) are cut to the model's count at once, and that cut is judged by the fetches
    themselves, which a window of 4 batches times by the hundred: it stands if each fetch
    now takes 15% less than before the cut (so the crowding was the threads'), else it is
    undone. (The rate of 4-batch windows is the wrong judge there: with many threads of
    GIL-bound fetches it varies from window to window by more than a cut saves, and a cut
    that saves reads as one that costs: docs/decisions/crowded-threads-cut-by-fetch-times.md.)
    The window right after that cut is a changeover, not judged, and so is the next unless
    it shows the speed-up: the old pool's queued fetches still run beside the new pool's.

    >>> s = ThreadSteer()
    >>> s.window(8, 1.0); s.steer(64, 8)        # first vote for fewer: kept
    64
    >>> s.window(16, 2.0); s.steer(64, 8)       # second vote: halved, at 8 batches/s
    32
    >>> s.window(20, 3.0); s.steer(32, 8)       # 4 batches/s after the cut: undone
    64
    >>> s.floor
    64
    """

    __slots__ = ("fewer_before", "trial", "crowd_trial", "floor", "rate", "_mark")

    def __init__(self) -> None:
        self.fewer_before = False  # the last decision asked for fewer threads
        self.trial: tuple[int, float] | None = None  # (threads, batches/s) before a cut
        # (threads, seconds a fetch took, windows since) before a cut of crowding threads
        self.crowd_trial: tuple[int, float, int] | None = None
        self.floor = 1  # no cut goes below this (a cut that cost throughput)
        self.rate: float | None = None  # batches a second handed out in the last window
        self._mark: tuple[int, float] | None = None  # (batches handed, time) at the last window

    def window(self, handed: int, now: float) -> None:
        """The loader had handed out ``handed`` batches in all at time ``now``."""
        mark, self._mark = self._mark, (handed, now)
        self.rate = None if mark is None or handed <= mark[0] or now <= mark[1] else (
            (handed - mark[0]) / (now - mark[1]))

    def steer(self, current: int, wanted: int, *, each: float | None = None, crowded: bool = False) -> int:
        """The thread count to run next, from ``current`` and the model's ``wanted``
        (``crowded``: because the threads crowd each other; ``each``: the seconds a fetch
        took in the last window)."""
        crowd, self.crowd_trial = self.crowd_trial, None
        if crowd is not None:
            sped_up = each is not None and each <= SPED_UP * crowd[1]
            if crowd[2] == 0 or crowd[2] == 1 and not sped_up:
                self.crowd_trial = (crowd[0], crowd[1], crowd[2] + 1)
                return current  # the changeover (the old pool's fetches may still run a window more)
            if not sped_up:
                self.floor = crowd[0]  # fetches did not speed up: they were not crowding
                self.fewer_before = False
                return crowd[0]
        fewer = wanted < current
        if fewer and crowded and each is not None and self.trial is None:  # one trial at a time
            target = max(wanted, self.floor)
            if self.fewer_before and current - target >= max(1, current // 4):
                self.fewer_before = False
                self.crowd_trial = (current, each, 0)
                return target
            self.fewer_before = True
            return current
        threads = current if fewer and not self.fewer_before else max(wanted, current // 2)
        self.fewer_before = fewer
        trial, self.trial = self.trial, None
        if trial is not None and self.rate is not None and self.rate < 0.85 * trial[1]:
            threads = self.floor = trial[0]
        threads = max(threads, self.floor)
        if abs(threads - current) < max(1, current // 4):
            return current
        if threads < current and self.rate is not None:
            self.trial = (current, self.rate)
        return threads


class Observations:
    """What the tuner has measured: a ``Window`` of per-batch means between each two stats
    snapshots (the last ``WINDOWS_KEPT``), the batches they cover, and the memory the latest
    snapshot told of (what a worker adds, what a batch holds).

    >>> o = Observations()
    >>> o.add({"batches": 8, "steps": 7, "step_s": 0.07, "wait_s": 0.1,
    ...        "workers": {0: {"batches": 8, "busy_s": 0.4}}})
    True
    >>> o.seen, o.windows[-1].busy
    (8, 0.05)
    """

    __slots__ = ("last", "rebase", "windows", "seen", "rss", "batch_bytes")

    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None  # the snapshot the next window starts from
        self.rebase = False  # the next snapshot is a baseline, not a window (unpin)
        self.windows: list[Window] = []
        self.seen = 0  # batches observed
        self.rss: float | None = None  # bytes a worker adds
        self.batch_bytes: float | None = None

    def rebased(self, snap: dict[str, Any]) -> bool:
        """Is ``snap`` the baseline asked for (``rebase``), taken as such and no window?"""
        if not self.rebase:
            return False
        self.rebase = False
        self.last = snap  # what came before the pin was lifted is not a window
        return True

    def add(self, snap: dict[str, Any]) -> bool:
        """Take a cumulative snapshot: did it make a window (batches were made and handed out
        since the last one)?"""
        last = self.last or {"batches": 0, "steps": 0, "step_s": 0.0, "wait_s": 0.0, "workers": {}}
        if snap.get("batches", 0) < last.get("batches", 0):
            last = {"batches": 0, "steps": 0, "step_s": 0.0, "wait_s": 0.0, "workers": {}}  # a reset
        self.last = snap
        n1, busy1, sq1, cpu1, cn1, sc1, sw1 = _totals(snap)
        n0, busy0, sq0, cpu0, cn0, sc0, sw0 = _totals(last)
        dn = n1 - n0
        handed = snap.get("batches", 0) - last.get("batches", 0)
        if dn <= 0 or handed <= 0:
            return False
        busy = (busy1 - busy0) / dn
        var = max(0.0, (sq1 - sq0) / dn - busy * busy)
        cpu = (cpu1 - cpu0) / (cn1 - cn0) if cn1 > cn0 else None
        dsteps = snap.get("steps", 0) - last.get("steps", 0)
        step = (snap.get("step_s", 0.0) - last.get("step_s", 0.0)) / dsteps if dsteps > 0 else None
        wait = (snap.get("wait_s", 0.0) - last.get("wait_s", 0.0)) / handed
        workers = int(snap.get("num_workers", 0) or 0)
        lanes = max(1, workers) * int(snap.get("fetch_threads", 1) or 1)
        use = (sc1 - sc0) / (sw1 - sw0) if sw1 > sw0 else (cpu / busy if cpu is not None and busy > 0 else None)
        samples = (snap.get("samples", 0) - last.get("samples", 0)) / handed
        (wk1, wn1), (wk0, wn0) = _work_totals(snap), _work_totals(last)
        measured = (wk1 - wk0) / (wn1 - wn0) if wn1 > wn0 else None
        self.windows.append(Window(dn, busy, math.sqrt(var), cpu, step, wait, lanes, workers, use, samples,
                                   measured))
        if len(self.windows) > WINDOWS_KEPT:
            del self.windows[0]  # a window every few batches for ever: 86 B a batch, unbounded
        self.seen += handed
        rss = [w.get("rss") for k, w in snap.get("workers", {}).items() if int(k) >= 0 and w.get("rss")]
        if rss:
            self.rss = max(rss)
        if snap.get("mean_batch_bytes"):
            self.batch_bytes = float(snap["mean_batch_bytes"])
        return True


class Tuner:
    """Reads stats snapshots, recommends loader settings within a CPU and a RAM budget.

    ``cpu`` and ``ram`` default to :func:`cpu_budget` and :func:`ram_budget`.
    Call :meth:`observe` every few batches with ``loader.stats()``; read
    :meth:`decision`. It settles once the same choice comes out of
    ``patience`` windows in a row, or after ``settle_after`` batches.

    >>> t = Tuner(cpu=4, ram=None)
    >>> t.observe({"batches": 16, "steps": 15, "step_s": 0.15, "wait_s": 0.8, "num_workers": 0,
    ...            "workers": {-1: {"batches": 16, "busy_s": 0.8, "cpu_s": 0.8, "cpu_batches": 16}}})
    >>> t.decision().num_workers
    4
    """

    def __init__(self, cpu: int | None = None, ram: int | None | str = "auto", *, target_wait: float = 0.05,
                 warmup: int = 8, patience: int = 3, settle_after: int = 48, max_threads: int = MAX_THREADS,
                 start: Decision | None = None, workers: int | None = None) -> None:
        self.cpu = cpu if cpu is not None else machine.cpu_budget()
        # the user's own num_workers, where only the threads or prefetch are tuned: threads
        # are sized for those workers, not for a count the tuner would pick
        self.fixed_workers = workers
        if isinstance(ram, str) and ram != "auto":
            raise ValueError(f"ram must be a byte count, None or 'auto', but got ram={ram!r}")
        self._ram = ram  # "auto": read when a decision first needs it (~50 us cold; most never do)
        self.target_wait = target_wait
        self.warmup = warmup
        self.patience = patience
        self.settle_after = settle_after
        self.max_threads = max_threads
        self.cap_why = ""  # why max_threads was lowered (one_thread)
        self._current = start or Decision(0, 1, None, "not measured yet", False)
        self._pinned: Decision | None = None
        self._settled = False
        self._streak = 0
        self.observed = Observations()
        self._io_evidence = False
        self._alone: float | None = None  # seconds a fetch took with no other running (note_waiting)
        self._crowded = False  # the decision's fetch threads were cut for crowding each other
        self._probed = False
        self._awaiting_cpu = False  # the first windows came before any worker's CPU time
        self.thread_steer = ThreadSteer()
        self.threads_run: int | None = None  # fetch threads the loader last ran (set by the loader)
        self.workers_run = 0  # workers the loader last ran (set by the loader: never stopped mid-run)

    @property
    def ram(self) -> int | None:
        """Bytes the loader may add (``ram_budget()`` unless given)."""
        if isinstance(self._ram, str):
            budget = machine.ram_budget()
            # the training processes of this machine share its memory as they share its cores
            self._ram = None if budget is None else budget // machine.ranks_here()
        return self._ram

    # -- input --------------------------------------------------------------
    def observe(self, snap: dict[str, Any]) -> None:
        """Take a cumulative ``loader.stats()`` snapshot; the difference to the last one is a window."""
        if self._pinned is not None or self.observed.rebased(snap):
            return
        self.thread_steer.window(int(snap.get("batches", 0)), time.perf_counter())
        if self.observed.add(snap):
            self._update()

    def steer_threads(self, current: int) -> int:
        """The fetch threads to run next: the decision's, damped and checked against the
        throughput of the last window (see :class:`ThreadSteer`)."""
        last = self.windows[-1] if self.windows else None
        each = last.measured / last.samples if last is not None and last.measured and last.samples >= 1 else None
        return self.thread_steer.steer(current, self.decision().fetch_threads, each=each,
                                       crowded=self._crowded and self._pinned is None)

    def pin(self, decision: Decision | dict[str, Any]) -> Decision:
        """Fix the decision (e.g. one saved with ``to_dict()``): observations no longer change it."""
        d = decision if isinstance(decision, Decision) else Decision.from_dict(decision)
        self._pinned = replace(d, settled=True, reason=f"fixed: {d.reason}" if d.reason else "fixed")
        return self._pinned

    def unpin(self) -> None:
        """Open a pinned decision to observation again, from the next snapshot on (the
        loader's own pin, once what it was based on stopped holding)."""
        self._pinned = None
        self._settled = False
        self._streak = 0
        self.observed.rebase = True

    def one_thread(self, why: str) -> None:
        """Never more than one fetch thread a worker from now on (``why`` joins the reason)."""
        if self.max_threads == 1:
            return
        self.max_threads = 1
        self.cap_why = why
        self.thread_steer = ThreadSteer()
        if self._current.fetch_threads > 1:
            self._current = replace(self._current, fetch_threads=1, reason=f"{self._current.reason}; {why}")

    def note_waiting(self, alone_s: float | None = None) -> None:
        """The loader saw a batch wait rather than compute (its CPU under half its wall time)
        before any CPU time reached the stats: treat fetches as I/O-bound until told otherwise.
        ``alone_s``: the seconds one of its fetches took with no other running."""
        self._io_evidence = True
        if alone_s is not None and alone_s > 0:
            self._alone = alone_s if self._alone is None else min(self._alone, alone_s)

    @property
    def pinned(self) -> bool:
        """True once ``pin`` fixed the decision (observations no longer change it)."""
        return self._pinned is not None

    @property
    def seen(self) -> int:
        """Batches observed."""
        return self.observed.seen

    @property
    def windows(self) -> list[Window]:
        """The windows observed, oldest first (the last ``WINDOWS_KEPT``)."""
        return self.observed.windows

    @property
    def measuring(self) -> bool:
        """True until enough batches were seen for a first estimate (the decision is a placeholder)."""
        return self._pinned is None and (self.seen < self.warmup or self._awaiting_cpu)

    def decision(self) -> Decision:
        """The current recommendation (settled once it stopped changing)."""
        return self._pinned or self._current

    # -- the model ------------------------------------------------------------
    def _estimate(self) -> dict[str, Any] | None:
        ws = [w for w in self.windows[-6:]]
        n = sum(w.batches for w in ws)
        if self.seen < self.warmup or n == 0:
            return None
        # the latest windows weigh most: settings changed under earlier ones
        wsum = sum(w.batches * (i + 1) for i, w in enumerate(ws))
        busy = sum(w.busy * w.batches * (i + 1) for i, w in enumerate(ws)) / wsum
        work = sum(w.work * w.batches * (i + 1) for i, w in enumerate(ws)) / wsum
        std = sum(w.busy_std * w.batches * (i + 1) for i, w in enumerate(ws)) / wsum
        cws = [(i, w) for i, w in enumerate(ws) if w.cpu is not None]
        cpu = (sum(w.cpu * w.batches * (i + 1) for i, w in cws) / sum(w.batches * (i + 1) for i, w in cws)
               if cws else None)
        sws = [(i, w) for i, w in enumerate(ws) if w.step is not None]
        step = (sum(w.step * w.batches * (i + 1) for i, w in sws) / sum(w.batches * (i + 1) for i, w in sws)
                if sws else 0.0)
        # A worker's first CPU time comes with its fourth batch (its first batch's one-time costs
        # left out): windows before that have none, and read as "no CPU clocks here" they would
        # start a probe of two fetch threads a worker, which CPU-bound work then keeps (the cut
        # back undone as costing throughput: docs/decisions/tuner-reads-lane-time-and-core-share.md).
        self._awaiting_cpu = (cpu is None and not self._io_evidence
                              and self.seen < self.warmup + 4 * max(1, ws[-1].workers))
        if self._awaiting_cpu:
            return None
        # without CPU times: did running more fetches than cores leave each fetch as fast?
        if cpu is None and not self._io_evidence:
            within = [w.work for w in self.windows if w.lanes <= self.cpu]
            beyond = [w.work for w in self.windows if w.lanes >= 2 * self.cpu]
            if beyond:
                self._probed = True
                if within and min(beyond) < 1.25 * min(within):
                    self._io_evidence = True
        # the share of its core a worker used, and with how many threads: the latest window
        # that knows (a mean over windows run with other thread counts would mix them up)
        use = next(((w.use, w.threads) for w in reversed(ws) if w.use is not None), None)
        samples = ws[-1].samples
        # what one fetch took in the latest window, as its threads timed it, and with how many
        last = ws[-1]
        each = (last.measured / last.samples, last.threads) if last.measured and last.samples >= 1 else None
        return {"busy": busy, "work": work, "std": std, "cpu": cpu, "step": step, "use": use, "samples": samples,
                "each": each}

    def _choose(self, e: dict[str, Any]) -> Decision:
        self._crowded = False
        busy, work, cpu, step = e["busy"], e["work"], e["cpu"], max(0.0, e["step"])
        if cpu is not None:
            ratio = min(1.0, cpu / work) if work > 0 else 1.0
        else:
            ratio = 0.3 if self._io_evidence else 1.0
        kind = "I/O-bound" if ratio < IO_BOUND else "CPU-bound"
        ratio_txt = f"cpu/wall {ratio:.0%}" if cpu is not None else (
            "fetches did not slow down beyond the cores" if self._io_evidence else "no CPU times: assumed")
        # loading inline costs busy per step: fine when that is under the target
        if step > 0 and work / (work + step) < self.target_wait:  # inline, a batch costs its work
            return Decision(0, 1, None, f"fetching costs {work / (work + step):.0%} of a step inline: "
                            "no workers needed", False)
        margin = 1.0 + 2 * self.target_wait  # jitter headroom
        lanes = math.ceil(work * margin / step) if step > 0 else 10**6
        if cpu is None and not self._io_evidence and not self._probed and lanes > self.cpu:
            # no CPU times and not enough cores: try twice the fetches on the same cores; if each
            # fetch stays as fast, they wait rather than compute (threads will do)
            return Decision(self.cpu, 2, 2, f"probing: {lanes} fetches at once would hide loading, "
                            f"{self.cpu} cores; does a second fetch thread per worker slow fetches down?", False)
        cap_note = ""
        if kind == "CPU-bound":
            need = math.ceil(work * ratio * margin / step) if step > 0 else 10**6
            workers = max(1, min(need, self.cpu)) if self.fixed_workers is None else self.fixed_workers
            threads = 1
            if need > self.cpu and self.fixed_workers is None:
                cap_note = f"; {need} would hide loading but the CPU budget is {self.cpu}"
            if lanes > workers and ratio < HALF_WAITING and self.max_threads > 1:
                # a fetch that waits a good part of its time leaves its worker's core idle
                # meanwhile: up to 1 / ratio threads fill it, where one thread runs well below
                # the speed of a few
                threads = min(self.max_threads, math.ceil(1 / ratio), math.ceil(lanes / max(1, workers)))
                cap_note += f"; each fetch waits {1 - ratio:.0%} of its time: {threads} threads a worker fill its core"
        else:
            cpu_need = math.ceil(work * ratio * margin / step) if step > 0 else self.cpu
            workers = max(1, min(cpu_need, self.cpu)) if self.fixed_workers is None else self.fixed_workers
            threads = min(self.max_threads, max(1, math.ceil(lanes / max(1, workers))))
            # Fetches that take many times what one took alone crowd each other (for the GIL,
            # a core, a link): with ``now`` threads each took ``slower`` times as long, so about
            # now / slower of them, each as fast as alone, fetch as much, and more run slower.
            # (ThreadSteer checks that such a cut speeds each fetch up:
            # docs/decisions/crowded-threads-cut-by-fetch-times.md.)
            slower = None
            if e.get("each") is not None and self._alone:
                each, each_threads = e["each"]
                slower = each / self._alone
            if e["use"] is not None:
                # a worker's threads share its core: with ``now`` of them it used ``use`` of
                # it, so about now / use of them fill it; more would only queue for it. At a
                # full core that count is unknown: half as many is offered, a cut ThreadSteer
                # undoes if it costs throughput; unless each fetch takes about what it took
                # alone: then fewer threads fetch fewer, and the check over 4 batches can let
                # such a cut stand
                use, now = e["use"]
                fill = (now // 2 if slower is None or slower >= CROWDED else now) if use >= SATURATED else (
                    math.ceil(now / max(use, 1e-3)))
                if fill < threads:
                    threads = max(1, fill)
                    cap_note = (f"; {lanes} fetches at once would hide loading, but {threads} threads "
                                "a worker keep its core busy")
            if slower is not None:
                fit = math.ceil(each_threads * CROWD_MARGIN / slower)
                if slower >= CROWDED and fit < threads:
                    threads = max(1, fit)
                    self._crowded = True
                    cap_note = (f"; {lanes} fetches at once would hide loading, but with {each_threads} threads "
                                f"a worker each took {slower:.0f}x as long as one alone: {threads} fetch as much")
            if lanes > workers * self.max_threads and not cap_note:
                cap_note = (f"; {lanes} fetches at once would hide loading, but {self.cap_why}" if self.cap_why
                            else f"; {lanes} fetches at once would hide loading, capped at {self.max_threads} threads")
        cv = e["std"] / busy if busy > 0 else 0.0
        prefetch = 4 if cv > 0.5 else 2
        if threads > 1 and e.get("samples", 0) >= 1:
            # a worker's threads fetch the samples of the batches it holds: with fewer samples
            # a batch than threads (batch_size=None: one), more batches in flight keep them busy
            prefetch = min(MAX_PREFETCH, max(prefetch, math.ceil(threads / e["samples"])))
        mem_note = ""
        obs = self.observed
        if self.ram is not None and (obs.rss or obs.batch_bytes):
            def per_worker(pf: int) -> float:
                return (obs.rss or 0.0) + pf * (obs.batch_bytes or 0.0) * max(1, threads // 8 + 1)
            if prefetch > 2 and workers * per_worker(prefetch) > self.ram:
                prefetch = 2
            fit = int(self.ram // max(1.0, per_worker(prefetch)))
            if fit < workers and self.fixed_workers is None:
                if fit < 1:
                    prefetch = 1
                    fit = max(1, int(self.ram // max(1.0, per_worker(1))))
                if kind == "I/O-bound" and fit < workers:
                    threads = min(self.max_threads, math.ceil(workers * threads / fit))
                    # more threads hold more batches (per_worker grows with them): fit again,
                    # or the raised threads' batches overrun the budget
                    fit = max(1, int(self.ram // max(1.0, per_worker(prefetch))))
                mem_note = (f"; memory allows {fit} (each worker ~{per_worker(prefetch) / 2**20:.0f} MiB, "
                            f"budget {self.ram / 2**20:.0f} MiB)")
                workers = min(workers, fit)
        reason = (f"{kind} ({ratio_txt}): a batch takes {work * 1e3:.1f} ms of fetching, "
                  f"the loop {step * 1e3:.1f} ms per batch{cap_note}{mem_note}")
        return Decision(workers, threads, prefetch, reason, False)

    def _update(self) -> None:
        if self._settled:
            return
        e = self._estimate()
        if e is None:
            why = ("measuring (the workers' first CPU times come with their fourth batch)" if self._awaiting_cpu
                   else f"measuring ({self.seen} of {self.warmup} batches)")
            self._current = replace(self._current, reason=why)
            return
        d = self._choose(e)
        prev = self._current
        same = (d.num_workers, d.fetch_threads, d.prefetch_factor) == (
            prev.num_workers, prev.fetch_threads, prev.prefetch_factor)
        self._streak = self._streak + 1 if same else 1
        if self._streak >= self.patience or self.seen >= self.settle_after:
            self._settled = True
            d = replace(d, settled=True)
        self._current = d
