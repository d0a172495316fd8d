"""DataLoader, the facade: arguments (``config.py``), ``iter()``, ``stats()``/``report()``/
``tuning()``, ``state_dict()`` (``position.py``), ``close()``, copies and pickles.

::

    iter(loader) -> Run (epoch.py): order.py's batches of indices --Task--> Pool (pool.py):
        executor (inline | threads | processes) --Result--> Reorder --> (pin) --> user

Each ``iter()`` makes a ``Run`` over a ``Pool``: a new pool per epoch, or the one persistent
workers keep. The main process makes every task, so a position in an epoch is how many
batches were handed out; that is what ``state_dict()`` stores.
"""

from __future__ import annotations

import math
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from . import _torch, config, position, rng
from .config import check_start_method, generator_seed
from .distributed import gives_rank_shares, group_world_size, rank_and_world
from .epoch import Run
from .errors import SlowSettingWarning, TooManyFailures
from .executors.processes import finish_cut_short
from .executors.fetcher import fetches_batches
from .executors.seeding import rng_lock
from .executors.worker import WorkerSpec
from .placement import rules
from .placement.rules import Mode
from .pool import Pool, pinner
from .samplers import Sampler
from .stats import Stats
from .placement import no_core_left as _no_core_left
from .placement import usable_cores
from .transport.recycle import Recycler

__all__ = ["DataLoader", "TooManyFailures", "STATE_VERSION"]

STATE_VERSION = position.STATE_VERSION

T = TypeVar("T")


