"""Torch parity: the same arguments give the same batches and the same errors.

Every case runs ``torch.utils.data.DataLoader`` and ``conveyor.DataLoader``
with the same settings and compares every batch (values, dtypes, container
types) and ``len()``.
"""

from __future__ import annotations

import collections
import itertools
import threading
import multiprocessing as mp
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import conveyor
from helpers import (
    Boxes,
    GetItems,
    Mixed,
    Random,
    Squares,
    Stream,
    boxes_collate,
    WORKERS,
    init_record,
    key,
    same,
    same_epochs,
)
from resume_harness import resumes_exactly

Factory = Callable[[], dict[str, Any]]


LIMIT = 200  # a loader that never stops fails on the batch count instead of hanging


def epochs(loader: Any, n: int = 1) -> list[list[Any]]:
    return [list(itertools.islice(loader, LIMIT)) for _ in range(n)]


def both(make: Callable[[], Any], kw: Factory, *, n: int = 1, seed: int | None = None,
         extra: dict[str, Any] | None = None) -> tuple[list[list[Any]], list[list[Any]]]:
    """Run torch's and conveyor's loaders on fresh datasets and arguments; the epochs of each."""
    out = []
    for cls, more in ((tud.DataLoader, {}), (conveyor.DataLoader, extra or {})):
        if seed is not None:
            torch.manual_seed(seed)
        loader = cls(make(), **kw(), **more)
        length = len(loader)
        got = epochs(loader, n)
        if hasattr(loader, "close"):
            loader.close()
        out.append((length, got))
    (tl, tb), (cl, cb) = out
    assert cl == tl, f"len(): conveyor {cl} != torch {tl}"
    for e, (t, c) in enumerate(zip(tb, cb)):
        assert len(c) == len(t), f"epoch {e}: conveyor {len(c)} batches, torch {len(t)}"
        same_epochs(c, t)
    return tb, cb


def gen(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- batching


CASES: dict[str, tuple[Callable[[], Any], Factory]] = {
    "bs1": (Squares, lambda: {}),
    "bs5": (Squares, lambda: {"batch_size": 5}),
    "bs5_drop_last": (Squares, lambda: {"batch_size": 5, "drop_last": True}),
    "bs_none": (Squares, lambda: {"batch_size": None}),
    "bs_none_mixed": (Mixed, lambda: {"batch_size": None}),
    "mixed": (Mixed, lambda: {"batch_size": 4}),
    "mixed_drop_last": (Mixed, lambda: {"batch_size": 4, "drop_last": True}),
    "getitems": (GetItems, lambda: {"batch_size": 6}),
    "boxes": (Boxes, lambda: {"batch_size": 5, "collate_fn": boxes_collate}),
    "shuffle_generator": (Squares, lambda: {"batch_size": 4, "shuffle": True, "generator": gen()}),
    "shuffle_generator_drop": (Squares, lambda: {"batch_size": 4, "shuffle": True, "drop_last": True,
                                                 "generator": gen(3)}),
    "torch_random_sampler": (Squares, lambda: {"batch_size": 3, "sampler": tud.RandomSampler(range(23), generator=gen())}),
    "torch_subset_sampler": (Squares, lambda: {"batch_size": 2, "sampler": tud.SubsetRandomSampler([1, 4, 9, 16, 22], generator=gen())}),
    "torch_weighted_sampler": (Squares, lambda: {"batch_size": 4, "sampler": tud.WeightedRandomSampler(
        [0.1 * i + 0.1 for i in range(23)], 15, generator=gen())}),
    "torch_batch_sampler": (Squares, lambda: {"batch_sampler": tud.BatchSampler(
        tud.RandomSampler(range(23), generator=gen()), 4, drop_last=False)}),
    "list_batch_sampler": (Squares, lambda: {"batch_sampler": [[3, 1], [0], [22, 5, 6]]}),
    "list_sampler": (Squares, lambda: {"batch_size": 2, "sampler": [5, 3, 1, 0, 2]}),
    "tensor_dataset": (lambda: tud.TensorDataset(torch.arange(30).view(15, 2), torch.arange(15.0)),
                       lambda: {"batch_size": 4}),
    "subset": (lambda: tud.Subset(Squares(), [5, 1, 7, 3, 20]), lambda: {"batch_size": 2}),
    "concat": (lambda: tud.ConcatDataset([Squares(5), tud.TensorDataset(torch.ones(4, 2), torch.arange(4))]),
               lambda: {"batch_size": 3}),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("workers", [0, 2])
def test_batches(case: str, workers: int) -> None:
    make, kw = CASES[case]
    both(make, lambda: {**kw(), "num_workers": workers})


CONVEYOR_SAMPLERS: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
    "sequential": (lambda: conveyor.SequentialSampler(range(23)), lambda: tud.SequentialSampler(range(23))),
    "random": (lambda: conveyor.RandomSampler(range(23), generator=gen()),
               lambda: tud.RandomSampler(range(23), generator=gen())),
    "random_replacement": (lambda: conveyor.RandomSampler(range(23), replacement=True, num_samples=9, generator=gen()),
                           lambda: tud.RandomSampler(range(23), replacement=True, num_samples=9, generator=gen())),
    "subset": (lambda: conveyor.SubsetRandomSampler([2, 4, 8, 16], generator=gen()),
               lambda: tud.SubsetRandomSampler([2, 4, 8, 16], generator=gen())),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(CONVEYOR_SAMPLERS))
def test_conveyor_samplers(name: str) -> None:
    mine, theirs = CONVEYOR_SAMPLERS[name]
    t = list(tud.DataLoader(Squares(), batch_size=3, sampler=theirs()))
    c = list(conveyor.DataLoader(Squares(), batch_size=3, sampler=mine()))
    same_epochs(c, t)
    tb = list(tud.DataLoader(Squares(), batch_sampler=tud.BatchSampler(theirs(), 4, True)))
    cb = list(conveyor.DataLoader(Squares(), batch_sampler=conveyor.BatchSampler(mine(), 4, True)))
    same_epochs(cb, tb)


# --------------------------------------------------------------------------- executors


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_worker_counts_and_types(workers: int, worker_type: str) -> None:
    kw = lambda: {"batch_size": 3, "shuffle": True, "generator": gen(11), "num_workers": workers}  # noqa: E731
    both(Mixed, kw, n=2, extra={"worker_type": worker_type})


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", ["mixed", "boxes"])
def test_spawn(case: str) -> None:
    make, kw = CASES[case]
    # torch with fork (fast) is the reference; conveyor spawns its workers
    t = list(tud.DataLoader(make(), **kw(), num_workers=2))
    with conveyor.DataLoader(make(), **kw(), num_workers=2, multiprocessing_context="spawn") as c:
        same_epochs(list(c), t)


@pytest.mark.timeout(30)
def test_fork_context_object() -> None:
    kw = lambda: {"batch_size": 4, "num_workers": 2, "multiprocessing_context": mp.get_context("fork")}  # noqa: E731
    both(Squares, kw)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_persistent_workers(worker_type: str) -> None:
    kw = lambda: {"batch_size": 4, "shuffle": True, "generator": gen(5), "num_workers": 2,  # noqa: E731
                  "persistent_workers": True}
    both(Squares, kw, n=3, extra={"worker_type": worker_type})


@pytest.mark.timeout(30)
def test_shuffle_with_manual_seed() -> None:
    kw = lambda: {"batch_size": 4, "shuffle": True}  # noqa: E731
    both(Squares, kw, n=2, seed=1234)
    kw2 = lambda: {"batch_size": 4, "shuffle": True, "num_workers": 2}  # noqa: E731
    both(Squares, kw2, n=2, seed=99)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [0, 2])
