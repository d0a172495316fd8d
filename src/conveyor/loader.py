"""DataLoader: wires sampler -> executor -> reorder -> (pin) -> user.

::

    batch sampler --Task(seq, epoch, indices)--> executor (inline | threads | processes)
    user <-- pin <-- decode <-- Reorder(seq) <-- Result(seq, batch | failure, timings)

The loader makes every task in the main process, so its position in an epoch
is simply how many batches it has handed out; that is what ``state_dict()``
stores. Executors, recovery and ordering live in ``conveyor.executors``; this
module only decides what to ask for, and when.
"""

from __future__ import annotations

import array
import base64
import collections
import dataclasses
import hashlib
import itertools
import math
import operator
import pickle
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from . import _torch, replay, rng
from .collate import default_collate, default_convert, numpy_collate
from .distributed import ShardedIterable, gives_rank_shares, group_world_size, rank_and_world
from .errors import Failure, SlowSettingWarning, TooManyFailures, capture, rebuild
from .executors import inherit
from ._platform.signals import hold_ctrl_c
from .executors.grouping import Grouping
from .executors.inline import InlineExecutor
from .executors.processes import ProcessExecutor, finish_cut_short
from .executors.recovery import Recovery
from .executors.reorder import Reorder
from .executors.sched import runqueue_wait as _runqueue_wait
from .executors.task import Death, Result, Task
from .executors.threads import ThreadExecutor
from .executors.fetcher import Fetcher, fetches_batches
from .executors.seeding import rng_lock
from .executors.worker import WorkerSpec
from .samplers import BatchSampler, RandomSampler, Sampler, SequentialSampler
from .stats import INLINE, Stats
from .tuning import IO_BOUND, MAX_THREADS, Tuner
from .tuning import cpu_share as _cores
from .tuning import no_core_left as _no_core_left
from .tuning import ranks_here
from .tuning import usable_cores
from ._tree import tree_map
from .transport import to_numpy
from .transport.recycle import Recycler

__all__ = ["DataLoader", "TooManyFailures", "STATE_VERSION"]

T = TypeVar("T")
STATE_VERSION = 1
_TICK = 1.0  # seconds between liveness checks while waiting
# A batch that costs less than this in the main process is cheaper to make there
# than to receive from a worker (pickle, pipe, wake-ups, ~100 us of the main process's
# time a batch, plus ~9 ms to fork each torch-sized worker): adaptive loaders keep it.
# On 2 cores, diabetes batches of 180-330 us ran 2x slower with workers than without.
INLINE_MAX_S = 500e-6
# ... or less than this many trips from a worker, where a trip costs more (a slower machine:
# see _trip_s). On an Intel Xeon VM where a diabetes batch's trip cost 73 us, 240 batches
# broke even at 800-850 us a batch (as the probe times it); 414 us batches ran 0.80x as
# fast with two workers, 860 us ones 1.12x.
TRIPS = 11
# A batch this slow is clearly worth a worker (two in a row: start them); a probing batch
# still running after this long starts them there and then (five times that: at once).
SLOW_S = 2e-3
# ... except after the very first batch, whose one-time costs (first calls into libraries,
# first touches of the data) pass SLOW_S on their own: a diabetes batch's reached 2.0-2.4 ms
# of CPU in fresh processes on a slow host (its later batches 0.4-0.7 ms) and forked the
# workers in 2 of 12 runs, each then twice as slow.
FIRST_SLOW_S = 5e-3
# A batch produced faster than this (bytes of arrays per second) is a memory copy: a worker
# would repeat the copy into shared memory and add a trip, so the main process keeps it.
# (Decoding JPEGs makes ~0.07 GB/s a core; copying arrays 1.5 GB/s into fresh pages, 10+
# into reused ones.)
INLINE_RATE = 1e9
# ... unless the training loop's step between batches is at least this share of a batch's
# cost: then workers make the copies beside the step, where the main process would add each
# to it (3x224x224 float32 batches of 32, 12 ms here, and a 20 ms step: 6.5-10 s an epoch of
# 200 made here, 4.2 s by 2 workers). A loop that only iterates keeps its copies here.
STEP_HIDES = 0.25
# The first probing batch also pays one-time costs: unless it mostly waits, it starts the
# workers only after this long (later ones after SLOW_S), so they overlap the rest of it.
EARLY_START_S = 0.025
# "auto" reads the stats every this many batches handed out (a snapshot costs ~50 us)
RETUNE_EVERY = 4
# Where the training processes leave no core for workers (tuning.no_core_left), a first batch
# starts them only if it kept the process this little busy: batches computing 1 ms a sample
# on 4 DDP ranks sharing 2 cores read 0.24-0.47 busy there, run-queue waits taken out.
CROWDED_WAITS = 0.2
# Workers that took longer than this many main-process batches, and this long, to start
# (spawned ones import afresh: 1.2-1.5 s with torch, for batches of ~10 ms) get a head start
# from the main process even with a worker per core: the training loop stood still for all
# of it, every epoch. (Forked ones start in ~20 ms.)
SLOW_START_BATCHES = 8
SLOW_START_S = 0.1


def _is_iterable_dataset(dataset: Any) -> bool:
    from .datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        return True
    torch = _torch.loaded()
    if torch is not None:
        from torch.utils.data import IterableDataset as TorchIterable

        if isinstance(dataset, TorchIterable):
            return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


