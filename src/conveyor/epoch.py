"""One pass over the data: what ``iter(loader)`` returns.

A ``Run`` reads the epoch's order (``order.py``), hands tasks to the pool's workers in
strict round robin up to each one's prefetch (``_fill``), takes their results in as they
come (``poll``), puts them back in order (``Reorder``) and hands out batches; the main
process makes batches itself where the pool says so (``Mode``). It keeps the epoch's
position for ``state_dict()`` (``where``), replaces dead workers and re-issues their tasks,
counts the samples skipped under ``on_error="skip"``, and says where a timed-out batch is.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _torch, failures, here, position
from .errors import TooManyFailures, rebuild
from .torch_names import TorchIteratorNames
from ._platform.signals import hold_ctrl_c
from .executors.recovery import Recovery
from .executors.reorder import Reorder
from .executors.task import Death, Result, Task
from .executors.seeding import rng_lock
from .order import EpochOrder, ReadAhead, StreamReplicas, task_indices
from .placement import rules
from .placement.rules import Mode
from .transport import to_numpy

if TYPE_CHECKING:
    from .loader import DataLoader
    from .pool import Pool

__all__ = ["Run"]

T = TypeVar("T")


_TICK = 1.0  # seconds between liveness checks while waiting


class Origin:
    """Where a run began: its first task's seq, the workers' base seed (a shared main-process
    pool takes a new one each epoch), the loader's generator as it was (for a state), a
    DataPipe's shuffle draw (``DataLoader.__iter__``), and what the run gives back if it is
    dropped unused: the loader's (epoch counter, resume state, end position) before its iter()."""

    __slots__ = ("first_seq", "base_seed", "generator_state", "pipe_seed", "undo")

    def __init__(self, loader: DataLoader[Any], pool: Pool) -> None:
        self.first_seq = pool.seq
        self.base_seed = pool.base_seed
        gen = loader.generator
        self.generator_state = gen.get_state() if _torch.is_generator(gen) else None
        self.pipe_seed: int | None = None
        self.undo: tuple[int, dict[str, Any] | None, dict[str, Any] | None] | None = None


class Rotation:
    """The round robin over the workers, as torch's: whose turn is next (-1 until the epoch's
    first dispatch) and which replicas of an iterable dataset have not run out."""

    __slots__ = ("turn", "live")

    def __init__(self, workers: int) -> None:
        self.turn = -1
        self.live = [True] * max(1, workers)