def test_two_epochs_generator(workers: int) -> None:
    kw = lambda: {"batch_size": 5, "shuffle": True, "generator": gen(21), "num_workers": workers}  # noqa: E731
    tb, _ = both(Squares, kw, n=2)
    assert key(tb[0]) != key(tb[1]), "the two epochs should be shuffled differently"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("order", ["numpy", "tensor"])
def test_a_sampler_given_as_an_array_of_indices(workers: int, order: str) -> None:
    # np.random.permutation(n) or torch.randperm(n) as the sampler: conveyor asked the array
    # for its truth value ("ambiguous") where torch iterates it
    perm = np.random.default_rng(0).permutation(20)
    sampler = perm if order == "numpy" else torch.from_numpy(perm)
    kw = lambda: {"batch_size": 6, "sampler": sampler, "num_workers": workers}  # noqa: E731
    tb, cb = both(Squares, kw, n=2)
    assert [b[1].tolist() for b in cb[0]] == [perm[k:k + 6].tolist() for k in range(0, 20, 6)]
    # the position is saved, and resumes there
    rest = resumes_exactly(lambda: conveyor.DataLoader(Squares(), **kw()), 1, via=None, convert=key)
    assert rest == [[key(b) for b in cb[0][1:]]]


def _three_epochs_alike(make: Callable[[Any], Any], take: Callable[[Any], int]) -> None:
    """torch's and conveyor's loaders (``make(module)``) hand out the same three epochs, the
    first cut to its first ``take(loader)`` batches."""
    out = []
    for cls in (tud.DataLoader, conveyor.DataLoader):
        loader = make(cls)
        first = [b for _, b in zip(range(take(loader)), loader)]
        out.append((first, list(loader), list(loader)))
        if hasattr(loader, "close"):
            loader.close()
    for c, t in zip(out[1], out[0]):
        same_epochs(c, t)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [0, 2])
def test_break_and_iterate_again(workers: int) -> None:
    _three_epochs_alike(lambda cls: cls(Squares(), batch_size=3, shuffle=True, generator=gen(8), num_workers=workers),
                        lambda loader: 3)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("workers", "prefetch"), [(0, None), (1, 3), (2, 1), (2, 2)])
@pytest.mark.parametrize("stop", ["len", -1, -2, -4, -6])
def test_an_epoch_ended_near_its_end_without_stopiteration_moves_the_generator_as_torchs(
        workers: int, prefetch: int | None, stop: int | str) -> None:
    # torch's loader with workers reads the sampler prefetch_factor x num_workers batches
    # ahead, so an epoch taken as len(loader) batches (a trainer's count, never asking for
    # the StopIteration) or broken off in its last few ran the sampler out: RandomSampler
    # draws one more permutation then. Batches made in the main process read no further
    # than the batch being made: every later epoch's order differed from torch's.
    kw: dict[str, Any] = {} if prefetch is None else {"prefetch_factor": prefetch}
    _three_epochs_alike(
        lambda cls: cls(list(range(40)), batch_size=2, shuffle=True, generator=gen(7), num_workers=workers, **kw),
        lambda loader: len(loader) + (0 if stop == "len" else int(stop)))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("use_gen", [False, True])
def test_order_is_drawn_when_torch_draws_it(workers: int, use_gen: bool) -> None:
    # torch's iterator with workers takes its first batches of indices (drawing the order)
    # when made, without workers at the first next(): a draw in between (a model's
    # initialisation) must move both loaders' orders alike
    out = []
    for cls in (tud.DataLoader, conveyor.DataLoader):
        torch.manual_seed(0)
        kw: dict[str, Any] = {"generator": gen(3)} if use_gen else {}
        loader = cls(Squares(), batch_size=3, shuffle=True, num_workers=workers, **kw)
        it = iter(loader)
        torch.randn(3)
        out.append(list(it))
        if hasattr(loader, "close"):
            loader.close()
    same_epochs(out[1], out[0])


