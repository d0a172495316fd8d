"""Resume with workers: a JSON state from step k gives the rest of the epoch, then the same epochs.

The reference is an uninterrupted run; the interrupted one stops after k
batches, saves ``state_dict()`` through ``json.dumps``/``json.loads`` and a
NEW loader (possibly with another worker count, type or prefetch) loads it
(tests/resume_harness.py). The state itself, and resumes where the main
process makes the batches, are tests/unit/test_position.py.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers import Stream
from resume_harness import cut, expected_after, interrupted, resume, resumes_exactly, run_epochs
from test_determinism import Noisy
from test_position import EPOCHS, KINDS, Stateless, make

import conveyor
from conveyor import DataLoader, get_worker_info

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


# --------------------------------------------------------------------------- exact resume with workers


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_resume_after_a_finished_epoch(kind: str, workers: int) -> None:
    """The epoch ran to StopIteration before saving: the new loader starts the next epoch."""
    kw = {"num_workers": workers, "worker_type": "thread"} if workers else {}
    resumes_exactly(lambda: make(kind), len(make(kind)), epochs=EPOCHS, first=lambda: make(kind, **kw), exhaust=True)


NEW = [
    {"num_workers": 2, "worker_type": "thread", "prefetch_factor": 4},
    {"num_workers": 3, "worker_type": "process", "prefetch_factor": 1, "adaptive": False},
    {"num_workers": 1, "worker_type": "process", "fetch_threads": 3, "adaptive": False},
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("new", NEW, ids=["threads2-pf4", "procs3-pf1", "proc1-ft3"])
@pytest.mark.parametrize("kind", ["shuffle-seed", "shuffle-generator", "weighted", "custom"])
def test_resume_with_other_workers(kind: str, new: dict[str, Any]) -> None:
    resumes_exactly(lambda: make(kind), 3, epochs=EPOCHS, first=lambda: make(kind, num_workers=2, adaptive=False),
                    resumed=lambda: make(kind, **new))


# --------------------------------------------------------------------------- samplers drawing from the global RNGs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("which", ["torch", "numpy", "random"])
def test_a_sampler_drawing_from_a_global_rng_resumes_exactly(which: str, workers: int) -> None:
    """torch's RandomSampler without a generator draws its order from torch's global RNG (and
    custom samplers from numpy's or Python's): the state holds their states at the epoch's
    start. The resumed process's RNGs are elsewhere: the rest of the epoch is still the
    saved run's, and the resume leaves the caller's RNGs as it found them."""
    import random

    class GlobalDraws(Stateless):
        def __iter__(self) -> Iterator[int]:
            if which == "numpy":
                return iter(np.random.permutation(self.n).tolist())
            order = list(range(self.n))
            random.shuffle(order)
            return iter(order)

    def build() -> DataLoader[Any]:
        sampler = torch.utils.data.RandomSampler(range(13)) if which == "torch" else GlobalDraws(13)
        return DataLoader(Noisy(13), batch_size=3, sampler=sampler, seed=3, num_workers=workers,
                          worker_type="thread")

    def seed_all(s: int) -> None:
        torch.manual_seed(s)
        np.random.seed(s)
        random.seed(s)

    seed_all(0)
    ref = run_epochs(build(), 2)
    seed_all(0)
    step = len(ref[0]) + 2
    got = interrupted(build(), build(), step, 2)  # the harness does not touch the RNGs
    assert got[0] == expected_after(ref, step)[0]

    # a resume with the checkpoint's RNGs restored by the caller: every later epoch is the same too,
    # and the replay has left them alone
    seed_all(0)
    first = build()
    with first:
        list(first)
        it = iter(first)
        next(it), next(it)
        state = json.loads(json.dumps(first.state_dict()))
        rngs = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        del it
    seed_all(99)
    second = build()
    with second:
        second.load_state_dict(state)
        torch.set_rng_state(rngs[0]), np.random.set_state(rngs[1]), random.setstate(rngs[2])
        rest = [b.tolist() for b in second]
        assert torch.equal(torch.get_rng_state(), rngs[0])
        if which == "numpy":
            assert np.array_equal(np.random.get_state()[1], rngs[1][1])
        if which == "random":
            assert random.getstate() == rngs[2]
    assert rest == expected_after(ref, step)[0]


# --------------------------------------------------------------------------- properties

WORKERS: list[dict[str, Any]] = [
    {},
    {"num_workers": 1, "worker_type": "thread"},
    {"num_workers": 2, "worker_type": "thread", "prefetch_factor": 1},
    {"num_workers": 3, "worker_type": "thread", "fetch_threads": 2},
    {"num_workers": 2, "worker_type": "process", "adaptive": False},
]


@st.composite
def cases(draw: Callable[..., Any]) -> dict[str, Any]:
    n = draw(st.integers(1, 30))
    batch_size = draw(st.integers(1, 7))
    drop_last = draw(st.booleans())
    if drop_last and n < batch_size:
        batch_size = n
    kind = draw(st.sampled_from(KINDS))
    before = draw(st.sampled_from(range(len(WORKERS))))
    after = draw(st.sampled_from(range(len(WORKERS))))
    if WORKERS[before].get("worker_type") == "process" and WORKERS[after].get("worker_type") == "process":
        after = 0  # processes in a few examples only
    step = draw(st.integers(0, 10_000))  # reduced modulo the epoch length in the test
    return {"n": n, "batch_size": batch_size, "drop_last": drop_last, "kind": kind, "before": before,
            "after": after, "step": step, "exhaust": draw(st.booleans())}


@pytest.mark.timeout(180)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_resume_property(case: dict[str, Any]) -> None:
    def build(workers: int) -> DataLoader[Any]:
        return make(case["kind"], n=case["n"], batch_size=case["batch_size"], drop_last=case["drop_last"],
                    **WORKERS[workers])

    per_epoch = len(build(0))
    step = case["step"] % (2 * per_epoch + 1) if per_epoch else 0
    exhaust = case["exhaust"] and step > 0 and step % per_epoch == 0  # the same state, StopIteration or not
    resumes_exactly(lambda: build(0), step, epochs=EPOCHS, first=lambda: build(case["before"]),
                    resumed=lambda: build(case["after"]), exhaust=exhaust)


# --------------------------------------------------------------------------- iterators not yet begun


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["shuffle-generator", "weighted-generator", "shuffle-seed"])
@pytest.mark.parametrize("workers", [0, 2])
def test_state_of_an_iterator_not_yet_advanced_names_its_epoch(kind: str, workers: int) -> None:
    # after a whole epoch, iter() makes the next one's iterator; saved before its first batch,
    # the state resumes that epoch (not a repeat of the one that ended)
    ref = run_epochs(make(kind, num_workers=workers), EPOCHS)
    first = make(kind, num_workers=workers)
    with first:
        assert [b.tolist() for b in first] == ref[0]
        it = iter(first)
        state = json.loads(json.dumps(first.state_dict()))
        assert (state["epoch"], state["batches"]) == (1, 0)
        del it
    assert resume(make(kind, num_workers=workers), state, EPOCHS - 1) == ref[1:]


def test_prefetch_factor_zero_is_refused() -> None:
    # torch accepts it and then fails an assertion when iterated
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(list(range(4)), num_workers=1, prefetch_factor=0)
    with pytest.raises(TypeError, match="prefetch_factor"):
        DataLoader(list(range(4)), num_workers=1, prefetch_factor=2.0)
    import numpy as np

    assert DataLoader(list(range(4)), num_workers=1, prefetch_factor=np.int64(3)).prefetch_factor == 3


# --------------------------------------------------------------------------- out of order, streams


class SlowAt(torch.utils.data.Dataset):
    """``i`` per index; the indices in ``slow`` take 0.2 s (their batch arrives late)."""

    def __init__(self, n: int, slow: set[int]) -> None:
        self.n, self.slow = n, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(0.2 if i in self.slow else 0.002)
        return i


@pytest.mark.timeout(60)
@pytest.mark.parametrize("replayed", [False, True], ids=["own-sampler", "list-sampler"])
@pytest.mark.parametrize("resume_in_order, resume_workers", [(False, 2), (True, 2), (True, 0), (False, 0)])
def test_resume_after_batches_handed_out_of_order(resume_in_order: bool, resume_workers: int,
                                                  replayed: bool) -> None:
    # with in_order=False the user may have received batches 0, 1, 3 and 5 while 2 is still
    # being made: the state must name those, and the resumed epoch give exactly the others
    # (also without workers, where the sampler is read one batch at a time; and for a sampler
    # without state_dict, replayed past the batches handed out)
    def make_loader(in_order: bool, workers: int = 2) -> DataLoader[Any]:
        return DataLoader(SlowAt(24, {4, 5}), batch_size=2, num_workers=workers, in_order=in_order,
                          adaptive=False, seed=1, sampler=list(range(24)) if replayed else None)

    got, state, _ = cut(make_loader(False), 4)
    assert [4, 5] not in got and state["batches"] <= 2 and state.get("done"), (got, state)
    second = make_loader(resume_in_order, resume_workers)
    with second:
        second.load_state_dict(state)
        rest = [b.tolist() for b in second]
        assert sorted(b.tolist() for b in second) == [[2 * i, 2 * i + 1] for i in range(12)]  # next: whole
    assert sorted(got + rest) == [[2 * i, 2 * i + 1] for i in range(12)]
    if resume_in_order:
        assert rest == sorted(rest)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_a_stream_mid_epoch(workers: int) -> None:
    # a stream cannot seek: the resumed epoch makes the first batches again and drops them
    def make_loader() -> DataLoader[Any]:
        return DataLoader(Stream(11, "torch"), batch_size=2, num_workers=workers)

    resumes_exactly(make_loader, 3, epochs=2)


@pytest.mark.timeout(60)
def test_a_state_after_a_streams_last_batch_names_the_next_epoch() -> None:
    # every worker had said its stream was over, yet a state saved before StopIteration named
    # the ended epoch: the resumed loader's first epoch was empty
    def make_loader() -> DataLoader[Any]:
        return DataLoader(Stream(11, "torch"), batch_size=2, num_workers=2, adaptive=False)

    ref = run_epochs(make_loader(), 2)
    first = make_loader()
    with first:
        it = iter(first)
        assert [next(it).tolist() for _ in range(len(ref[0]))] == ref[0]
        for _ in range(200):  # the workers' word that their streams ended
            state = json.loads(json.dumps(first.state_dict()))
            if state["epoch"] == 1:
                break
            time.sleep(0.05)
        assert state["epoch"] == 1 and state["batches"] == 0, state
        with pytest.raises(StopIteration):
            next(it)
    second = make_loader()
    with second:
        second.load_state_dict(state)
        assert [b.tolist() for b in second] == ref[1]


class SlowStream(torch.utils.data.IterableDataset):
    """0..n-1 shared between workers by torch's worker info; item 4 takes 0.3 s."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if i == 4:
                time.sleep(0.3)
            yield i


