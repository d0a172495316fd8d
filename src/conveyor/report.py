"""Where the time went, in a sentence a user can act on (pictures: ``plots.py``).

::

    loader.stats() --> report(snapshot) --> "loading is the bottleneck: 63% of each step ..."

The worker estimate: a worker needs ``mean_batch_s`` for a batch and the
training loop takes ``step_per_batch_s`` to use one, so ``ceil(mean_batch_s /
step_per_batch_s)`` workers keep up; more than the cores this process may use
only helps when fetches wait on storage (then ``fetch_threads`` is cheaper).
"""

from __future__ import annotations

import math
from typing import Any

from .stats import INLINE
from .placement import cpu_share

__all__ = ["report", "workers_lose", "workers_needed"]

HIDDEN = 0.05  # the consumer waiting less than this is "hidden"
BOTTLENECK = 0.10
HANDOFF = 5e-4  # seconds a batch from a worker costs the main process, roughly: cheaper batches stay inline
# Workers "clearly lose" when the loop waits this many times what a batch costs to make (the
# main process would make it in that time, num_workers=0), and by this much over a run: a few
# batches a few microseconds apart are no finding.
LOSE_RATIO = 1.5
LOSE_MIN_S = 0.01
# a spawned or forkserver worker's start that pickles more than this (seconds, or bytes) is
# worth a word: the worker unpickles it as long again, and a start's pickle is written to the
# child before the next worker is started
PICKLE_S = 0.1
PICKLE_BYTES = 64 << 20


def _mean_batch(snap: dict[str, Any]) -> tuple[float, float | None]:
    """Mean wall seconds a worker spends per batch, and the share of a fetch spent on CPU (None:
    not reported). A worker's ``fetch_threads`` split a batch between them: a fetch takes
    about mean x threads of wall time."""
    mean, cpu = _per_batch(snap)
    threads = max(1, int(snap.get("fetch_threads", 1) or 1))
    return mean, (min(1.0, cpu / (mean * threads)) if cpu is not None and mean > 0 else None)


def _per_batch(snap: dict[str, Any]) -> tuple[float, float | None]:
    """A worker's mean wall and CPU seconds per batch (CPU: None where not reported). Where
    workers made batches, the main process's (probing batches, paying first calls' costs,
    made with other threads) are left out: they would make a short run's "N workers" larger."""
    n = busy = cpu = 0.0
    cpu_n = 0
    made = snap.get("workers", {})
    if any(int(k) >= 0 and w.get("batches") for k, w in made.items()):
        made = {k: w for k, w in made.items() if int(k) >= 0}
    for w in made.values():
        n += w.get("batches", 0)
        busy += w.get("busy_s", 0.0)
        if w.get("cpu_s") is not None:
            cpu += w["cpu_s"]
            cpu_n += w.get("cpu_batches", w.get("batches", 0))
    if not n:
        return 0.0, None
    return busy / n, (cpu / cpu_n if cpu_n else None)


def _core_busy(snap: dict[str, Any]) -> float | None:
    """The share of one core a worker keeps busy while it makes batches (None: not reported).
    Fetch threads that hold the GIL take turns: each fetch then computes a 1/threads share
    of its time, yet the core is full and more threads cannot help
    (docs/decisions/report-advises-from-what-sets-the-pace.md)."""
    mean, cpu = _per_batch(snap)
    return min(1.0, cpu / mean) if cpu is not None and mean > 0 else None


def _collate_share(snap: dict[str, Any]) -> float:
    """The share of the workers' time spent in collate_fn (0 where not reported)."""
    busy = collate = 0.0
    for k, w in snap.get("workers", {}).items():
        if int(k) >= 0:
            busy += w.get("busy_s", 0.0)
            collate += w.get("collate_s", 0.0)
    return collate / busy if busy > 0 else 0.0


def _busy_fractions(snap: dict[str, Any]) -> dict[int, float]:
    """Each worker that made batches: the share of its time it was busy (where reported)."""
    return {int(k): w["busy_fraction"] for k, w in snap.get("workers", {}).items()
            if int(k) >= 0 and w.get("busy_fraction") is not None and w.get("batches")}