@pytest.mark.parametrize("module", [tud, conveyor])
def test_set_epoch_between_iter_and_the_first_batch_counts(module: Any) -> None:
    # torch's BatchSampler leaves a sampler alone until the first batch: a DistributedSampler's
    # set_epoch() after iter() still applies (the usual loop calls it before iter(), but not all)
    out = []
    for cls in (tud.DataLoader, conveyor.DataLoader):
        sampler = module.DistributedSampler(Squares(16), num_replicas=2, rank=0, shuffle=True, seed=3)
        loader = cls(Squares(16), batch_size=4, sampler=sampler)
        it = iter(loader)
        sampler.set_epoch(1)
        out.append(list(it))
    same_epochs(out[1], out[0])


@pytest.mark.timeout(30)
def test_two_iterators_sharing_a_generator_draw_as_torchs_do() -> None:
    # each iterator draws its seed and its first batches' order from the shared generator as
    # it is made; an epoch of 3 batches ends inside torch's prefetch, which draws the
    # sampler's closing permutation too
    out = []
    for cls in (tud.DataLoader, conveyor.DataLoader):
        loader = cls(Squares(12), batch_size=4, shuffle=True, num_workers=2, generator=gen(3))
        a, b = iter(loader), iter(loader)
        out.append((list(a), list(b)))
        if hasattr(loader, "close"):
            loader.close()
    same_epochs(out[1][0], out[0][0])
    same_epochs(out[1][1], out[0][1])


def test_main_process_epochs_share_one_pool_and_iterators_stay_independent() -> None:
    # without workers every epoch reuses one pool (nothing to start or close); as with torch,
    # two live iterators still walk the data independently, and a setting changed between
    # epochs applies to the next
    t = tud.DataLoader(Squares(), batch_size=3, shuffle=True, generator=gen(4))
    c = conveyor.DataLoader(Squares(), batch_size=3, shuffle=True, generator=gen(4))
    ta, ca = iter(t), iter(c)
    tfirst, cfirst = [next(ta), next(ta)], [next(ca), next(ca)]
    tb, cb = iter(t), iter(c)
    assert cb.pool is ca.pool  # type: ignore[attr-defined]
    same_epochs(list(cb), list(tb))
    same_epochs(cfirst + list(ca), tfirst + list(ta))
    c.collate_fn = t.collate_fn = lambda samples: len(samples)
    assert list(c) == list(t) == [3] * 7 + [2]
    assert iter(c).pool is not ca.pool  # type: ignore[attr-defined]
    c.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_in_order_false_same_multiset(worker_type: str) -> None:
    t = list(tud.DataLoader(Squares(40), batch_size=3, num_workers=2))
    with conveyor.DataLoader(Squares(40), batch_size=3, num_workers=2, in_order=False,
                             worker_type=worker_type) as loader:
        c = list(loader)
    assert collections.Counter(map(key, c)) == collections.Counter(map(key, t))


@pytest.mark.timeout(30)
def test_worker_init_fn_one_worker() -> None:
    kw = lambda: {"batch_size": 2, "num_workers": 1, "worker_init_fn": init_record}  # noqa: E731
    both(Random, kw, seed=5)


# --------------------------------------------------------------------------- iterable datasets


@pytest.mark.timeout(10)  # a loader that never ends an epoch hangs inside next()
@pytest.mark.parametrize("shard", ["none", "torch", "conveyor"])
@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_iterable(shard: str, workers: int, batch_size: int | None) -> None:
    if shard == "conveyor":
        # torch's workers do not publish conveyor's worker info: replicate torch with its own sharding
        t = list(tud.DataLoader(Stream(11, "torch"), batch_size=batch_size, num_workers=workers))
        with conveyor.DataLoader(Stream(11, "conveyor"), batch_size=batch_size, num_workers=workers) as c:
            assert len(c) == len(tud.DataLoader(Stream(11), batch_size=batch_size))
            same_epochs(epochs(c)[0], t)
        return
    both(lambda: Stream(11, shard), lambda: {"batch_size": batch_size, "num_workers": workers})