@pytest.mark.timeout(60)
def test_resume_a_stream_handed_out_of_order() -> None:
    def make_loader() -> DataLoader[Any]:
        return DataLoader(SlowStream(24), batch_size=2, num_workers=2, in_order=False)

    got, state, _ = cut(make_loader(), 4)
    [rest] = resume(make_loader(), state)
    assert sorted(got + rest) == sorted(b.tolist() for b in DataLoader(SlowStream(24), batch_size=2, num_workers=2))


class Uneven(torch.utils.data.IterableDataset):
    """Worker 0's stream is one batch long, worker 1's six: replicas run out apart."""

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is not None and info.id == 0:
            yield from [100, 101]
            return
        for i in range(12):
            time.sleep(0.005)
            yield i


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("worker_type", ["process", "thread"])
def test_resume_a_stream_whose_replicas_end_apart(in_order: bool, worker_type: str) -> None:
    # a replica that has run out still answers its turns; the state counts each replica's
    # batches, not turns
    def make_loader() -> DataLoader[Any]:
        return DataLoader(Uneven(), batch_size=2, num_workers=2, worker_type=worker_type, in_order=in_order, seed=0)

    full = sorted(b.tolist() for b in make_loader())
    got, state, _ = cut(make_loader(), 4)
    assert sum(state["replicas"]) == state["batches"] == 4
    [rest] = resume(make_loader(), state)
    assert sorted(got + rest) == full


