"""A loader's arguments: checked, coerced as torch coerces them, and completed.

``resolve`` turns ``DataLoader(...)``'s arguments into the loader's attributes; a wrong one
raises a ValueError or TypeError naming it (torch's words where torch has them).
"""

from __future__ import annotations

import hashlib
import math
import operator
import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from . import _torch
from .collate import default_collate, default_convert, numpy_collate
from .executors.fetcher import fetches_batches
from .order import Repeat
from .samplers import BatchSampler, RandomSampler, Sampler, SequentialSampler
from .placement import cpu_share
from .transport import to_numpy

__all__ = ["resolve", "is_iterable_dataset", "check_start_method", "generator_seed"]


def is_iterable_dataset(dataset: Any) -> bool:
    if not hasattr(type(dataset), "__iter__"):
        # a map-style dataset: an IterableDataset (conveyor's or torch's) without ``__iter__``
        # cannot be made (it is abstract in Iterable). The isinstance checks below walk each
        # base's subclasses the first time a class is seen, ~0.25 ms of a fresh process's loader
        return False
    from .datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        return True
    torch = _torch.loaded()
    if torch is not None:
        from torch.utils.data import IterableDataset as TorchIterable

        if isinstance(dataset, TorchIterable):
            return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def check_start_method(context: Any, num_workers: int, worker_type: str) -> Any:
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


def generator_seed(generator: Any) -> int:
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



def resolve(
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
) -> dict[str, Any]:
    """The loader's attributes from its arguments: each checked (a ValueError or TypeError naming
    it, with torch's words where torch has them), torch's coercions applied, and the defaults that
    depend on others filled in (samplers, collate_fn, "auto"'s choices)."""
    a = types.SimpleNamespace()
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
        num_workers = cpu_share()  # the most the tuner may start; it begins with none
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
                and not is_iterable_dataset(dataset)):
            raise TypeError(f"{name} should be an iterable of indices (a Sampler, a list), "
                            f"but got {name}={order!r:.100}")
    if not any(hasattr(dataset, m) for m in ("__getitem__", "__getitems__", "__iter__")):
        raise TypeError("dataset should be a map-style dataset (with __getitem__) or an iterable one "
                        f"(with __iter__), but got dataset={dataset!r:.100}")

    a.num_workers = num_workers
    a.prefetch_factor = prefetch_factor
    a._groups_ok = groups_ok
    a.pin_memory = pin_memory
    a.pin_memory_device = pin_memory_device
    a.timeout = timeout
    a.worker_init_fn = worker_init_fn
    a.multiprocessing_context = check_start_method(multiprocessing_context, num_workers, worker_type)
    a.in_order = in_order
    a.worker_type = worker_type
    a.output = output
    a.fetch_threads = fetch_threads
    a.on_error = on_error
    a.max_failures = max_failures
    a.max_worker_restarts = max_worker_restarts
    a.adaptive = adaptive
    a.restart_hung = restart_hung
    a._auto = auto if any(auto.values()) else None

    iterable = is_iterable_dataset(dataset)
    if iterable and threads_asked not in (None, 1):
        raise ValueError(f"fetch_threads needs a map-style dataset (samples fetched by index); an iterable "
                         f"dataset's samples come from one iterator per worker, but got "
                         f"fetch_threads={threads_asked!r}")
    if iterable and a._auto is not None:
        a._auto["num_workers"] = False  # replicas shard by worker count: it cannot change
        a._auto["fetch_threads"] = False  # and one iterator a worker is read by one thread
        if not any(a._auto.values()):
            a._auto = None
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

    a._seed_of_generator = seed is None and _torch.is_generator(generator)
    if a._seed_of_generator:
        seed = generator_seed(generator)
    a.seed = seed
    a._own_sampler = sampler is None and not iterable
    if sampler is None:
        if iterable:
            sampler = Repeat()
        elif shuffle:
            sampler = RandomSampler(dataset, generator=generator, seed=seed if generator is None else None)
        else:
            sampler = SequentialSampler(dataset)
    if batch_size is not None and batch_sampler is None and not iterable:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)

    a.dataset = dataset
    a.batch_size = batch_size
    a.drop_last = drop_last
    a.sampler = sampler
    a.batch_sampler = batch_sampler
    a.generator = generator
    a._iterable = iterable
    a._auto_collation = batch_size is not None if iterable else batch_sampler is not None
    if a._auto_collation and not iterable and fetches_batches(dataset):
        # its __getitems__ makes each batch in one call: no samples for threads to share (a
        # warning, not an error: one setting for many datasets is common)
        if threads_asked not in (None, 1, "auto"):
            warnings.warn(f"fetch_threads={threads_asked!r} does nothing here: fetch threads share a batch's "
                          "samples, fetched one index at a time, and this dataset makes each batch in one call "
                          "of its __getitems__ (num_workers makes more batches at once)", stacklevel=4)
            a.fetch_threads = 1
        if a._auto is not None:
            a._auto["fetch_threads"] = False
            if not any(a._auto.values()):
                a._auto = None
    if a._auto_collation:
        default_fn = default_collate if output == "torch" else numpy_collate
    else:
        default_fn = default_convert if output == "torch" else to_numpy
    # the default given back (a trainer rebuilding a loader from its attributes, as Lightning
    # does) is the default: its fast paths (bulk gathers, no conversion) stay
    a._default_collate = collate_fn is None or collate_fn is default_fn
    a.collate_fn = default_fn if collate_fn is None else collate_fn
    a.persistent_workers = persistent_workers
    return vars(a)