@pytest.mark.timeout(30)
def test_iterable_drop_last_two_epochs() -> None:
    both(lambda: Stream(11, "torch"), lambda: {"batch_size": 2, "drop_last": True, "num_workers": 2}, n=2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shard", ["conveyor", "torch", "torch-by-name"])
def test_iterable_threads_sharded_with_either_info(shard: str) -> None:
    # torch keeps one worker info per process: conveyor answers torch's function per thread,
    # also through a name imported from torch before any worker started
    t = list(tud.DataLoader(Stream(11, "torch"), batch_size=2, num_workers=2))
    with conveyor.DataLoader(Stream(11, shard), batch_size=2, num_workers=2, worker_type="thread") as c:
        same_epochs(epochs(c)[0], t)
    assert tud.get_worker_info() is None  # outside a worker, torch's own answer


@pytest.mark.timeout(30)
def test_conveyors_worker_info_answers_inside_torchs_own_workers() -> None:
    # a stream sharded with conveyor.get_worker_info, loaded by torch's DataLoader: it heard
    # None in torch's workers, and each of them read the whole stream (every sample twice)
    want = list(tud.DataLoader(Stream(11, "torch"), batch_size=2, num_workers=2))
    same_epochs(list(tud.DataLoader(Stream(11, "conveyor"), batch_size=2, num_workers=2)), want)


class _Range(tud.IterableDataset):  # type: ignore[type-arg]
    """torch's IterableDataset example 2: each worker narrows its copy's range in worker_init_fn."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Any:
        return iter(range(self.start, self.end))


def _narrow(worker_id: int) -> None:
    info = tud.get_worker_info()
    ds = info.dataset
    whole, per = (ds.start, ds.end), -(-(ds.end - ds.start) // info.num_workers)
    ds.start = whole[0] + worker_id * per
    ds.end = min(ds.start + per, whole[1])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workers", [2, 3])
def test_thread_workers_each_narrow_a_copy_of_the_stream_as_torch_documents(workers: int) -> None:
    # every thread narrowed the one shared object: 2 workers gave [8, 8, 9, 9, 10, 10, 11, 11],
    # 3 gave nothing, with no error; and the user's dataset was left changed
    ds = _Range(3, 20)
    want = sorted(tud.DataLoader(_Range(3, 20), batch_size=None, num_workers=workers, worker_init_fn=_narrow))
    with conveyor.DataLoader(ds, batch_size=None, num_workers=workers, worker_type="thread",
                             worker_init_fn=_narrow) as c:
        got = sorted(int(x) for x in c)
    assert got == [int(x) for x in want] == list(range(3, 20))
    assert (ds.start, ds.end) == (3, 20)


class WhoFetches(tud.Dataset):
    """The id of the worker fetching each index, as conveyor's and torch's info tell it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        mine, theirs = conveyor.get_worker_info(), tud.get_worker_info()
        return torch.tensor([-1 if mine is None else mine.id, -1 if theirs is None else theirs.id])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_fetch_threads_know_their_worker(worker_type: str) -> None:
    with conveyor.DataLoader(WhoFetches(), batch_size=4, num_workers=2, fetch_threads=2, adaptive=False,
                             worker_type=worker_type) as c:
        got = [b.tolist() for b in c]
    assert got == [[[0, 0]] * 4, [[1, 1]] * 4]


# --------------------------------------------------------------------------- errors


def _dead_ctx() -> Any:
    return object()


BAD: dict[str, Callable[[], dict[str, Any]]] = {
    "shuffle_and_sampler": lambda: {"dataset": Squares(), "shuffle": True, "sampler": [0, 1]},
    "batch_sampler_and_batch_size": lambda: {"dataset": Squares(), "batch_size": 3, "batch_sampler": [[0, 1]]},
    "batch_sampler_and_shuffle": lambda: {"dataset": Squares(), "shuffle": True, "batch_sampler": [[0, 1]]},
    "batch_sampler_and_sampler": lambda: {"dataset": Squares(), "sampler": [0], "batch_sampler": [[0, 1]]},
    "batch_sampler_and_drop_last": lambda: {"dataset": Squares(), "drop_last": True, "batch_sampler": [[0, 1]]},
    "batch_size_none_drop_last": lambda: {"dataset": Squares(), "batch_size": None, "drop_last": True},
    "negative_workers": lambda: {"dataset": Squares(), "num_workers": -1},
    "negative_timeout": lambda: {"dataset": Squares(), "timeout": -1},
    "prefetch_without_workers": lambda: {"dataset": Squares(), "prefetch_factor": 2},
    "negative_prefetch": lambda: {"dataset": Squares(), "num_workers": 1, "prefetch_factor": -1},
    "persistent_without_workers": lambda: {"dataset": Squares(), "persistent_workers": True},
    "bad_context_string": lambda: {"dataset": Squares(), "num_workers": 1, "multiprocessing_context": "nope"},
    "bad_context_object": lambda: {"dataset": Squares(), "num_workers": 1, "multiprocessing_context": _dead_ctx()},
    "context_without_workers": lambda: {"dataset": Squares(), "multiprocessing_context": "fork"},
    "iterable_shuffle": lambda: {"dataset": Stream(), "shuffle": True},
    "iterable_sampler": lambda: {"dataset": Stream(), "sampler": [0, 1]},
    "iterable_batch_sampler": lambda: {"dataset": Stream(), "batch_sampler": [[0, 1]]},
    # torch's own test_invalid_ctor_args_combinations: a stream refuses any sampler first
    "iterable_sampler_int": lambda: {"dataset": Stream(), "sampler": 3},
    "iterable_batch_sampler_int": lambda: {"dataset": Stream(), "batch_sampler": 3},
}


def _error_of(fn: Callable[[], Any]) -> type[BaseException] | None:
    try:
        fn()
    except Exception as exc:
        return type(exc)
    return None


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_like_torch(case: str) -> None:
    theirs = _error_of(lambda: tud.DataLoader(**BAD[case]()))
    assert theirs is not None, f"torch accepted {case}"
    mine = _error_of(lambda: conveyor.DataLoader(**BAD[case]()))
    assert mine is theirs, f"{case}: conveyor raised {mine}, torch raised {theirs}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [np.int64(2), np.int32(1), True, torch.tensor(1)],
                         ids=["np.int64", "np.int32", "bool", "0-d tensor"])
def test_a_worker_count_torch_takes_as_an_integer_is_taken(count: Any) -> None:
    """torch compares num_workers with 0 and counts with it: anything integer-like runs."""
    want = [[t.tolist() for t in b] for b in tud.DataLoader(Squares(), batch_size=4, num_workers=count)]
    loader = conveyor.DataLoader(Squares(), batch_size=4, num_workers=count)
    assert type(loader.num_workers) is int and loader.num_workers == int(count)
    assert [[t.tolist() for t in b] for b in loader] == want


# torch takes these and fails at the first batch with a TypeError that names no argument
# ("'int' object is not callable"): conveyor raises the same type when the loader is made
LATE: dict[str, Callable[[], dict[str, Any]]] = {
    "collate_fn": lambda: {"dataset": Squares(), "collate_fn": 3},
    "worker_init_fn": lambda: {"dataset": Squares(), "num_workers": 1, "worker_init_fn": "init"},
    "sampler": lambda: {"dataset": Squares(), "sampler": 3},
    "batch_sampler": lambda: {"dataset": Squares(), "batch_sampler": 3},
    "dataset": lambda: {"dataset": None},
}


@pytest.mark.parametrize("case", sorted(LATE))
def test_arguments_torch_finds_wrong_only_when_iterated_are_refused_when_made(case: str) -> None:
    assert _error_of(lambda: tud.DataLoader(**LATE[case]())) is None
    assert _error_of(lambda: next(iter(tud.DataLoader(**LATE[case]())))) is TypeError
    with pytest.raises(TypeError, match=case):
        conveyor.DataLoader(**LATE[case]())