@pytest.mark.timeout(60)
@pytest.mark.parametrize("saved, resumed", [(2, 3), (0, 3), (2, 0)])
def test_a_stream_resumed_mid_epoch_with_another_worker_count_is_refused(saved: int, resumed: int) -> None:
    # each worker's copy shards the stream by the worker count: with another count the batches
    # handed out cannot be found again (dropping as many lost and repeated samples, silently).
    # The loaded state stays: with the saved count the rest of the epoch is exact.
    first = DataLoader(Stream(11, "torch"), batch_size=2, num_workers=saved)
    with first:
        it = iter(first)
        got = [next(it) for _ in range(2)]
        state = json.loads(json.dumps(first.state_dict()))
    second = DataLoader(Stream(11, "torch"), batch_size=2, num_workers=resumed)
    with second:
        second.load_state_dict(state)
        with pytest.raises(ValueError, match="num_workers"):
            iter(second)
        second.num_workers = saved
        rest = list(second)
    assert sorted(int(row[0]) for b in got + rest for row in b) == list(range(11))


class DrawingStream(torch.utils.data.IterableDataset):
    """Four items, each with a draw from torch's global RNG."""

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        for i in range(4):
            yield i, torch.rand(1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_a_seeded_stream_resumes_with_its_epochs_draws(persistent: bool) -> None:
    # a persistent worker's draws in epoch 1 used to continue from epoch 0's; a resumed run's
    # fresh worker started over, and repeated epoch 0's values
    def make_loader() -> DataLoader[Any]:
        return DataLoader(DrawingStream(), batch_size=2, seed=7, num_workers=1, persistent_workers=persistent)

    resumes_exactly(make_loader, 3, epochs=2)  # epoch 0's two batches, then one of epoch 1


@pytest.mark.timeout(60)
def test_a_seeded_streams_draws_are_the_same_with_persistent_workers_or_not() -> None:
    """Draws are a function of (seed, epoch): persistent workers, which keep epoch 0's base
    seed, must draw as workers started afresh for each epoch do."""
    def epochs(persistent: bool) -> list[Any]:
        loader = DataLoader(DrawingStream(), batch_size=2, seed=7, num_workers=2, persistent_workers=persistent)
        with loader:
            return [[b[1].flatten().tolist() for b in loader] for _ in range(3)]

    fresh, kept = epochs(False), epochs(True)
    assert fresh == kept
    assert fresh[0] != fresh[1] != fresh[2]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["torch-random", "own-rng", "shuffle-generator"])