class Run(TorchIteratorNames, Generic[T]):
    """One pass over the data: what ``iter(loader)`` returns."""

    def __init__(self, loader: DataLoader[T], pool: Pool, epoch: int, skip: int, *, owns_pool: bool,
                 done: Iterable[int] = (), replicas: Iterable[int] | None = None,
                 replayed: dict[str, Any] | None = None) -> None:
        rng_lock.put_back()  # the RNGs thread workers seeded, as they found them: the sampler may draw
        self.loader = loader
        self.pool = pool
        self.epoch = epoch
        self.owns_pool = owns_pool
        self.finished = False
        self.successor: Run[T] | None = None  # the epoch a later iter() started on persistent workers
        self.exhausted = False  # reached the end of its epoch
        self.yielded = skip
        # torch warns once a stream has handed out more batches than len(dataset) said, when
        # len(loader) was asked (as torch, it compares batches with the dataset's length)
        self.len_said = loader._len_called if loader._iterable else None
        self.stats = loader._stats
        self.origin = Origin(loader, pool)
        iterable = loader._iterable
        self.out_seq = -1  # seq of the batch being handed out
        self.out_worker = -1  # and of the replica it came from (streams)
        # a stream's position (map-style ones: ``order``)
        self.replicas = StreamReplicas(loader.num_workers, skip, replicas) if iterable else None
        self.here = here.Here()  # the main process's batches: lean path, bulk gathers
        self.order = EpochOrder(loader, skip, done, replayed, gather=pool.spec.gather, first_seq=pool.seq,
                                made_here=lambda: pool.mode is not Mode.WORKERS)
        pool.epoch_start = pool.seq
        self.reorder = Reorder(pool.seq, loader.in_order)
        self.inflight: dict[int, tuple[int, Task]] = {}
        self.rotation = Rotation(loader.num_workers)
        self.recovery = Recovery(loader.max_worker_restarts, can_reissue=not loader._iterable)
        self.budget = failures.SkipBudget(loader.max_failures, loader._stats)  # on_error="skip"
        self.pin = loader._slot_pinner
        self.to_numpy = loader.output == "numpy" and not loader._default_collate
        self.skipped = skip
        self.thread = threading.get_ident()  # the thread that last asked for a batch

    def _give_back(self) -> bool:
        """Dropped or closed before handing out a batch (a trainer's probe: Lightning calls
        iter() once on loaders it does not know), this run gives its epoch back: the next
        iter() is the epoch this one would have been, with the same ``seed=`` draws, as if
        iter() had never been called. Not once a later iter() has begun another epoch."""
        undo, self.origin.undo = self.origin.undo, None
        loader = self.loader
        if (undo is None or self.exhausted or self.yielded != self.skipped or loader._epoch != self.epoch + 1
                or loader._last_run not in (None, self)):
            return False
        loader._epoch, resume, loader._ended = undo
        if resume is not None and loader._resume is None:
            loader._resume = resume
        return True

    def begin(self) -> None:
        """Begin the sampler's iteration if no batch has been asked for yet: a state names
        the iteration its epoch is in. Without workers the sampler is read at the first
        next(), as torch's is; a state taken before it would describe the sampler's previous
        iteration (a custom sampler's state_dict()) or leave the first draw from a global
        RNG out of the epoch (torch's RandomSampler without a generator), and the resumed
        epoch would be the one before, or later epochs would differ. So the draw comes when
        the state is asked for, as it does at iter() with workers."""
        if self.pool.seq == self.origin.first_seq:  # no batch asked for yet
            self.order.begin()

    # -- iterator protocol --------------------------------------------------
    def __iter__(self) -> Run[T]:
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self) -> T:
        if self.here.lean:
            return here.lean_next(self)  # type: ignore[no-any-return]
        ready = self.here.ready
        if ready and self.pin is None:
            # batches already gathered in bulk (map-style, in order): hand one out with the
            # least bookkeeping
            batch, size = ready.popleft()
            self.yielded += 1
            self.order.prefix += 1
            self.here.seq += 1
            self.stats.handed_now(size)
            return batch  # type: ignore[no-any-return]
        if self.finished:
            if self.successor is not None:
                return next(self.successor)
            raise StopIteration
        self.thread = threading.get_ident()
        asked = time.perf_counter()
        try:
            batch, size = self._next()
            streams = self.replicas
            while streams is not None and streams.dropping and streams.drop(max(self.out_worker, 0)):
                batch, size = self._next()  # (a resumed stream's batch the user had received)
        except StopIteration:
            self._finish()
            raise
        except Exception:
            pool = self.pool
            if pool.dead and pool.closer not in (None, threading.get_ident()):
                # close() from another thread, while this one made a batch or waited on the
                # workers it shut down (a process object closed under a poll, a restart or a
                # start refused): the epoch ends, as it does when close() comes between batches
                self._finish()
                raise StopIteration from None
            raise
        if self.replicas is not None:
            self.replicas.done[max(self.out_worker, 0)] += 1
        else:
            self.order.handed(self.out_seq)
        self.yielded += 1
        ahead = self.order.batches
        if type(ahead) is ReadAhead and self.pool.mode == Mode.WORKERS:
            # torch's loader reads one more batch of indices for each it hands out
            ahead.top_up(self.order.primed + self.yielded - self.skipped)
        if self.len_said is not None and self.yielded > self.len_said:
            self._warn_len()
        self.stats.handed(asked, time.perf_counter(), size, len(self.reorder))
        # every rules.RETUNE_EVERY batches the loader handed out, across epochs: counted per epoch,
        # epochs of under 4 batches would never feed the tuner ("not measured yet" for good)
        if self.pool.tuner is not None and self.stats.batches % rules.RETUNE_EVERY == 0 and self.pool.probe.tuning():
            self.pool.probe.retune(self.loader.stats())
        return batch

    def _warn_len(self) -> None:
        msg = (f"Length of IterableDataset {self.loader.dataset} was reported to be {self.len_said} (when "
               f"accessing len(dataloader)), but {self.yielded} samples have been fetched. ")
        if self.loader.num_workers > 0:
            msg += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                    "IterableDataset replica at each worker (see get_worker_info()).")
        warnings.warn(msg, UserWarning, stacklevel=3)

    @property
    def ex(self) -> Any:
        return self.pool.executor

    def _next(self) -> tuple[Any, int]:
        pool = self.pool
        if self.here.ready or (self.order.slices is not None and pool.bulk_ok()):
            return here.bulk(self)
        if not self.inflight and not len(self.reorder):
            while pool.probe.serve_here():
                if pool.mode == Mode.INLINE and pool.quick:
                    return here.quick(self)
                indices = next(self.order.batches)  # StopIteration ends the epoch
                task = Task(pool.seq, self.epoch, task_indices(indices) if self.loader._auto_collation else [indices])
                pool.seq += 1
                self.reorder.next = pool.seq
                if pool.mode == Mode.WORKERS:
                    _ = self.ex  # started now if not yet (a later epoch's workers, which paid)
                if pool.mode == Mode.WORKERS and not pool.probe.holds_back():
                    self._fill()  # the workers start on the batches after this one
                else:
                    # if this batch turns out slow and workers start meanwhile, they get the next
                    # batches once they are ready, all but those of the worker whose RNG this
                    # batch stands in for
                    pool.probe.on_early = lambda: pool.probe.holds_back() or self._fill(
                        hold=(task.seq - self.origin.first_seq) % max(1, pool.num_workers))
                try:
                    result = pool.probe.fetch_here(task)
                finally:
                    pool.probe.on_early = None
                out = self._take(result)
                if out is not None:
                    if pool.mode == Mode.WORKERS and pool.started and not pool.probe.holds_back():
                        # workers started while this batch was made here: the one held back for
                        # it (its RNG stand-in) gets its batches now, not at the next call
                        self._fill()
                    return out
                if self.inflight or len(self.reorder):
                    break  # the workers hold the next batches: wait for them
        waited_since = time.monotonic()
        polled = False  # this call has read the pipes already (and refilled)
        while True:
            r = self.reorder.pop()
            if r is not None:
                if self.ex.kind != "inline":
                    if self.inflight and not polled and self.pool.grouping.size == 1:
                        # a batch was waiting here: collect what else is done, without blocking,
                        # and refill, so a worker never sits idle while its results sit in the pipe.
                        # (Grouped batches are refilled by the count handed out, which a poll does
                        # not change: a system call a batch for nothing.)
                        self.poll(0)
                    else:
                        # the batch handed out leaves room for the next task now, as torch's
                        # loader refills when it hands one out. Refilled only at the next call,
                        # one worker with prefetch_factor=1 would idle through every training
                        # step, and a stream whose every result is waiting here would never hear
                        # its last worker's end (a state_dict saved after its last batch would
                        # name the ended epoch; docs/decisions/refill-on-every-hand-out.md)
                        self._fill()
                out = self._take(r)
                if out is not None:
                    return out
                waited_since = time.monotonic()
                continue
            if self.finished or pool.dead:
                raise StopIteration  # close() from another thread ended this epoch
            self._fill()
            if not self.inflight and self.order.sampler_done and not len(self.reorder):
                raise StopIteration
            timeout = _TICK
            if self.loader.timeout > 0:
                timeout = min(timeout, max(0.0, waited_since + self.loader.timeout - time.monotonic()))
            polled = True
            if not self.poll(timeout):
                if self.loader.timeout > 0 and time.monotonic() - waited_since >= self.loader.timeout:
                    if not failures.restart_hung(self):
                        raise failures.timeout_error(self)
                    waited_since = time.monotonic()
                continue

    def poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for what the workers send and take it in (``_absorb``); False
        when nothing came. Process workers' results are read and recorded with a Ctrl-C held
        (``hold_ctrl_c``): one between the two would lose the result, and a persistent loader's
        later epochs would wait for ever on the worker still counted as holding it."""
        ex = self.ex
        ready = ex.wait_ready(timeout)
        if not ready:
            return False
        with hold_ctrl_c():
            events = ex.take_ready(ready)
            deaths = self._take_in(events)
        for death in deaths:  # (replacing a worker waits for it: not held; an unhandled death is seen again)
            failures.replace_dead(self, death)
        self._fill()
        return bool(events)

    def _absorb(self, events: list[Any]) -> None:
        """Take finished batches and deaths from the executor, then refill at once: results
        often arrive together, and a worker must not wait for the consumer to run dry
        before it hears of its next batch."""
        for death in self._take_in(events):
            failures.replace_dead(self, death)
        self._fill()

    def _take_in(self, events: list[Any]) -> list[Death]:
        """Record the results among ``events``; returns the deaths."""
        deaths = []
        for ev in events:
            if isinstance(ev, Death):
                deaths.append(ev)
            elif ev.seq < self.origin.first_seq or ev.seq not in self.inflight:
                self.ex.release(ev)  # from an abandoned epoch
            else:
                self.inflight.pop(ev.seq, None)
                pool = self.pool
                if not pool.grouping.decided:
                    pool.grouping.note(ev)
                if not pool.delivered:
                    pool.delivered = True
                    pool.probe.findings.start_s = time.perf_counter() - pool.launcher.started_at
                self.reorder.push(ev)
        return deaths

    def _take(self, r: Result) -> tuple[Any, int] | None:
        """The user's batch from a result, or None when there is nothing to hand out."""
        self.out_seq = r.seq
        self.out_worker = r.worker
        if r.start and not r.exhausted:  # (a stream's end is no batch: its worker's mean would shrink)
            self.stats.result(r.worker, r.start, r.fetched, r.end, cpu=r.cpu, nbytes=r.nbytes, rss=r.rss,
                              cpu_span=r.cpu_span, work=r.work)
        if r.exhausted:
            w = max(r.worker, 0)  # -1: the main process, the only replica with 0 workers
            live = self.rotation.live
            first = w >= len(live) or live[w]  # tasks in flight behind it end too
            if w < len(live):
                live[w] = False
            if r.skipped:
                self.budget.count(list(r.skipped), samples=len(r.skipped))
            if r.exhausted == 2 and first:
                warnings.warn(
                    f"conveyor: the stream of {'the main process' if r.worker < 0 else f'worker {w}'} ended right "
                    "after an item raised (on_error='skip'): a generator is over once it has raised, so the "
                    "rest of that stream, if any, is lost. To skip bad items and go on, catch them inside "
                    "__iter__, or give the iterator a __next__ that can be called again after raising.",
                    RuntimeWarning, stacklevel=4)
            return None
        loader = self.loader
        if r.failure is not None:
            original = r.failure.original  # a thread worker's SystemExit, KeyboardInterrupt: raised
            if (loader.on_error == "skip" and r.failure.where == "fetching"
                    and (original is None or isinstance(original, Exception))):
                self.budget.count([r.failure], samples=len(r.failure.indices or []) or 1)
                if self.replicas is None:
                    self.order.handed(r.seq)  # skipped whole: its position is done with
                return None
            raise rebuild(r.failure)
        n = samples_in(self.loader, r)
        if r.skipped:
            # the batch's samples count as seen before the failures are weighed against them
            try:
                self.budget.count(list(r.skipped), samples=n, failed=len(r.skipped))
            except TooManyFailures:
                if r.worker >= 0:
                    self.ex.release(r)  # not handed out: its slot goes back (a persistent pool would lose it for good)
                raise
            n -= len(r.skipped)
        else:
            self.budget.seen += n
        if r.empty:
            if self.replicas is None:
                self.order.handed(r.seq)
            return None
        return self.dressed(r.batch if r.worker < 0 else self.ex.decode(r)), n

    def dressed(self, batch: Any) -> Any:
        """A batch as the user gets it: numpy arrays where ``output="numpy"`` asks for them
        of a user's collate_fn, pinned where ``pin_memory`` asks."""
        if self.to_numpy:
            batch = to_numpy(batch)
        if self.pin is not None:
            batch = self.pin(batch)
        return batch

    # -- dispatch -----------------------------------------------------------
    def _fill(self, hold: int | None = None) -> None:
        """Hand out tasks up to each worker's prefetch; ``hold``: a worker to give none to now."""
        ex = self.ex
        if self.order.sampler_done:
            return
        n = ex.num_workers
        cap = 1 if ex.kind == "inline" else self.pool.depth()
        if ex.kind == "inline":
            if self.inflight or len(self.reorder):
                return
            if self.loader._iterable and not self.rotation.live[0]:
                self.order.sampler_done = True
                return
            self._send(0, 1)
            return
        # Batches ahead of the user, whether still in a worker or finished and waiting here,
        # number at most prefetch x workers, as torch's do: results are collected as soon as
        # they arrive, and counting only the tasks still out would let the workers run ever
        # further ahead, holding shared memory and taking the training loop's CPU to do it
        # (docs/decisions/prefetch-counts-batches-ahead-of-user.md).
        room = n * cap - len(self.inflight) - len(self.reorder)
        rotation = self.rotation
        if room <= 0 and rotation.turn >= 0:
            return  # every worker holds its share (strict round robin keeps them even)
        group = self.pool.grouping.size if ex.kind == "process" else 1
        if cap < 2 * group:
            group = 1  # (fetch threads or a prefetch of 1 since: a whole group would leave the worker idle)
        fresh = not self.inflight and not len(self.reorder)  # the loop waits for the next batch
        if group > 1 and room < n * group and not fresh:
            return  # grouped batches go out a whole group a worker at a time (executors/grouping.py)
        if rotation.turn < 0:  # the first dispatch of this epoch: batches made in the main process came first
            rotation.turn = (self.pool.seq - self.origin.first_seq) % max(1, n)
        live_replicas = rotation.live
        while len(live_replicas) < n:
            live_replicas.append(True)  # workers added by the tuner
        # Strict round robin (over live replicas of an iterable dataset), as torch does:
        # batch k goes to worker k % n, so per-worker RNG streams match torch's. Tasks for
        # one worker travel together in one message.
        # With in_order=False a worker at its share is passed over, as torch does: a slow
        # batch then holds up only its own worker, the others go on taking batches.
        orders: dict[int, list[Task]] = {}
        held = {w: ex.outstanding(w) for w in range(n)}
        strict = self.loader.in_order or self.loader._iterable
        for _ in range(max(0, room)):
            live = False
            for k in range(n):
                w = (rotation.turn + k) % n
                if live_replicas[w]:
                    live = True
                    if strict or (held[w] < cap and w != hold):
                        break
            else:
                if not live:
                    self.order.sampler_done = True
                break  # (in_order=False) every live worker holds its share
            if held[w] >= cap or w == hold:
                break  # the turn stays with w: order must follow the rotation
            task = self._next_task(w)
            if task is None:
                break
            rotation.turn = (w + 1) % n
            held[w] += 1
            orders.setdefault(w, []).append(task)
        for w, tasks in orders.items():
            if group > 1:
                # with nothing in flight (an epoch's start) each worker's first batch goes alone:
                # in a group it would wait for the rest of the group
                first = 1 if fresh else 0
                if first:
                    ex.submit(w, tasks[:1])
                for k in range(first, len(tasks), group):
                    ex.submit(w, tasks[k:k + group], grouped=True)  # one order, one message back
            else:
                ex.submit(w, tasks)
        ex.flush_freed()

    def _next_task(self, worker: int) -> Task | None:
        """The next task (recorded as held by ``worker``), or None when the sampler is done."""
        try:
            indices = next(self.order.batches)
        except StopIteration:
            self.order.sampler_done = True
            return None
        if indices is not None and not self.loader._auto_collation:
            indices = [indices]
        elif indices is not None:
            indices = task_indices(indices)
        seq = self.pool.seq
        self.pool.seq += 1
        task = Task(seq, self.epoch, indices, self.origin.pipe_seed)
        self.inflight[seq] = (worker, task)
        return task

    def _send(self, worker: int, count: int) -> bool:
        tasks = []
        for _ in range(count):
            task = self._next_task(worker)
            if task is None:
                break
            tasks.append(task)
        if tasks:
            self.ex.submit(worker, tasks)
        return not self.order.sampler_done

    # -- endings ------------------------------------------------------------
    def _finish(self) -> None:
        if self.finished:
            return
        self.exhausted = True
        self.finished = True
        rng_lock.put_back()  # the training loop's RNGs back from thread workers
        self.loader._ended = position.run_position(self)
        self.stats.epoch_end()
        pool = self.pool
        if pool.launched and not pool.persistent and not pool.dead:
            if not pool.delivered and pool.starting():
                pool.probe.findings.unready = True  # the whole epoch was made here while they started
            pool.probe.findings.fed_s, pool.probe.findings.fed_batches = self.stats.since(pool.probe.fed_from)
        elif pool.probe.here_from is not None and not pool.launched and not pool.dead:
            waited, handed = self.stats.since(pool.probe.here_from)
            if handed:
                pool.probe.findings.here_s, pool.probe.findings.here_batches = waited, handed
        if self.owns_pool:
            loader = self.loader
            if loader._inline is None and not loader._iterable and self.pool.serves_every_epoch():
                loader._inline = self.pool  # the next epochs' too (DataLoader._inline_pool)
                self.owns_pool = False  # the loader closes it now
            else:
                self.pool.close()
        elif self.pool is self.loader._inline and self.pool.auto is not None and not self.pool.serves_every_epoch():
            # the "auto" pool the epochs shared started workers in this one (its batches got
            # costly): they end with the epoch, as workers that do not persist do
            pool = self.pool
            if not any(r is not self and r.pool is pool and not r.finished for r in list(self.loader._runs)):
                self.loader._inline = None
                pool.close()
        # last: under warnings-as-errors it raises in place of StopIteration, the epoch closed
        self.loader._warn_if_workers_lose()

    def _abandon(self) -> None:
        """A new epoch starts on the same (persistent) workers: drop this one."""
        if self.finished:
            return
        self.finished = True
        if self.loader._last_run is self:
            self.loader._ended = position.run_position(self)
        self.here.lean = False
        self.here.ready.clear()  # batches gathered ahead: the next epoch's are its own
        self._release_buffered()

    def _release_buffered(self) -> None:
        """Give the slots of batches made but never handed out back to their workers (results
        still in flight are released as they arrive: ``_absorb``)."""
        for r in list(self.reorder.buffer.values()):
            if r.worker >= 0:
                self.ex.release(r)
        self.reorder.buffer.clear()
        self.inflight.clear()

    def close(self) -> None:
        self._abandon()
        self._give_back()  # (after _abandon, which notes where the run ended)
        if self.owns_pool:
            self.pool.close()

    def __del__(self) -> None:
        try:
            if self._give_back():
                pass  # never began: nothing to resume from
            elif not self.finished:
                ref = self.loader._last_ref
                if ref is None or ref() in (None, self):
                    self.loader._ended = position.run_position(self)  # dropped mid-epoch: resume from here
            if self.owns_pool and not self.pool.dead:
                self.pool.close()
            elif not self.finished and not self.pool.dead:
                # dropped mid-epoch (a ``break``) on persistent workers: the batches it was
                # sent would hold their slots until close(), more memory at every break
                self._release_buffered()
        except Exception:
            pass


def samples_in(loader: DataLoader[Any], r: Result) -> int:
    """How many samples ``r``'s batch was made of (skipped ones included)."""
    if not loader._auto_collation:
        return 1
    return r.samples or loader.batch_size or 1