class DataLoader(Generic[T]):
    """Batches from a dataset, fetched in the background: ``torch.utils.data.DataLoader``'s API.

    Every argument of torch's DataLoader means what it means there (the few places
    where draws or timing differ are listed in docs/determinism.md). conveyor adds:

    * ``worker_type``: ``"process"`` (default, as torch) or ``"thread"``;
    * ``output``: ``"torch"`` (default when torch is installed) or ``"numpy"``;
    * ``seed``: makes sampling and every sample's RNG a function of (seed, epoch,
      index), identical for any worker count (a ``generator`` does the same);
    * ``fetch_threads``: samples fetched at once inside each worker (slow storage; map-style
      datasets, as an iterable one's worker reads one iterator);
      default 1, or ``"auto"`` with ``num_workers="auto"`` (as is ``prefetch_factor``
      left unset): pass a number to pin it;
    * ``on_error`` / ``max_failures``: ``"skip"`` leaves bad samples out of their batch, up
      to a count, or a fraction of the samples seen so far (rounded up: one bad sample in
      the first batch is not yet a rate); 1% unless given, so that a pipeline whose
      samples all fail still stops, with the first failure's traceback (an error in
      ``collate_fn`` is raised: it is no bad sample);
    * ``prefetch_factor`` left unset: a process worker's tiny batches (under 32 KB, made in
      well under a millisecond) travel in groups of up to 8, one order and one message back
      a group (``executors/grouping.py``), and a worker holds 2 groups; a number counts
      batches, as torch's does;
    * ``max_worker_restarts``: dead process workers are replaced, their batches re-issued;
    * ``restart_hung``: with ``timeout``, a process worker stuck on a batch longer than
      that is killed and replaced (counted against ``max_worker_restarts``) instead of
      raising;
    * ``device`` / ``device_depth``: batches arrive already on ``device`` (e.g. ``"cuda"``),
      copied ``device_depth`` ahead on a side stream (see ``DevicePrefetcher``); on a CUDA
      device, process workers' batches are copied from their page-locked slots, with or
      without ``pin_memory``;
    * ``adaptive``: off by default, so that ``num_workers=N`` runs N workers making every
      batch, as torch's. ``True`` (an opt-in) makes N a ceiling: batches that cost less in
      the main process than a trip from a worker are made there, and workers start only
      when they pay off. ``num_workers="auto"`` adapts so and chooses the count too.
      Workers the user set that cost more than they save are kept, with one
      ``SlowSettingWarning`` after an epoch.

    >>> loader = DataLoader(list(range(10)), batch_size=4, output="numpy")
    >>> [b.tolist() for b in loader]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    _frozen = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
    # torch's DataLoader, this class's base when torch is installed (see _public_class), makes
    # these read-only properties of its own state; plain values here put them in the
    # instance's __dict__, where this class's __init__, copies and pickles keep them
    multiprocessing_context: Any = None
    _auto_collation: bool = False

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[int]] | Iterable[list[int]] | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | str | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_type: str = "process",
        output: str | None = None,
        seed: int | None = None,
        fetch_threads: int | str | None = None,
        on_error: str = "raise",
        max_failures: int | float = 0.01,
        max_worker_restarts: int = 3,
        adaptive: bool = False,
        restart_hung: bool = False,
        device: Any = None,
        device_depth: int = 2,
    ) -> None:
        self._initialized = False
        settings = config.resolve(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                                  batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                                  pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                                  worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                                  generator=generator, prefetch_factor=prefetch_factor,
                                  persistent_workers=persistent_workers, pin_memory_device=pin_memory_device,
                                  in_order=in_order, worker_type=worker_type, output=output, seed=seed,
                                  fetch_threads=fetch_threads, on_error=on_error, max_failures=max_failures,
                                  max_worker_restarts=max_worker_restarts, adaptive=adaptive,
                                  restart_hung=restart_hung, device=device, device_depth=device_depth)
        for name, value in settings.items():
            setattr(self, name, value)
        self._epoch = 0
        self._resume: dict[str, Any] | None = None
        # the global RNGs a sampler without state_dict draws from (replay.Mark); None: not seen yet
        self._rng_use: frozenset[str] | None = None
        self._loaded: dict[str, Any] | None = None
        self._ended: dict[str, Any] | None = None  # where the last run stopped (see Run.where)
        self._len_called: int | None = None
        self._ranks_checked = False  # (_check_ranks)
        self._device_args = None if device is None else (device, device_depth)
        self._start_runtime()
        self._initialized = True
        if self.num_workers > 0:
            self._check_worker_count()

    # -- torch's guards -----------------------------------------------------
    def __setattr__(self, attr: str, val: Any) -> None:
        if getattr(self, "_initialized", False):
            if attr in self._frozen:
                raise ValueError(f"{attr} attribute should not be set after {type(self).__name__} is initialized")
            if attr == "multiprocessing_context":  # checked and made a context, as torch's setter does
                val = check_start_method(val, self.num_workers, self.worker_type)
            if attr == "generator" and self._seed_of_generator:
                # torch draws the workers' seeds from whatever generator the loader has then
                if _torch.is_generator(val):
                    super().__setattr__("seed", generator_seed(val))
                else:
                    super().__setattr__("seed", None)
                    super().__setattr__("_seed_of_generator", False)
            if not attr.startswith("_"):
                self.__dict__["_inline"] = None  # the next epoch's pool sees the new setting
                self.__dict__["_findings"].forget()  # and probes again
        super().__setattr__(attr, val)

    def _check_worker_count(self) -> None:
        cpus = usable_cores()  # as torch's warning counts: the process's, not its rank's share
        if self.num_workers > cpus and self.worker_type == "process":
            warnings.warn(
                f"This DataLoader will create {self.num_workers} worker processes in total. This "
                # (the words after the colon are torch's warning's: users' filters and torch's own
                # tests match on them)
                f"process may use at most {cpus} CPUs: excessive worker creation might get DataLoader "
                "running slow or even freeze; lower num_workers (or try num_workers='auto').", stacklevel=3)

    # torch's private names that tools read (Lightning resets ``_iterator`` when a loop ends,
    # torchdata's helpers read ``_dataset_kind``)
    def _get_iterator(self) -> Iterator[T]:
        """A new iterator, as torch's loader makes in ``iter()`` (never torch's own)."""
        return self.__iter__()

    def check_worker_number_rationality(self) -> None:
        """Warn when ``num_workers`` is more than the cores this process may use, as torch does."""
        self._check_worker_count()

    @property
    def _dataset_kind(self) -> int:
        """torch's ``_DatasetKind``: 0 for a map-style dataset, 1 for an iterable one."""
        return 1 if self._iterable else 0

    @property
    def _IterableDataset_len_called(self) -> int | None:  # noqa: N802 - torch's name
        """The dataset length ``len(loader)`` read for an iterable dataset, else None."""
        return self._len_called

    @property
    def _iterator(self) -> Any:
        """The epoch persistent workers are serving (torch keeps one iterator), else None."""
        run = self._last_run
        live = self.persistent_workers and self._persistent is not None and run is not None and not run.finished
        return run if live else None

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        if value is not None:
            raise ValueError(f"_iterator can only be reset to None, got {value!r:.80}")
        self.close()  # torch's next iter() then makes new workers: so does this loader's

    def _start_runtime(self) -> None:
        """What a loader owns rather than describes: workers (none yet), statistics, memory
        kept for reuse, the device stage. Made anew for a copy or an unpickled loader."""
        self._persistent: Pool | None = None
        self._inline: Pool | None = None  # the main-process pool every epoch shares (_inline_pool)
        self._runs: weakref.WeakSet[Run[T]] = weakref.WeakSet()
        self._stats = Stats()
        self._tuner: Any = None  # "auto"'s tuner: one for every epoch, as workers may not persist
        # weak: the run refers to its loader, and a cycle would keep workers alive until gc
        self._last_ref: weakref.ref[Run[T]] | None = None
        self._last_pool: Pool | None = None  # for stats() after the run is gone
        self._recycler = Recycler()  # memory of large main-process batches the user has dropped
        # descriptors open before this loader's main process first touched the dataset (files
        # it opens since are made private to each forked worker: executors/inherit.py)
        self._fd_mark: list[dict[int, tuple[int, int]] | None] = []
        self._forked: list[bool] = []  # a pool of this loader has started process workers
        self._findings = rules.Findings()  # what adaptive pools found, for the next epochs' pools
        self._warned_slow = False  # SlowSettingWarning given (once a loader)
        self._slot_pinner = pinner(self)
        self._device_stage: Any = None
        self._pipe_group: Any = None  # the gloo group a DataPipe's shuffle seed is shared over (__iter__)
        if self._device_args is not None:
            from .device import DevicePrefetcher, pin

            device, depth = self._device_args
            # weak references back to the loader: a cycle would leave it (and its workers) to
            # the cycle collector, which a gc.freeze() held for fork workers keeps away
            me = weakref.ref(self)

            def where() -> Any:
                loader = me()
                return position.position(loader) if loader is not None else None

            self._device_stage = DevicePrefetcher(
                weakref.proxy(self), device, depth=depth, pinner=self._slot_pinner or pin,
                track_state=True, state_fn=where)

    _RUNTIME = ("_persistent", "_inline", "_runs", "_stats", "_tuner", "_last_ref", "_last_pool",
                "_recycler", "_slot_pinner", "_device_stage", "_pipe_group")

    def __getstate__(self) -> dict[str, Any]:
        """Its arguments and position, as torch's loader pickles (its dataset, sampler and
        collate_fn must pickle); workers, statistics and the device stage are made anew.
        Taken mid-epoch, the copy resumes that epoch where it is (its ``state_dict()``),
        when the sampler can say its position; otherwise it starts the next epoch."""
        state = self._arguments()
        run = self._last_run
        if run is not None and not run.finished:
            try:
                state["_copied_position"] = self.state_dict()
            except (TypeError, ValueError):
                pass
        return state

    def __copy__(self) -> DataLoader[T]:
        """A shallow copy shares the sampler and generator, so it does not take a running
        epoch's position (loading it would move the original's sampler): it starts afresh."""
        clone = self.__class__.__new__(self.__class__)
        clone.__dict__.update(self._arguments())
        clone._start_runtime()
        return clone

    def _arguments(self) -> dict[str, Any]:
        """What a copy takes: everything but the runtime state (``_RUNTIME``)."""
        return {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME}

    def __setstate__(self, state: dict[str, Any]) -> None:
        copied = state.pop("_copied_position", None)
        self.__dict__.update(state)
        self._start_runtime()
        if copied is not None:
            self.load_state_dict(copied)

    # -- sizes --------------------------------------------------------------
    @property
    def _index_sampler(self) -> Any:
        if self._iterable:
            return self.sampler
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            length = len(self.dataset)
            self._len_called = length
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    # -- iteration ----------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        if not self._stats.began:
            if self.output == "torch" or self.seed is None:
                # this iter() needs torch (tensors; torch's draw of the workers' base seed):
                # imported before the clock starts, and timed apart. Inside, its seconds would
                # be the first batch's, and report() would call them the workers' start-up
                # (docs/decisions/torch-import-outside-the-clock.md)
                self._stats.torch_import_s = _torch.import_s()
            # the clock of first_batch_s, throughput and the trace starts here, not when the loader
            # was made: the model built and moved meanwhile (seconds) would read as the workers' start-up
            self._stats.begin()
        else:
            self._stats.run_start()  # the time since the last epoch (or a break) is no step
        if not self._ranks_checked:
            self._check_ranks()
        epoch, skip, base_seed, done, replicas = self._epoch, 0, None, [], None
        persistent = self.persistent_workers and self.num_workers > 0
        replayed = None
        undo = (self._epoch, None, self._ended)  # what a run dropped before its first batch gives back
        pipe_seed = None
        if self._iterable and self.seed is None and _torch.is_datapipe(self.dataset):
            # a DataPipe's shuffles: one draw at every iter(), before the workers' base seed is
            # drawn (as torch's loader draws them), so that torch.manual_seed(s) before each
            # epoch repeats its order, with persistent workers (no new base seed) too
            torch = _torch.get()
            assert torch is not None
            drawn = torch.empty((), dtype=torch.int64).random_(generator=self.generator)
            if group_world_size() > 1:
                # every rank shuffles alike, then takes its shard: rank 0's draw, as torch's
                # loader broadcasts it (over a gloo group: the default one may be NCCL's)
                dist = torch.distributed
                if self._pipe_group is None:
                    self._pipe_group = dist.new_group(backend="gloo")
                dist.broadcast(drawn, src=0, group=self._pipe_group)
            pipe_seed = int(drawn.item())
        if self._resume is not None:
            position.check_replicas(self, self._resume)
            resume, self._resume = self._resume, None
            if not resume["finished"]:  # (an ended epoch's draws are replayed once, here)
                undo = (self._epoch, resume, self._ended)
            epoch, skip, base_seed = resume["epoch"], resume["batches"], resume.get("base_seed")
            done, replicas = resume.get("done") or [], resume.get("replicas")
            replayed = resume.get("replayed")
            if resume["finished"]:
                # the saved epoch had ended: replay its draws (no fetching) and go on to the next
                if self._own_sampler and self.seed is not None and hasattr(self.sampler, "set_epoch"):
                    self.sampler.set_epoch(epoch)
                if replayed is not None:
                    position.replay_ended(self, replayed)
                elif not self._iterable and resume["replay"]:
                    for _ in self._index_sampler:
                        pass
                epoch, skip, done, replicas, replayed = epoch + 1, 0, [], None, None
                if not persistent:
                    base_seed = None  # torch draws a new one for every iterator
        self._epoch = epoch + 1
        if self._own_sampler and self.seed is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        for old in list(self._runs):
            old.order.run_out()
        # torch's iterator that starts workers draws a DataPipe seed once more once they are
        # started (its own copy's, unused by them): drawn here too, so the generator (or the
        # global RNG) goes on as torch's does and the next epoch's order is torch's too
        redraw = pipe_seed is not None and self.num_workers > 0 and not (
            persistent and self._persistent is not None and not self._persistent.dead)
        if persistent:
            if self._persistent is None or self._persistent.dead:
                self._persistent = Pool(self, base_seed if base_seed is not None
                                               else self._draw_base_seed(epoch))
            pool = self._persistent
            taken = list(self._runs)
            for run in taken:
                run._abandon()
        else:
            seed = base_seed if base_seed is not None else self._draw_base_seed(epoch)
            pool = self._inline_pool(seed)
        if redraw:
            torch = _torch.get()
            assert torch is not None
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        run = Run(self, pool, epoch, skip, owns_pool=not persistent and pool is not self._inline, done=done,
                   replicas=replicas, replayed=replayed)
        run.origin.undo = undo
        run.origin.pipe_seed = pipe_seed
        if persistent:
            # torch's loader has one iterator over persistent workers, which iter() resets: an
            # iterator taken before goes on with the new epoch (a batch peeked at mid-epoch,
            # zip(loader, loader)), where ending it would shorten the epoch without a word
            for old in taken:
                old.successor = run
        self._runs.add(run)
        self._last_ref = weakref.ref(run)
        self._last_pool = pool  # closed with its run; kept for stats()
        if self._device_stage is not None:
            run.pin = None  # the device thread pins (and copies) each batch
            if pool.mode == Mode.WORKERS and pool.num_workers and not pool.started and not pool.dead:
                # workers known to be needed fork here, in the caller's thread, as torch's do
                # in iter(), not from the device thread while the caller's thread runs on
                pool.executor  # noqa: B018 - starts them
            return self._device_stage.wrap(run, exclusive=persistent)
        return run

    def _check_ranks(self) -> None:
        """Under torch.distributed with more than one rank, a map-style dataset read through a
        sampler that is not a distributed one gives every rank the whole dataset: say so, once.
        (Streams shard themselves, or not, inside their own ``__iter__``: a ShardedIterable
        does, DataPipes are sharded across ranks by the loader, and others cannot be told.)"""
        world = group_world_size()
        if world <= 1:
            return  # (asked again at the next iter(): the group may be made later)
        self._ranks_checked = True  # the samplers cannot change (they are frozen attributes)
        if self._iterable or gives_rank_shares(self.sampler) or gives_rank_shares(self.batch_sampler):
            return
        given_batches = self.batch_size is None and self.batch_sampler is not None  # batch_sampler= was given
        shown = self.batch_sampler if given_batches else self.sampler
        warnings.warn(
            f"conveyor: torch.distributed runs {world} ranks, but this DataLoader's sampler "
            f"({type(shown).__name__}) is not a distributed one: every rank will see the whole dataset. "
            "Give each rank its share with sampler=conveyor.DistributedSampler(dataset) (or torch's "
            "DistributedSampler), and call its set_epoch(epoch) every epoch.", UserWarning, stacklevel=3)

    def _inline_pool(self, base_seed: int) -> Pool:
        """The pool of a run without workers. One made in the main process alone (no workers,
        no "auto", no fetch threads, a map-style dataset) holds nothing to close and serves
        every epoch: making one each epoch costs ~15 us, a real share of an epoch of in-memory
        arrays. So does an "auto" pool once its choice of the main process is pinned
        (``Pool.serves_every_epoch``). Setting any public attribute of the loader drops it
        (see ``__setattr__``)."""
        shareable = (self.num_workers == 0 and self._auto is None and self.fetch_threads == 1
                     and not self._iterable)
        pool = self._inline
        if shareable:
            if pool is None or pool.dead:
                pool = self._inline = Pool(self, base_seed)
        elif pool is None or not pool.serves_every_epoch():  # "auto"'s, handed over by Run._finish
            return Pool(self, base_seed)
        pool.base_seed = base_seed  # torch draws one for every iterator; runs keep their own
        return pool

    def _draw_base_seed(self, epoch: int) -> int:
        # torch draws the workers' base seed from loader.generator (or the global RNG) for
        # every new iterator; doing the same keeps shuffled orders identical to torch's.
        if self.seed is not None and not _torch.is_generator(self.generator):
            return rng.mix(self.seed, epoch, 0x5EED) >> 1
        torch = _torch.get()
        if torch is not None:
            return int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        import numpy as np

        return int(np.random.randint(0, 2**62))

    def _spec(self, base_seed: int) -> WorkerSpec:
        # ``gather`` is a protocol a dataset opts into with ``gatherable = True`` (ArrayDataset
        # does): a tensor used as the dataset, or a dataset with some other ``gather``
        # method, goes through ``__getitem__`` as it does with torch
        gather = (self._default_collate and self._auto_collation and not self._iterable
                  and self.on_error == "raise" and getattr(self.dataset, "gatherable", False) is True
                  and callable(getattr(self.dataset, "gather", None)))
        return WorkerSpec(
            dataset=self.dataset,
            collate_fn=self.collate_fn,
            auto_collation=self._auto_collation,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            iterable=self._iterable,
            num_workers=self.num_workers,
            base_seed=base_seed,
            seed=self.seed,
            worker_init_fn=self.worker_init_fn,
            fetch_threads=self.fetch_threads,
            on_error=self.on_error,
            gather=gather,
            output=self.output,
            default_collate=self._default_collate,
            rank_world=rank_and_world() if self._iterable else None,
        )

    @property
    def _last_run(self) -> Run[T] | None:
        return self._last_ref() if self._last_ref is not None else None

    # -- introspection ------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-stage timings, wait fraction, per-worker fetch times, throughput and failures.

        Totals over every epoch since the first iter(): ``batches``, ``samples``, ``epochs``;
        ``wait_s`` (time inside ``next()``; ``first_waits_s`` of it for each epoch's first
        batch), ``step_s`` over ``steps`` (the loop's time between two batches of one epoch),
        ``wait_fraction`` = wait / (wait + step); ``elapsed_s``, the loader's time: from the
        first iter() to now, or to the end of the last epoch (or the last batch of one left
        early, once its iterator is gone, or close()), less the time between epochs, so
        ``throughput_*`` and the workers' ``busy_fraction`` read later hold still.
        ``workers`` maps a worker id (``-1``: the main process) to its batches, fetch, collate,
        busy and CPU seconds. ``main_process_batches`` counts the batches the current pool
        made in the main process (a pool of workers that do not persist lives one epoch;
        ``workers[-1]`` counts every epoch's). ``tuning``: what "auto" chose, and why.
        """
        if self._last_run is None:
            self._stats.pause()  # no iterator left (an epoch left early): its clock holds
        snap = self._stats.snapshot()
        snap["num_workers"] = self.num_workers
        snap["worker_type"] = self.worker_type if self.num_workers else "inline"
        snap["prefetch_factor"] = self.prefetch_factor
        snap["fetch_threads"] = self.fetch_threads
        run = self._last_run
        pool = self._persistent or (run.pool if run is not None else self._last_pool)
        snap["main_process_batches"] = pool.inline_batches if pool is not None else 0
        snap["workers_started"] = bool(pool is not None and pool.launched)
        snap["iterable"] = self._iterable  # (report: a stream's worker reads one iterator, no fetch threads)
        # (report: nor can fetch threads share a batch that __getitems__ makes in one call)
        snap["batch_getitems"] = self._auto_collation and not self._iterable and fetches_batches(self.dataset)
        snap["in_order"] = self.in_order
        snap["persistent_workers"] = self.persistent_workers
        snap["keeps_files"] = False  # (report: fetch threads of a worker would share its open files)
        if pool is not None:
            # workers that started count, also while the pool still probes (else a short epoch of
            # thread workers reads as num_workers=0, and report() advises what was set already)
            snap["num_workers"] = pool.num_workers if pool.mode == Mode.WORKERS or pool.launched else 0
            snap["fetch_threads"] = pool.threads
            snap["prefetch_factor"] = pool.prefetch if pool.num_workers else None
            snap["keeps_files"] = pool.probe._keeps_files
            pool.probe.describe(snap, self._auto, {name: getattr(self, name) for name in
                                                   ("num_workers", "fetch_threads", "prefetch_factor")})
        return snap

    def _warn_if_workers_lose(self) -> None:
        """After an epoch: warn once if the user's own num_workers cost more than they save
        (``report.workers_lose``). The setting stands; "auto" needs no warning, it chooses."""
        if self._warned_slow or self._auto is not None or self.num_workers == 0:
            return
        from .report import workers_lose

        words = workers_lose(self.stats())
        if words is not None:
            self._warned_slow = True
            warnings.warn(f"conveyor: {words} (loader.report() says more)", SlowSettingWarning, stacklevel=4)

    def tuning(self) -> dict[str, Any] | None:
        """What ``"auto"`` settled on: num_workers, fetch_threads, prefetch_factor, the
        ``reason`` and whether it ``settled``; ``kwargs`` holds the three settings alone, to
        pass back instead of ``"auto"`` for a reproducible run:
        ``DataLoader(dataset, batch_size=..., **loader.tuning()["kwargs"])``. None without
        "auto".
        """
        return self.stats().get("tuning")

    def report(self) -> str:
        """One sentence on where the time goes and what to change."""
        from .report import report

        snap = self.stats()
        if _no_core_left():
            snap["shared_cores"] = rules.ranks_words()  # (only the report says it: stats() stays numbers)
        return report(snap)

    # -- checkpointing ------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-JSON position of this loader: resume with :meth:`load_state_dict`.

        With ``device=``, the position is that of the last batch the consumer
        received (not of the batches waiting on the device).

        >>> loader = DataLoader(list(range(10)), batch_size=2, output="numpy")
        >>> it = iter(loader); _ = next(it)
        >>> loader.state_dict()["batches"]
        1
        """
        if self._device_stage is not None:
            return self._device_stage.state_dict()
        return position.position(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the rest of the interrupted epoch, then the same epochs after."""
        position.load(self, state)

    # -- shutdown -----------------------------------------------------------
    def close(self) -> None:
        """Stop every worker and free shared memory. Idempotent; running iterations end, and
        iterating the loader again starts it afresh (new workers)."""
        if self._device_stage is not None:
            self._device_stage.reset()
        for run in list(self._runs):
            run.close()
        self._stats.pause()  # stats() read after close() holds still
        if self._persistent is not None:
            self._persistent.close()
            self._persistent = None
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        self._recycler.clear()
        rng_lock.put_back()
        finish_cut_short()  # closes a Ctrl-C cut short in a finalizer, this loader's or another's

    def __enter__(self) -> DataLoader[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._persistent is not None:
                self._persistent.close()
        except Exception:
            pass


# The class users get: torch's DataLoader's subclass when torch is installed, so that trainers
# that test isinstance (Lightning, accelerate) take it for one, else the class above. It is
# made at its first use, not when conveyor is imported: torch takes 1-2 s to import, which a
# numpy pipeline, or a spawned worker (which imports conveyor, never the loader class), would
# pay for nothing. torch's __init__ never runs: the class above shadows every name torch's
# sets or defines (its properties, __setattr__, __iter__, __len__, _get_iterator,
# check_worker_number_rationality) and keeps its own state in its own attributes.
_Loader = DataLoader
if not TYPE_CHECKING:
    del DataLoader
_made: type | None = None
_making = threading.Lock()


def _torch_base() -> type | None:
    if not _torch.available():
        return None
    try:
        from torch.utils.data import DataLoader as base
    except ImportError:  # torch blocked or broken: the numpy core still works
        return None
    return base  # type: ignore[no-any-return]


def _public_class() -> type:
    global _made
    with _making:
        if _made is None:
            base = _torch_base()
            if base is None:
                _made = _Loader
            else:
                _Loader.__qualname__ = _Loader.__name__ = "_Loader"  # the name is the subclass's
                class DataLoader(_Loader[T], base[T]):  # type: ignore[misc, valid-type]
                    __doc__ = _Loader.__doc__
                    # its own __init__, so that tools that wrap each subclass's __init__ to
                    # record its arguments (Lightning does, to rebuild loaders) find it
                    __init__ = _Loader.__init__

                DataLoader.__module__ = __name__
                DataLoader.__qualname__ = "DataLoader"
                _made = DataLoader
            globals()["DataLoader"] = _made
        return _made


def __getattr__(name: str) -> Any:
    if name == "DataLoader":
        return _public_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if sys.version_info < (3, 11):  # pragma: no cover
    raise ImportError("conveyor needs Python 3.11 or newer")