def _uneven(snap: dict[str, Any]) -> str | None:
    """Is one worker busy most of the time and another far less? (An IterableDataset's shards
    of unequal length: a worker more, advised for the mean, gains nothing; even shards do.)"""
    busy = _busy_fractions(snap)
    if len(busy) < 2:
        return None
    top, low = max(busy, key=busy.__getitem__), min(busy, key=busy.__getitem__)
    if busy[top] < 0.6 or busy[low] >= 0.6 * busy[top]:
        return None
    stream = " (an IterableDataset's shards of unequal length?)" if snap.get("iterable") else ""
    return (f"the work is uneven: worker {top} was busy {_pct(busy[top])} of the time, worker {low} "
            f"{_pct(busy[low])}{stream}, and the busiest sets the pace; even it out")


def _why_slow_though_enough(snap: dict[str, Any], nw: int, mean: float) -> str:
    """Why the loop waits though the workers should keep up on average: the workers made no
    batch yet, their start-up, batches of uneven cost, or (failing that) the hand-over."""
    made = {int(k): w.get("batches", 0) for k, w in snap.get("workers", {}).items()}
    if not any(b for k, b in made.items() if k >= 0) and made.get(INLINE):
        # spawned workers import afresh (seconds): a short run is made here meanwhile (else it
        # reads "the time goes to handing batches over" of batches no worker handed over)
        return (f"the main process made all {made[INLINE]} batches while the workers started up; "
                "they take over in a longer run")
    n = sq = 0.0
    for k, w in snap.get("workers", {}).items():
        b = w.get("batches", 0)
        if int(k) >= 0 and b:
            n += b
            sq += b * (w.get("std_batch_s", 0.0) ** 2 + w.get("mean_batch_s", 0.0) ** 2)
    std = math.sqrt(max(0.0, sq / n - mean * mean)) if n else 0.0
    if std >= mean:
        fix = ("raise prefetch_factor to have more in flight" if snap.get("in_order") is False else
               "in_order=False hands out the batches that are ready first (or raise prefetch_factor)")
        return (f"batches take {mean * 1e3:.1f} ms on average but unevenly (std {std * 1e3:.1f} ms), and in "
                f"order a slow one holds back those behind it: {fix}")
    ready = float(snap.get("mean_ready_batches") or 0.0)
    if ready >= 1.0:
        # batches were waiting made: more in flight cannot help, so a larger prefetch_factor
        # is no advice here
        per = float(snap.get("wait_per_batch_s") or 0.0)
        return (f"{ready:.1f} batches were ready on average, so the wait ({per * 1e3:.2f} ms a batch) is the "
                "main process taking each batch in, which a larger prefetch_factor does not shorten")
    return "the time goes to handing batches over; raise prefetch_factor"


def _pickled_dataset(snap: dict[str, Any]) -> str | None:
    """Did starting spawned or forkserver workers pickle a large dataset (what shared memory
    could not carry: Python objects, many small arrays)? Where the time went, and what to do."""
    starts = int(snap.get("dataset_pickles") or 0)
    if not starts:
        return None
    seconds = float(snap.get("dataset_pickle_s") or 0.0)
    nbytes = int(snap.get("dataset_pickle_bytes") or 0)
    each = seconds / starts
    if each < PICKLE_S and nbytes < PICKLE_BYTES:
        return None
    shared = int(snap.get("dataset_shared_bytes") or 0)
    passed = f"; {shared / 1e6:.0f} MB of arrays went by shared memory" if shared >= 1e6 else ""
    once = "" if snap.get("persistent_workers") else " (persistent_workers=True pays it once)"
    return (f"starting the workers spent {seconds:.2f} s pickling the dataset ({starts} start(s), up to "
            f"{nbytes / 1e6:.0f} MB each, which each worker unpickles again{passed}): keep the data in numpy "
            "arrays of 1 MB or more (ArrayDataset for rows, StringArray for strings), which spawned and "
            f"forkserver workers map from shared memory, or use multiprocessing_context='fork'{once}")


