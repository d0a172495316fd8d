"""Determinism: with a seed, batches are a function of (seed, epoch, index) only.

A dataset drawing from ``random``, numpy's and torch's global RNGs inside
``__getitem__`` (or ``__getitems__``) must give bit-identical batches for any
worker count, worker type, prefetch depth, fetch concurrency and adaptivity;
other seeds and other epochs must give other streams.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from helpers import same_epochs

import conveyor
from conveyor import DataLoader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def draw(i: int) -> torch.Tensor:
    """One sample: its index and one draw from each global RNG."""
    return torch.tensor(
        [i, random.getrandbits(31), int(np.random.randint(0, 2**31)), int(torch.randint(0, 2**31, ()).item()),
         int(torch.rand(()).mul(2**20).item())],
        dtype=torch.int64,
    )


class Noisy(conveyor.Dataset):
    """``__getitem__`` draws from every global RNG (as random augmentation does)."""

    def __init__(self, n: int = 30) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return draw(i)


class NoisyItems(Noisy):
    """The same, fetched a batch at a time through ``__getitems__``."""

    def __getitem__(self, i: int) -> torch.Tensor:
        raise AssertionError("__getitems__ should be used")

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return [draw(i) for i in indices]


def epochs(loader: DataLoader[Any], count: int = 2) -> list[list[Any]]:
    with loader:
        return [[b.clone() for b in loader] for _ in range(count)]


BASE: dict[str, Any] = {"batch_size": 4, "shuffle": True}

# (num_workers, worker_type, prefetch_factor, fetch_threads, adaptive)
CONFIGS = [
    (1, "process", 2, 1, False),
    (2, "process", 1, 1, False),
    (2, "process", 4, 4, False),
    (2, "process", 2, 1, True),
    (6, "process", 2, 1, False),
    (1, "thread", 2, 1, False),
    (2, "thread", 1, 4, False),
    (2, "thread", 4, 1, True),
    (6, "thread", 2, 4, False),
]


def _ids(cfg: tuple[Any, ...]) -> str:
    return "w{}-{}-pf{}-ft{}-ad{}".format(*cfg)


def make(ds: Any, cfg: tuple[int, str, int, int, bool] | None, **kw: Any) -> DataLoader[Any]:
    if cfg is None:
        return DataLoader(ds, **BASE, **kw)
    workers, kind, prefetch, fetch, adaptive = cfg
    return DataLoader(ds, **BASE, **kw, num_workers=workers, worker_type=kind, prefetch_factor=prefetch,
                      fetch_threads=fetch, adaptive=adaptive)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
@pytest.mark.parametrize("dataset", [Noisy, NoisyItems])
def test_seed_gives_same_batches_for_any_execution(cfg: tuple[Any, ...], dataset: type[Noisy]) -> None:
    ref = epochs(make(dataset(), None, seed=7))
    got = epochs(make(dataset(), cfg, seed=7))
    for e in range(2):
        same_epochs(ref[e], got[e])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_persistent_workers_keep_a_seeds_epochs_and_a_generators_follow_torch(worker_type: str) -> None:
    # seed mode: epochs are a function of (seed, epoch) whatever the workers' lifetime.
    # torch mode: torch draws each iterator's base seed from the generator, and persistent
    # workers make one iterator for every epoch: from the second epoch on, the order differs
    # from a loader without persistent workers, in torch and in conveyor alike.
    kw: dict[str, Any] = {"num_workers": 2, "worker_type": worker_type, "persistent_workers": True,
                          "adaptive": False}
    ref = epochs(make(Noisy(), None, seed=7), 3)
    got = epochs(DataLoader(Noisy(), **BASE, **kw, seed=7), 3)
    for e in range(3):
        same_epochs(ref[e], got[e])
    alone = epochs(make(Noisy(), None, generator=torch.Generator().manual_seed(11)), 3)
    persistent = epochs(DataLoader(Noisy(), **BASE, **kw, generator=torch.Generator().manual_seed(11)), 3)
    same_epochs(alone[0], persistent[0])
    assert not all(torch.equal(a, b) for a, b in zip(alone[1], persistent[1]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[6]], ids=_ids)
def test_generator_gives_same_batches_for_any_execution(cfg: tuple[Any, ...]) -> None:
    ref = epochs(make(Noisy(), None, generator=torch.Generator().manual_seed(11)))
    got = epochs(make(Noisy(), cfg, generator=torch.Generator().manual_seed(11)))
    for e in range(2):
        same_epochs(ref[e], got[e])


@pytest.mark.timeout(60)
def test_without_shuffle_the_samples_rng_is_seeded_too() -> None:
    ref = epochs(DataLoader(Noisy(), batch_size=3, seed=5))
    got = epochs(DataLoader(Noisy(), batch_size=3, seed=5, num_workers=2, worker_type="thread", fetch_threads=2))
    same_epochs(ref[0], got[0])
    same_epochs(ref[1], got[1])


def test_repeated_runs_agree_and_global_rng_does_not_matter() -> None:
    torch.manual_seed(1)
    random.seed(1)
    a = epochs(make(Noisy(), None, seed=3))
    torch.manual_seed(2)
    random.seed(2)
    np.random.seed(2)
    b = epochs(make(Noisy(), None, seed=3))
    same_epochs(a[0], b[0])
    same_epochs(a[1], b[1])


def _values(batches: list[torch.Tensor]) -> list[list[int]]:
    return [row for b in batches for row in b.tolist()]


@pytest.mark.parametrize("dataset", [Noisy, NoisyItems])
def test_other_seeds_and_epochs_give_other_streams(dataset: type[Noisy]) -> None:
    a = epochs(make(dataset(), None, seed=1))
    b = epochs(make(dataset(), None, seed=2))
    for e in range(2):
        assert _values(a[e]) != _values(b[e])
    # across epochs: another order, and other draws for the same sample
    assert [r[0] for r in _values(a[0])] != [r[0] for r in _values(a[1])]
    first = {r[0]: r[1:] for r in _values(a[0])}
    second = {r[0]: r[1:] for r in _values(a[1])}
    assert first.keys() == second.keys()
    assert all(first[i] != second[i] for i in first)


def test_other_generator_seeds_give_other_streams() -> None:
    a = epochs(make(Noisy(), None, generator=torch.Generator().manual_seed(1)), 1)
    b = epochs(make(Noisy(), None, generator=torch.Generator().manual_seed(2)), 1)
    assert _values(a[0]) != _values(b[0])


def _draws(loader: DataLoader[Any]) -> dict[int, list[int]]:
    return {r[0]: r[1:] for r in _values(epochs(loader, 1)[0])}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cfg", [None, CONFIGS[1]], ids=["main", "workers"])
def test_a_loader_made_again_over_the_same_generator_draws_new_augmentations(cfg: Any) -> None:
    # a trainer that rebuilds its loader every epoch hands it the same generator, which the
    # last one advanced: torch's workers then draw other seeds from it. Seeding every sample
    # by the generator's initial seed alone gave each sample its first epoch's draws again.
    g = torch.Generator().manual_seed(5)
    first, again = _draws(make(Noisy(), cfg, generator=g)), _draws(make(Noisy(), cfg, generator=g))
    assert first.keys() == again.keys()
    assert all(first[i] != again[i] for i in first)
    # still a function of the generator: the same sequence of loaders gives the same draws,
    # with or without workers
    h = torch.Generator().manual_seed(5)
    assert _draws(make(Noisy(), None, generator=h)) == first
    assert _draws(make(Noisy(), None, generator=h)) == again


def test_a_generator_set_after_the_loader_is_made_seeds_its_samples() -> None:
    loader = make(Noisy(), None, generator=torch.Generator().manual_seed(1))
    loader.generator = torch.Generator().manual_seed(2)
    assert _draws(loader) == _draws(make(Noisy(), None, generator=torch.Generator().manual_seed(2)))
    loader.generator = None  # torch then draws from the global RNG, as the loader does now
    assert loader.seed is None


def test_sample_draws_do_not_depend_on_its_batch() -> None:
    """The draws of sample i are the same whatever batch (or position) it lands in."""
    a = epochs(DataLoader(Noisy(), batch_size=4, seed=9), 1)
    b = epochs(DataLoader(Noisy(), batch_size=7, seed=9, num_workers=2, worker_type="thread"), 1)
    assert _values(a[0]) == _values(b[0])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", [{}, {"num_workers": 2, "adaptive": True}, {"num_workers": 2, "adaptive": False}],
                         ids=["inline", "adaptive", "processes"])
def test_main_process_rng_is_left_alone(kw: dict[str, Any]) -> None:
    """Seeding per sample must not change the user's global RNG streams in the main process.

    (Thread workers share the process's global RNGs: docs/determinism.md says so.)
    """
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    with DataLoader(Noisy(), batch_size=4, seed=4, **kw) as loader:
        for _ in loader:
            pass
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], got[0]) and expected[1:] == got[1:]


@pytest.mark.timeout(60)
def test_without_seed_workers_are_seeded_like_torch() -> None:
    """No seed: a process worker's RNGs start as torch seeds them (base_seed + worker id).

    One worker keeps the comparison independent of the dispatch order (which
    test_parity.py checks against torch's round robin with two).
    """
    ds = Noisy(12)
    torch.manual_seed(42)
    want = [b.clone() for b in torch.utils.data.DataLoader(ds, batch_size=3, num_workers=1)]
    torch.manual_seed(42)
    with DataLoader(ds, batch_size=3, num_workers=1, adaptive=False) as loader:
        got = [b.clone() for b in loader]
    same_epochs(want, got)


@pytest.mark.timeout(60)
def test_adaptive_probing_of_a_drawing_dataset_matches_the_worker() -> None:
    """No seed, adaptive: the main process's probing batch is first made with the user's RNGs,
    finds they moved, puts them back and makes the batch again as the worker would. Batches
    and the user's streams come out as without probing."""
    ds = Noisy(12)
    runs = []
    for adaptive in (False, True):
        conveyor.rng.seed_all(42, numpy_seed=42)  # the caller's RNGs, alike for both runs
        with DataLoader(ds, batch_size=3, num_workers=1, adaptive=adaptive) as loader:
            got = [b.clone() for b in loader]
            probed = loader.stats()["main_process_batches"]
        runs.append((got, probed, torch.rand(2), random.random(), np.random.rand()))
    (want, none, *after_want), (got, probed, *after_got) = runs
    same_epochs(want, got)
    assert none == 0 and probed == 1  # the one probing batch, made again seeded as the worker
    assert torch.equal(after_want[0], after_got[0]) and after_want[1:] == after_got[1:]


@pytest.mark.timeout(60)
def test_later_epochs_of_a_drawing_dataset_make_no_batch_with_the_callers_rngs() -> None:
    """No seed, adaptive, workers that do not persist: the first epoch's probe found the
    workers worth it and the dataset drawing, so later epochs start the workers at once.
    While they started, the main process made a batch with its own RNGs: torch's draws
    differed from epoch 2 on, and so did the training loop's next one."""
    ds = Noisy(48)
    runs = []
    for adaptive in (False, True):
        conveyor.rng.seed_all(7, numpy_seed=7)  # the caller's RNGs, alike for both runs
        with DataLoader(ds, batch_size=4, shuffle=True, num_workers=1, adaptive=adaptive) as loader:
            epochs_got = []
            for _ in range(3):
                epochs_got.append([b.clone() for b in loader])
                epochs_got.append([torch.rand(2)])  # the loop's own draw after the epoch
        runs.append(epochs_got)
    want, got = runs
    for e in range(len(want)):
        same_epochs(want[e], got[e])


_LAZY_NUMPY_RANDOM = r"""
import sys
import numpy, torch
import conveyor
assert "numpy.random" not in sys.modules, "precondition: nothing imported numpy.random"


class Quiet:
    def __len__(self): return 12
    def __getitem__(self, i): return torch.tensor([i, int("numpy.random" in sys.modules)])


class ImportsAndDraws(Quiet):
    def __getitem__(self, i):
        import numpy.random
        return torch.tensor([i, int(numpy.random.randint(0, 2**31))])


conveyor.rng.RngState().restore()
print("snapshot-imported", "numpy.random" in sys.modules)
for adaptive in (False, True):
    with conveyor.DataLoader(Quiet(), batch_size=3, num_workers=1, adaptive=adaptive) as loader:
        batches = [b for b in loader]
    assert [b[:, 0].tolist() for b in batches][0] == [0, 1, 2]
    print("worker-imported", bool(torch.cat(batches)[:, 1].any()), "main-imported", "numpy.random" in sys.modules)
runs = []
for adaptive in (False, True):
    torch.manual_seed(5)
    with conveyor.DataLoader(ImportsAndDraws(), batch_size=3, num_workers=1, adaptive=adaptive) as loader:
        runs.append([b.tolist() for b in loader])
print("drawing-same", runs[0] == runs[1])
torch.manual_seed(5)
want = [b.tolist() for b in torch.utils.data.DataLoader(ImportsAndDraws(), batch_size=3, num_workers=1)]
print("like-torch", runs[0] == want)
"""


@pytest.mark.timeout(120)
def test_a_snapshot_does_not_import_numpy_random_and_a_dataset_importing_it_is_seeded() -> None:
    """Snapshotting the user's RNGs and seeding a worker must not import numpy.random (~10 ms
    in a fresh process, ~6 ms in a forked one): neither the main process nor a worker whose
    dataset never touches it imports it. A dataset that imports it in __getitem__ and draws
    gets the stream torch's worker (which seeds numpy eagerly) would have given it."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LAZY_NUMPY_RANDOM], capture_output=True, text=True,
                         timeout=100, check=True).stdout.split()
    assert out == ["snapshot-imported", "False",
                   "worker-imported", "False", "main-imported", "False",
                   "worker-imported", "False", "main-imported", "False",
                   "drawing-same", "True", "like-torch", "True"], out


_SEED_ON_IMPORT = r"""
import sys
import numpy
from conveyor import rng
assert "numpy.random" not in sys.modules, "precondition: nothing imported numpy.random"
rng.seed_worker(1234, 3)
print("pending-imported", "numpy.random" in sys.modules)
state = rng.RngState()
import numpy.random
lazy = numpy.random.rand(3).tolist()
eager = numpy.random.RandomState(numpy.random.SeedSequence([3, 1234, 0]).generate_state(4)).rand(3).tolist()
print("seeded-at-import", lazy == eager, numpy.random.__loader__.__class__.__name__)
state.restore()  # the pending seed again, now applied at once
print("restored", numpy.random.rand(3).tolist() == eager)
"""


@pytest.mark.timeout(60)
def test_a_pending_numpy_seed_is_applied_when_numpy_random_is_imported() -> None:
    """seed_worker where numpy.random is not imported seeds it at its import, exactly as an
    eager seed would have; the module keeps its own loader; a snapshot taken meanwhile
    restores the same seed."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SEED_ON_IMPORT], capture_output=True, text=True,
                         timeout=50, check=True).stdout.split()
    assert out == ["pending-imported", "False", "seeded-at-import", "True", "SourceFileLoader",
                   "restored", "True"], out


def test_snapshots_with_pending_numpy_seeds_compare_by_seed() -> None:
    """Two snapshots taken with the same pending numpy seed are the same; with different
    ones, or one pending and one imported, they are not."""
    from conveyor.rng import RngState, _Pending, _WorkerNumpySeed

    a, b, c = RngState(), RngState(), RngState()
    a.np, b.np, c.np = _Pending(_WorkerNumpySeed(0, 7)), _Pending(_WorkerNumpySeed(0, 7)), _Pending(5)
    assert a.same(b) and not a.same(c) and not c.same(RngState())
    import pickle

    assert pickle.loads(pickle.dumps(a)).same(a)


class DrawsFrom(conveyor.Dataset):
    """Draws from every global RNG for indices from ``start`` on; counts its fetches."""

    def __init__(self, start: int, n: int = 12) -> None:
        self.start, self.n, self.calls = start, n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        self.calls += 1
        return draw(i) if i >= self.start else torch.tensor([i, 0, 0, 0, 0])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("start", "fetched_here"), [(0, 3), (3, 9)],
                         ids=["draws-from-the-first-batch", "draws-from-the-second"])