class _Repeat:
    """The index sampler of an iterable dataset: 'the next batch', forever."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


def _check_start_method(context: Any, num_workers: int, worker_type: str) -> Any:
    import multiprocessing as mp

    if context is None:
        return None
    if num_workers <= 0:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={num_workers}")
    if worker_type == "thread":  # a start method for processes that never start: not dropped unsaid
        raise ValueError(f"multiprocessing_context is for process workers, but got "
                         f"multiprocessing_context={context!r} with worker_type='thread'")
    if isinstance(context, str):
        valid = mp.get_all_start_methods()
        if context not in valid:
            raise ValueError(
                f"multiprocessing_context option should specify a valid start method in {valid!r}, "
                f"but got multiprocessing_context={context!r}")
        return mp.get_context(context)
    if not isinstance(context, mp.context.BaseContext):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={context}")
    return context


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
        threads_asked = fetch_threads
        if type(num_workers) is not int and not isinstance(num_workers, str) and hasattr(num_workers, "__index__"):
            num_workers = operator.index(num_workers)  # numpy integers, 0-d tensors, bools: as torch takes them
        # prefetch_factor=N counts batches, as torch's; left unset, tiny batches may travel in
        # groups, and a worker then holds that many groups (executors/grouping.py)
        groups_ok = prefetch_factor is None or prefetch_factor == "auto"
        if num_workers == "auto":
            # "auto" tunes everything the user left unset: threads for storage that waits,
            # and how far ahead each worker runs
            fetch_threads = "auto" if fetch_threads is None else fetch_threads
            prefetch_factor = "auto" if prefetch_factor is None else prefetch_factor
        elif fetch_threads is None:
            fetch_threads = 1
        auto = {"num_workers": num_workers == "auto", "fetch_threads": fetch_threads == "auto",
                "prefetch_factor": prefetch_factor == "auto"}
        if auto["num_workers"]:
            num_workers = _cores()  # the most the tuner may start; it begins with none
        if auto["fetch_threads"]:
            if num_workers == 0:
                raise ValueError("fetch_threads='auto' needs num_workers > 0 or num_workers='auto'")
            fetch_threads = 1
        if auto["prefetch_factor"]:
            if num_workers == 0:
                raise ValueError("prefetch_factor='auto' needs num_workers > 0 or num_workers='auto'")
            prefetch_factor = 2
        if not isinstance(num_workers, int):
            raise TypeError(f"num_workers option should be an int, but got num_workers={num_workers!r}")
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None:
            if isinstance(prefetch_factor, bool):
                raise TypeError(f"prefetch_factor option should be an int, but got prefetch_factor={prefetch_factor!r}")
            try:
                prefetch_factor = operator.index(prefetch_factor)  # numpy integers too
            except TypeError:
                raise TypeError(f"prefetch_factor option should be an int, but got "
                                f"prefetch_factor={prefetch_factor!r}") from None
            if prefetch_factor <= 0:
                # torch accepts 0 here and then fails an assertion when iterated
                raise ValueError(f"prefetch_factor option should be positive, but got prefetch_factor={prefetch_factor}")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if worker_type not in ("process", "thread"):
            raise ValueError(f"worker_type must be 'process' or 'thread', but got worker_type={worker_type!r}")
        if output is None:
            output = "torch" if _torch.available() else "numpy"
        if output not in ("torch", "numpy"):
            raise ValueError(f"output must be 'torch' or 'numpy', but got output={output!r}")
        if output == "torch" and not _torch.available():
            raise ValueError("output='torch' needs torch: pip install 'conveyor[torch]', or use output='numpy'")
        if not isinstance(fetch_threads, int) or isinstance(fetch_threads, bool) or fetch_threads < 1:
            raise ValueError(f"fetch_threads must be a positive int, but got fetch_threads={fetch_threads!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', but got on_error={on_error!r}")
        if (isinstance(max_failures, bool) or not isinstance(max_failures, (int, float)) or max_failures < 0
                or math.isnan(max_failures)):
            raise ValueError(f"max_failures must be a non-negative count or fraction, got max_failures={max_failures!r}")
        if isinstance(max_failures, float) and max_failures > 1:
            raise ValueError(f"max_failures as a fraction must be at most 1, got max_failures={max_failures!r}")
        if not isinstance(max_worker_restarts, int) or max_worker_restarts < 0:
            raise ValueError(f"max_worker_restarts must be a non-negative int, got {max_worker_restarts!r}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int, but got seed={seed!r}")
        # torch takes these and fails at the first batch, with "'int' object is not callable"
        # and no name: say which argument, and now
        for name, fn in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} should be callable, but got {name}={fn!r:.100}")
        for name, order in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            # (a stream refuses any sampler, with torch's ValueError, below)
            if (order is not None and not (hasattr(order, "__iter__") or hasattr(order, "__getitem__"))
                    and not _is_iterable_dataset(dataset)):
                raise TypeError(f"{name} should be an iterable of indices (a Sampler, a list), "
                                f"but got {name}={order!r:.100}")
        if not any(hasattr(dataset, m) for m in ("__getitem__", "__getitems__", "__iter__")):
            raise TypeError("dataset should be a map-style dataset (with __getitem__) or an iterable one "
                            f"(with __iter__), but got dataset={dataset!r:.100}")

        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self._groups_ok = groups_ok
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = _check_start_method(multiprocessing_context, num_workers, worker_type)
        self.in_order = in_order
        self.worker_type = worker_type
        self.output = output
        self.fetch_threads = fetch_threads
        self.on_error = on_error
        self.max_failures = max_failures
        self.max_worker_restarts = max_worker_restarts
        self.adaptive = adaptive
        self.restart_hung = restart_hung
        self._auto = auto if any(auto.values()) else None

        iterable = _is_iterable_dataset(dataset)
        if iterable and threads_asked not in (None, 1):
            raise ValueError(f"fetch_threads needs a map-style dataset (samples fetched by index); an iterable "
                             f"dataset's samples come from one iterator per worker, but got "
                             f"fetch_threads={threads_asked!r}")
        if iterable and self._auto is not None:
            self._auto["num_workers"] = False  # replicas shard by worker count: it cannot change
            self._auto["fetch_threads"] = False  # and one iterator a worker is read by one thread
            if not any(self._auto.values()):
                self._auto = None
        if iterable and _torch.is_datapipe(dataset):
            # torch's (deprecated) DataPipes: shuffle= sets their shufflers, as torch's loader does;
            # each process worker shards its copy. Thread workers share one pipe: no shards.
            if shuffle is not None:
                from torch.utils.data import graph_settings

                dataset = graph_settings.apply_shuffle_settings(dataset, shuffle=bool(shuffle))
                shuffle = None
            if worker_type == "thread" and num_workers > 1:
                raise ValueError("a DataPipe is sharded across process workers, each with its own copy: "
                                 "use worker_type='process' (or num_workers=1)")
        if iterable:
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, "
                                 f"but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, "
                                 f"but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler "
                                 f"option, but got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, "
                                 "sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None:
            if drop_last:
                raise ValueError("batch_size=None option disables auto-batching and is mutually "
                                 "exclusive with drop_last")

        self._seed_of_generator = seed is None and _torch.is_generator(generator)
        if self._seed_of_generator:
            seed = _generator_seed(generator)
        self.seed = seed
        self._own_sampler = sampler is None and not iterable
        if sampler is None:
            if iterable:
                sampler = _Repeat()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator, seed=seed if generator is None else None)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self._iterable = iterable
        self._auto_collation = batch_size is not None if iterable else batch_sampler is not None
        if self._auto_collation and not iterable and fetches_batches(dataset):
            # its __getitems__ makes each batch in one call: no samples for threads to share (a
            # warning, not an error: one setting for many datasets is common)
            if threads_asked not in (None, 1, "auto"):
                warnings.warn(f"fetch_threads={threads_asked!r} does nothing here: fetch threads share a batch's "
                              "samples, fetched one index at a time, and this dataset makes each batch in one call "
                              "of its __getitems__ (num_workers makes more batches at once)", stacklevel=2)
                self.fetch_threads = 1
            if self._auto is not None:
                self._auto["fetch_threads"] = False
                if not any(self._auto.values()):
                    self._auto = None
        if self._auto_collation:
            default_fn = default_collate if output == "torch" else numpy_collate
        else:
            default_fn = default_convert if output == "torch" else to_numpy
        # the default given back (a trainer rebuilding a loader from its attributes, as Lightning
        # does) is the default: its fast paths (bulk gathers, no conversion) stay
        self._default_collate = collate_fn is None or collate_fn is default_fn
        self.collate_fn = default_fn if collate_fn is None else collate_fn
        self.persistent_workers = persistent_workers
        self._epoch = 0
        self._resume: dict[str, Any] | None = None
        # the global RNGs a sampler without state_dict draws from (replay.Mark); None: not seen yet
        self._rng_use: frozenset[str] | None = None
        self._loaded: dict[str, Any] | None = None
        self._ended: dict[str, Any] | None = None  # where the last run stopped (see _Run.where)
        self._len_called: int | None = None
        self._ranks_checked = False  # (_check_ranks)
        self._device_args = None if device is None else (device, device_depth)
        self._start_runtime()
        self._initialized = True
        if num_workers > 0:
            self._check_worker_count()

    # -- torch's guards -----------------------------------------------------
    def __setattr__(self, attr: str, val: Any) -> None:
        if getattr(self, "_initialized", False):
            if attr in self._frozen:
                raise ValueError(f"{attr} attribute should not be set after {type(self).__name__} is initialized")
            if attr == "multiprocessing_context":  # checked and made a context, as torch's setter does
                val = _check_start_method(val, self.num_workers, self.worker_type)
            if attr == "generator" and self._seed_of_generator:
                # torch draws the workers' seeds from whatever generator the loader has then
                if _torch.is_generator(val):
                    super().__setattr__("seed", _generator_seed(val))
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
        self._persistent: _Pool | None = None
        self._inline: _Pool | None = None  # the main-process pool every epoch shares (_inline_pool)
        self._runs: weakref.WeakSet[_Run[T]] = weakref.WeakSet()
        self._stats = Stats()
        self._tuner: Any = None  # "auto"'s tuner: one for every epoch, as workers may not persist
        # weak: the run refers to its loader, and a cycle would keep workers alive until gc
        self._last_ref: weakref.ref[_Run[T]] | None = None
        self._last_pool: _Pool | None = None  # for stats() after the run is gone
        self._recycler = Recycler()  # memory of large main-process batches the user has dropped
        # descriptors open before this loader's main process first touched the dataset (files
        # it opens since are made private to each forked worker: executors/inherit.py)
        self._fd_mark: list[dict[int, tuple[int, int]] | None] = []
        self._forked: list[bool] = []  # a pool of this loader has started process workers
        self._findings = _Findings()  # what adaptive pools found, for the next epochs' pools
        self._warned_slow = False  # SlowSettingWarning given (once a loader)
        self._slot_pinner = _pinner(self)
        self._device_stage: Any = None
        self._pipe_group: Any = None  # the gloo group a DataPipe's shuffle seed is shared over (__iter__)
        if self._device_args is not None:
            from .device import DevicePrefetcher, pin

            device, depth = self._device_args
            # weak references back to the loader: a cycle would leave it (and its workers) to
            # the cycle collector, which a gc.freeze() held for fork workers keeps away
            me = weakref.ref(self)

            def position() -> Any:
                loader = me()
                return loader._position() if loader is not None else None

            self._device_stage = DevicePrefetcher(
                weakref.proxy(self), device, depth=depth, pinner=self._slot_pinner or pin,
                track_state=True, state_fn=position)

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
        position = state.pop("_copied_position", None)
        self.__dict__.update(state)
        self._start_runtime()
        if position is not None:
            self.load_state_dict(position)

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
                # imported before the clock starts, and timed apart. Inside, its ~1.7 s was
                # the first batch's, and report() called it the workers' start-up
                self._stats.torch_import_s = _torch.import_s()
            # the clock of first_batch_s, throughput and the trace starts here, not when the loader
            # was made: the model built and moved meanwhile (seconds) read as the workers' start-up
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
            self._check_replicas(self._resume)
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
                    self._replay_ended(replayed)
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
            old._run_out_sampler()
        # torch's iterator that starts workers draws a DataPipe seed once more once they are
        # started (its own copy's, unused by them): drawn here too, so the generator (or the
        # global RNG) goes on as torch's does and the next epoch's order is torch's too
        redraw = pipe_seed is not None and self.num_workers > 0 and not (
            persistent and self._persistent is not None and not self._persistent.dead)
        if persistent:
            if self._persistent is None or self._persistent.dead:
                self._persistent = _Pool(self, base_seed if base_seed is not None
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
        run = _Run(self, pool, epoch, skip, owns_pool=not persistent and pool is not self._inline, done=done,
                   replicas=replicas, replayed=replayed)
        run.undo = undo
        run.pipe_seed = pipe_seed
        if persistent:
            # torch's loader has one iterator over persistent workers, which iter() resets: an
            # iterator taken before goes on with the new epoch (a batch peeked at mid-epoch,
            # zip(loader, loader)), where ending it shortened the epoch without a word
            for old in taken:
                old.successor = run
        self._runs.add(run)
        self._last_ref = weakref.ref(run)
        self._last_pool = pool  # closed with its run; kept for stats()
        if self._device_stage is not None:
            run.pin = None  # the device thread pins (and copies) each batch
            if pool.mode == "workers" and pool.num_workers and not pool.started and not pool.dead:
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

    def _stream_rank_world(self) -> tuple[int, int]:
        """The (rank, world size) a stream is sharded by: a ShardedIterable's own, else this
        process's (what ``shard_iterable`` inside ``__iter__`` reads)."""
        if isinstance(self.dataset, ShardedIterable):
            return self.dataset.rank, self.dataset.world_size
        return rank_and_world()

    def _check_replicas(self, resume: dict[str, Any]) -> None:
        """A stream resumed mid-epoch must be read by as many replicas as it was saved from.

        Each worker's copy of an IterableDataset shards the stream by the worker count, and
        a stream cannot seek: the resumed epoch makes again the batches each replica had
        handed out and drops them. With another count the shards differ, and dropping by
        count lost and repeated samples without a word."""
        replicas = resume.get("replicas")
        if not self._iterable or resume["finished"] or not replicas:
            return
        now = max(1, self.num_workers)
        if len(replicas) != now:
            saved = f"num_workers={len(replicas)}" if len(replicas) > 1 else "num_workers=0 or 1"
            raise ValueError(
                f"this state was saved mid-epoch from an IterableDataset read by {len(replicas)} replica(s) "
                f"({saved}); this loader has num_workers={self.num_workers}, which shards the stream "
                f"otherwise: the batches already handed out cannot be found again. Resume with {saved}, "
                f"or from a state saved at an epoch's end")

    def _inline_pool(self, base_seed: int) -> _Pool:
        """The pool of a run without workers. One made in the main process alone (no workers,
        no "auto", no fetch threads, a map-style dataset) holds nothing to close and serves
        every epoch: making it cost ~15 us an epoch, a real share of an epoch of in-memory
        arrays. So does an "auto" pool once its choice of the main process is pinned
        (``_Pool.serves_every_epoch``). Setting any public attribute of the loader drops it
        (see ``__setattr__``)."""
        shareable = (self.num_workers == 0 and self._auto is None and self.fetch_threads == 1
                     and not self._iterable)
        pool = self._inline
        if shareable:
            if pool is None or pool.dead:
                pool = self._inline = _Pool(self, base_seed)
        elif pool is None or not pool.serves_every_epoch():  # "auto"'s, handed over by _Run._finish
            return _Pool(self, base_seed)
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
    def _last_run(self) -> _Run[T] | None:
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
            # workers that started count, also while the pool still probes (a short epoch of
            # thread workers read as num_workers=0, and report() advised what was set already)
            snap["num_workers"] = pool.num_workers if pool.mode == "workers" or pool.launched else 0
            snap["fetch_threads"] = pool.threads
            snap["prefetch_factor"] = pool.prefetch if pool.num_workers else None
            snap["keeps_files"] = pool._keeps_files
            cost = pool.findings.batch_s
            if not pool.launched and pool.mode == "inline" and pool._start_outweighs(cost):
                assert cost is not None
                snap["workers_not_started"] = _start_words(pool.findings, cost, pool.epoch_batches or 0)
            if pool.tuner is not None:
                # what "auto" chose for the settings it tunes; a setting the user fixed is
                # reported as it is (the tuner's decision may name another it may not apply)
                tuning = pool.tuner.decision().to_dict()
                for name in ("num_workers", "fetch_threads", "prefetch_factor"):
                    if not (self._auto or {}).get(name):
                        # the user's own setting, not what runs now: ``adaptive`` may keep the
                        # user's workers back while batches are cheap (it read num_workers=0
                        # beside prefetch_factor=2, which the constructor refuses)
                        tuning[name] = getattr(self, name)
                if pool.launched and (self._auto or {}).get("fetch_threads"):
                    # the threads that run: the tuner's wish goes through ThreadSteer, which
                    # damps cuts and undoes those that cost throughput
                    wish = tuning["fetch_threads"]
                    tuning["fetch_threads"] = snap["fetch_threads"]
                    if wish != snap["fetch_threads"] and tuning.get("reason"):
                        # the reason argues for the wish: say why another count runs (it read
                        # "32 threads a worker keep its core busy" beside fetch_threads=64)
                        tuning["reason"] += (f"; {snap['fetch_threads']} threads run, not {wish}: a cut goes "
                                             "at most halfway at a time and is undone if it costs throughput")
                if not tuning["num_workers"]:
                    tuning["prefetch_factor"] = None  # (what the constructor takes without workers)
                running = snap["num_workers"]
                if (pool.launched and pool.mode == "workers" and (self._auto or {}).get("num_workers")
                        and tuning["num_workers"] < running):
                    # workers are not stopped mid-run: those that run are what to pin (the
                    # tuner's smaller count, pinned, ran 1.81 s where what ran took 1.28 s)
                    wish, tuning["num_workers"] = tuning["num_workers"], running
                    if tuning.get("reason") and not pool.tuner.measuring:
                        # the reason argues for the wish (it read "memory allows 1" beside 2)
                        tuning["reason"] += (f"; {running} workers run, not {wish}: workers that started "
                                             "are kept to the end of the run")
                # the settings alone, to pass back as they are: DataLoader(ds, **tuning["kwargs"])
                tuning["kwargs"] = {name: tuning[name] for name in ("num_workers", "fetch_threads", "prefetch_factor")}
                snap["tuning"] = tuning
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
            snap["shared_cores"] = _ranks_words()  # (only the report says it: stats() stays numbers)
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
        return self._position()

    def _position(self) -> dict[str, Any]:
        if self._resume is not None and self._loaded is not None:
            return dict(self._loaded)  # loaded and not iterated yet: still that position
        run = self._last_run
        if run is not None and not run.finished:
            run.begin()
        where = run.where(take_in=True) if run is not None and not run.finished else self._ended
        state: dict[str, Any] = {"version": STATE_VERSION, "dataset_len": self._dataset_len(), "seed": self.seed,
                                 "batch_size": None if self.batch_size is None else int(self.batch_size),
                                 "drop_last": bool(self.drop_last)}
        if self._iterable:
            state["rank_world"] = list(self._stream_rank_world())
        gen = self.generator
        gstate = None
        if where is None:  # nothing iterated yet: the next epoch starts afresh
            state.update(epoch=self._epoch, batches=0, replay=False, sampler=None)
            gstate = gen.get_state() if _torch.is_generator(gen) else None
        else:
            if where["finished"] or self._handed_all(where["batches"]):
                # the next epoch starts afresh, after replaying (without fetching) the draws of
                # the one that ended, which is what the sampler's state describes. An epoch
                # whose every batch was handed out has ended too, StopIteration or not: a
                # trainer that counts len(loader) batches (Lightning) saves there and then
                # asks for the next epoch, as it would of this loader (torchdata's
                # StatefulDataLoader resumes such a state at the next epoch as well)
                state.update(epoch=where["epoch"] + 1, batches=0, replay=True)
            else:
                state.update(epoch=where["epoch"], batches=where["batches"], replay=False)
                for key in ("done", "replicas"):
                    if where.get(key):
                        state[key] = where[key]
            state.update(base_seed=where["base_seed"], sampler=self._sampler_state(where))
            if where.get("replayed") is not None:
                replayed = where["replayed"]
                state["replayed"] = dict(replayed, rngs=replay.as_json(replayed["rngs"]))
            gstate = where["generator"]
        if gstate is not None:
            state["generator"] = base64.b64encode(bytes(gstate.numpy().tobytes())).decode("ascii")
        return state

    def _handed_all(self, batches: int) -> bool:
        """True when ``batches`` handed out are all of a map-style epoch's."""
        if self._iterable:
            return False
        try:
            return bool(batches >= len(self._index_sampler))
        except TypeError:  # a sampler without a length
            return False

    def _sampler_state(self, where: dict[str, Any]) -> Any:
        """The index sampler's state: how its most recent iteration began (None for a sampler
        resumed by replaying: ``where["replayed"]`` holds how)."""
        if self._iterable or self._replays() or _is_stateless(self._index_sampler):
            return None
        return self._index_sampler.state_dict()

    def _replays(self) -> bool:
        """True when the index sampler keeps no state (torch's samplers, a list, a custom
        one): a resumed epoch replays it from the RNG states its iteration began with
        (``replay``)."""
        if self._iterable:
            return False
        sampler = self._index_sampler
        if getattr(sampler, "state_dict", None) is None or (
                isinstance(sampler, BatchSampler) and getattr(sampler.sampler, "state_dict", None) is None):
            return not _is_stateless(sampler)
        return False

    def _replay_ended(self, replayed: dict[str, Any]) -> None:
        """Draw the whole ended epoch again from its RNG states (no fetching), checking what
        it draws, so the next epoch draws as it would have after it.

        A sampler with ``set_epoch`` (torch's DistributedSampler) takes its epoch from the
        caller, who has set the next one by now: the replay draws that one, so it is not
        checked, and without generators of its own there is nothing for it to advance."""
        sampler = self._index_sampler
        told = callable(getattr(replay.inner(sampler), "set_epoch", None))
        if told and not replayed["rngs"].get("own"):
            return
        got = n = 0
        with replay.Replaying(replayed["rngs"], sampler):
            for b in sampler:
                got = replay.digest(got, b)
                n += 1
        problem = replay.check(sampler, replayed.get("digest"), got, n, int(replayed.get("batches", n)))
        if problem and not told:
            warnings.warn(problem, UserWarning, stacklevel=3)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the rest of the interrupted epoch, then the same epochs after."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a conveyor DataLoader state of version {STATE_VERSION}: {state!r:.200}")
        for run in list(self._runs):
            if not run.finished and run.yielded > 0:
                raise RuntimeError("load_state_dict() while an iterator of this loader is running: finish "
                                   "or abandon the epoch (or create a new loader) before loading a state")
        if self._device_stage is not None:
            self._device_stage.reset()  # an epoch begun but not yet handed out: dropped
        n = self._dataset_len()
        if state.get("dataset_len") != n:
            raise ValueError(f"this state was saved for a dataset of length {state.get('dataset_len')}, "
                             f"but this loader's dataset has length {n}")
        if state.get("seed") != self.seed:
            raise ValueError(f"this state was saved with seed={state.get('seed')}, this loader has seed={self.seed}")
        self._check_position(state)
        if int(state.get("batches") or 0) > 0:  # a position counted in batches: they must be the same batches
            for key in ("batch_size", "drop_last"):
                if key in state and state[key] != getattr(self, key):
                    raise ValueError(f"this state was saved mid-epoch with {key}={state[key]!r}, this loader has "
                                     f"{key}={getattr(self, key)!r}: its {state['batches']} batches handed out would "
                                     f"be other samples")
            saved = tuple(state["rank_world"]) if self._iterable and "rank_world" in state else None
            now = self._stream_rank_world() if saved is not None else None
            if saved is not None and saved != now:
                assert now is not None
                raise ValueError(f"this state was saved mid-epoch by rank {saved[0]} of {saved[1]}, and this loader "
                                 f"is rank {now[0]} of {now[1]}: a stream's share of each rank follows the world "
                                 "size, so the batches already handed out cannot be found again. Resume with "
                                 "the saved world size, or from a state saved at an epoch's end")
        sampler_state = state.get("sampler")
        replayed = state.get("replayed") if self._replays() else None
        if replayed is not None and not (isinstance(replayed, dict) and isinstance(replayed.get("rngs"), dict)):
            raise ValueError(f"state['replayed'] should hold the RNG states of a sampler without "
                             f"state_dict(), got {replayed!r:.200}")
        if sampler_state is not None:
            sampler = self._index_sampler
            load = getattr(sampler, "load_state_dict", None)
            if load is None:
                raise TypeError(f"{type(sampler).__name__} has no load_state_dict(): cannot resume its position")
            load(sampler_state)
        gen = self.generator
        if "generator" in state and _torch.is_generator(gen):
            torch = _torch.get()
            assert torch is not None
            raw = base64.b64decode(state["generator"])
            gen.set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        replay = bool(state.get("replay"))
        done = state.get("done") or []
        if not isinstance(done, list) or not all(isinstance(p, int) and p > int(state["batches"]) for p in done):
            raise ValueError(f"state['done'] should list batch positions after state['batches'], got {done!r:.200}")
        replicas = state.get("replicas")
        if replicas is not None and not (isinstance(replicas, list) and all(
                isinstance(c, int) and c >= 0 for c in replicas) and sum(replicas) == int(state["batches"])):
            raise ValueError(f"state['replicas'] should count the batches of each replica, got {replicas!r:.200}")
        self._resume = {"epoch": int(state["epoch"]) - replay, "batches": int(state["batches"]),
                        "base_seed": state.get("base_seed"), "finished": replay,
                        "replay": sampler_state is not None, "done": done, "replicas": replicas,
                        "replayed": replayed}
        self._loaded = dict(state)
        self._epoch = int(state["epoch"])

    def _check_position(self, state: dict[str, Any]) -> None:
        """Refuse a state that names no position this loader can reach (checked before any of
        it is taken): each was loaded, and the loader resumed elsewhere without a word."""
        total = None if self._iterable else _sized(self._index_sampler)  # batches in an epoch

        def whole(v: Any) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

        replay = state.get("replay", False)
        if not isinstance(replay, (bool, np.bool_)):
            raise ValueError(f"state['replay'] should be True or False, got {replay!r:.100}")
        batches = state.get("batches")
        if replay and (batches or state.get("done") or state.get("replicas")):
            raise ValueError(f"state['replay'] is True, which names an epoch's end, but state['batches'] is "
                             f"{batches!r:.100}" + (f" and state['done'] is {state.get('done')!r:.100}"
                                                    if state.get("done") else "")
                             + ": a state saved mid-epoch has replay False")
        epoch = state.get("epoch")
        low = 1 if replay else 0  # a replayed state names the epoch after the one it replays
        if not whole(epoch) or epoch < low:
            raise ValueError(f"state['epoch'] should be a whole number >= {low}"
                             + (" (state['replay'] is True: the epoch after the one replayed)" if replay else "")
                             + f", got {epoch!r:.100}")
        if not whole(batches) or batches < 0 or total is not None and batches > total:
            span = f"from 0 to {total} (the batches of an epoch)" if total is not None else ">= 0"
            raise ValueError(f"state['batches'] should be a whole number {span}, got {batches!r:.100}")
        done = state.get("done") or []
        last = None if total is None else total - 1
        if not isinstance(done, list) or not all(whole(p) and p > batches and (last is None or p <= last)
                                                 for p in done) or len(set(done)) != len(done):
            span = f"from {batches + 1} to {last}" if last is not None else f"after {batches}"
            raise ValueError(f"state['done'] should list batch positions {span} (handed out ahead of "
                             f"state['batches']={batches}), each once, got {done!r:.200}")
        self._check_sampler_seeds(state.get("sampler"), self._index_sampler, "state['sampler']")

    def _check_sampler_seeds(self, saved: Any, sampler: Any, path: str) -> None:
        """A seeded sampler's saved seed must be this loader's sampler's: another shuffled
        other samples, without a word."""
        while isinstance(saved, dict) and sampler is not None:
            if saved.get("mode") == "seed" and "seed" in saved:
                mine = getattr(sampler, "seed", None)
                if mine is not None and saved["seed"] != mine:
                    raise ValueError(f"{path}['seed'] is {saved['seed']!r:.100}, but this loader's sampler "
                                     f"({type(sampler).__name__}) has seed {mine}: it would shuffle other "
                                     "samples. Resume with the seed the state was saved with")
            saved, sampler, path = saved.get("sampler"), getattr(sampler, "sampler", None), f"{path}['sampler']"

    def _dataset_len(self) -> int | None:
        try:
            return len(self.dataset)
        except TypeError:
            return None

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