@pytest.mark.parametrize("attr,value", [("batch_size", 4), ("sampler", [0]), ("batch_sampler", [[0]]),
                                        ("drop_last", True), ("dataset", [1, 2])])
def test_setting_frozen_attribute_after_init(attr: str, value: Any) -> None:
    t = tud.DataLoader(Squares(), batch_size=2)
    c = conveyor.DataLoader(Squares(), batch_size=2)
    theirs = _error_of(lambda: setattr(t, attr, value))
    mine = _error_of(lambda: setattr(c, attr, value))
    assert theirs is not None
    assert mine is theirs


@pytest.mark.parametrize("workers, value", [(2, "bad"), (2, object()), (0, "fork"), (2, "spawn")])
def test_setting_multiprocessing_context_after_init_is_checked_as_torchs(workers: int, value: Any) -> None:
    t = tud.DataLoader(Squares(), batch_size=2, num_workers=workers)
    c = conveyor.DataLoader(Squares(), batch_size=2, num_workers=workers)
    theirs = _error_of(lambda: setattr(t, "multiprocessing_context", value))
    mine = _error_of(lambda: setattr(c, "multiprocessing_context", value))
    assert mine is theirs
    if theirs is None:  # a start method's name becomes its context
        assert c.multiprocessing_context is mp.get_context(value) and t.multiprocessing_context is mp.get_context(value)


def test_a_start_method_for_thread_workers_is_refused_naming_it() -> None:
    # thread workers start no processes: a start method given for them was dropped unsaid
    with pytest.raises(ValueError, match="multiprocessing_context.*worker_type='thread'"):
        conveyor.DataLoader(Squares(), batch_size=2, num_workers=1, worker_type="thread",
                            multiprocessing_context="spawn")
    with conveyor.DataLoader(Squares(), batch_size=2, num_workers=1, worker_type="thread") as loader:
        with pytest.raises(ValueError, match="multiprocessing_context.*worker_type='thread'"):
            loader.multiprocessing_context = "spawn"
        loader.multiprocessing_context = None
        assert loader.multiprocessing_context is None


# --------------------------------------------------------------------------- per-worker seeding