def test_probing_fetches_a_drawing_batch_once_unless_it_began_to_draw(start: int, fetched_here: int) -> None:
    """The first probing batch is made seeded as its worker: a dataset that draws (random
    augmentation) is fetched once. Later ones are made unseeded once a batch left the RNGs
    alone; one that draws after all is made again, seeded. Batches match adaptive=False."""
    runs = []
    for adaptive in (False, True):
        ds = DrawsFrom(start)
        torch.manual_seed(7)
        with DataLoader(ds, batch_size=3, num_workers=1, adaptive=adaptive) as loader:
            runs.append(([b.clone() for b in loader], ds.calls))
    (want, none), (got, here) = runs
    same_epochs(want, got)
    assert none == 0 and here == fetched_here


class Pausing(conveyor.Dataset):
    """Draws, lets go of the GIL (as reading a file does), draws again."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        first = random.getrandbits(31)
        time.sleep(0.002)
        return torch.tensor([i, first, int(torch.randint(0, 2**31, ()).item()), int(np.random.randint(0, 2**31))])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fetch_threads", [1, 2])
def test_thread_workers_keep_each_sample_stream_while_the_main_process_makes_batches(fetch_threads: int) -> None:
    # the main process makes the first batches itself (adaptive) while thread workers start:
    # its own seeded samples, and its saving and restoring of its RNGs, must not land between
    # a worker's seeding of a sample and that sample's draws
    ref = epochs(DataLoader(Pausing(), batch_size=3, seed=5))
    got = epochs(DataLoader(Pausing(), batch_size=3, seed=5, num_workers=2, worker_type="thread",
                            fetch_threads=fetch_threads))
    same_epochs(ref[0], got[0])
    same_epochs(ref[1], got[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", [{}, {"num_workers": 2}, {"num_workers": 2, "worker_type": "thread"}],
                         ids=["main", "processes", "threads"])
def test_two_live_iterators_keep_the_epochs_they_were_made_for(kw: dict[str, Any]) -> None:
    # the second iter() must not change the order of the first, made for the epoch before
    seq = epochs(DataLoader(Noisy(16), **BASE, seed=11, **kw), 2)
    loader = DataLoader(Noisy(16), **BASE, seed=11, **kw)
    with loader:
        a, b = iter(loader), iter(loader)
        got_a, got_b = [x.clone() for x in a], [x.clone() for x in b]
    assert all(torch.equal(x, y) for x, y in zip(got_a, seq[0], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(got_b, seq[1], strict=True))


def _rng_states() -> tuple[Any, ...]:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop", ["epoch", "break"])
@pytest.mark.parametrize("kw", [{"worker_type": "thread"}, {"worker_type": "thread", "fetch_threads": 2},
                                {"worker_type": "thread", "adaptive": True}, {}],
                         ids=["threads", "fetch_threads", "adaptive", "processes"])
def test_thread_workers_leave_the_global_rngs_as_they_found_them(kw: dict[str, Any], stop: str) -> None:
    # thread workers seed the RNGs of the training loop's process: a sampler drawing its order
    # from them (one without a generator) drew the next epoch's from wherever the sample
    # fetched last in wall time left them, and two runs with one seed could shuffle otherwise
    kw = {"adaptive": False, **kw}
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    before = _rng_states()
    loader = DataLoader(Noisy(24), batch_size=3, seed=5, num_workers=2, **kw)
    with loader:
        for n, _ in enumerate(loader):
            if stop == "break" and n == 2:
                break
        if stop == "epoch":
            assert _rng_states() == before  # put back at the epoch's end
    assert _rng_states() == before  # and by close()
    # the state the next epoch begins from is the one it found: the same order every run
    sampler = torch.utils.data.RandomSampler(range(24))  # draws from torch's global RNG
    orders = []
    for _ in range(2):
        torch.manual_seed(3)
        with DataLoader(Noisy(24), batch_size=3, sampler=sampler, seed=5, num_workers=2, **kw) as loader:
            orders.append([[b[:, 0].tolist() for b in loader] for _ in range(3)])
    assert orders[0] == orders[1]


@pytest.mark.timeout(60)
def test_auto_probing_batches_draw_as_a_loader_without_workers() -> None:
    """num_workers="auto" chooses the worker count itself, so there is no worker whose stream a
    probing batch must match: the main process makes it as num_workers=0 does, drawing from
    the user's RNGs as they are (it used to seed them as worker 0's first)."""
    ds = Noisy(12)
    runs = []
    for workers in (0, "auto"):
        torch.manual_seed(42)
        random.seed(42)
        np.random.seed(42)
        with DataLoader(ds, batch_size=3, num_workers=workers) as loader:
            got = [b.clone() for b in loader]
            here = loader.stats()["main_process_batches"]
        runs.append((got, here, torch.rand(2), random.random(), np.random.rand()))
    (want, _, *after_want), (got, here, *after_got) = runs
    assert here >= 2  # two cheap probing batches at least (a slow machine may start workers after)
    same_epochs(want[:here], got[:here])
    if here == len(want):  # every batch made here: the user's streams moved as without workers
        assert torch.equal(after_want[0], after_got[0]) and after_want[1:] == after_got[1:]


class NoisyStream(conveyor.IterableDataset):
    """A stream of 12 items, each with draws from every global RNG (an augmenting stream)."""

    def __iter__(self) -> Any:
        return (draw(i) for i in range(12))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch_size", [None, 3])
def test_a_seeded_stream_in_the_main_process_draws_on_as_one_worker_does(batch_size: int | None) -> None:
    # the main process put the caller's RNG state back after each batch and never seeded the
    # stream: every batch started from the same state, and drew the same
    def rows(**kw: Any) -> list[list[int]]:
        with DataLoader(NoisyStream(), batch_size=batch_size, seed=7, **kw) as loader:
            return [r for _ in range(2) for b in loader for r in (b.view(-1, 5).tolist())]

    torch.manual_seed(0)
    mine = torch.rand(())
    torch.manual_seed(0)
    inline = rows()
    assert torch.rand(()) == mine  # the caller's RNG as it was
    assert len({tuple(r[1:]) for r in inline}) == 24  # every item of both epochs draws anew
    assert inline == rows(num_workers=1, adaptive=False)  # as one process worker draws


class Reads(conveyor.Dataset):
    """Reads slowly (lets go of the GIL, as reading a file does), counting the reads in
    progress; draws from the global RNGs only at the indices ``draws_at`` names."""

    def __init__(self, n: int = 48, draws_at: int | None = None) -> None:
        self.n, self.draws_at = n, draws_at
        self.counts = multiprocessing.Array("i", 2)  # reads in progress, most at once (forked workers too)

    @property
    def most(self) -> int:
        return self.counts[1]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        counts = self.counts
        with counts.get_lock():
            counts[0] += 1
            counts[1] = max(counts[1], counts[0])
        time.sleep(0.002)
        with counts.get_lock():
            counts[0] -= 1
        if self.draws_at is not None and i % self.draws_at == self.draws_at - 1:
            # a single legacy normal too: numpy keeps its pair's other half for the next one
            return torch.cat([draw(i), torch.tensor([int(np.random.standard_normal() * 2**20)])])
        return torch.tensor([i, 0, 0, 0, 0, 0])


FETCHING = [{"num_workers": 0, "fetch_threads": 8}, {"num_workers": 2, "fetch_threads": 4},
            {"num_workers": 2, "worker_type": "thread", "fetch_threads": 4}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", FETCHING, ids=["main", "processes", "threads"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_seeded_fetch_threads_stay_bit_identical_when_samples_draw_after_quiet_ones(
        kw: dict[str, Any], shuffle: bool) -> None:
    # eleven quiet reads in a row, then one that draws: by then the fetch threads fetch
    # unseeded, at once. The draw is seen and that sample fetched again, seeded, in turn.
    def make_loader(**more: Any) -> DataLoader[Any]:
        return DataLoader(Reads(draws_at=12), batch_size=6, shuffle=shuffle, seed=3, adaptive=False, **more)

    ref = epochs(make_loader())
    got = epochs(make_loader(**kw))
    for e in range(2):
        same_epochs(ref[e], got[e])
    assert any(int(b[:, 1].abs().sum()) for b in ref[0])  # some samples did draw


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", [{**FETCHING[1], "num_workers": 1}, FETCHING[2]], ids=["processes", "threads"])
def test_seeded_fetch_threads_read_at_once_when_the_dataset_draws_nothing(kw: dict[str, Any]) -> None:
    # with a seed each sample is seeded and fetched in turn: 4 threads read one at a time.
    # A dataset that draws nothing from the global RNGs needs no seeding: reads overlap.
    ds = Reads()
    with DataLoader(ds, batch_size=8, seed=3, adaptive=False, **kw) as loader:
        seeded = [b.clone() for b in loader]
    assert ds.most > 1
    with DataLoader(Reads(), batch_size=8) as plain:
        same_epochs([b.clone() for b in plain], seeded)


class ReadsTheSeed(Reads):
    """Depends on the global RNGs without moving them: reads torch's seed, draws inside
    ``fork_rng`` (which puts the state back)."""

    def __getitem__(self, i: int) -> torch.Tensor:
        x = super().__getitem__(i)
        with torch.random.fork_rng():
            drawn = int(torch.randint(0, 2**31, ()).item())
        return torch.cat([x, torch.tensor([torch.initial_seed() % 2**31, drawn])])


class FailsOnce(Reads):
    """Index 11's first read fails (flaky storage)."""

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 11:
            with self.counts.get_lock():
                first, self.counts[0] = self.counts[0] >= 0, -1000
            if first:
                raise OSError("read of 11 failed")
        return super().__getitem__(i)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", FETCHING[1:], ids=["processes", "threads"])