def _nbytes(batch: Any) -> int:
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


def _trip_s(batch: Any, output: str) -> float:
    """Seconds of this machine's CPU a trip from a process worker costs a batch shaped like
    ``batch`` (its envelope: encode, pickle, unpickle, decode), without moving its data (each
    array leaf stands in as one element of its dtype): the best of three. 0.0 for a batch
    it cannot time (what does not pickle is the workers' to report, not this estimate's)."""
    from .transport import Packed, Views, decode, encode

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
class _Findings:
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


class _ReadAhead:
    """A sampler's batches read ``len(head)`` ahead of the batches made, as torch's loader
    with workers reads them: it takes ``prefetch_factor * num_workers`` at iter() and one
    more for each batch it hands out. Batches made in the main process (adaptive, with the
    user's workers kept back) read the sampler only as far as the batch being made, so an
    epoch that ended without the StopIteration (``zip(range(len(loader)), loader)``, a
    trainer counting ``len(loader)`` batches, a break in its last few) never ran the sampler
    out: torch's RandomSampler draws one more permutation from the generator then, and every
    later epoch's order differed from torch's. While the pool's workers make the batches
    they read ahead as they are sent batches (``_Run._fill``), and ``top_up`` reads the rest
    of torch's count when a batch is handed out: a worker still holding its share (its results
    not yet read from the pipe) is sent nothing then, and how far the sampler had been read
    when an epoch was left depended on the workers' timing."""

    __slots__ = ("buf", "src", "pool", "done", "drawn")

    def __init__(self, head: list[Any], src: Iterator[Any], pool: _Pool) -> None:
        self.buf = collections.deque(head)
        self.src = src
        self.pool = pool
        self.done = False
        self.drawn = len(head)  # batches read from the sampler so far

    def top_up(self, count: int) -> None:
        """Read the sampler until ``count`` batches have been read (or it ends)."""
        while self.drawn < count and not self.done:
            try:
                self.buf.append(next(self.src))
            except StopIteration:
                self.done = True
                return
            self.drawn += 1

    def __iter__(self) -> _ReadAhead:
        return self

    def __next__(self) -> Any:
        buf = self.buf
        if not self.done and self.pool.mode != "workers":  # made here ("inline", "probe")
            try:
                buf.append(next(self.src))  # the one torch's loader takes as it hands a batch out
                self.drawn += 1
            except StopIteration:
                self.done = True
        if buf:
            return buf.popleft()
        if self.done:
            raise StopIteration
        try:
            item = next(self.src)  # (workers: straight from the sampler)
        except StopIteration:
            self.done = True  # not asked again: a sampler's iterator need not stay ended
            raise
        self.drawn += 1
        return item