def _copied_arrays(snap: dict[str, Any]) -> str | None:
    """Did the pools copy a user's own numpy arrays into shared memory for spawned or
    forkserver workers? Arrays no conveyor container holds are copied by each pool, once for
    all its workers, and the workers wait for them whole (their reads cannot be checked
    chunk by chunk); the main process holds them twice meanwhile. What it cost, and what to do."""
    copies = int(snap.get("dataset_copies") or 0)
    seconds = float(snap.get("dataset_copied_s") or 0.0)
    nbytes = int(snap.get("dataset_copied_bytes") or 0)
    if not copies or (seconds < PICKLE_S and nbytes < PICKLE_BYTES):
        return None
    again = ("" if snap.get("persistent_workers") else
             "; each epoch's workers get their own, which persistent_workers=True makes once")
    return (f"starting the workers spent {seconds:.2f} s copying the dataset's own numpy arrays into shared "
            f"memory ({nbytes / 1e6:.0f} MB in {copies} copies{again}), which the workers wait for whole and "
            "the main process holds beside the originals: wrap them in ArrayDataset (moved into shared memory "
            "once and kept there; its rows are read while the copy goes on), or use "
            "multiprocessing_context='fork'")


def _start_up(snap: dict[str, Any]) -> str | None:
    """Is most of the loop's wait for each epoch's first batch (the workers starting up)?"""
    wait = float(snap.get("wait_s") or 0.0)
    first = float(snap.get("first_waits_s") or 0.0)
    if wait <= 0 or first < 0.5 * wait:
        return None
    persist = snap.get("persistent_workers")
    fix = "paid once: a longer run hides it" if persist else "persistent_workers=True pays it once"
    which = "the first batch" if persist else "each epoch's first batch"
    return f"{_pct(first / wait)} of the wait ({first:.2f} s) is for {which}, the workers' start-up: {fix}"


def _idle_share(snap: dict[str, Any]) -> float | None:
    """The share of their time the workers that made batches sat idle, where most of it
    (None: busy, or not known)."""
    busy = _busy_fractions(snap)
    if not busy:
        return None
    idle = 1.0 - sum(busy.values()) / len(busy)
    return idle if idle > 0.5 else None


def workers_lose(snap: dict[str, Any]) -> str | None:
    """Do the user's workers cost more than they save? A sentence with the numbers, else None.

    A batch made in the main process (``num_workers=0``) costs what it costs a worker to
    fetch and collate it; with workers the loop pays its wait inside ``next()`` instead.
    Where that wait is more than ``LOSE_RATIO`` times the cost (pickling, the trip, the
    workers' start-up outweigh the work), the workers lose. A persistent loader's start-up
    is paid once, so its first waits are left out; a loader whose workers do not persist
    pays it every epoch, so they count, and where they alone make the loss the sentence
    names ``persistent_workers=True``.

    >>> snap = {"batches": 20, "num_workers": 2, "wait_s": 0.2, "first_waits_s": 0.01,
    ...         "workers": {0: {"batches": 10, "fetch_s": 0.002, "collate_s": 0.001},
    ...                     1: {"batches": 10, "fetch_s": 0.002, "collate_s": 0.001}}}
    >>> workers_lose(snap)[:61]
    'the loop waited 10.00 ms a batch for 2 workers, while a batch'
    """
    nw = int(snap.get("num_workers") or 0)
    batches = int(snap.get("batches") or 0)
    made = {int(k): w for k, w in (snap.get("workers") or {}).items()}
    by_workers = sum(w.get("batches", 0) for k, w in made.items() if k >= 0)
    if nw <= 0 or batches < 4 or by_workers < batches or made.get(INLINE, {}).get("batches"):
        return None  # (batches made in the main process: its own cost is measured, not this)
    if int(snap.get("fetch_threads", 1) or 1) > 1:
        return None  # fetch threads overlap waits on storage the main process would serialise
    work = sum((w.get("fetch_s", 0.0) + w.get("collate_s", 0.0)) or w.get("busy_s", 0.0)
               for k, w in made.items() if k >= 0)
    cost = work / by_workers
    if cost <= 0:
        return None  # not timed
    wait = float(snap.get("wait_s") or 0.0)
    first = float(snap.get("first_waits_s") or 0.0)

    def loses(waited: float) -> bool:
        per = waited / batches
        return per > LOSE_RATIO * cost and (per - cost) * batches >= LOSE_MIN_S

    persistent = bool(snap.get("persistent_workers"))
    waited = wait - first if persistent else wait
    if not loses(waited):
        return None
    per = waited / batches
    fix = "use num_workers=0, or num_workers='auto' to choose"
    if not persistent and not loses(wait - first):
        fix = (f"most of it is each epoch's workers starting up ({first:.2f} s): persistent_workers=True pays "
               "that once; or use num_workers=0, or num_workers='auto' to choose")
    return (f"the loop waited {per * 1e3:.2f} ms a batch for {_workers(nw)}, while a batch takes "
            f"{cost * 1e3:.2f} ms to make ({per / cost:.1f}x that): the main process would make them faster; {fix}")