def _seed_of(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    assert info is not None
    # torch's worker seed is base_seed + worker_id; both loaders draw base_seed the same way
    assert torch.initial_seed() == info.seed


def _seeds(cls: Any, seed: int) -> list[int]:
    torch.manual_seed(seed)
    loader = cls(_WorkerSeed(4), batch_size=1, num_workers=2, worker_init_fn=_seed_of)
    got = sorted({int(b[1][0]) for b in loader})
    if hasattr(loader, "close"):
        loader.close()
    return got


class _WorkerSeed(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, torch.initial_seed()


@pytest.mark.timeout(30)
def test_worker_seeds_match_torch() -> None:
    assert _seeds(conveyor.DataLoader, 42) == _seeds(tud.DataLoader, 42)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_random_in_getitem_matches_torch_two_workers(batch_size: int) -> None:
    """No seed given: torch.randint in __getitem__ gives torch's values for the same manual_seed.

    Torch hands map-style batches to its workers in strict round robin; values match only when
    conveyor hands batch k to worker k % num_workers and each worker fetches its batches in order.
    """
    both(lambda: Random(16), lambda: {"batch_size": batch_size, "num_workers": 2}, seed=2024)


class _RandomWithWorker(tud.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        assert info is not None, "sample fetched outside a worker"
        return torch.cat([torch.randint(0, 2**30, (2,)), torch.tensor([info.id, info.seed])])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_each_worker_draws_torchs_stream(batch_size: int) -> None:
    """What conveyor promises: worker w is seeded base_seed + w as torch, and its samples draw its
    stream in order, whichever batches it is handed."""
    torch.manual_seed(2024)
    with conveyor.DataLoader(_RandomWithWorker(), batch_size=batch_size, num_workers=2, **WORKERS) as loader:
        rows = [r for b in loader for r in b.tolist()]
    assert len(rows) == 16
    by_worker: dict[tuple[int, int], list[list[int]]] = {}
    for a, b, wid, seed in rows:
        by_worker.setdefault((wid, seed), []).append([a, b])
    for (wid, seed), values in by_worker.items():
        torch.manual_seed(seed)
        assert values == [torch.randint(0, 2**30, (2,)).tolist() for _ in values], f"worker {wid}"
    torch.manual_seed(2024)
    assert sorted(_seeds(tud.DataLoader, 2024)) == sorted({seed for _, seed in by_worker})


# --------------------------------------------------------------------------- the seed's training loop


class DiabetesDataset(tud.Dataset):
    """The seed's dataset, unchanged apart from its CSV path."""

    def __init__(self, filepath: str) -> None:
        xy = np.loadtxt(filepath, delimiter=",", dtype=np.float32)
        self.len = xy.shape[0]
        self.x_data = torch.from_numpy(xy[:, :-1])
        self.y_data = torch.from_numpy(xy[:, [-1]])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_data[index], self.y_data[index]

    def __len__(self) -> int:
        return self.len


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(8, 6)
        self.linear2 = torch.nn.Linear(6, 4)
        self.linear3 = torch.nn.Linear(4, 1)
        self.sigmoid = torch.nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.sigmoid(self.linear1(x))
        x = self.sigmoid(self.linear2(x))
        x = self.sigmoid(self.linear3(x))
        return x


def _train(loader_cls: Any, csv: str, workers: int) -> list[float]:
    torch.manual_seed(0)
    dataset = DiabetesDataset(csv)
    train_loader = loader_cls(dataset=dataset, batch_size=32, shuffle=True, num_workers=workers)
    model = Model()
    criterion = torch.nn.BCELoss(reduction="mean")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(3):
        for i, data in enumerate(train_loader):
            x, y = data
            y_pre = model.forward(x)
            loss = criterion(y_pre, y)
            losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return losses


@pytest.fixture(scope="module")
def diabetes_csv(tmp_path_factory: pytest.TempPathFactory) -> str:
    rs = np.random.RandomState(0)
    x = rs.uniform(-1, 1, size=(200, 8)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float32)
    path = Path(tmp_path_factory.mktemp("diabetes")) / "diabetes.csv"
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", fmt="%.6f")
    return str(path)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", [0, 2])
def test_diabetes_training_loop(diabetes_csv: str, workers: int) -> None:
    theirs = _train(tud.DataLoader, diabetes_csv, workers)
    mine = _train(conveyor.DataLoader, diabetes_csv, workers)
    assert len(mine) == len(theirs) == 3 * 7
    assert mine == theirs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_a_loader_copies_and_pickles_as_torchs(how: str) -> None:
    # torch's loader pickles and copies (its arguments and dataset); conveyor's copies its
    # arguments and position, and makes its own workers, statistics and device stage
    import copy
    import pickle

    make = {"pickle": lambda x: pickle.loads(pickle.dumps(x)), "deepcopy": copy.deepcopy, "copy": copy.copy}[how]
    loader = conveyor.DataLoader(Squares(), batch_size=3, shuffle=True, generator=gen(2), num_workers=2,
                                 persistent_workers=True, device="cpu")
    clone = make(loader)
    theirs = make(tud.DataLoader(Squares(), batch_size=3, shuffle=True, generator=gen(2), num_workers=2,
                                 persistent_workers=True))
    mine, copied = [list(loader) for _ in range(2)], [list(clone) for _ in range(2)]
    if how != "copy":  # a shallow copy shares the generator with its original
        same_epochs(copied[0] + copied[1], mine[0] + mine[1])
        same_epochs(copied[0] + copied[1], [b for _ in range(2) for b in theirs])
    assert clone._persistent is not loader._persistent and clone._device_stage is not loader._device_stage
    # a loader that has run copies too: its position goes with it, not its workers
    again = make(loader)
    assert again._persistent is None and again.state_dict()["epoch"] == loader.state_dict()["epoch"]
    # taken mid-epoch, the copy goes on with that epoch where the original is
    it = iter(loader)
    for _ in range(2):
        next(it)
    middle = make(loader)
    if how == "copy":  # it shares the sampler and generator being iterated: it starts afresh
        assert middle.state_dict()["batches"] == 0
        rest = list(it)
        assert len(rest) == len(loader) - 2
    else:
        assert middle.state_dict()["batches"] == 2
        same_epochs(list(middle), list(it))
    for x in (loader, clone, again, middle):
        x.close()


class _OwnGather(tud.Dataset):
    """A dataset whose ``gather`` method has nothing to do with conveyor's protocol."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> int:
        return i * 10

    def gather(self, what: str) -> str:
        return what


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("make", ["tensor", "own_gather"])
def test_a_tensor_or_a_dataset_with_its_own_gather_is_indexed(make: str, workers: int) -> None:
    """torch.Tensor has a gather() method too: only datasets saying ``gatherable = True`` are
    gathered; the rest go through ``__getitem__`` as torch's loader does."""
    def ds() -> Any:
        return torch.arange(12.0).view(6, 2) if make == "tensor" else _OwnGather()

    want = list(tud.DataLoader(ds(), batch_size=2, num_workers=workers))
    got = list(conveyor.DataLoader(ds(), batch_size=2, num_workers=workers, **WORKERS))
    same_epochs(want, got)


class _Point:
    def __init__(self, x: int) -> None:
        self.x = x


def _points(batch: list[_Point], *, collate_fn_map: Any = None) -> list[int]:
    return [p.x * 10 for p in batch]


def _padded(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(batch, batch_first=True)


class _Ragged(tud.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, _Point]:
        return torch.arange(i + 1), _Point(i)


@pytest.mark.parametrize("workers", [0, 2])
def test_functions_registered_in_torchs_collate_table_are_used(workers: int) -> None:
    """torch's documented way to extend default_collate: register a type, or replace its own
    entry, in torch.utils.data._utils.collate.default_collate_fn_map."""
    from torch.utils.data._utils import collate as torch_collate

    table = torch_collate.default_collate_fn_map
    saved = dict(table)
    try:
        table[_Point] = _points
        table[torch.Tensor] = _padded
        want = list(tud.DataLoader(_Ragged(), batch_size=3, num_workers=workers))
        got = list(conveyor.DataLoader(_Ragged(), batch_size=3, num_workers=workers, **WORKERS))
        same_epochs(want, got)
        assert got[1][1] == [30, 40, 50]
        assert conveyor.default_collate([_Point(1), _Point(2)]) == [10, 20]
    finally:
        table.clear()
        table.update(saved)
    # with torch's table as it was, conveyor's own functions are back
    with pytest.raises(TypeError, match="default_collate"):
        conveyor.default_collate([_Point(1), _Point(2)])
    same(conveyor.default_collate([torch.zeros(2), torch.ones(2)]), torch.tensor([[0.0, 0.0], [1.0, 1.0]]))


class _WaitsAtZero(tud.Dataset):
    """Index 0 waits (up to 20 s) for a file the consumer creates once it has had ``need``
    other batches: only a loader that passes the stuck worker over gets there."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> int:
        if i == 0:
            import time

            end = time.monotonic() + 20
            while not Path(self.flag).exists() and time.monotonic() < end:
                time.sleep(0.01)
        return i


@pytest.mark.timeout(60)
def test_in_order_false_passes_over_a_worker_stuck_on_a_slow_batch(tmp_path: Path) -> None:
    """torch, in_order=False: a worker holding its share of batches gets no more; the other
    workers take them. (Strict round robin stopped at the stuck worker's turn: 2 batches.)"""
    flag = str(tmp_path / "go")
    loader = conveyor.DataLoader(_WaitsAtZero(flag), batch_size=1, num_workers=2, in_order=False, **WORKERS)
    before = 0
    seen = []
    for batch in loader:
        seen.append(int(batch))
        if 0 not in seen:
            before += 1
            if before == 10:
                Path(flag).touch()
    assert sorted(seen) == list(range(24))
    assert before >= 10


class _NoGetitems(tud.Dataset):
    __getitems__ = None  # torch: a falsy __getitems__ means "none", fetch one by one

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize("workers", [0, 2])
def test_a_getitems_set_to_none_fetches_one_by_one(workers: int) -> None:
    want = list(tud.DataLoader(_NoGetitems(), batch_size=2, num_workers=workers))
    same_epochs(want, list(conveyor.DataLoader(_NoGetitems(), batch_size=2, num_workers=workers, **WORKERS)))


class _LongerThanItSays(tud.IterableDataset):
    def __len__(self) -> int:
        return 6

    def __iter__(self) -> Any:
        return iter(range(9))


@pytest.mark.parametrize("workers, batch_size", [(0, None), (0, 1), (0, 2), (2, 1)])
def test_a_stream_longer_than_its_len_warns_as_torchs(workers: int, batch_size: int | None) -> None:
    import warnings

    def warned(module: Any) -> tuple[int, int]:
        loader = module.DataLoader(_LongerThanItSays(), batch_size=batch_size, num_workers=workers)
        len(loader)  # torch warns only once len() was asked
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            n = sum(1 for _ in loader)
        return n, sum("Length of IterableDataset" in str(w.message) for w in caught)

    theirs, mine = warned(tud), warned(conveyor)
    assert mine == theirs
    assert batch_size == 2 or theirs[1] > 0


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_datapipe_is_sharded_and_shuffled_as_torchs_loader_does(workers: int, persistent: bool) -> None:
    # torch's (deprecated) DataPipes: shuffle= sets their shufflers, and each worker shards its
    # copy after one shared shuffle: every item once an epoch, never twice
    datapipes = pytest.importorskip("torch.utils.data.datapipes.iter")
    pipe = datapipes.IterableWrapper(range(40)).shuffle().sharding_filter()
    loader = conveyor.DataLoader(pipe, batch_size=4, shuffle=True, num_workers=workers,
                                 persistent_workers=persistent)
    epochs = [[int(v) for b in loader for v in b] for _ in range(2)]
    for items in epochs:
        assert sorted(items) == list(range(40))
    assert epochs[0] != list(range(40)) and epochs[0] != epochs[1]
    theirs = tud.DataLoader(datapipes.IterableWrapper(range(40)).shuffle().sharding_filter(), batch_size=4,
                            shuffle=False, num_workers=workers)
    mine = conveyor.DataLoader(datapipes.IterableWrapper(range(40)).shuffle().sharding_filter(), batch_size=4,
                               shuffle=False, num_workers=workers)
    assert [b.tolist() for b in mine] == [b.tolist() for b in theirs]  # shuffle=False: in order


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_datapipe_s_unseeded_epochs_and_the_rng_after_them_are_torchs(workers: int, persistent: bool) -> None:
    # one torch.manual_seed, then epochs with no seed of their own: each epoch's shuffle and
    # what the global RNG gives afterwards are torch's, as torch's loader draws its DataPipe
    # seeds (one more where an iterator starts its workers)
    datapipes = pytest.importorskip("torch.utils.data.datapipes.iter")

    def run(module: Any) -> tuple[list[list[int]], float]:
        torch.manual_seed(7)
        pipe = datapipes.IterableWrapper(range(20)).shuffle().sharding_filter()
        loader = module.DataLoader(pipe, batch_size=None, num_workers=workers, persistent_workers=persistent)
        epochs = [[int(v) for v in loader] for _ in range(3)]
        return epochs, torch.rand(1).item()

    mine, theirs = run(conveyor), run(tud)
    assert all(sorted(e) == list(range(20)) for e in mine[0])
    assert mine == theirs


def test_a_datapipe_refuses_thread_workers_it_cannot_shard() -> None:
    datapipes = pytest.importorskip("torch.utils.data.datapipes.iter")
    with pytest.raises(ValueError, match="DataPipe"):
        conveyor.DataLoader(datapipes.IterableWrapper(range(4)), num_workers=2, worker_type="thread")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("iterable", [False, True])
def test_an_iterator_taken_before_goes_on_with_the_epoch_a_new_iter_starts_on_persistent_workers(
        iterable: bool) -> None:
    # torch's loader keeps one iterator over persistent workers and iter() resets it: a batch
    # peeked at mid-epoch restarts the epoch under the training loop, zip(loader, loader)
    # pairs consecutive batches. Ending the earlier iterator cut the epoch short silently.
    class Stream(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            return iter(range(info.id, 10, info.num_workers) if info else range(10))

    def runs(make: Callable[..., Any]) -> tuple[list, list, list]:
        loader = make(Stream() if iterable else list(range(10)), batch_size=2, num_workers=2,
                      persistent_workers=True)
        steps = []
        for step, batch in enumerate(loader):
            steps.append(batch.tolist())
            if step == 1:
                next(iter(loader))
        pairs = [(a.tolist(), b.tolist()) for a, b in zip(loader, loader)]
        a, b = iter(loader), iter(loader)
        both = [next(a).tolist(), next(b).tolist(), *(x.tolist() for x in a)]
        if hasattr(loader, "close"):
            loader.close()
        return steps, pairs, both

    ours, theirs = runs(conveyor.DataLoader), runs(tud.DataLoader)
    assert ours == theirs
    assert len(ours[0]) > 2 and ours[1]  # the epoch went on; zip paired batches


class _SeesIndices(tud.Dataset):
    """``__getitems__`` answers with the type of the indices it was given, once per sample."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> str:
        return "one"

    def __getitems__(self, idx: Any) -> list[str]:
        return [type(idx).__name__] * len(idx)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_getitems_in_workers_gets_the_indices_as_the_batch_sampler_gave_them(worker_type: str) -> None:
    # a bucketing batch sampler's numpy arrays reached a vectorised __getitems__ as lists
    # once workers made the batches (idx.min() raised AttributeError), where torch passes them on
    batches = [np.array([3, 4, 5]), (10, 11), range(20, 23), torch.tensor([7, 8]), [1, 2]]
    theirs = list(tud.DataLoader(_SeesIndices(), batch_sampler=batches, num_workers=2, collate_fn=list))
    with conveyor.DataLoader(_SeesIndices(), batch_sampler=batches, num_workers=2, collate_fn=list,
                             worker_type=worker_type, seed=3) as loader:
        ours = list(loader)
    assert ours == theirs == [["ndarray"] * 3, ["tuple"] * 2, ["range"] * 3, ["Tensor"] * 2, ["list"] * 2]


@pytest.mark.timeout(60)
def test_torchs_private_names_that_tools_read() -> None:
    class Stream(tud.IterableDataset):
        def __iter__(self):
            return iter(range(6))

        def __len__(self) -> int:
            return 6

    for make in (tud.DataLoader, conveyor.DataLoader):
        mapped, stream = make(list(range(10)), batch_size=2), make(Stream(), batch_size=2)
        assert (mapped._dataset_kind, stream._dataset_kind) == (0, 1)
        assert stream._IterableDataset_len_called is None
        len(stream)
        assert stream._IterableDataset_len_called == 6
        loader = make(list(range(10)), batch_size=2, num_workers=2, persistent_workers=True)
        assert loader._iterator is None
        it = iter(loader)
        next(it)
        assert loader._iterator is not None
        # Lightning, when a loop ends: the workers go, the next epoch gets new ones
        loader._iterator = None
        assert loader._iterator is None
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
        with pytest.warns(UserWarning, match="This DataLoader will create 64 worker processes in total.*excessive worker creation"):
            make(list(range(10)), num_workers=64).check_worker_number_rationality()
        if make is conveyor.DataLoader:
            assert it.pool.dead and loader._persistent is not None  # new workers served the epoch after
            loader.close()


class _Together(tud.Dataset):
    """Each sample waits until three others are being fetched with it (a barrier of 4): an
    epoch ends only if the loader fetches its samples four at a time."""

    def __init__(self, n: int = 16) -> None:
        self.n, self.barrier = n, threading.Barrier(4, timeout=10)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.barrier.wait()
        return i


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wrap", ["subset", "random_split", "stack", "nested"])
def test_torchs_wrappers_of_a_dataset_fetched_by_index_get_fetch_threads(wrap: str) -> None:
    # Subset and StackDataset define a __getitems__ that loops over dataset[i] when what they
    # wrap has none: batches of a random_split were fetched one sample after another whatever
    # fetch_threads said (here: BrokenBarrierError after 10 s)
    base = _Together(32)
    if wrap == "subset":
        ds, want = tud.Subset(base, list(range(0, 32, 2))), list(range(0, 32, 2))
    elif wrap == "random_split":
        ds = tud.random_split(base, [16, 16], generator=torch.Generator().manual_seed(0))[0]
        want = [int(i) for i in ds.indices]
    elif wrap == "stack":
        ds, want = tud.StackDataset(tud.Subset(base, range(16)), list(range(100, 116))), None
    else:
        ds, want = tud.Subset(tud.Subset(base, list(range(16, 32))), list(range(16))), list(range(16, 32))
    with conveyor.DataLoader(ds, batch_size=4, num_workers=1, worker_type="thread", fetch_threads=4,
                             collate_fn=list, adaptive=False) as loader:
        got = [s for batch in loader for s in batch]
    if want is None:
        assert got == [(i, 100 + i) for i in range(16)]
    else:
        assert got == want


class _Vectorised(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        raise AssertionError("fetched one by one")

    def __getitems__(self, idx: list[int]) -> list[int]:
        return [i * 10 for i in idx]


@pytest.mark.timeout(60)
def test_a_dataset_that_makes_its_batches_in_one_call_is_warned_of_fetch_threads_and_keeps_the_call() -> None:
    # fetch threads share a batch's samples; a __getitems__ of its own makes the batch in one
    # call (directly or under a Subset): the threads did nothing, said nowhere
    for ds in (_Vectorised(), tud.Subset(_Vectorised(), range(8))):
        with pytest.warns(UserWarning, match="fetch_threads=4 does nothing"):
            loader = conveyor.DataLoader(ds, batch_size=4, num_workers=1, fetch_threads=4, collate_fn=list)
        with loader:
            assert loader.fetch_threads == 1 and loader.stats()["fetch_threads"] == 1
            assert [b for b in loader] == [[0, 10, 20, 30], [40, 50, 60, 70]]
    with conveyor.DataLoader(tud.Subset(_Vectorised(), range(8)), batch_size=4, num_workers="auto",
                             collate_fn=list) as loader:
        assert [b for b in loader] == [[0, 10, 20, 30], [40, 50, 60, 70]]
        assert loader.stats()["batch_getitems"] and loader._auto is not None
        assert not loader._auto["fetch_threads"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch_size", [None, 1])
def test_fetch_threads_of_a_thread_worker_run_across_batches_of_one_sample(batch_size: int | None) -> None:
    # a thread worker started a task's fetches only when it got to that task, waiting on one
    # at a time: batches of one sample were fetched one after another whatever the threads.
    # (batch_size=None fetches dataset[i], as torch does, under a Subset too: threads may share those.)
    # Not process workers: they read new orders between batches, so at times only three are in
    # flight, and this barrier of four breaks (a leftover)
    ds = tud.Subset(_Together(8), range(8))
    with conveyor.DataLoader(ds, batch_size=batch_size, num_workers=1, worker_type="thread", fetch_threads=4,
                             adaptive=False, collate_fn=None if batch_size is None else list) as loader:
        assert [int(x) if batch_size is None else x[0] for x in loader] == list(range(8))