class _Slices:
    """Batches of indices as slices of the sampler's whole order (one array per epoch).

    Used for datasets with ``gather``: no Python int per index, and the main process
    can take many batches' indices at once.
    """

    def __init__(self, batch_sampler: BatchSampler, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.size = batch_sampler.batch_size
        self.skip = skip
        self.order: Any = None
        self.pos = 0
        self.end = 0
        self.per_chunk = 0  # batches per bulk gather (set on first use)

    @classmethod
    def of(cls, loader: DataLoader[Any], skip: int) -> _Slices | None:
        bs = loader.batch_sampler
        if type(bs) is not BatchSampler or not callable(getattr(bs.sampler, "order", None)):
            return None
        return cls(bs, skip)

    def begin(self, prime: bool) -> None:
        """Draw the order now when ``prime`` or when the sampler takes its epoch when iterated
        (seed mode); else it is drawn at the first batch, and the sampler's state meanwhile is a
        fresh start's."""
        sampler = self.batch_sampler.sampler
        if prime or getattr(sampler, "_torch_mode", True) is False:
            self._load()
        elif callable(getattr(sampler, "_will_start", None)):
            sampler._will_start()

    def _load(self) -> None:
        self.order = self.batch_sampler.sampler.order()
        n = len(self.order)
        self.end = n - n % self.size if self.batch_sampler.drop_last else n
        self.pos = min(self.end, self.skip * self.size)

    def __iter__(self) -> _Slices:
        return self

    def __next__(self) -> Any:
        got = self.chunk(1)
        if got is None:
            raise StopIteration
        return got

    def chunk(self, batches: int) -> Any:
        """The indices of the next ``batches`` batches, or None at the end of the epoch."""
        if self.order is None:
            self._load()
        if self.pos >= self.end:
            return None
        stop = min(self.end, self.pos + batches * self.size)
        out = self.order[self.pos:stop]
        self.pos = stop
        return out


def _torch_split() -> Callable[[Any, int], Any]:
    """``torch.split`` without the Python wrapper around it (a third of its cost on small tensors)."""
    torch = _torch.get()
    assert torch is not None
    return getattr(getattr(torch, "_VF", None), "split", None) or torch.split


def _bulk_batches(dataset: Any, size: int, budget: int = 8 << 20) -> int:
    """How many batches to gather at once: up to 64, within ``budget`` bytes."""
    row = sum(a[:1].nbytes if hasattr(a, "nbytes") else a[:1].element_size() * a[:1].numel()
              for a in getattr(dataset, "arrays", ()))
    return max(1, min(64, budget // max(1, row * size)))


def _ranks_words() -> str:
    """How many training processes share how many cores, in words."""
    return f"{ranks_here()} training processes share this machine's {usable_cores()} cores"


def _start_words(findings: _Findings, cost: float, batches: int) -> str:
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


def _digested(batches: Iterator[Any], digests: array.array, d: int, learn: tuple[Any, Any] | None) -> Iterator[Any]:
    """``batches``, each extending the digest in ``digests``; with ``learn`` (the loader, weakly,
    and the RNG mark), the global RNGs the sampler's first draw moved: later epochs' marks take
    those alone (and torch's, cheap to copy); see replay.Mark.

    A function, not a method of the run: the run holds this generator, and a generator of its
    own would hold the run, a cycle that kept an epoch broken off early (a torch sampler, a
    ``break``) and its workers alive until a full collection: two more processes an epoch."""
    for b in batches:
        if learn is not None:
            loader, rngs = learn[0](), learn[1]
            if loader is not None:
                loader._rng_use = rngs.moved() | {"torch"}
            learn = None
        d = replay.digest(d, b)
        digests.append(d)
        yield b


class _CpuTimed:
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


def _typical(costs: list[float]) -> float:
    """What a main-process batch costs: a low quantile, since a busy machine preempts some
    batches, which says nothing of their cost."""
    return sorted(costs)[len(costs) // 4]


def _estimate(costs: list[float]) -> float:
    """What a main-process batch costs, for a loader whose count of workers is set: the
    cheapest of the first probing batches, the low quartile once there are more.

    The first batches read high (one-time costs, cold caches, and each probing batch's RNG
    bookkeeping), and the two mistakes do not cost alike: workers started for batches that
    were cheaper here stay (diabetes on a slow host, probing batches of 0.5-1.6 ms and later
    ones of 0.4: twice as slow), while batches kept here are timed again by the quick path
    (``_Pool.note``, every 16) and go to the workers if they are costly after all."""
    return min(costs) if len(costs) <= 4 else _typical(costs)


def _probed_enough(costs: list[float]) -> bool:
    """Have the probing batches said enough to choose? After four, or as soon as two cost
    at most ``INLINE_MAX_S``: the low quartile of four is then at most that whatever the
    other two cost, so the choice is the one four would make. With tiny samples each
    probing batch pays ~0.15 ms of RNG bookkeeping, a real share of a short run."""
    return len(costs) >= 4 or sum(c <= INLINE_MAX_S for c in costs) >= 2


def _is_stateless(sampler: Any) -> bool:
    inner = getattr(sampler, "sampler", sampler)
    return type(inner).__name__ == "SequentialSampler"


def _reads_ahead_freely(loader: DataLoader[Any]) -> bool:
    """May the sampler be read further ahead than torch's loader reads it (grouped tasks)?

    Only where its draws do not depend on how far it was read: a sequential order, or the
    loader's own sampler under ``seed=`` (a function of seed and epoch). A shuffle drawn from
    a generator or torch's global RNG draws its next permutation when it runs out, so an epoch
    left a few batches before its end would move later epochs' orders away from torch's
    (docs/determinism.md)."""
    if loader._own_sampler and loader.seed is not None:
        return True
    return _is_stateless(loader._index_sampler)


class _Pool:
    """The workers of a loader (started lazily), the main process's own fetcher, and the seed.

    Under ``num_workers="auto"`` (or the ``adaptive=True`` opt-in) the main process fetches
    the first batches itself and starts the workers only when a batch costs more than
    sending it would (``INLINE_MAX_S``); otherwise the workers make every batch.
    """

    def __init__(self, loader: DataLoader[Any], base_seed: int) -> None:
        self.spec = loader._spec(base_seed)
        self.base_seed = base_seed
        self.num_workers = loader.num_workers
        self.threads = loader.fetch_threads
        pf = loader.prefetch_factor
        self.prefetch = 2 if pf is None else max(1, pf)
        self.auto = loader._auto
        self.tuner: Any = None
        # a batch made in the main process cannot be timed out: with a timeout, workers make
        # every batch (no probing here; "auto" starts with a worker per core and trims the rest)
        self.timed = loader.timeout > 0
        kept = None
        if self.auto is not None:
            kept = loader._tuner
            self.tuner = loader._tuner = kept or Tuner(
                cpu=_cores(), warmup=RETUNE_EVERY, workers=None if self.auto["num_workers"] else self.num_workers)
            if loader._iterable:
                self.tuner.one_thread("an iterable dataset's worker reads its one iterator: 1 thread")
            if self.auto["num_workers"] and not self.timed:
                self.num_workers = 0
        self.worker_type = loader.worker_type
        self.context = loader.multiprocessing_context
        self.pinner = loader._slot_pinner
        self.recycler = loader._recycler  # large batches made in this process reuse memory
        self.fd_mark = loader._fd_mark  # shared with the loader: noted once, before its first batch here
        self._keeps_files = False
        self.forked = loader._forked
        self.dead = False
        self.seq = 0  # next task number; grows across epochs
        self._holder: list[Any] = []  # the executor, once started
        self._locals: list[Fetcher] = []  # the main process's fetcher, once used
        # what the finalizer closes holds nothing of the user's (no dataset, no collate_fn):
        # the finalizer registry keeps it reachable, and with it anything it refers to
        self._closers: list[Any] = []  # worker executors
        self._finalizer = weakref.finalize(self, _close_all, self._closers)
        auto_workers = self.auto is not None and self.auto["num_workers"] and not self.timed
        self.adaptive = auto_workers or (loader.adaptive and self.num_workers > 0 and not loader._iterable
                                         and loader.worker_init_fn is None and not self.timed)
        self.mode = "probe" if self.adaptive else "workers"
        # "auto" where the training processes leave no core for a worker that computes: only
        # batches that wait (on storage) get workers
        self.no_core_left = bool(auto_workers) and _no_core_left()
        self.findings = loader._findings
        self.persistent = loader.persistent_workers
        self.epoch_batches: int | None = None  # batches an epoch, where the sampler says
        if self.adaptive and not self.persistent:
            try:
                self.epoch_batches = len(loader)
            except TypeError:
                pass
        self.launched_at = 0.0
        self.fed_from = (0.0, 0)  # the loop's wait and batches handed, as the workers started
        self.closer: int | None = None  # the thread that closed this pool
        self.here_from: tuple[float, int] | None = None  # ... as this pool began, where that is wanted
        if self.adaptive and not auto_workers and self.findings.workers_paid:
            # an earlier epoch's probe found these batches worth the workers: each epoch of
            # workers that do not persist probed anew, serially, before forking (3 MB samples
            # in batches of 16, 2 workers: 1.14-1.20x torch's time; 0.79 without the probe)
            self.mode = "workers"
            if not self.findings.draws_rngs and self._start_outweighs(self.findings.batch_s):
                self.mode = "inline"  # ... unless starting them costs more than they can save
        # ... and with a worker per core, the main process makes no batch while they start:
        # it would only take a core from them (3 MB samples, 2 workers on 2 cores: 1.03x
        # torch's time with that batch, 0.92-0.98 without)
        self.no_head_start = (self.mode == "workers" and self.adaptive and self.num_workers >= _cores()
                              and not self.findings.slow_start())
        # ... nor where an earlier epoch's probe found the batches draw from the global RNGs:
        # made here, the head start drew from the caller's RNGs, not the worker's seeded ones
        # (torch's augmentations differed from epoch 2 on, and the training loop's next draw)
        self.no_head_start = self.no_head_start or (self.mode == "workers" and self.findings.draws_rngs)
        # "auto" chooses the worker count itself, so there is no worker whose stream a probing
        # batch must match: it is made as num_workers=0 makes a batch, with the RNGs as they are
        self.probe_as_worker = not auto_workers
        self.inline_costs: list[float] = []
        self.inline_max: float | None = None  # INLINE_MAX_S or TRIPS trips, once timed
        self.probe_cpu = 0.0  # CPU seconds of the last probing batch
        self.inline_rates: list[float] = []  # bytes per second of the main-process batches
        self.copying = False  # main-process batches are made at memory-copy speed, the step hiding none
        self.steps_seen: list[float] = []  # the training loop's time before main-process batches
        self.loop_stats = loader._stats  # when the loop was last handed a batch
        self.asked_at = 0.0  # when fetch_here began
        self.on_early: Callable[[], None] | None = None  # the run's dispatch, for _start_early
        self.inline_batches = 0
        # batches a process worker's task carries (executors/grouping.py): map-style only, where
        # a worker's task is its batch's indices and nothing hangs on the stream it reads
        self.grouping = Grouping()
        if loader._iterable or self.threads != 1 or not loader._groups_ok or not _reads_ahead_freely(loader):
            self.grouping.decided = True
        self.launched = False  # workers were started at some point
        self.delivered = False  # a worker has handed back a batch
        self.rng_states: dict[int, rng.RngState] = {}  # worker -> RNG state after its probing batches
        self.rng_seeded: dict[int, rng.RngState] = {}  # worker -> RNG state as seeding leaves it
        self.rng_sensitive = False  # the dataset draws from the global RNGs
        self.rng_quiet = False  # a probing batch made with seeded RNGs left them alone
        from .datasets import ArrayDataset

        # ArrayDataset.gather draws no randomness: many batches can be gathered at once, and
        # an in-memory gather is never faster in a worker (which would copy it once more)
        self.bulk = self.spec.gather and isinstance(loader.dataset, ArrayDataset) and loader.on_error == "raise"
        if self.bulk and self.mode == "probe":
            self.mode = "inline"
        if self.bulk and self.tuner is not None and self.auto is not None and self.auto["num_workers"]:
            self.tuner.pin({"num_workers": 0, "fetch_threads": 1, "prefetch_factor": None,
                            "reason": "in-memory arrays: one gather in the main process beats any worker"})
        self.epoch_start = 0  # seq of the current epoch's first batch
        if kept is not None and not kept.measuring and not self.bulk:
            self._resume(kept)
        if self.num_workers == 0 and not auto_workers:
            inline = InlineExecutor(self.spec)
            inline.fetcher.alloc = self.recycler
            self._holder.append(inline)
            if not loader._iterable:
                self.mode = "inline"  # no workers: every batch is made here
        # plain batches (no per-sample seeding, no skipping) need no task envelope in the main process
        self.quick = (self.spec.auto_collation and not self.spec.iterable and self.spec.seed is None
                      and self.spec.on_error == "raise")
        if self.findings.fed_s is not None and not self.persistent:
            # an epoch made here, once workers were timed, is timed too: which fed the loop faster?
            self.here_from = self.loop_stats.mark()

    def serves_every_epoch(self) -> bool:
        """Is this an "auto" pool that settled on the main process for good (its choice of no
        workers and one thread pinned, no worker ever started)? Such a pool holds nothing an
        epoch must renew, so later epochs share it, as a loader without workers shares its
        own: making and closing one cost "auto" ~100 us an epoch."""
        tuner = self.tuner
        return (self.auto is not None and tuner is not None and tuner.pinned and self.mode == "inline"
                and self.num_workers == 0 and self.threads == 1 and not self.launched and not self.dead
                and not self._holder)

    def _resume(self, tuner: Tuner) -> None:
        """Start where "auto" got to in the epochs before (workers that do not persist are
        new every epoch): no probing batches, and the tuner goes on from its last choice.
        Threads start at the count that ran, which ThreadSteer may have kept above the wish,
        and workers at the count that ran, which the tuner may have wished smaller (what
        tuning() reports: those that ran are what to pin)."""
        auto = self.auto or {}
        kept = tuner.decision()
        if auto.get("fetch_threads"):
            threads = tuner.threads_run or kept.fetch_threads
            # the census of open files (~60 us an epoch) only matters for more than one thread
            if threads <= 1 or not self.keeps_files():
                self.threads = threads
        if auto.get("prefetch_factor") and kept.prefetch_factor:
            self.prefetch = kept.prefetch_factor
        if auto.get("num_workers"):
            self.num_workers = max(kept.num_workers, tuner.workers_run, 1 if self.timed else 0)
            # the probe that would tell whether the dataset draws from the global RNGs does
            # not run again: with workers, the workers make every batch, as torch's would
            self.mode = "workers" if self.num_workers else "inline"
            # ... without workers, batches that grow costly take them up again (``_Pool.note``)
            self.adaptive = not self.num_workers
            cost = self.findings.batch_s
            if self.num_workers and not self.timed and cost is not None and self._start_outweighs(cost):
                # the workers would cost more than they save: the main process makes the
                # batches, as it did while they started, and takes them up again if they
                # grow costly (``_Pool.note``)
                self.num_workers = tuner.workers_run = 0
                self.mode = "inline"
                self.adaptive = True
                tuner.pin({"num_workers": 0, "fetch_threads": self.threads, "prefetch_factor": None,
                           "reason": _start_words(self.findings, cost, self.epoch_batches or 0)
                           + ": no workers (persistent_workers=True would start them once)"})
        if (self.spec.fetch_threads, self.spec.num_workers) != (self.threads, self.num_workers):
            self.spec = dataclasses.replace(self.spec, fetch_threads=self.threads, num_workers=self.num_workers)

    @property
    def started(self) -> bool:
        return bool(self._holder)

    @property
    def executor(self) -> Any:
        if not self._holder:
            if self.dead:
                raise RuntimeError("this DataLoader's workers were shut down")
            if self.tuner is not None:
                # the RAM budget is the memory free before the workers take theirs: read after
                # their start, what they hold was missing from it and then charged to it again
                _ = self.tuner.ram
            # started and recorded with a Ctrl-C held: one in between left an executor nothing
            # closes (its workers ended unjoined, their process objects' pipes open for good)
            with hold_ctrl_c():
                if self.worker_type == "thread":
                    ex: Any = ThreadExecutor(self.spec, self.num_workers)
                else:
                    me = weakref.ref(self)
                    mark = self.fd_mark
                    # a loader's first workers may collect loaders dropped before in reference cycles
                    # (a full collection); its later epochs' pools need not (see processes._freeze)
                    first, self.forked[:] = not self.forked, [True]
                    ex = ProcessExecutor(lambda: getattr(me(), "spec", None), self.num_workers, self.context,
                                         pinner=self.pinner,
                                         private_files=lambda: inherit.opened_since(mark[0] if mark else None),
                                         collect=first, shipped=self.loop_stats.shipped)
                self._holder.append(ex)
                self._closers.append(ex)
            if self.dead:  # close() from another thread while they started: nothing else closes them
                ex.close()
                raise RuntimeError("this DataLoader's workers were shut down")
            self.launched = True
            self.launched_at = time.perf_counter()
            self.fed_from = self.loop_stats.mark()
            if self.tuner is not None:
                self.tuner.workers_run = self.num_workers
            if self.auto is None:
                self.findings.workers_paid = True
        return self._holder[0]

    def depth(self) -> int:
        """Batches each worker holds at once: ``prefetch_factor``, and with fetch threads at
        least enough that the threads never run dry while a finished batch makes its trip
        and waits its turn to be handed out (64 threads and batches of 32: 4 batches)."""
        size = self.spec.batch_size or 1
        if self.threads > 1:
            return max(self.prefetch, -(-self.threads // size) + 2)
        return self.prefetch * self.grouping.size  # (prefetch_factor tasks of grouped batches)

    def bulk_ok(self) -> bool:
        """May the main process gather many batches at once (in-memory arrays, main-process mode)?"""
        return self.bulk and (self.mode == "inline" or (self.num_workers == 0 and self.tuner is None))

    def serve_here(self) -> bool:
        """Should the main process make the next batch itself?

        Yes while probing, when batches are cheap, while the workers are still starting
        (so their start-up overlaps useful work instead of stalling it), and once more
        when they have started but not yet delivered a batch: the caller then hands them
        the batches after this one first. A worker's first batch comes late (its own
        start-up, and a freshly forked parent and child copying pages they both write):
        the main process, idle otherwise, makes one meanwhile.
        """
        if self.mode != "workers":
            return True
        if not self.adaptive or self.rng_sensitive or self.no_head_start:
            return False
        ex = self.executor
        if getattr(ex, "ready", ex.num_workers) < ex.num_workers:
            for ev in ex.poll(0):  # picks up start-up messages; nothing of ours is in flight
                if isinstance(ev, Result):
                    ex.release(ev)
        return not self.delivered

    def holds_back(self) -> bool:
        """Do the batches wait here for workers still starting, the main process making them
        meanwhile? Until every worker has said hello, where a head start is allowed at all
        (``serve_here``) and the workers start slowly: spawned (or forkserver) ones import
        afresh (1.2-1.5 s with torch), and the training loop stood still that long on the
        first batch handed to them. Forked ones start in ~20 ms: they get their batches at
        once, and have them made by the time they would hear of them."""
        if self.delivered or not self.adaptive or self.rng_sensitive or self.no_head_start or not self.starting():
            return False
        return getattr(self.executor, "method", "fork") != "fork" or self.findings.slow_start()

    def starting(self) -> bool:
        """Are some of the workers started still starting (as far as their hellos read)?"""
        if not self.started:
            return False
        ex = self.executor
        ready = getattr(ex, "ready", None)
        return ready is not None and ready < ex.num_workers

    def local_fetcher(self) -> Fetcher:
        """The main process's own fetcher (made on first use)."""
        if not self._locals:
            if not self.fd_mark and self.worker_type == "process" and (self.num_workers or self.auto):
                self.fd_mark.append(inherit.open_fds())  # before this process first touches the dataset
            # thread workers share this process's RNGs: its seeded samples take the lock too
            fetcher = Fetcher(self.spec, None, shared_rng=self.worker_type == "thread")
            fetcher.alloc = self.recycler
            self._locals.append(fetcher)
        return self._locals[0]

    def note(self, cost: float, batch: Any) -> None:
        """The cost of ``batch``, made in the main process by the quick path."""
        self.inline_batches += 1
        costs = self.inline_costs
        costs.append(cost)
        if len(costs) >= 16:
            if (self.adaptive and not self.copying and (self.tuner is None or self._reopenable())
                    and self._costly(costs, batch)):
                if self.tuner is None:
                    self.mode = "workers"  # batches got costly: time for the workers after all
                else:
                    self._reopen()
            costs.clear()

    def _step_hides(self, cost: float) -> bool:
        """Do the training loop's last steps between main-process batches (two at most, the
        shorter counts) take ``STEP_HIDES`` of a batch costing ``cost`` or more?"""
        steps = self.steps_seen[-2:]
        return bool(steps) and min(steps) >= STEP_HIDES * cost

    def _costly(self, costs: list[float], batch: Any) -> bool:
        """Is a window of 16 main-process batches worth the workers? Its fifth cheapest is
        (a few batches the machine slowed down say nothing)."""
        typical = self.findings.batch_s = sorted(costs)[4]
        return self.worth_workers(typical, batch)

    def _reopenable(self) -> bool:
        """Is this an "auto" pool whose probe settled on the main process, pinning no
        workers, that may still start them?"""
        auto, tuner = self.auto, self.tuner
        return (auto is not None and bool(auto["num_workers"]) and tuner is not None and tuner.pinned
                and self.mode == "inline" and not self.bulk and not self.timed and not self.no_core_left)

    def _reopen(self, threads: int | None = None) -> None:
        """Start a worker per core ("auto": the tuner refines from there). Where the probe had
        pinned no workers, batches got costly since (a dataset whose first samples are
        cached, or sorted by size): the pin is lifted and the tuner chooses again."""
        if self._reopenable():
            assert self.tuner is not None
            self.tuner.unpin()
        self.apply(_cores(), self.threads if threads is None else threads, self.prefetch)

    def worth_workers(self, cost: float, batch: Any) -> bool:
        """Is a batch like ``batch`` that costs ``cost`` here worth a trip from a worker? Not
        below ``INLINE_MAX_S``; above it, not below ``TRIPS`` trips either, a trip timed once
        for this batch's shape (``_trip_s``: a slow machine's trips cost more). Nor when
        starting the workers costs more than they could save (``_start_outweighs``)."""
        if cost <= INLINE_MAX_S or self._start_outweighs(cost) or self.no_core_left:
            return False
        if self.inline_max is None:
            self.inline_max = max(INLINE_MAX_S, TRIPS * _trip_s(batch, self.spec.output))
        return cost > self.inline_max

    def _start_outweighs(self, cost: float | None) -> bool:
        """Would the workers, started and stopped once an epoch (they do not persist), cost
        more than making all the epoch's batches here at ``cost`` each? Known once this
        loader has run them for an epoch (``_Findings``). Spawned workers import the main
        process's modules afresh: 1.2-1.5 s with torch, for epochs of 2000 samples that the
        main process made in 0.064 s (num_workers=2 spent 1.8 s an epoch)."""
        spent = self.findings.workers_s()
        if cost is None or self.persistent or self.epoch_batches is None:
            return False
        if self.findings.unready:
            return True  # they started more slowly than a whole epoch was made here
        if self.findings.workers_lose(cost):
            return True  # the loop waited longer for their batches than for those made here
        return spent is not None and spent >= cost * self.epoch_batches

    def fetch_here(self, task: Task) -> Result:
        """Run ``task`` in the main process, timing it for the workers-or-not decision."""
        self.asked_at = time.perf_counter()
        local = self.local_fetcher()
        if self.mode == "probe" and self.spec.seed is None:
            return self._probe(local, task)
        restore = None
        if self.spec.seed is not None:
            with rng_lock:  # not while a thread worker is between seeding a sample and its draws
                restore = rng_lock.save()
        t0, fresh = time.perf_counter(), self.recycler.fresh_s
        try:
            local.schedule(task)
            result = local.run(task)
        finally:
            if restore is not None:
                with rng_lock:
                    rng_lock.restore(restore)
        return self._timed(result, time.perf_counter() - t0 - (self.recycler.fresh_s - fresh))

    def _probe(self, local: Fetcher, task: Task) -> Result:
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
            return self._timed(*self._run_probe(local, task, watch=True))
        w = (task.seq - self.epoch_start) % max(1, self.num_workers or _cores())
        user = rng.RngState()
        before: rng.RngState | None = None
        moved = True  # the user's RNGs may have moved (an exception, or a seeded run)
        try:
            if self.rng_sensitive or not self.rng_quiet:
                before = self._seed_as(w)
            result, cost = self._run_probe(local, task, watch=True)
            after = rng.RngState()
            moved = before is not None or not after.same(user)
            if before is None and moved:
                # made with the user's RNGs, and the dataset drew from them after all: make
                # it again exactly as the worker would
                user.restore()
                before = self._seed_as(w)
                result, _ = self._run_probe(local, task, watch=False)
                after = rng.RngState()
        finally:
            if moved:
                user.restore()
        if before is not None and not after.same(before):
            self.rng_states[w] = after
            self.rng_sensitive = True
            self.findings.draws_rngs = True
            self.spec = dataclasses.replace(self.spec, rng_states=dict(self.rng_states))
            if self.launched and hasattr(self.executor, "set_rng"):
                self.executor.set_rng(w, after)  # started early, before this batch ended
            if self.num_workers:
                self.mode = "workers"
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
        rng.seed_worker(self.base_seed, w)
        state = self.rng_seeded[w] = rng.RngState()
        return state

    def _run_probe(self, local: Fetcher, task: Task, *, watch: bool) -> tuple[Result, float]:
        """Make ``task`` here and time it; with ``watch``, a slow batch starts the workers."""
        # the run-queue clock first: a thread is preempted as a system call returns, such as
        # reading the clocks below (4-6 ms on 2 cores busy with 2 other loops), and read after
        # them, that wait counted as the batch waiting: a first batch computing 1 ms a sample
        # read 0.31 cores busy over 7.6 ms and forked the workers after 2 of its 8 samples
        rq0 = _runqueue_wait() if watch else None
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        own0 = time.thread_time()
        fresh = self.recycler.fresh_s
        local.schedule(task)
        start: Callable[[], None] | None = None
        if watch and not self.launched and not self.copying:
            if self.num_workers:
                start = self._start_early
            elif self.auto is not None and self.auto["num_workers"]:
                start = self._start_early_auto
        rates = self.inline_rates
        slow = SLOW_S if len(self.inline_costs) >= 2 else FIRST_SLOW_S
        if start is not None and self.num_workers and self.probe_cpu > slow and rates and rates[-1] < INLINE_RATE:
            # the batch before kept this process computing for longer than SLOW_S (the very
            # first batch: FIRST_SLOW_S), not copying memory nor faulting in new pages:
            # preemption cannot explain that, so the workers are forked now and make the next
            # batches while this one, the second opinion, is made here
            start()
            start = None
        forking = None if start is None else _CpuTimed(start, local.cpu_clock)  # the workers' start, from the watch
        if forking is not None:
            local.watch = (SLOW_S, self._early_check(forking, t0, cpu0, rq0, first=not self.inline_costs))
        try:
            result = local.run(task)
        finally:
            local.watch = None
        if forking is not None and forking.cpu_s and result.cpu is not None:
            # workers forked inside this batch, from its watch: that CPU time is not the batch's
            # (2 ms of waiting and 2 of Python a sample, batches of 2: 30 ms of CPU against 8 of
            # wall, and the tuner gave the fetches 1 thread where 4 ran 1.6x as fast)
            result.cpu = max(0.0, result.cpu - forking.cpu_s)
        # new memory's page faults are paid once; reused memory is what later batches get
        faults = self.recycler.fresh_s - fresh
        self.probe_cpu = time.thread_time() - own0 - faults  # this thread's: no other thread's work counts
        # the batch costs what fetching and collating it took, as the quick path times a batch
        # kept here (``note``): the probe's own envelope (the task, the result, the watch, the
        # RNG bookkeeping) is not paid by such batches. It added 100-200 us to diabetes batches
        # of ~400 on the Intel VM, enough to pass INLINE_MAX_S and time a trip (``_trip_s``,
        # ~2 ms of first calls into torch in a fresh process) for batches that stay here.
        made = result.end - result.start if result.end else time.perf_counter() - t0
        return result, made - faults

    @staticmethod
    def _early_check(start: Callable[[float], None], t0: float, cpu0: float, rq0: float | None,
                     *, first: bool) -> Callable[[], float | None]:
        """The watch of a probing batch still running after ``SLOW_S``: start the
        workers (returns None), or say how much longer to wait before asking again.

        The very first batch also pays one-time costs (first touches of the data, first calls
        into libraries), which are CPU work: it starts the workers at once only if it is
        waiting (the process used under half a core meanwhile), else after ``EARLY_START_S``.
        Time this thread spent preempted (``rq0``: its run-queue wait at the start) is not
        waiting: on a busy machine a computing batch would otherwise read as one that waits.
        """
        def check() -> float | None:
            wall = time.perf_counter() - t0
            rq1 = _runqueue_wait() if rq0 is not None else None
            ran = wall - (rq1 - rq0) if rq1 is not None and rq0 is not None else wall
            busy = (time.process_time() - cpu0) / max(ran, 1e-9)  # cores the batch kept busy while it ran
            if not first or ran >= EARLY_START_S or busy < 0.5:
                start(busy)
                return None
            return EARLY_START_S - ran
        return check

    def _threads_to_start(self, busy: float, alone_s: float | None = None) -> None:
        """The user's workers with fetch_threads="auto", about to start: where a probing
        batch mostly waits (kept ``busy`` cores busy), they start with threads wide, as "auto"
        workers do (2 workers, 5 ms a sample: 10 batches of one thread each came before the
        tuner's first say, 1.25 s for 100 batches where 16 threads took 0.58). ``alone_s``:
        what one fetch took alone, by default what the probing fetcher measured."""
        if self.auto is None or not self.auto["fetch_threads"] or self.started:
            return
        if alone_s is None:
            alone_s = self.local_fetcher().alone_s
        threads = self._threads_for(busy, alone_s)
        if threads != self.threads:
            self.threads = threads
            self.spec = dataclasses.replace(self.spec, fetch_threads=threads)
            if self.tuner is not None:
                self.tuner.threads_run = threads

    def _start_early(self, busy: float = 1.0) -> None:
        """A probing batch is slow: fork the workers now, while the main process finishes it."""
        self._threads_to_start(busy)
        try:
            _ = self.executor
        except Exception:  # noqa: BLE001 - surfaces again, with its context, at the next dispatch
            self._holder.clear()
            self._closers.clear()
            return
        if self.on_early is not None:
            self.on_early()  # hand the next batches out at once, so workers overlap this one

    def _start_early_auto(self, busy: float = 1.0) -> None:
        """num_workers="auto" and a probing batch is slow: start one worker per core now,
        with fetch threads if it mostly waits (``busy``: the cores it kept busy, < 0.5) and
        they are "auto" too; the main process fetches the rest of its batch with as many.
        The tuner trims workers, threads and prefetch from what it then measures."""
        if self.no_core_left and busy >= CROWDED_WAITS:
            return  # it computes: a worker would only take the training loop's core
        threads = self._threads_for(busy, self.local_fetcher().alone_s)
        if threads != self.threads:
            self.local_fetcher().set_threads(threads)
        self.apply(_cores(), threads, self.prefetch)
        if self.on_early is not None:
            self.on_early()

    def _timed(self, result: Result, cost: float) -> Result:
        self.inline_batches += 1
        costs = self.inline_costs
        costs.append(cost)
        if len(costs) > 16:
            del costs[0]
        if not self.adaptive:
            return result
        if (self.mode == "inline" and cost <= SLOW_S and self.inline_batches % 16 and self.tuner is not None
                and self.tuner.pinned and self.auto is not None and self.auto["num_workers"]):
            # "auto" settled here: only a slow batch, or every 16th, is looked at (walking each
            # batch for its size cost ~2 us of a 12 us batch_size=None batch)
            return result
        self.findings.batch_s = _estimate(costs)  # for later epochs: are their workers worth starting?
        # A batch made at memory speed (gathering arrays already in memory) gains nothing from
        # a worker, which would copy it once more into shared memory: keep such batches here,
        # unless the training step between them would hide the workers' copies.
        rate = _nbytes(result.batch) / cost if cost > 0 else 0.0
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
        copying = self.copying = (len(rates) >= 2 and max(rates[-2:]) > INLINE_RATE
                                  and not self._step_hides(min(self.inline_costs[-2:])))
        if self.tuner is not None and self.auto is not None and self.auto["num_workers"]:
            waits = result.cpu is not None and result.cpu < 0.5 * cost  # warm-up costs are CPU
            if self.num_workers == 0 and cost > SLOW_S and not copying and not self._start_outweighs(cost) and (
                    waits or len(costs) >= 2 and min(costs[-2:]) > SLOW_S and not self.no_core_left):
                self._jump_start(result, cost)
            elif (self.inline_batches % 16 == 0 and len(costs) >= 16 and not copying and self._reopenable()
                  and self._costly(costs, result.batch)):
                self._reopen()  # as _Pool.note does for batches made by the quick path
            elif self.mode == "probe" and (copying or _probed_enough(costs)):
                typical = _typical(costs)
                if copying or not self.worth_workers(typical, result.batch):
                    self.mode = "inline"
                    self.tuner.workers_run = 0  # any started early make no batch from here
                    why = (f"batches are made at {rate / 1e9:.1f} GB/s in the main process (copying memory): "
                           "workers would only copy them again" if copying else
                           f"{_ranks_words()}, which leaves no core for a worker that computes"
                           if self.no_core_left and typical > INLINE_MAX_S else
                           f"a batch costs {typical * 1e6:.0f} us in the main process, less than bringing it "
                           f"from a worker would ({(self.inline_max or INLINE_MAX_S) * 1e6:.0f} us)")
                    self.tuner.pin({"num_workers": 0, "fetch_threads": self.threads, "prefetch_factor": None,
                                    "reason": why + ": no workers"})
        elif self.rng_sensitive or (not copying and not self._start_outweighs(cost) and (
                cost > 5 * SLOW_S and rate < INLINE_RATE or (len(costs) >= 2 and min(costs[-2:]) > SLOW_S))):
            # clearly worth a worker (one batch can be slow because the machine is busy:
            # a moderately slow one must be seen twice), or only a worker makes it right
            self.mode = "workers"
            if result.cpu is not None and cost > 0:
                self._threads_to_start(result.cpu / cost, cost / max(1, result.samples))
        elif _probed_enough(costs):
            self.mode = "workers" if not copying and self.worth_workers(_estimate(costs), result.batch) else "inline"
        return result

    # -- num_workers / fetch_threads / prefetch_factor = "auto" --------------
    def _jump_start(self, result: Result, cost: float) -> None:
        """A first batch this costly needs workers now; the tuner refines from there."""
        self._reopen(self.threads if result.cpu is None or cost <= 0 else
                     self._threads_for(result.cpu / cost, cost / max(1, result.samples)))

    def _threads_for(self, busy: float, alone_s: float | None) -> int:
        """Fetch threads for a batch that kept ``busy`` cores busy: as many as the tuner
        allows when it mostly waits (and tells the tuner it waits, and that a fetch took
        ``alone_s`` with no other running), else the current.

        ``busy`` is read early, over a fetch or two that also paid one-time costs, so it
        says that fetches wait, not how many would fill a core (one fetch per idle core
        read 5-28 threads on the latency benchmark, whose fetches use 0.5% of theirs).
        Threads that wait cost no CPU: they start wide, and the tuner trims them to what
        the training loop takes and what fills a worker's core, each cut checked.
        """
        if busy >= IO_BOUND:
            return self.threads
        tuner = self.tuner
        if tuner is not None:
            tuner.note_waiting(alone_s)
        if self.auto is None or not self.auto["fetch_threads"] or self.keeps_files():
            return self.threads
        return tuner.max_threads if tuner is not None else MAX_THREADS

    def keeps_files(self) -> bool:
        """Has the dataset opened files it keeps open (a lazily opened handle), as far as the
        main process saw? Threads of one worker would share such a handle, and a ``seek`` in
        one moves the others' reads: "auto" then leaves fetch threads at what they are
        (``fetch_threads=N`` still forces them)."""
        if not self._keeps_files:
            self._keeps_files = bool(inherit.opened_since(self.fd_mark[0] if self.fd_mark else None))
            if self._keeps_files and self.tuner is not None:
                self.tuner.one_thread("the dataset keeps files open, which fetch threads would share: 1 thread")
        return self._keeps_files

    def tuning(self) -> bool:
        """Is the tuner still open to change (so worth a stats snapshot)?"""
        tuner = self.tuner
        return tuner is not None and not tuner.pinned

    def retune(self, snap: dict[str, Any]) -> None:
        tuner = self.tuner
        if tuner is None or not self.tuning():
            return
        tuner.observe(snap)
        if tuner.measuring:
            return  # its decision is a placeholder: keep what the probe started with
        d = tuner.decision()
        auto = self.auto or {}
        workers = d.num_workers if auto.get("num_workers") else self.num_workers
        if auto.get("num_workers") and self.mode == "probe" and workers == 0:
            return  # the main-process probe decides that
        if not auto.get("num_workers") and self.mode != "workers":
            # the user's workers, kept back by ``adaptive`` while batches are cheaper made
            # here: that choice stands (it takes them up when batches grow costly)
            workers = 0
        if auto.get("num_workers") and self.started and workers < self.num_workers:
            workers = self.num_workers  # never stop workers mid-run: they cost nothing idle
        threads = self.threads
        if auto.get("fetch_threads"):
            # a dataset seen keeping files open after threads were raised gets one thread again:
            # threads of a worker would share the handle (64 ran on it, tuning() said 64)
            threads = 1 if self.keeps_files() else tuner.steer_threads(self.threads)
        prefetch = (d.prefetch_factor or 2) if auto.get("prefetch_factor") else self.prefetch
        self.apply(workers, threads, prefetch)
        tuner.threads_run = self.threads

    def apply(self, workers: int, threads: int, prefetch: int) -> None:
        if workers > 0 and self.mode != "workers" or workers > self.num_workers:
            if not self.started:
                self.num_workers = workers
                self.spec = dataclasses.replace(self.spec, fetch_threads=threads, num_workers=workers)
                self.threads = threads
                self.mode = "workers"
                _ = self.executor
            else:
                self.executor.grow(workers)
                self.num_workers = workers
                if self.tuner is not None:
                    self.tuner.workers_run = workers
                self.mode = "workers"
        if threads != self.threads and self.started:
            self.executor.set_threads(threads)
            self.threads = threads
        self.prefetch = max(1, prefetch)

    def close(self) -> None:
        self.dead = True
        self.closer = threading.get_ident()
        t0 = time.perf_counter()
        self._finalizer()
        if self.launched:
            self.findings.stop_s = time.perf_counter() - t0
            if not self.delivered:  # the epoch ended before they handed back a batch: at least this
                self.findings.start_s = max(self.findings.start_s or 0.0, t0 - self.launched_at)
        for ex in self._holder:
            ex.close()  # the main process's own executor (the finalizer had the workers')
        self._holder.clear()
        for f in self._locals:
            f.close()
        self._locals.clear()


def _close_all(closers: list[Any]) -> None:
    # each is closed, though one is cut short (a Ctrl-C as it waits for its workers): the
    # finalizer that calls this runs once
    stop: BaseException | None = None
    for ex in closers:
        try:
            ex.close()
        except BaseException as e:  # noqa: BLE001 - raised once the others are closed
            stop = stop or e
    closers.clear()
    if stop is not None:
        raise stop


class _Run(Generic[T]):
    """One pass over the data: what ``iter(loader)`` returns."""

    def __init__(self, loader: DataLoader[T], pool: _Pool, epoch: int, skip: int, *, owns_pool: bool,
                 done: Iterable[int] = (), replicas: Iterable[int] | None = None,
                 replayed: dict[str, Any] | None = None) -> None:
        rng_lock.put_back()  # the RNGs thread workers seeded, as they found them: the sampler may draw
        self.loader = loader
        self.pool = pool
        self.epoch = epoch
        self.owns_pool = owns_pool
        self.finished = False
        self.successor: _Run[T] | None = None  # the epoch a later iter() started on persistent workers
        self.exhausted = False  # reached the end of its epoch
        self.yielded = skip
        # torch warns once a stream has handed out more batches than len(dataset) said, when
        # len(loader) was asked (as torch, it compares batches with the dataset's length)
        self.len_said = loader._len_called if loader._iterable else None
        self.stats = loader._stats
        gen = loader.generator
        self.generator_state = gen.get_state() if _torch.is_generator(gen) else None
        iterable = loader._iterable
        # Map-style: the positions (batch numbers in the epoch) handed out or skipped whole:
        # all below ``prefix``, and ``ahead`` beyond it (batches handed out of order, or left
        # out of a resumed epoch because an out-of-order run had handed them out).
        self.ahead: set[int] = set() if iterable else {p for p in done if p > skip}
        self.prefix = skip
        self.positions: list[int] | None = None  # position of each batch of this run, when some are left out
        self.out_seq = -1  # seq of the batch being handed out
        self.out_worker = -1  # and of the replica it came from (streams)
        self.bulk_seq = 0  # seq of the next batch in ``ready``
        # A stream cannot seek: its position is how many batches each replica had handed out,
        # and a resumed epoch makes those again and drops them (exact when each replica's
        # stream is deterministic; replicas are handed out in order, whatever ``in_order``).
        self.replicas_done = [0] * max(1, loader.num_workers) if iterable else []
        self.drop_counts: list[int] = []  # batches to drop, per replica
        self.drop_any = 0  # or from any replica: another worker count shards the stream otherwise
        if iterable and skip:
            counts = list(replicas or ())
            if len(counts) == len(self.replicas_done):
                self.drop_counts = counts
            else:
                self.drop_any = skip
        self.dropping = self.drop_any + sum(self.drop_counts)  # batches still to drop
        self.prefix_base = skip  # position of this run's first batch (map-style, none left out)
        self.slices = _Slices.of(loader, skip) if pool.spec.gather and not self.ahead else None
        self.rngs: replay.Mark | dict[str, Any] | None = None  # a sampler without state_dict: _replayed_batches
        self.ready: collections.deque[Any] = collections.deque()  # batches of one bulk gather
        # torch's iterator with workers takes its first prefetch_factor * num_workers batches of
        # indices when it is made (drawing the order then, and from a shared generator before
        # the next iterator's seed); without workers it waits for the first next(). Seed-mode
        # samplers take their epoch when iterated, so a second live iterator cannot change it.
        primed = 0
        if not iterable and loader.num_workers > 0:
            primed = loader.num_workers * (loader.prefetch_factor or 2)
        self.primed = primed
        if self.slices is not None:
            self.batches: Iterator[Any] = self.slices
            self.slices.begin(primed > 0)
        else:
            start = 0  # position of the sampler's next batch
            if loader._replays():
                self.batches, start = self._replayed_batches(skip, replayed)
            else:
                self.batches = iter(loader._index_sampler)  # a stream's: placeholders, never skipped
            if not iterable and loader._auto_collation and not _fresh_batches(loader._index_sampler):
                # a batch sampler may yield one list refilled in place: each batch is copied as it
                # is drawn, or batches read ahead (and tasks not yet sent) change under the loader
                self.batches = map(_own_indices, self.batches)
            if self.ahead:
                self.positions = []
                # a copy: ``ahead`` loses each position as the prefix passes it, and the
                # sampler is read lazily (without workers, up to the batch being made)
                self.batches = self._leave_out(self.batches, skip, frozenset(self.ahead), self.positions, start)
            elif skip > start and not iterable:
                self.batches = itertools.islice(self.batches, skip - start, None)
            if primed:
                head = list(itertools.islice(self.batches, primed))
                self.batches = _ReadAhead(head, self.batches, pool)
        self.sampler_done = False
        # has the sampler's iteration begun? With workers it begins here (``primed``); without,
        # at the first batch, as torch's does, or when a state is asked for first (``begin``)
        self.begun = primed > 0 or iterable or self.slices is not None or skip > 0 or bool(self.ahead)
        self.first_seq = pool.seq
        self.base_seed = pool.base_seed  # a shared main-process pool takes a new one each epoch
        pool.epoch_start = pool.seq
        self.reorder = Reorder(pool.seq, loader.in_order)
        self.inflight: dict[int, tuple[int, Task]] = {}
        self.active = [True] * max(1, loader.num_workers)  # iterable datasets: replicas not yet exhausted
        self.rr = -1  # next worker in the rotation; set at the first dispatch
        self.recovery = Recovery(loader.max_worker_restarts, can_reissue=not loader._iterable)
        self.samples_seen = 0
        self.failed = 0
        self.first_failure: Failure | None = None  # this epoch's, chained by TooManyFailures
        self.failure_kinds: dict[str, int] = {}  # this epoch's failures by exception type
        self.pin = loader._slot_pinner
        self.to_numpy = loader.output == "numpy" and not loader._default_collate
        # the main process makes every batch by the quick path and nothing else needs doing
        # per batch: __next__ takes the lean path (see _lean)
        self.lean = False
        self._quick_fetch: Callable[[Any], Any] | None = None
        self.skipped = skip
        self.pipe_seed: int | None = None  # (DataLoader.__iter__)
        # the loader's (epoch counter, resume state, end position) before this run's iter()
        self.undo: tuple[int, dict[str, Any] | None, dict[str, Any] | None] | None = None
        self.thread = threading.get_ident()  # the thread that last asked for a batch

    def _give_back(self) -> bool:
        """Dropped or closed before handing out a batch (a trainer's probe: Lightning calls
        iter() once on loaders it does not know), this run gives its epoch back: the next
        iter() is the epoch this one would have been, with the same ``seed=`` draws, as if
        iter() had never been called. Not once a later iter() has begun another epoch."""
        undo, self.undo = self.undo, None
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
        next(), as torch's is; a state taken before it described the sampler's previous
        iteration (a custom sampler's state_dict()) or left the first draw from a global
        RNG out of the epoch (torch's RandomSampler without a generator), and the resumed
        epoch was the one before, or later epochs differed. The draw now comes when the
        state is asked for, as it does at iter() with workers."""
        if self.begun or self.pool.seq != self.first_seq:
            return
        self.begun = True
        head = list(itertools.islice(self.batches, 1))
        self.batches = itertools.chain(head, self.batches)

    def _replayed_batches(self, skip: int, replayed: dict[str, Any] | None) -> tuple[Iterator[Any], int]:
        """The batches of a sampler without state_dict (``DataLoader._replays``), and the
        position of the first: the RNG states its iteration begins with are noted, and each
        batch drawn extends a digest (``replay``). A resumed epoch (``replayed``) draws its
        first ``skip`` batches and one more under the saved RNG states, checks them, and
        goes on from position ``skip``."""
        sampler = self.loader._index_sampler
        self.digests = array.array("I")  # the digest after each position from ``digest_base`` on
        if replayed is None:
            self.rngs = replay.Mark(sampler, self.loader._rng_use or replay.GLOBALS)
            self.digest_base, self.digest_at_base = 0, 0
            return self._digesting(iter(sampler)), 0
        self.rngs = replayed["rngs"]
        got = n = 0
        with replay.Replaying(self.rngs, sampler):
            raw = iter(sampler)
            for b in itertools.islice(raw, skip):
                got = replay.digest(got, b)
                n += 1
            # the first batch after them is drawn here too: a sampler may draw its order from
            # a global RNG at its first batch (torch's RandomSampler does)
            head = list(itertools.islice(raw, 1))
        problem = replay.check(sampler, replayed.get("digest"), got, n, skip)
        if problem:
            warnings.warn(problem, UserWarning, stacklevel=4)
        self.digest_base, self.digest_at_base = n, got
        return self._digesting(itertools.chain(head, raw)), n

    def _run_out_sampler(self) -> None:
        """A new epoch begins and this one has handed out every batch without reaching the
        end of its sampler (a trainer that counts len(loader) batches never asks for the
        StopIteration): take the sampler to its end now. torch's RandomSampler (and the
        loader's own in torch mode) draws one more permutation when its iterator runs out,
        and a resumed epoch, which looks ahead from where it starts, may run it out where
        the saved one did not: ending every such epoch alike keeps the next epochs' draws
        the same in both (as torch's loader with workers, which looks ahead too, does)."""
        if self.sampler_done or self.loader._device_stage is not None or not self.loader._handed_all(self.prefix):
            return
        try:
            extra = next(self.batches)
        except StopIteration:
            self.sampler_done = True
            return
        self.batches = itertools.chain([extra], self.batches)  # its length was wrong: keep it

    def _digesting(self, batches: Iterator[Any]) -> Iterator[Any]:
        learn = isinstance(self.rngs, replay.Mark) and self.loader._rng_use is None
        return _digested(batches, self.digests, self.digest_at_base,
                         (weakref.ref(self.loader), self.rngs) if learn else None)

    def _replayed_where(self) -> dict[str, Any]:
        """How a resumed epoch replays this run's sampler up to the position handed out (the
        RNG states are written as JSON when a state is asked for: DataLoader._position)."""
        k = self.prefix - self.digest_base
        d = self.digest_at_base if k <= 0 else self.digests[k - 1]
        return {"rngs": self.rngs, "batches": self.prefix, "digest": d}

    @staticmethod
    def _leave_out(batches: Iterator[Any], skip: int, done: frozenset[int], positions: list[int],
                   start: int = 0) -> Iterator[Any]:
        """The batches from ``skip`` on but those at ``done``, noting each one's position
        (the first of ``batches`` is at ``start``)."""
        for p, b in enumerate(batches, start):
            if p >= skip and p not in done:
                positions.append(p)
                yield b

    def _handed(self, seq: int) -> None:
        """The batch of ``seq`` reached the user, or was skipped whole: advance the position."""
        k = seq - self.first_seq
        pos = self.positions[k] if self.positions is not None else self.prefix_base + k
        if pos != self.prefix:
            self.ahead.add(pos)
            return
        self.prefix += 1
        ahead = self.ahead
        while self.prefix in ahead:
            ahead.discard(self.prefix)
            self.prefix += 1

    # -- torch's iterator's private names, which tools and tests read ----------
    @property
    def _workers(self) -> list[Any]:
        """The worker processes (``multiprocessing.Process``) serving this epoch; none
        before they start, or with thread workers or none."""
        ex = self.pool._holder[0] if self.pool._holder else None
        if not isinstance(ex, ProcessExecutor):
            return []
        return [wk.proc for wk in ex.workers if wk is not None]

    @property
    def _num_workers(self) -> int:
        return self.loader.num_workers

    @property
    def _num_yielded(self) -> int:
        return self.yielded

    @property
    def _shutdown(self) -> bool:
        return bool(self.pool.dead)

    def _shutdown_workers(self) -> None:
        self.close()

    @property
    def _dataset(self) -> Any:
        return self.loader.dataset

    @property
    def _index_sampler(self) -> Any:
        return self.loader._index_sampler

    @property
    def _dataset_kind(self) -> int:
        return self.loader._dataset_kind

    @property
    def _auto_collation(self) -> bool:
        return self.loader._auto_collation

    @property
    def _IterableDataset_len_called(self) -> int | None:  # noqa: N802 - torch's name
        return self.len_said

    @property
    def _persistent_workers(self) -> bool:
        return bool(self.loader.persistent_workers)

    @property
    def _base_seed(self) -> int:
        return self.base_seed

    # -- iterator protocol --------------------------------------------------
    def __iter__(self) -> _Run[T]:
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self) -> T:
        if self.lean:
            return self._lean()  # type: ignore[no-any-return]
        ready = self.ready
        if ready and self.pin is None:
            # batches already gathered in bulk (map-style, in order): hand one out with the
            # least bookkeeping
            batch, size = ready.popleft()
            self.yielded += 1
            self.prefix += 1
            self.bulk_seq += 1
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
            while self.dropping:  # a resumed stream's batches the user had received (see ``drop_counts``)
                w = max(self.out_worker, 0)
                if self.drop_counts:
                    if not self.drop_counts[w]:
                        break
                    self.drop_counts[w] -= 1
                else:
                    self.drop_any -= 1
                self.replicas_done[w] += 1
                self.dropping -= 1
                batch, size = self._next()
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
        if self.replicas_done:
            self.replicas_done[max(self.out_worker, 0)] += 1
        else:
            self._handed(self.out_seq)
        self.yielded += 1
        ahead = self.batches
        if type(ahead) is _ReadAhead and self.pool.mode == "workers":
            # torch's loader reads one more batch of indices for each it hands out
            ahead.top_up(self.primed + self.yielded - self.skipped)
        if self.len_said is not None and self.yielded > self.len_said:
            self._warn_len()
        self.stats.handed(asked, time.perf_counter(), size, len(self.reorder))
        # every RETUNE_EVERY batches the loader handed out, across epochs: counted per epoch,
        # epochs of under 4 batches never fed the tuner ("not measured yet" for good)
        if self.pool.tuner is not None and self.stats.batches % RETUNE_EVERY == 0 and self.pool.tuning():
            self.pool.retune(self.loader.stats())
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
        if self.ready or (self.slices is not None and pool.bulk_ok()):
            return self._bulk()
        if not self.inflight and not len(self.reorder):
            while pool.serve_here():
                if pool.mode == "inline" and pool.quick:
                    return self._quick()
                indices = next(self.batches)  # StopIteration ends the epoch
                task = Task(pool.seq, self.epoch, _task_indices(indices) if self.loader._auto_collation else [indices])
                pool.seq += 1
                self.reorder.next = pool.seq
                if pool.mode == "workers":
                    _ = self.ex  # started now if not yet (a later epoch's workers, which paid)
                if pool.mode == "workers" and not pool.holds_back():
                    self._fill()  # the workers start on the batches after this one
                else:
                    # if this batch turns out slow and workers start meanwhile, they get the next
                    # batches once they are ready, all but those of the worker whose RNG this
                    # batch stands in for
                    pool.on_early = lambda: pool.holds_back() or self._fill(
                        hold=(task.seq - self.first_seq) % max(1, pool.num_workers))
                try:
                    result = pool.fetch_here(task)
                finally:
                    pool.on_early = None
                out = self._take(result)
                if out is not None:
                    if pool.mode == "workers" and pool.started and not pool.holds_back():
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
                        self._poll(0)
                    else:
                        # the batch handed out leaves room for the next task now, as torch's
                        # loader refills when it hands one out. Refilled only at the next call,
                        # one worker with prefetch_factor=1 idled through every training step
                        # (10 ms loads, 10 ms steps: 22.0 ms a step, torch 13.3), and a stream
                        # whose every result was waiting here never heard its last worker's end
                        # (a state_dict saved after its last batch named the ended epoch)
                        self._fill()
                out = self._take(r)
                if out is not None:
                    return out
                waited_since = time.monotonic()
                continue
            if self.finished or pool.dead:
                raise StopIteration  # close() from another thread ended this epoch
            self._fill()
            if not self.inflight and self.sampler_done and not len(self.reorder):
                raise StopIteration
            timeout = _TICK
            if self.loader.timeout > 0:
                timeout = min(timeout, max(0.0, waited_since + self.loader.timeout - time.monotonic()))
            polled = True
            if not self._poll(timeout):
                if self.loader.timeout > 0 and time.monotonic() - waited_since >= self.loader.timeout:
                    if not self._restart_hung():
                        raise self._timeout_error()
                    waited_since = time.monotonic()
                continue

    def _poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for what the workers send and take it in (``_absorb``); False
        when nothing came. Process workers' results are read and recorded with a Ctrl-C held
        (``hold_ctrl_c``): one between the two lost the result, and a persistent loader's
        later epochs waited for ever on the worker still counted as holding it."""
        ex = self.ex
        wait = getattr(ex, "wait_ready", None)
        if wait is None:
            events = ex.poll(timeout)
            if events:
                self._absorb(events)
            return bool(events)
        ready = wait(timeout)
        if not ready:
            return False
        with hold_ctrl_c():
            events = ex.take_ready(ready)
            deaths = self._take_in(events)
        for death in deaths:  # (replacing a worker waits for it: not held; an unhandled death is seen again)
            self._on_death(death)
        self._fill()
        return bool(events)

    def _absorb(self, events: list[Any]) -> None:
        """Take finished batches and deaths from the executor, then refill at once: results
        often arrive together, and a worker must not wait for the consumer to run dry
        before it hears of its next batch."""
        for death in self._take_in(events):
            self._on_death(death)
        self._fill()

    def _take_in(self, events: list[Any]) -> list[Death]:
        """Record the results among ``events``; returns the deaths."""
        deaths = []
        for ev in events:
            if isinstance(ev, Death):
                deaths.append(ev)
            elif ev.seq < self.first_seq or ev.seq not in self.inflight:
                self.ex.release(ev)  # from an abandoned epoch
            else:
                self.inflight.pop(ev.seq, None)
                pool = self.pool
                if not pool.grouping.decided:
                    pool.grouping.note(ev)
                if not pool.delivered:
                    pool.delivered = True
                    pool.findings.start_s = time.perf_counter() - pool.launched_at
                self.reorder.push(ev)
        return deaths

    def _quick(self) -> tuple[Any, int]:
        """A batch made in the main process, without the task envelope (the common, cheap case)."""
        pool = self.pool
        indices = next(self.batches)  # StopIteration ends the epoch
        self.out_seq = pool.seq
        pool.seq += 1
        self.reorder.next = pool.seq
        fetcher = pool.local_fetcher()
        batch, n, start, end = self._quick_batch(fetcher.quick, indices)
        self.stats.result(INLINE, start, 0.0, end)
        if not self.lean:
            self._go_lean(fetcher)
        return batch, n

    def _quick_batch(self, fetch: Callable[[Any], Any], indices: Any) -> tuple[Any, int, float, float]:
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
        self.pool.note(end - start, batch)
        n = len(indices)
        self.samples_seen += n
        if self.to_numpy:
            batch = to_numpy(batch)
        if self.pin is not None:
            batch = self.pin(batch)
        return batch, n, start, end

    def _go_lean(self, fetcher: Fetcher) -> None:
        """Take the lean path from the next batch on if it would do all there is to do."""
        pool = self.pool
        self.lean = (pool.mode == "inline" and pool.quick and not self.dropping and not self.replicas_done
                     and self.len_said is None and self.positions is None and not self.ahead
                     and not self.ready and self.slices is None and not self.inflight
                     and not len(self.reorder) and not (pool.tuner is not None and pool.tuning()))
        self._quick_fetch = fetcher.quick if self.lean else None

    def _lean(self) -> Any:
        """``__next__`` for batches the main process makes by the quick path, with nothing
        in flight, nothing to skip or drop and no tuner to feed. The general path's checks
        cost a few microseconds a batch, in this loop and in the training step after it
        (whose memory they push out of the caches): on diabetes_train, a ~280 us step, they
        were part of a 2-3% gap to torch's loader without workers (next() 106-108 -> 103-106
        us a batch here). The stats take five numbers a batch and catch up when read
        (``Stats.made_here``): 15 alternated fresh runs, conveyor0 against torch0 went from
        1.6% to 0.9% slower over 10 epochs."""
        if self.finished:
            raise StopIteration
        asked = time.perf_counter()
        try:
            indices = next(self.batches)
        except StopIteration:
            self._finish()
            raise
        pool = self.pool
        seq = pool.seq
        self.out_seq = seq
        pool.seq = self.reorder.next = seq + 1
        fetch = self._quick_fetch
        assert fetch is not None
        batch, n, start, end = self._quick_batch(fetch, indices)
        if pool.mode != "inline":
            self.lean = False  # batches got costly: the workers make the next ones
        self.prefix += 1  # in order, none left out: the position is the count
        self.yielded += 1
        self.stats.made_here(start, end, asked, time.perf_counter(), n)
        return batch

    def _bulk(self) -> tuple[Any, int]:
        """In-memory arrays made in the main process: one gather for many batches, then views."""
        if not self.ready:
            slices = self.slices
            assert slices is not None
            if slices.per_chunk == 0:
                slices.per_chunk = _bulk_batches(self.loader.dataset, slices.size)
            indices = slices.chunk(slices.per_chunk)
            if indices is None:
                raise StopIteration
            start = time.perf_counter()
            cols = self.loader.dataset.gather(indices, output=self.loader.output)
            size = slices.size
            if self.loader.output == "torch":
                split = _torch_split()
                parts = [split(c, size) for c in cols]
            else:
                cuts = list(range(size, len(indices), size))
                parts = [np.split(c, cuts) for c in cols]
            count = len(parts[0])
            sizes = [size] * count
            sizes[-1] = len(indices) - size * (count - 1)
            self.ready.extend(zip(map(list, zip(*parts)), sizes))
            # one event for the gather, counting its batches (main-process batches, as any)
            self.stats.result(-1, start, 0.0, time.perf_counter(), batches=count)
            self.pool.inline_batches += count
            self.bulk_seq = self.pool.seq
            self.pool.seq += count
            self.reorder.next = self.pool.seq
        self.out_seq = self.bulk_seq
        self.bulk_seq += 1
        if self.pin is not None:
            batch, n = self.ready.popleft()
            return self.pin(batch), n
        return self.ready.popleft()

    def _take(self, r: Result) -> tuple[Any, int] | None:
        """The user's batch from a result, or None when there is nothing to hand out."""
        self.out_seq = r.seq
        self.out_worker = r.worker
        if r.start and not r.exhausted:  # (a stream's end is no batch: its worker's mean would shrink)
            self.stats.result(r.worker, r.start, r.fetched, r.end, cpu=r.cpu, nbytes=r.nbytes, rss=r.rss,
                              cpu_span=r.cpu_span, work=r.work)
        if r.exhausted:
            w = max(r.worker, 0)  # -1: the main process, the only replica with 0 workers
            first = w >= len(self.active) or self.active[w]  # tasks in flight behind it end too
            if w < len(self.active):
                self.active[w] = False
            if r.skipped:
                self._count_failures(list(r.skipped), samples=len(r.skipped))
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
                self._count_failures([r.failure], samples=len(r.failure.indices or []) or 1)
                if not self.replicas_done:
                    self._handed(r.seq)  # skipped whole: its position is done with
                return None
            raise rebuild(r.failure)
        n = _batch_size(self.loader, r)
        if r.skipped:
            # the batch's samples count as seen before the failures are weighed against them
            try:
                self._count_failures(list(r.skipped), samples=n, failed=len(r.skipped))
            except TooManyFailures:
                if r.worker >= 0:
                    self.ex.release(r)  # not handed out: its slot goes back (a persistent pool lost it for good)
                raise
            n -= len(r.skipped)
        else:
            self.samples_seen += n
        if r.empty:
            if not self.replicas_done:
                self._handed(r.seq)
            return None
        batch = r.batch if r.worker < 0 else self.ex.decode(r)
        if self.to_numpy:
            batch = to_numpy(batch)
        if self.pin is not None:
            batch = self.pin(batch)
        return batch, n

    def _count_failures(self, failures: list[Failure], samples: int, failed: int | None = None) -> None:
        """``samples`` more were seen, ``failed`` of them (all by default) failing with ``failures``."""
        self.stats.skipped(failures)
        self.failed += samples if failed is None else failed
        self.samples_seen += samples
        if failures and self.first_failure is None:
            self.first_failure = failures[0]
        for f in failures:
            kind = f.type_name.rsplit(".", 1)[-1]
            self.failure_kinds[kind] = self.failure_kinds.get(kind, 0) + 1
        limit = self.loader.max_failures
        seen = max(1, self.samples_seen)
        # a fraction allows that share of the samples seen so far, rounded up: one bad sample
        # early on is not yet a rate
        over = self.failed > (limit if isinstance(limit, int) else math.ceil(limit * seen - 1e-9))
        if over:
            first = self.first_failure or failures[0]
            summary = ", ".join(f"{k} x{v}" for k, v in sorted(self.failure_kinds.items(), key=lambda kv: -kv[1]))
            err = TooManyFailures(
                f"{self.failed} of {seen} samples failed so far this epoch ({summary}), more than "
                f"max_failures={limit!r} allows under on_error='skip'. The epoch's first failure is chained "
                "below.", list(self.stats.failures))
            try:
                raise err from rebuild(first)
            finally:
                # the exception would hold this frame, and the frame it: a cycle that kept the
                # epoch's workers, pipes and slots until a full collection, for a loop that
                # catches it and goes on (15 epochs: 30 processes, 171 fds, 81 segments)
                del err

    # -- dispatch -----------------------------------------------------------
    def _fill(self, hold: int | None = None) -> None:
        """Hand out tasks up to each worker's prefetch; ``hold``: a worker to give none to now."""
        ex = self.ex
        if self.sampler_done:
            return
        n = ex.num_workers
        cap = 1 if ex.kind == "inline" else self.pool.depth()
        if ex.kind == "inline":
            if self.inflight or len(self.reorder):
                return
            if self.loader._iterable and not self.active[0]:
                self.sampler_done = True
                return
            self._send(0, 1)
            return
        # Batches ahead of the user, whether still in a worker or finished and waiting here,
        # number at most prefetch x workers, as torch's do: results are collected as soon as
        # they arrive, and counting only the tasks still out let the workers run ever further
        # ahead, holding shared memory and taking the training loop's CPU to do it.
        room = n * cap - len(self.inflight) - len(self.reorder)
        if room <= 0 and self.rr >= 0:
            return  # every worker holds its share (strict round robin keeps them even)
        group = self.pool.grouping.size if ex.kind == "process" else 1
        if cap < 2 * group:
            group = 1  # (fetch threads or a prefetch of 1 since: a whole group would leave the worker idle)
        fresh = not self.inflight and not len(self.reorder)  # the loop waits for the next batch
        if group > 1 and room < n * group and not fresh:
            return  # grouped batches go out a whole group a worker at a time (executors/grouping.py)
        if self.rr < 0:  # the first dispatch of this epoch: batches made in the main process came first
            self.rr = (self.pool.seq - self.first_seq) % max(1, n)
        while len(self.active) < n:
            self.active.append(True)  # workers added by the tuner
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
                w = (self.rr + k) % n
                if self.active[w]:
                    live = True
                    if strict or (held[w] < cap and w != hold):
                        break
            else:
                if not live:
                    self.sampler_done = True
                break  # (in_order=False) every live worker holds its share
            if held[w] >= cap or w == hold:
                break  # the turn stays with w: order must follow the rotation
            task = self._next_task(w)
            if task is None:
                break
            self.rr = (w + 1) % n
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
        flush = getattr(ex, "flush_freed", None)
        if flush is not None:
            flush()

    def _next_task(self, worker: int) -> Task | None:
        """The next task (recorded as held by ``worker``), or None when the sampler is done."""
        try:
            indices = next(self.batches)
        except StopIteration:
            self.sampler_done = True
            return None
        if indices is not None and not self.loader._auto_collation:
            indices = [indices]
        elif indices is not None:
            indices = _task_indices(indices)
        seq = self.pool.seq
        self.pool.seq += 1
        task = Task(seq, self.epoch, indices, self.pipe_seed)
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
        return not self.sampler_done

    # -- faults -------------------------------------------------------------
    def _on_death(self, death: Death) -> None:
        if self.finished or self.pool.dead:
            raise StopIteration  # workers stopped by close() (from another thread): no restart
        self.stats.deaths.append(death.describe())
        # a stream's replica that has handed out nothing this epoch (a worker that died in an
        # epoch the user broke off, say) starts over in a new worker: nothing is lost
        w = death.worker
        fresh = (bool(self.replicas_done) and w < len(self.replicas_done) and self.replicas_done[w] == 0
                 and not any(r.worker == w for r in self.reorder.buffer.values()))
        if not self.recovery.should_restart(death, fresh=fresh):
            err = self.recovery.error()
            self.close()
            raise err
        self.stats.restarts += 1
        # a replacement that does not start is waited for as a batch is: timeout, when set
        wait = self.loader.timeout or 60.0
        if isinstance(self.ex, ProcessExecutor):
            # replacements killed before they start are replaced within the same budget
            budget = self.recovery.max_restarts
            tasks = self.ex.restart(death.worker, wait, tries=1 + budget - len(self.recovery.deaths),
                                    spent=f"max_worker_restarts={budget} allows no more")
            for early in self.ex.take_start_deaths():
                self.recovery.deaths.append(early)
                self.stats.deaths.append(early.describe())
                self.stats.restarts += 1
        else:
            tasks = self.ex.restart(death.worker, wait)
        tasks = [t for t in tasks if t.seq in self.inflight]
        if tasks:
            for t in tasks:
                self.inflight[t.seq] = (death.worker, t)
            self.ex.submit(death.worker, tasks)

    def _restart_hung(self) -> bool:
        """With ``restart_hung=True``, kill the worker holding the awaited batch; recovery replaces it."""
        if not self.loader.restart_hung or not hasattr(self.ex, "kill"):
            return False
        awaited = self._awaited()
        if awaited is None:
            return False
        worker, batch = awaited
        stack = self.ex.stack(worker) if hasattr(self.ex, "stack") else None
        cause = f"stuck for more than timeout={self.loader.timeout} s on {batch}, restart_hung=True"
        self.ex.kill(worker, cause, stack)  # the next poll reports its death; its tasks are re-issued
        return True

    def _held_over(self, worker: int | None = None) -> str:
        """A worker (``worker``, or any) still busy with a batch of an earlier epoch, which
        the awaited batch waits behind (persistent workers, after a timeout or a break)."""
        ledger = getattr(self.ex, "ledger", None)
        for w, held in enumerate(ledger.held if ledger is not None else ()):
            old = [t for t in held.values() if t.seq < self.first_seq]
            if old and worker in (None, w):
                return (f"worker {w} is still making a batch of an earlier epoch ({_indices_words(old[0])}), and "
                        "must finish it first")
        return ""

    def _awaited(self) -> tuple[int, str] | None:
        """The worker holding the batch the consumer waits for, and that batch in words."""
        seq = self.reorder.next if self.loader.in_order else min(self.inflight, default=None)
        where = self.inflight.get(seq) if seq is not None else None
        if seq is None or where is None:
            return None
        worker, task = where
        return worker, f"batch {seq - self.first_seq} of this epoch ({_indices_words(task)})"

    def _timeout_error(self) -> RuntimeError:
        awaited = self._awaited()
        if awaited is None:
            behind = self._held_over()
            where = f" waiting for batch {self.reorder.next - self.first_seq} of this epoch: {behind}" if behind else ""
            return RuntimeError(f"DataLoader timed out after {self.loader.timeout} seconds{where}")
        worker, batch = awaited
        starting = self.ex.starting_for(worker) if hasattr(self.ex, "starting_for") else None
        stack = None
        if hasattr(self.ex, "stack"):
            stack = self.ex.stack(worker)
        if hasattr(self.ex, "give_up"):
            self.ex.give_up(worker)
        elif hasattr(self.ex, "hung"):
            self.ex.hung.add(worker)  # closing need not wait for it to finish its batch
        msg = f"DataLoader timed out after {self.loader.timeout} seconds waiting for {batch} from worker {worker}"
        behind = self._held_over(worker)
        if behind:
            msg += f" ({behind})"
        if starting is not None:
            how = ("imports the main script and its modules afresh, unpickles the dataset and runs worker_init_fn"
                   if self.ex.method != "fork" else "runs worker_init_fn")
            msg += (f", which has not started yet after {starting:.1f} s: a new worker {how} before its first "
                    "batch, and the timeout counts that too (raise timeout; with persistent_workers=True only the "
                    "first epoch pays it)")
        if stack:
            msg += f"; its Python stack right now:\n{stack}"
        return RuntimeError(msg)

    # -- endings ------------------------------------------------------------
    def where(self, take_in: bool = False) -> dict[str, Any]:
        """This run's position, for the loader's state_dict (``take_in``: results waiting in
        the pipes may be taken in, see ``_stream_over``; never from a finalizer)."""
        where: dict[str, Any] = {
            "epoch": self.epoch, "batches": self.yielded if self.replicas_done else self.prefix,
            "finished": self.finished and self.exhausted or self._stream_over(take_in), "base_seed": self.base_seed,
            "generator": self.generator_state}
        if self.ahead:
            where["done"] = sorted(self.ahead)  # handed out of order, beyond ``batches``
        if self.replicas_done:
            where["replicas"] = list(self.replicas_done)  # batches each replica of the stream handed out
        if self.rngs is not None:
            where["replayed"] = self._replayed_where()
        return where

    def _stream_over(self, take_in: bool) -> bool:
        """A stream's every worker has said it is exhausted and every batch was handed out:
        the epoch is over, though the iterator has not raised its StopIteration yet."""
        if not self.replicas_done or self.finished or self.dropping:
            return False
        if (take_in and any(self.active) and self.inflight and self.loader._device_stage is None
                and self.ex.kind != "inline" and threading.get_ident() == self.thread):
            # the workers' word may be waiting in the pipes: take it in (no batch is handed out).
            # Only in the thread that iterates: a checkpoint thread's poll ran into the loop's
            # ("concurrent poll() invocation"), and its refill wrote orders into the same pipes
            self._poll(0)
        if self.inflight:
            return False
        buffered = list(self.reorder.buffer.values())
        if any(not r.exhausted for r in buffered):
            return False  # batches still to hand out
        said = {max(r.worker, 0) for r in buffered}
        return all(not active or w in said for w, active in enumerate(self.active))

    def _finish(self) -> None:
        if self.finished:
            return
        self.exhausted = True
        self.finished = True
        rng_lock.put_back()  # the training loop's RNGs back from thread workers
        self.loader._ended = self.where()
        self.stats.epoch_end()
        pool = self.pool
        if pool.launched and not pool.persistent and not pool.dead:
            if not pool.delivered and pool.starting():
                pool.findings.unready = True  # the whole epoch was made here while they started
            pool.findings.fed_s, pool.findings.fed_batches = self.stats.since(pool.fed_from)
        elif pool.here_from is not None and not pool.launched and not pool.dead:
            waited, handed = self.stats.since(pool.here_from)
            if handed:
                pool.findings.here_s, pool.findings.here_batches = waited, handed
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
            self.loader._ended = self.where()
        self.lean = False
        self.ready.clear()  # batches gathered ahead: the next epoch's are its own
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
                    self.loader._ended = self.where()  # dropped mid-epoch: resume from here
            if self.owns_pool and not self.pool.dead:
                self.pool.close()
            elif not self.finished and not self.pool.dead:
                # dropped mid-epoch (a ``break``) on persistent workers: the batches it was
                # sent would hold their slots until close(), 5-10 MB more a break
                self._release_buffered()
        except Exception:
            pass


def _sized(obj: Any) -> int | None:
    """``len(obj)``, or None for an object without a length."""
    try:
        return int(len(obj))
    except (TypeError, NotImplementedError):
        return None


def _fresh_batches(sampler: Any) -> bool:
    """Does this batch sampler yield a new object for every batch (conveyor's and torch's own)?"""
    kind = type(sampler)
    return kind is BatchSampler or (kind.__name__ == "BatchSampler"
                                    and kind.__module__ == "torch.utils.data.sampler")


def _own_indices(indices: Any) -> Any:
    """A batch sampler's indices, copied where the sampler could change them after yielding."""
    kind = type(indices)
    if kind is list:
        return indices.copy()
    if kind is tuple or kind is range:
        return indices
    if isinstance(indices, np.ndarray):
        return indices.copy()
    if _torch.is_tensor(indices):
        return indices.clone()
    return list(indices)


def _task_indices(indices: Any) -> Any:
    """A batch sampler's indices as a task carries them: a list, tuple, range, numpy array or
    tensor as it is (a dataset's ``__getitems__`` gets it so in a worker, as under torch),
    anything else (a generator) as a list."""
    if type(indices) in (list, tuple, range) or isinstance(indices, np.ndarray) or _torch.is_tensor(indices):
        return indices
    return list(indices)


def _generator_seed(generator: Any) -> int:
    """The seed of every sample's RNG that a torch generator gives: its initial seed while
    it is as ``manual_seed`` left it, else a hash of its state. A loader made anew over the
    same generator once it has drawn (a loader a trainer rebuilds every epoch) so gets other
    augmentations, as torch's workers get other seeds from it."""
    seed = int(generator.initial_seed())
    torch = _torch.get()
    if torch is None or generator.device.type != "cpu":
        return seed
    state = generator.get_state()
    fresh = torch.Generator()
    fresh.manual_seed(seed)
    if torch.equal(fresh.get_state(), state):
        return seed
    return int.from_bytes(hashlib.blake2b(state.numpy().tobytes(), digest_size=8).digest(), "little") >> 1


def _indices_words(task: Task) -> str:
    """A task's samples in words, for messages: its indices, or a stream's next batch."""
    return "the next batch" if task.indices is None else f"indices {list(task.indices)}"


def _batch_size(loader: DataLoader[Any], r: Result) -> int:
    """How many samples ``r``'s batch was made of (skipped ones included)."""
    if not loader._auto_collation:
        return 1
    return r.samples or loader.batch_size or 1


def _pinner(loader: DataLoader[Any]) -> Callable[[Any], Any] | None:
    """The SlotPinner of ``pin_memory=True``, or of ``device=`` a CUDA device: batches from
    process workers are then page-locked where they lie, in their registered slots, and the
    device stage copies them without first copying them into pinned memory (5-8 against
    54 GB/s for a 64x3x224x224 batch on an H200)."""
    torch = _torch.get() if loader.pin_memory or loader._device_args is not None else None
    to_cuda = torch is not None and loader._device_args is not None and _is_cuda(torch, loader._device_args[0])
    if not (loader.pin_memory or to_cuda):
        return None
    if loader.pin_memory and loader.pin_memory_device:
        # as torch's: the device is the current accelerator's, whatever was named
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used as the device, "
                      f"ignore pin_memory_device='{loader.pin_memory_device}'.", stacklevel=4)
    if torch is None or not torch.cuda.is_available():
        if loader.pin_memory:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device "
                          "pinned memory won't be used.", stacklevel=4)
        return None  # (device= a CUDA device without CUDA is refused by the device stage)
    from .device import SlotPinner

    # the device stage keeps each host batch until its own copy ends: no fences needed there
    return SlotPinner(fences=loader._device_args is None)


def _is_cuda(torch: Any, device: Any) -> bool:
    try:
        return bool(torch.device(device).type == "cuda")
    except (RuntimeError, TypeError, ValueError):
        return False  # the device stage names what is wrong with it


if sys.version_info < (3, 11):  # pragma: no cover
    raise ImportError("conveyor needs Python 3.11 or newer")
