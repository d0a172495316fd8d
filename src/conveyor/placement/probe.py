"""The decisions of a pool that adapts: where the next batch is made, and when workers start.

Under ``num_workers="auto"`` (or the ``adaptive=True`` opt-in) the main process makes the
first batches itself and times them (``Mode.PROBE``): batches cheaper than a trip from a
worker stay there (``Mode.INLINE``), costlier ones go to workers started then and there
(``Mode.WORKERS``), with fetch threads where a batch mostly waits. With ``adaptive=True`` a
probing batch is made as the worker torch would give it to would make it (its seeded RNGs),
so that the batches are those of a loader that does not adapt. The thresholds are in
``rules.py``; the tuner (``tuner.py``) refines the counts from the stats.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import rng
from ..executors.sched import runqueue_wait as _runqueue_wait
from ..executors.task import Result, Task
from . import rules
from .machine import cpu_share, no_core_left
from .rules import Mode, Verdict
from .tuner import IO_BOUND, MAX_THREADS, Tuner

if TYPE_CHECKING:
    from ..loader import DataLoader
    from ..pool import Pool

__all__ = ["Probe"]


class Probe:
    """The decisions of a pool that adapts (``num_workers="auto"``, or ``adaptive=True``):
    whether the main process makes the next batch, what a batch costs here and in a worker,
    when to start the workers (and how many fetch threads), and the tuner's choices applied.
    A pool that does not adapt keeps one that says so (``adaptive`` False) and decides nothing.
    """

    def __init__(self, pool: Pool, loader: DataLoader[Any], auto_workers: bool) -> None:
        self.pool = pool
        self.adaptive = auto_workers or (loader.adaptive and pool.num_workers > 0 and not loader._iterable
                                         and loader.worker_init_fn is None and not pool.timed)
        if self.adaptive:
            pool.mode = Mode.PROBE
        # "auto" where the training processes leave no core for a worker that computes: only
        # batches that wait (on storage) get workers
        self.no_core_left = auto_workers and no_core_left()
        self.findings = loader._findings
        self.loop_stats = loader._stats  # when the loop was last handed a batch
        self.epoch_batches: int | None = None  # batches an epoch, where the sampler says
        if self.adaptive and not pool.persistent:
            try:
                self.epoch_batches = len(loader)
            except TypeError:
                pass
        self.fed_from = (0.0, 0)  # the loop's wait and batches handed, as the workers started
        self.here_from: tuple[float, int] | None = None  # ... as this pool began, where that is wanted
        self._keeps_files = False
        if self.adaptive and not auto_workers and self.findings.workers_paid:
            # an earlier epoch's probe found these batches worth the workers: later epochs of
            # workers that do not persist start them at once, rather than probe anew, serially,
            # before forking (docs/decisions/findings-carry-across-epochs.md)
            pool.mode = Mode.WORKERS
            if not self.findings.draws_rngs and self._start_outweighs(self.findings.batch_s):
                pool.mode = Mode.INLINE  # ... unless starting them costs more than they can save
        # ... and with a worker per core, the main process makes no batch while they start:
        # it would only take a core from them (docs/decisions/head-start-while-workers-start.md)
        self.no_head_start = (pool.mode == Mode.WORKERS and self.adaptive and pool.num_workers >= cpu_share()
                              and not self.findings.slow_start())
        # ... nor where an earlier epoch's probe found the batches draw from the global RNGs:
        # made here, the head start would draw from the caller's RNGs, not the worker's seeded
        # ones (the augmentations would differ from torch's from the second epoch on, and so
        # would the training loop's next draw)
        self.no_head_start = self.no_head_start or (pool.mode == Mode.WORKERS and self.findings.draws_rngs)
        # "auto" chooses the worker count itself, so there is no worker whose stream a probing
        # batch must match: it is made as num_workers=0 makes a batch, with the RNGs as they are
        self.probe_as_worker = not auto_workers
        self.inline_costs: list[float] = []
        self.inline_max: float | None = None  # INLINE_MAX_S or TRIPS trips, once timed
        self.probe_cpu = 0.0  # CPU seconds of the last probing batch
        self.inline_rates: list[float] = []  # bytes per second of the main-process batches
        self.copying = False  # main-process batches are made at memory-copy speed, the step hiding none
        self.steps_seen: list[float] = []  # the training loop's time before main-process batches
        self.asked_at = 0.0  # when fetch_here began
        self.on_early: Callable[[], None] | None = None  # the run's dispatch, for _start_early
        self.rng_states: dict[int, rng.RngState] = {}  # worker -> RNG state after its probing batches
        self.rng_seeded: dict[int, rng.RngState] = {}  # worker -> RNG state as seeding leaves it
        self.rng_sensitive = False  # the dataset draws from the global RNGs
        self.rng_quiet = False  # a probing batch made with seeded RNGs left them alone

    def time_the_epoch(self) -> None:
        """An epoch made here, once workers were timed, is timed too: which fed the loop faster?"""
        if self.findings.fed_s is not None and not self.pool.persistent:
            self.here_from = self.loop_stats.mark()

    def resume(self, tuner: Tuner) -> None:
        """Start where "auto" got to in the epochs before (workers that do not persist are
        new every epoch): no probing batches, and the tuner goes on from its last choice.
        Threads start at the count that ran, which ThreadSteer may have kept above the wish,
        and workers at the count that ran, which the tuner may have wished smaller (what
        tuning() reports: those that ran are what to pin)."""
        auto = self.pool.auto or {}
        kept = tuner.decision()
        if auto.get("fetch_threads"):
            threads = tuner.threads_run or kept.fetch_threads
            # the census of open files (~60 us an epoch) only matters for more than one thread
            if threads <= 1 or not self.keeps_files():
                self.pool.threads = threads
        if auto.get("prefetch_factor") and kept.prefetch_factor:
            self.pool.prefetch = kept.prefetch_factor
        if auto.get("num_workers"):
            self.pool.num_workers = max(kept.num_workers, tuner.workers_run, 1 if self.pool.timed else 0)
            # the probe that would tell whether the dataset draws from the global RNGs does
            # not run again: with workers, the workers make every batch, as torch's would
            self.pool.mode = Mode.WORKERS if self.pool.num_workers else Mode.INLINE
            # ... without workers, batches that grow costly take them up again (``Probe.note``)
            self.adaptive = not self.pool.num_workers
            cost = self.findings.batch_s
            if self.pool.num_workers and not self.pool.timed and cost is not None and self._start_outweighs(cost):
                # the workers would cost more than they save: the main process makes the
                # batches, as it did while they started, and takes them up again if they
                # grow costly (``Probe.note``)
                self.pool.num_workers = tuner.workers_run = 0
                self.pool.mode = Mode.INLINE
                self.adaptive = True
                tuner.pin({"num_workers": 0, "fetch_threads": self.pool.threads, "prefetch_factor": None,
                           "reason": rules.start_words(self.findings, cost, self.epoch_batches or 0)
                           + ": no workers (persistent_workers=True would start them once)"})
        if (self.pool.spec.fetch_threads, self.pool.spec.num_workers) != (self.pool.threads, self.pool.num_workers):
            self.pool.spec = dataclasses.replace(self.pool.spec, fetch_threads=self.pool.threads, num_workers=self.pool.num_workers)


    def serve_here(self) -> bool:
        """Should the main process make the next batch itself?

        Yes while probing, when batches are cheap, while the workers are still starting
        (so their start-up overlaps useful work instead of stalling it), and once more
        when they have started but not yet delivered a batch: the caller then hands them
        the batches after this one first. A worker's first batch comes late (its own
        start-up, and a freshly forked parent and child copying pages they both write):
        the main process, idle otherwise, makes one meanwhile.
        """
        if self.pool.mode != Mode.WORKERS:
            return True
        if not self.adaptive or self.rng_sensitive or self.no_head_start:
            return False
        ex = self.pool.executor
        if ex.ready < ex.num_workers:
            for ev in ex.poll(0):  # picks up start-up messages; nothing of ours is in flight
                if isinstance(ev, Result):
                    ex.release(ev)
        return not self.pool.delivered


    def holds_back(self) -> bool:
        """Do the batches wait here for workers still starting, the main process making them
        meanwhile? Until every worker has said hello, where a head start is allowed at all
        (``serve_here``) and the workers start slowly: spawned (or forkserver) ones import
        afresh, torch included, and the training loop would stand still that long on the
        first batch handed to them. Forked ones start quickly: they get their batches at
        once, and have them made by the time they would hear of them."""
        if self.pool.delivered or not self.adaptive or self.rng_sensitive or self.no_head_start or not self.pool.starting():
            return False
        return self.pool.executor.method not in (None, "fork") or self.findings.slow_start()


    def note(self, cost: float, batch: Any) -> None:
        """The cost of ``batch``, made in the main process by the quick path."""
        self.pool.inline_batches += 1
        costs = self.inline_costs
        costs.append(cost)
        if len(costs) >= 16:
            if (self.adaptive and not self.copying and (self.pool.tuner is None or self._reopenable())
                    and self._costly(costs, batch)):
                if self.pool.tuner is None:
                    self.pool.mode = Mode.WORKERS  # batches got costly: time for the workers after all
                else:
                    self._reopen()
            costs.clear()


    def _step_hides(self, cost: float) -> bool:
        """Do the training loop's last steps between main-process batches (two at most, the
        shorter counts) take ``rules.STEP_HIDES`` of a batch costing ``cost`` or more?"""
        steps = self.steps_seen[-2:]
        return bool(steps) and min(steps) >= rules.STEP_HIDES * cost


    def _costly(self, costs: list[float], batch: Any) -> bool:
        """Is a window of 16 main-process batches worth the workers? Its low quartile (the
        fifth cheapest, ``rules.typical``) is: a few batches the machine slowed down say nothing."""
        typical = self.findings.batch_s = rules.typical(costs)
        return self.worth_workers(typical, batch)


    def _reopenable(self) -> bool:
        """Is this an "auto" pool whose probe settled on the main process, pinning no
        workers, that may still start them?"""
        auto, tuner = self.pool.auto, self.pool.tuner
        return (auto is not None and bool(auto["num_workers"]) and tuner is not None and tuner.pinned
                and self.pool.mode == Mode.INLINE and not self.pool.bulk and not self.pool.timed and not self.no_core_left)


    def _reopen(self, threads: int | None = None) -> None:
        """Start a worker per core ("auto": the tuner refines from there). Where the probe had
        pinned no workers, batches got costly since (a dataset whose first samples are
        cached, or sorted by size): the pin is lifted and the tuner chooses again."""
        if self._reopenable():
            assert self.pool.tuner is not None
            self.pool.tuner.unpin()
        self.pool.apply(cpu_share(), self.pool.threads if threads is None else threads, self.pool.prefetch)


    def worth_workers(self, cost: float, batch: Any) -> bool:
        """Is a batch like ``batch`` that costs ``cost`` here worth a trip from a worker? Not
        below ``rules.INLINE_MAX_S``; above it, not below ``rules.TRIPS`` trips either, a trip timed once
        for this batch's shape (``rules.trip_s``: a slow machine's trips cost more). Nor when
        starting the workers costs more than they could save (``_start_outweighs``)."""
        if cost <= rules.INLINE_MAX_S or self._start_outweighs(cost) or self.no_core_left:
            return False
        if self.inline_max is None:
            self.inline_max = max(rules.INLINE_MAX_S, rules.TRIPS * rules.trip_s(batch, self.pool.spec.output))
        return cost > self.inline_max


    def _start_outweighs(self, cost: float | None) -> bool:
        """Would the workers, started and stopped once an epoch (they do not persist), cost
        more than making all the epoch's batches here at ``cost`` each? Known once this
        loader has run them for an epoch (``rules.Findings``). Spawned workers import the main
        process's modules afresh, torch included, which can take far longer than a short epoch
        made here (docs/decisions/findings-carry-across-epochs.md)."""
        spent = self.findings.workers_s()
        if cost is None or self.pool.persistent or self.epoch_batches is None:
            return False
        if self.findings.unready:
            return True  # they started more slowly than a whole epoch was made here
        if self.findings.workers_lose(cost):
            return True  # the loop waited longer for their batches than for those made here
        return spent is not None and spent >= cost * self.epoch_batches


    def fetch_here(self, task: Task) -> Result:
        """Run ``task`` in the main process, timing it for the workers-or-not decision."""
        self.asked_at = time.perf_counter()
        if self.pool.mode == Mode.PROBE and self.pool.spec.seed is None:
            return self._probe(task)
        t0, fresh = time.perf_counter(), self.pool.recycler.fresh_s
        result = self.pool.main.run(task)
        return self._timed(result, time.perf_counter() - t0 - (self.pool.recycler.fresh_s - fresh))


    def _probe(self, task: Task) -> Result:
        """A probing batch, made exactly as the worker torch would give it to would make it.

        The global RNGs are set to that worker's (seeded as a worker is seeded, or as its
        last probing batch left them). If the batch moved them, the dataset draws from
        them: the main process stops making batches and the real worker takes over the
        RNG state, so results match a loader without ``adaptive``. Once a batch has left
        them alone, later probing batches are made with the RNGs as they are (seeding and
        restoring cost ~0.1 ms a batch) and only compared; one that moves them after all
        is made again, seeded.

        With ``num_workers="auto"`` there is no such worker (the count is the loader's own
        choice): the batch is made as a loader without workers makes it, drawing from the
        RNGs as they are (seeding and three snapshots cost ~0.8 ms in a fresh process).
        """
        if not self.probe_as_worker:
            return self._timed(*self._run_probe(task, watch=True))
        w = (task.seq - self.pool.epoch_start) % max(1, self.pool.num_workers or cpu_share())
        user = rng.RngState()
        before: rng.RngState | None = None
        moved = True  # the user's RNGs may have moved (an exception, or a seeded run)
        try:
            if self.rng_sensitive or not self.rng_quiet:
                before = self._seed_as(w)
            result, cost = self._run_probe(task, watch=True)
            after = rng.RngState()
            moved = before is not None or not after.same(user)
            if before is None and moved:
                # made with the user's RNGs, and the dataset drew from them after all: make
                # it again exactly as the worker would
                user.restore()
                before = self._seed_as(w)
                result, _ = self._run_probe(task, watch=False)
                after = rng.RngState()
        finally:
            if moved:
                user.restore()
        if before is not None and not after.same(before):
            self.rng_states[w] = after
            self.rng_sensitive = True
            self.findings.draws_rngs = True
            self.pool.spec = dataclasses.replace(self.pool.spec, rng_states=dict(self.rng_states))
            if self.pool.launched:
                self.pool.executor.set_rng(w, after)  # started early, before this batch ended
            if self.pool.num_workers:
                self.pool.mode = Mode.WORKERS
        elif before is not None:
            self.rng_quiet = True
        return self._timed(result, cost)


    def _seed_as(self, w: int) -> rng.RngState:
        """Set the global RNGs to worker ``w``'s: as its last probing batch left them, or as
        seeding leaves them (snapshotted once: a snapshot and a restore cost ~50 us each,
        mostly numpy's). Returns that state."""
        state = self.rng_states.get(w) or self.rng_seeded.get(w)
        if state is not None:
            state.restore()
            return state
        rng.seed_worker(self.pool.base_seed, w)
        state = self.rng_seeded[w] = rng.RngState()
        return state


    def _run_probe(self, task: Task, *, watch: bool) -> tuple[Result, float]:
        """Make ``task`` here and time it; with ``watch``, a slow batch starts the workers."""
        # the run-queue clock first: a thread is preempted as a system call returns, such as
        # reading the clocks below, and read after them, that wait counts as the batch waiting:
        # a first batch that computes reads as one that waits, and forks the workers early
        rq0 = _runqueue_wait() if watch else None
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        own0 = time.thread_time()
        fresh = self.pool.recycler.fresh_s
        start: Callable[[], None] | None = None
        if watch and not self.pool.launched and not self.copying:
            if self.pool.num_workers:
                start = self._start_early
            elif self.pool.auto is not None and self.pool.auto["num_workers"]:
                start = self._start_early_auto
        rates = self.inline_rates
        slow = rules.SLOW_S if len(self.inline_costs) >= 2 else rules.FIRST_SLOW_S
        if start is not None and self.pool.num_workers and self.probe_cpu > slow and rates and rates[-1] < rules.INLINE_RATE:
            # the batch before kept this process computing for longer than rules.SLOW_S (the very
            # first batch: rules.FIRST_SLOW_S), not copying memory nor faulting in new pages:
            # preemption cannot explain that, so the workers are forked now and make the next
            # batches while this one, the second opinion, is made here
            start()
            start = None
        main = self.pool.main
        forking = None if start is None else rules.CpuTimed(start, main.fetcher.cpu_clock)  # the workers' start, from the watch
        result = main.run(task, None if forking is None else
                          (rules.SLOW_S, self._early_check(forking, t0, cpu0, rq0, first=not self.inline_costs)))
        if forking is not None and forking.cpu_s and result.cpu is not None:
            # workers forked inside this batch, from its watch: that CPU time is not the batch's
            # (counted, it makes a batch that waits read as CPU-bound, and the tuner gives its
            # fetches one thread)
            result.cpu = max(0.0, result.cpu - forking.cpu_s)
        # new memory's page faults are paid once; reused memory is what later batches get
        faults = self.pool.recycler.fresh_s - fresh
        self.probe_cpu = time.thread_time() - own0 - faults  # this thread's: no other thread's work counts
        # the batch costs what fetching and collating it took, as the quick path times a batch
        # kept here (``note``): the probe's own envelope (the task, the result, the watch, the
        # RNG bookkeeping) is not paid by such batches. Counted, it makes cheap batches read
        # costly: past INLINE_MAX_S, and a trip timed (``rules.trip_s``, first calls into torch
        # in a fresh process) for batches that stay here (docs/decisions/probe-reads-batch-costs-low.md).
        made = result.end - result.start if result.end else time.perf_counter() - t0
        return result, made - faults


    @staticmethod
    def _early_check(start: Callable[[float], None], t0: float, cpu0: float, rq0: float | None,
                     *, first: bool) -> Callable[[], float | None]:
        """The watch of a probing batch still running after ``rules.SLOW_S``: start the
        workers (returns None), or say how much longer to wait before asking again.

        The very first batch also pays one-time costs (first touches of the data, first calls
        into libraries), which are CPU work: it starts the workers at once only if it is
        waiting (the process used under half a core meanwhile), else after ``rules.EARLY_START_S``.
        Time this thread spent preempted (``rq0``: its run-queue wait at the start) is not
        waiting: on a busy machine a computing batch would otherwise read as one that waits.
        """
        def check() -> float | None:
            wall = time.perf_counter() - t0
            rq1 = _runqueue_wait() if rq0 is not None else None
            ran = wall - (rq1 - rq0) if rq1 is not None and rq0 is not None else wall
            busy = (time.process_time() - cpu0) / max(ran, 1e-9)  # cores the batch kept busy while it ran
            if not first or ran >= rules.EARLY_START_S or busy < 0.5:
                start(busy)
                return None
            return rules.EARLY_START_S - ran
        return check


    def _threads_to_start(self, busy: float, alone_s: float | None = None) -> None:
        """The user's workers with fetch_threads="auto", about to start: where a probing
        batch mostly waits (kept ``busy`` cores busy), they start with threads wide, as "auto"
        workers do: else their first batches, until the tuner's first say, are fetched one
        thread each (docs/decisions/auto-tunes-only-what-is-auto.md). ``alone_s``:
        what one fetch took alone, by default what the probing fetcher measured."""
        if self.pool.auto is None or not self.pool.auto["fetch_threads"] or self.pool.started:
            return
        if alone_s is None:
            alone_s = self.pool.main.fetcher.alone_s
        threads = self._threads_for(busy, alone_s)
        if threads != self.pool.threads:
            self.pool.threads = threads
            self.pool.spec = dataclasses.replace(self.pool.spec, fetch_threads=threads)
            if self.pool.tuner is not None:
                self.pool.tuner.threads_run = threads


    def _start_early(self, busy: float = 1.0) -> None:
        """A probing batch is slow: fork the workers now, while the main process finishes it."""
        self._threads_to_start(busy)
        if not self.pool.try_start():
            return
        if self.on_early is not None:
            self.on_early()  # hand the next batches out at once, so workers overlap this one


    def _start_early_auto(self, busy: float = 1.0) -> None:
        """num_workers="auto" and a probing batch is slow: start one worker per core now,
        with fetch threads if it mostly waits (``busy``: the cores it kept busy, < 0.5) and
        they are "auto" too; the main process fetches the rest of its batch with as many.
        The tuner trims workers, threads and prefetch from what it then measures."""
        if self.no_core_left and busy >= rules.CROWDED_WAITS:
            return  # it computes: a worker would only take the training loop's core
        threads = self._threads_for(busy, self.pool.main.fetcher.alone_s)
        if threads != self.pool.threads:
            self.pool.main.fetcher.set_threads(threads)
        self.pool.apply(cpu_share(), threads, self.pool.prefetch)
        if self.on_early is not None:
            self.on_early()


    def _timed(self, result: Result, cost: float) -> Result:
        self.pool.inline_batches += 1
        costs = self.inline_costs
        costs.append(cost)
        if len(costs) > 16:
            del costs[0]
        if not self.adaptive:
            return result
        if (self.pool.mode == Mode.INLINE and cost <= rules.SLOW_S and self.pool.inline_batches % 16 and self.pool.tuner is not None
                and self.pool.tuner.pinned and self.pool.auto is not None and self.pool.auto["num_workers"]):
            # "auto" settled here: only a slow batch, or every 16th, is looked at (walking each
            # batch for its size costs ~2 us, a real share of a tiny batch_size=None batch)
            return result
        self.findings.batch_s = rules.estimate(costs)  # for later epochs: are their workers worth starting?
        # A batch made at memory speed (gathering arrays already in memory) gains nothing from
        # a worker, which would copy it once more into shared memory: keep such batches here,
        # unless the training step between them would hide the workers' copies.
        rate = rules.nbytes(result.batch) / cost if cost > 0 else 0.0
        rates = self.inline_rates
        rates.append(rate)
        if len(rates) > 16:
            del rates[0]
        handed = self.loop_stats.last_handed
        if handed is not None and handed < self.asked_at:
            steps = self.steps_seen
            steps.append(self.asked_at - handed)  # from handing out the last batch to asking for this one
            if len(steps) > 4:
                del steps[0]
        # page faults of new memory and preemption only ever slow a batch down: the faster of
        # the last two says best what a batch costs once memory is reused
        copying = self.copying = (len(rates) >= 2 and max(rates[-2:]) > rules.INLINE_RATE
                                  and not self._step_hides(min(self.inline_costs[-2:])))
        auto = self.pool.tuner is not None and self.pool.auto is not None and bool(self.pool.auto["num_workers"])
        seen = rules.Timed(costs=tuple(costs), rate=rate, copying=copying, auto=auto,
                           waits=result.cpu is not None and result.cpu < 0.5 * cost,  # warm-up costs are CPU
                           probing=self.pool.mode == Mode.PROBE, workers=self.pool.num_workers,
                           window_end=self.pool.inline_batches % 16 == 0, rng_sensitive=self.rng_sensitive,
                           no_core_left=self.no_core_left)
        said, low, whole = rules.verdict(seen, self._start_outweighs, lambda c: self.worth_workers(c, result.batch),
                                         self._reopenable)
        if whole:
            self.findings.batch_s = low
        if said is Verdict.JUMP:
            self._jump_start(result, cost)
        elif said is Verdict.REOPEN:
            self._reopen()  # as Probe.note does for batches made by the quick path
        elif said is Verdict.HERE and auto:
            assert self.pool.tuner is not None and low is not None
            self.pool.mode = Mode.INLINE
            self.pool.tuner.workers_run = 0  # any started early make no batch from here
            why = (f"batches are made at {rate / 1e9:.1f} GB/s in the main process (copying memory): "
                   "workers would only copy them again" if copying else
                   f"{rules.ranks_words()}, which leaves no core for a worker that computes"
                   if self.no_core_left and low > rules.INLINE_MAX_S else
                   f"a batch costs {low * 1e6:.0f} us in the main process, less than bringing it "
                   f"from a worker would ({(self.inline_max or rules.INLINE_MAX_S) * 1e6:.0f} us)")
            self.pool.tuner.pin({"num_workers": 0, "fetch_threads": self.pool.threads, "prefetch_factor": None,
                                 "reason": why + ": no workers"})
        elif said is Verdict.HERE:
            self.pool.mode = Mode.INLINE
        elif said is Verdict.WORKERS_NOW:
            self.pool.mode = Mode.WORKERS
            if result.cpu is not None and cost > 0:
                self._threads_to_start(result.cpu / cost, cost / max(1, result.samples))
        elif said is Verdict.WORKERS:
            self.pool.mode = Mode.WORKERS
        return result


    # -- num_workers / fetch_threads / prefetch_factor = "auto" --------------
    def _jump_start(self, result: Result, cost: float) -> None:
        """A first batch this costly needs workers now; the tuner refines from there."""
        self._reopen(self.pool.threads if result.cpu is None or cost <= 0 else
                     self._threads_for(result.cpu / cost, cost / max(1, result.samples)))


    def _threads_for(self, busy: float, alone_s: float | None) -> int:
        """Fetch threads for a batch that kept ``busy`` cores busy: as many as the tuner
        allows when it mostly waits (and tells the tuner it waits, and that a fetch took
        ``alone_s`` with no other running), else the current.

        ``busy`` is read early, over a fetch or two that also paid one-time costs, so it
        says that fetches wait, not how many would fill a core (one-time costs read as far
        too few threads for fetches that barely use a core:
        docs/decisions/tuner-reads-lane-time-and-core-share.md).
        Threads that wait cost no CPU: they start wide, and the tuner trims them to what
        the training loop takes and what fills a worker's core, each cut checked.
        """
        if busy >= IO_BOUND:
            return self.pool.threads
        tuner = self.pool.tuner
        if tuner is not None:
            tuner.note_waiting(alone_s)
        if self.pool.auto is None or not self.pool.auto["fetch_threads"] or self.keeps_files():
            return self.pool.threads
        return tuner.max_threads if tuner is not None else MAX_THREADS


    def keeps_files(self) -> bool:
        """Has the dataset opened files it keeps open (a lazily opened handle), as far as the
        main process saw? Threads of one worker would share such a handle, and a ``seek`` in
        one moves the others' reads: "auto" then leaves fetch threads at what they are
        (``fetch_threads=N`` still forces them)."""
        if not self._keeps_files:
            self._keeps_files = bool(self.pool.launcher.files_opened())
            if self._keeps_files and self.pool.tuner is not None:
                self.pool.tuner.one_thread("the dataset keeps files open, which fetch threads would share: 1 thread")
        return self._keeps_files


    def tuning(self) -> bool:
        """Is the tuner still open to change (so worth a stats snapshot)?"""
        tuner = self.pool.tuner
        return tuner is not None and not tuner.pinned


    def retune(self, snap: dict[str, Any]) -> None:
        tuner = self.pool.tuner
        if tuner is None or not self.tuning():
            return
        tuner.observe(snap)
        if tuner.measuring:
            return  # its decision is a placeholder: keep what the probe started with
        d = tuner.decision()
        auto = self.pool.auto or {}
        workers = d.num_workers if auto.get("num_workers") else self.pool.num_workers
        if auto.get("num_workers") and self.pool.mode == Mode.PROBE and workers == 0:
            return  # the main-process probe decides that
        if not auto.get("num_workers") and self.pool.mode != Mode.WORKERS:
            # the user's workers, kept back by ``adaptive`` while batches are cheaper made
            # here: that choice stands (it takes them up when batches grow costly)
            workers = 0
        if auto.get("num_workers") and self.pool.started and workers < self.pool.num_workers:
            workers = self.pool.num_workers  # never stop workers mid-run: they cost nothing idle
        threads = self.pool.threads
        if auto.get("fetch_threads"):
            # a dataset seen keeping files open after threads were raised gets one thread again:
            # threads of a worker would share the handle
            threads = 1 if self.keeps_files() else tuner.steer_threads(self.pool.threads)
        prefetch = (d.prefetch_factor or 2) if auto.get("prefetch_factor") else self.pool.prefetch
        self.pool.apply(workers, threads, prefetch)
        tuner.threads_run = self.pool.threads

    def describe(self, snap: dict[str, Any], auto: dict[str, bool] | None, settings: dict[str, Any]) -> None:
        """Add to a stats snapshot why the workers were not started, where that is why
        (``workers_not_started``), and what "auto" chose for the settings in ``auto``
        (``tuning``: the rest are the user's ``settings``, reported as they are)."""
        cost = self.findings.batch_s
        if not self.pool.launched and self.pool.mode == Mode.INLINE and self._start_outweighs(cost):
            assert cost is not None
            snap["workers_not_started"] = rules.start_words(self.findings, cost, self.epoch_batches or 0)
        if self.pool.tuner is not None:
            # what "auto" chose for the settings it tunes; a setting the user fixed is
            # reported as it is (the tuner's decision may name another it may not apply)
            tuning = self.pool.tuner.decision().to_dict()
            for name in ("num_workers", "fetch_threads", "prefetch_factor"):
                if not (auto or {}).get(name):
                    # the user's own setting, not what runs now: ``adaptive`` may keep the
                    # user's workers back while batches are cheap, and what runs would read
                    # num_workers=0 beside prefetch_factor=2, which the constructor refuses
                    tuning[name] = settings[name]
            if self.pool.launched and (auto or {}).get("fetch_threads"):
                # the threads that run: the tuner's wish goes through ThreadSteer, which
                # damps cuts and undoes those that cost throughput
                wish = tuning["fetch_threads"]
                tuning["fetch_threads"] = snap["fetch_threads"]
                if wish != snap["fetch_threads"] and tuning.get("reason"):
                    # the reason argues for the wish: say why another count runs
                    tuning["reason"] += (f"; {snap['fetch_threads']} threads run, not {wish}: a cut goes "
                                         "at most halfway at a time and is undone if it costs throughput")
            if not tuning["num_workers"]:
                tuning["prefetch_factor"] = None  # (what the constructor takes without workers)
            running = snap["num_workers"]
            if (self.pool.launched and self.pool.mode == Mode.WORKERS and (auto or {}).get("num_workers")
                    and tuning["num_workers"] < running):
                # workers are not stopped mid-run: those that run are what to pin (the tuner's
                # smaller count, pinned, runs slower: docs/decisions/findings-carry-across-epochs.md)
                wish, tuning["num_workers"] = tuning["num_workers"], running
                if tuning.get("reason") and not self.pool.tuner.measuring:
                    # the reason argues for the wish: say why more workers run
                    tuning["reason"] += (f"; {running} workers run, not {wish}: workers that started "
                                         "are kept to the end of the run")
            # the settings alone, to pass back as they are: DataLoader(ds, **tuning["kwargs"])
            tuning["kwargs"] = {name: tuning[name] for name in ("num_workers", "fetch_threads", "prefetch_factor")}
            snap["tuning"] = tuning