def workers_needed(snap: dict[str, Any]) -> int | None:
    """``ceil(mean_batch_s / step_per_batch_s)``: workers that keep up with the loop, each with
    the fetch threads it has (None: unknown). ``mean_batch_s`` is a worker's wall time per batch
    with its threads splitting the batch: it is already the time with that many in flight.

    >>> workers_needed({"step_per_batch_s": 0.01, "fetch_threads": 1,
    ...                 "workers": {0: {"batches": 10, "busy_s": 0.35}}})
    4
    """
    mean, _ = _mean_batch(snap)
    step = snap.get("step_per_batch_s")
    if not mean:
        return None
    if not step:
        return None
    return max(1, math.ceil(mean / step - 1e-9))


def _n_workers(snap: dict[str, Any]) -> int:
    if "num_workers" in snap and snap["num_workers"] is not None:
        return int(snap["num_workers"])
    return len([w for w in snap.get("workers", {}) if int(w) >= 0])


def _workers(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


def _cores(n: int) -> str:
    return "1 core" if n == 1 else f"{n} cores"


def _pct(x: float) -> str:
    return f"{round(x * 100)}%"


def report(snap: dict[str, Any], cores: int | None = None) -> str:
    """A sentence (or a few) saying whether loading stalls training, and what to change.

    ``snap`` is ``loader.stats()``; ``cores`` the CPU budget (default: the cores this
    process may use, its share where training processes share them: the budget
    ``num_workers="auto"`` fills, one worker a core).

    >>> report({"batches": 100, "steps": 99, "wait_fraction": 0.63, "step_per_batch_s": 0.01,
    ...         "num_workers": 1, "workers": {0: {"batches": 100, "busy_s": 3.5}}}, cores=8)
    'loading is the bottleneck: 63% of each step is spent waiting; 4 workers would hide it.'
    """
    if not snap.get("batches"):
        if snap.get("epochs"):
            # (it said "iterate the loader" of a loader iterated to its end)
            return (f"{snap['epochs']} epoch(s) ended without a batch: the dataset is empty, or drop_last=True "
                    "with fewer samples than batch_size.")
        return "no batches yet: iterate the loader, then ask again."
    cores = cores if cores is not None else cpu_share()
    wf = float(snap.get("wait_fraction", 0.0))
    nw = _n_workers(snap)
    need = workers_needed(snap)
    mean, ratio = _mean_batch(snap)
    threads = max(1, int(snap.get("fetch_threads", 1) or 1))
    core = _core_busy(snap)
    # fetches that wait, in workers whose core has room for more of them
    io_bound = ratio is not None and ratio < 0.5 and (core is None or core < 0.75)
    collate = _collate_share(snap)
    cheaper = (f"make the collate_fn cheaper (it takes {_pct(collate)} of a batch's time)"
               if collate >= 0.5 else "make each sample cheaper")
    threadable = not snap.get("iterable") and not snap.get("batch_getitems")  # (the loader refuses threads)
    storage = ""
    if ratio is None and threadable and threads < 64:
        # (no such advice where 64, the most a worker takes, already run)
        storage = (", or use fetch_threads if fetches wait on storage" if threads == 1 else
                   f", or raise fetch_threads (now {threads}) if fetches wait on storage")
    parts: list[str] = []

    not_started = snap.get("workers_not_started")
    lose = workers_lose(snap)
    if snap.get("steps") == 0:
        # epochs of one batch (a small validation set): no step between two batches was
        # timed, and the wait is all of the measured time (else it reads "100% of each step
        # is spent waiting; the training loop takes (almost) no time")
        parts.append(_one_batch_epochs(snap, mean, nw))
    elif not_started and wf >= HIDDEN:
        # adaptive kept the batches here (``Probe._start_outweighs``): more workers is no advice
        parts.append(f"the main process makes the batches ({_pct(wf)} of the time is spent waiting): "
                     f"{not_started}; persistent_workers=True would start them once, for every epoch")
    elif nw == 0 and wf >= HIDDEN and 0 < mean < HANDOFF:
        parts.append(f"loading in the main process takes {mean * 1e3:.2f} ms a batch ({_pct(wf)} of the time), "
                     "less than handing a batch over from a worker costs: num_workers=0 is right")
    elif wf >= BOTTLENECK:
        head = f"loading is the bottleneck: {_pct(wf)} of each step is spent waiting"
        uneven = _uneven(snap)
        start_up = _start_up(snap) if nw > 0 and snap.get("workers_started") else None
        idle = _idle_share(snap) if nw > 0 else None
        if uneven is not None:
            parts.append(f"{head}; {uneven}")
        elif start_up is not None:
            parts.append(f"{head}; {start_up}")
        elif idle is not None:
            # the loop waits while the workers idle: what limits it is the main process taking
            # batches in, which more workers (the mean's advice) cannot speed up
            per = float(snap.get("wait_per_batch_s") or 0.0)
            enough = max(1, math.ceil(nw * (1.0 - idle) - 1e-9))
            fix = (f": batches this cheap ({mean * 1e3:.2f} ms) are faster made there, num_workers=0"
                   if 0 < mean < HANDOFF else
                   f"; {_workers(enough)} would do as well and leave it more CPU" if enough < nw else "")
            parts.append(f"{head}, though the workers sat idle {_pct(idle)} of the time: the main process sets "
                         f"the pace, taking each batch in ({per * 1e3:.2f} ms){fix}")
        elif lose is not None:
            parts.append(f"{head}, and the workers cost more than they save: {lose}")
        elif need is None or need > 16 * max(cores, nw, 1):
            more = f" (up to num_workers={cores} can help)" if nw < cores else ""
            parts.append(f"{head}; the training loop takes (almost) no time between batches, so loading sets "
                         f"the pace{more}")
        elif io_bound and need > nw and snap.get("iterable"):
            # a stream's worker reads its one iterator: fetch threads cannot split it (the
            # loader refuses them), so only more workers, each with its shard, read more at once
            parts.append(f"{head}; fetches mostly wait on storage (CPU {_pct(ratio or 0)} of their time): an "
                         f"IterableDataset's worker reads one item at a time, so num_workers={min(need, 64)}, each "
                         "reading its shard, would hide it (or let the stream read ahead itself)")
        elif io_bound and need > nw and snap.get("keeps_files") and threads == 1:
            # the dataset keeps files open: a worker's fetch threads would share each handle
            # (a seek in one moves the others' reads), so "auto" keeps one thread
            parts.append(f"{head}; fetches mostly wait on storage (CPU {_pct(ratio or 0)} of their time), but the "
                         f"dataset keeps files open, which a worker's fetch threads would share: num_workers="
                         f"{min(need, 64)} would hide it (or open a handle per thread, then use fetch_threads)")
        elif io_bound and need > nw and snap.get("batch_getitems"):
            # nor can fetch threads split a batch the dataset makes in one call (refused too)
            parts.append(f"{head}; fetches mostly wait on storage (CPU {_pct(ratio or 0)} of their time): the "
                         f"dataset's __getitems__ makes each batch in one call, so num_workers={min(need, 64)} "
                         "would hide it (or let __getitems__ fetch its samples concurrently)")
        elif io_bound and need > nw:
            # ``need`` counts workers with this many threads each: the fetches in flight it takes
            # are ``need * threads``, spread over the workers there are (64 threads at most each)
            per = max(1, nw)
            lanes = need * threads
            if math.ceil(lanes / per) <= 64:
                advice = f"fetch_threads={math.ceil(lanes / per)} with num_workers={per}"
            else:
                advice = f"fetch_threads=64 with num_workers={math.ceil(lanes / 64)}"
            parts.append(f"{head}; fetches mostly wait on storage (CPU {_pct(ratio or 0)} of their time): "
                         f"{advice} would hide it")
        elif need > nw and snap.get("shared_cores") and not io_bound:
            # the training processes of this machine leave none of its cores to a worker
            # ("auto" starts none for batches that compute): one would only slow the loop
            parts.append(f"{head}; {snap['shared_cores']}, which leaves no core for a worker that computes: "
                         f"{cheaper}, or run fewer training processes on this machine")
        elif need > nw:
            if need <= cores:
                parts.append(f"{head}; {_workers(need)} would hide it")
            elif nw >= cores:
                parts.append(f"{head}; {_workers(need)} would hide it, but {_workers(nw)} already "
                             f"{'uses' if nw == 1 else 'use'} {'more than ' if nw > cores else ''}the "
                             f"{_cores(cores)} this process may use: {cheaper}{storage}")
            else:
                parts.append(f"{head}; {_workers(need)} would hide it, but this process may use only "
                             f"{_cores(cores)}: use num_workers={cores}, and {cheaper}{storage}")
        else:
            parts.append(f"{head}, though {_workers(nw)} should keep up (each batch takes "
                         f"{mean * 1e3:.1f} ms, a step {float(snap.get('step_per_batch_s') or 0) * 1e3:.1f} ms): "
                         + _why_slow_though_enough(snap, nw, mean))
    elif wf >= HIDDEN and lose is not None:
        parts.append(f"the consumer waited {_pct(wf)} of the time, and the workers cost more than they save: {lose}")
    elif wf >= HIDDEN:
        extra = ""
        if need is not None and need > nw:
            # as the bottleneck's advice: fetches that wait want threads, and no more workers
            # than the cores free for them
            if io_bound and threadable:
                extra = "; more fetch_threads would hide the rest"
            elif need <= cores and not io_bound and not snap.get("shared_cores"):
                extra = f"; {_workers(need)} would hide the rest"
        parts.append(f"loading is mostly hidden: the consumer waited {_pct(wf)} of the time{extra}")
    else:
        # the loop hardly waits: its own step sets the pace, which faster loading cannot change
        head = f"the training step is the bottleneck: the loop waited for data {_pct(wf)} of the time"
        busy = [w.get("busy_fraction") for k, w in snap.get("workers", {}).items()
                if int(k) >= 0 and w.get("busy_fraction") is not None]
        if nw > 1 and need is not None and need < nw:
            util = f" ({_pct(sum(busy) / len(busy))} busy)" if busy else ""
            parts.append(f"{head}, and the workers are idle{util}; {_workers(need)} would do")
        elif nw == 0:
            parts.append(f"{head}; num_workers=0 is fine")
        else:
            parts.append(f"{head}; faster loading would not speed training up")

    failures = snap.get("failures") or []
    if failures:
        first = failures[0]
        count = snap.get("failure_count") or len(failures)
        parts.append(f"{count} sample(s) failed and were skipped (first: index {first.get('index')}, "
                     f"{first.get('error')})")
    restarts = int(snap.get("restarts", 0) or 0)
    deaths = snap.get("deaths") or []
    if restarts or deaths:
        how = f"; {deaths[0]}" if deaths else ""
        parts.append(f"{restarts} worker restart(s){how}")
    for said in (_pickled_dataset(snap), _copied_arrays(snap)):
        if said is not None:
            parts.append(said)
    first_s = snap.get("first_batch_s")
    step = snap.get("step_per_batch_s") or 0.0
    said_first = any("first batch" in p for p in parts)  # (the start-up's share of the wait: its own numbers)
    advised = any("persistent_workers=True" in p for p in parts)
    if first_s is not None and first_s > 1.0 and first_s > 20 * max(step, mean) and not said_first:
        if nw > 0 and snap.get("persistent_workers"):
            parts.append(f"the first batch took {first_s:.1f} s (worker start-up), paid once: the workers persist")
        elif nw > 0 and not advised:
            parts.append(f"the first batch took {first_s:.1f} s (worker start-up); persistent_workers=True pays "
                         "it once instead of every epoch")
        elif nw > 0:
            parts.append(f"the first batch took {first_s:.1f} s (worker start-up)")
        else:
            parts.append(f"the first batch took {first_s:.1f} s: one-time costs of the first samples "
                         "(opening files, first imports), paid once")
    imported = snap.get("torch_import_s")
    if imported is not None and imported >= 0.1:
        # timed apart from the loader's clock, so that it does not read as the workers' start-up
        parts.append(f"importing torch took {imported:.1f} s before the first batch (once per process, outside "
                     "the loader's times)")
    return ". ".join(p[0].upper() + p[1:] if i else p for i, p in enumerate(parts)) + "."


def _one_batch_epochs(snap: dict[str, Any], mean: float, nw: int) -> str:
    """What to say of epochs of one batch each: no step between batches to weigh the wait against."""
    said = f"each epoch handed out one batch ({snap['batches']} so far), so no training step between batches was timed"
    if mean > 0:
        said += f": a batch took {mean * 1e3:.1f} ms to make"
    said += "; the loop waits for an epoch's first batch"
    if nw and not snap.get("persistent_workers"):
        said += ", and persistent_workers=True starts the workers once"
    return said