def test_samples_that_read_the_rngs_without_moving_them_stay_seeded(kw: dict[str, Any]) -> None:
    ref = epochs(DataLoader(ReadsTheSeed(), batch_size=6, seed=3))
    got = epochs(DataLoader(ReadsTheSeed(), batch_size=6, seed=3, adaptive=False, **kw))
    for e in range(2):
        same_epochs(ref[e], got[e])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", FETCHING[1:], ids=["processes", "threads"])
def test_a_read_that_fails_once_fails_with_seeded_fetch_threads_too(kw: dict[str, Any]) -> None:
    # fetched at once and unseeded, a failed read is not tried again: it fails as it would
    # have seeded (the RNGs had no part in it)
    with DataLoader(FailsOnce(), batch_size=6, seed=3, adaptive=False, **kw) as loader:
        with pytest.raises(OSError, match="read of 11 failed"):
            for _ in loader:
                pass


@pytest.mark.parametrize("what", ["random", "random normal", "numpy", "numpy normal", "torch", "torch normal"])
def test_a_fingerprint_sees_every_draw_from_the_global_rngs(what: str) -> None:
    draws = {"random": random.random, "random normal": lambda: random.gauss(0, 1), "numpy": np.random.rand,
             "numpy normal": np.random.standard_normal, "torch": lambda: torch.rand(()),
             "torch normal": lambda: torch.randn(())}
    fingerprint = conveyor.rng.fingerprint
    conveyor.rng.seed_all(11)
    first = fingerprint()
    assert fingerprint() == first  # nothing drew
    for _ in range(2):  # the second normal of a pair is kept from the first draw: seen too
        draws[what]()
        moved = fingerprint()
        assert moved != first
        first = moved
    conveyor.rng.seed_all(11)
    again = fingerprint()
    conveyor.rng.seed_all(11)
    assert fingerprint() == again


@pytest.mark.timeout(30)
def test_the_rng_lock_held_whole_waits_for_shared_holders_and_they_for_it() -> None:
    from conveyor.executors.seeding import RngLock

    lock = RngLock()
    order: list[str] = []
    reading, done = threading.Event(), threading.Event()

    def reader() -> None:
        with lock.shared():
            reading.set()
            done.wait(10)
            order.append("read")

    def writer() -> None:
        with lock:
            order.append("wrote")

    r = threading.Thread(target=reader)
    r.start()
    reading.wait(10)
    with lock.shared():  # shared holders hold it together
        order.append("read too")
    w = threading.Thread(target=writer)
    w.start()
    w.join(0.3)
    assert order == ["read too"]  # the writer waits for the reader still holding it
    done.set()
    r.join(10)
    w.join(10)
    assert order == ["read too", "read", "wrote"]
    # a stuck reader given up lets writers on
    stuck = threading.Event()
    t = threading.Thread(target=lambda: lock.shared().__enter__() or stuck.set())
    t.start()
    stuck.wait(10)
    lock.abandon({t.ident})  # type: ignore[arg-type]
    w = threading.Thread(target=writer)
    w.start()
    w.join(10)
    assert order[-1] == "wrote" and len(order) == 4