def test_epochs_taken_by_length_resume_exactly(kind: str, workers: int) -> None:
    """A trainer that knows len(loader) (Lightning) takes that many batches and starts the next
    epoch without the iterator's StopIteration. torch's RandomSampler (and the loader's own in
    torch mode) draws one more permutation when its iterator runs out: a resumed epoch, which
    looks ahead from where it starts, ran it out where the saved one had not, and its later
    epochs drew other orders."""
    def epochs_by_length(loader: DataLoader[Any], count: int, state: Any = None,
                         save_at: int | None = None) -> tuple[list[list[int]], Any]:
        got, saved = [], None
        with loader:
            if state is not None:
                loader.load_state_dict(state)
            for e in range(count):
                it = iter(loader)
                todo = len(loader) if e or state is None else len(loader) - state["batches"]
                for _ in range(todo):
                    got.append(next(it).tolist())
                    if save_at is not None and len(got) == save_at:
                        saved = json.loads(json.dumps(loader.state_dict()))
        return got, saved

    def build() -> DataLoader[Any]:
        # (with workers, adaptive: cheap batches are made in the main process, one at a time)
        return make(kind, n=24, batch_size=4, num_workers=workers, worker_type="thread")

    step = len(build()) + 4  # two batches before the end of the second epoch
    ref, state = epochs_by_length(build(), 4, save_at=step)
    assert state["batches"] == 4
    rest, _ = epochs_by_length(build(), 3, state=state)
    assert rest == ref[step:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", ["mid-epoch", "epoch-end"])
def test_torchs_distributed_sampler_resumes_with_the_callers_set_epoch(stop: str, workers: int) -> None:
    """torch's DistributedSampler (no state_dict) in the usual loop: set_epoch before each
    epoch, on resume too. Resumed at an epoch's end, the caller has already set the next
    epoch when the loader replays the ended one: that replay drew another order and warned."""
    def build() -> tuple[Any, DataLoader[Any]]:
        sampler = torch.utils.data.DistributedSampler(range(20), num_replicas=2, rank=1, shuffle=True, seed=7)
        return sampler, DataLoader(Noisy(20), batch_size=3, sampler=sampler, num_workers=workers,
                                   worker_type="thread", seed=2)

    def train(first_epoch: int, state: Any = None, save_after: int = -1) -> tuple[list[Any], Any]:
        sampler, loader = build()
        got, saved = [], None
        with loader:
            if state is not None:
                loader.load_state_dict(state)
            for epoch in range(first_epoch, 4):
                sampler.set_epoch(epoch)
                for batch in loader:
                    got.append(batch.tolist())
                    if len(got) == save_after:
                        saved = epoch, json.loads(json.dumps(loader.state_dict()))
                if stop == "epoch-end" and epoch == 1 and state is None:
                    saved = epoch + 1, json.loads(json.dumps(loader.state_dict()))
        return got, saved

    ref, (epoch, state) = train(0, save_after=6)  # 4 batches an epoch: the second epoch's third
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", conveyor.SlowSettingWarning)  # (a judgement of speed: a loaded machine may earn it)
        rest, _ = train(epoch, state)
    assert rest == ref[8 if stop == "epoch-end" else 6:]


class EpochCounting(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """A custom sampler with state_dict(): its state is the iteration that most recently
    began (docs/determinism.md), each iteration's order drawn from its number."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.next_epoch = 0
        self.current: int | None = None

    def __iter__(self) -> Iterator[int]:
        self.current, self.next_epoch = self.next_epoch, self.next_epoch + 1
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(100 + self.current)).tolist())

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.next_epoch if self.current is None else self.current}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_epoch, self.current = state["epoch"], None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("sampler", ["custom-with-state", "torch-global-rng"])
def test_a_state_taken_between_iter_and_the_first_batch_resumes_that_epoch(sampler: str, workers: int) -> None:
    # Without workers the sampler is read at the first next(), as torch's is: a state taken
    # before it described the previous iteration of a custom sampler (the resumed epoch was
    # the one before) and left a global-RNG sampler's first draw out (later epochs differed)
    def make() -> DataLoader[Any]:
        s = EpochCounting() if sampler == "custom-with-state" else torch.utils.data.RandomSampler(range(8))
        return DataLoader(list(range(8)), batch_size=4, sampler=s, num_workers=workers, output="numpy")

    torch.manual_seed(0)
    first = make()
    with first:
        _ = [b.tolist() for b in first]  # epoch 0
        it = iter(first)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to warn about
            warnings.simplefilter("ignore", conveyor.SlowSettingWarning)  # (microsecond batches, 2 workers)
            state, rng = json.loads(json.dumps(first.state_dict())), torch.get_rng_state()
        want = [b.tolist() for b in it] + [b.tolist() for b in first]  # epochs 1 and 2
    torch.manual_seed(123)  # another process, as far as the global RNG goes
    second = make()
    with second:
        torch.set_rng_state(rng)  # as the docs ask where there is neither seed= nor generator=
        second.load_state_dict(state)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.simplefilter("ignore", conveyor.SlowSettingWarning)
            got = [b.tolist() for b in second] + [b.tolist() for b in second]
    assert state["epoch"] == 1 and state["batches"] == 0
    assert got == want
