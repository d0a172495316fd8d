"""A loader's position: its state is small versioned JSON, a state from step k resumes the
rest of the epoch and the same epochs after it where the main process makes the batches, and
a state that names no reachable position is refused (resumes with workers, streams and
batches handed out of order are tests/integration/test_resume.py)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from helpers import Stream
from resume_harness import carry, cut, resume, resumes_exactly, run_epochs
from test_determinism import Noisy

from conveyor import (
    ArrayDataset,
    DataLoader,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


EPOCHS = 3


class Rotating(Sampler[int]):
    """A custom sampler with its own epoch counter and a state_dict.

    Like the built-in samplers, its state names the iteration that most
    recently started (the loader skips what was consumed of it).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0
        self.current: int | None = None

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        e = self.epoch
        self.current, self.epoch = e, e + 1
        for j in range(self.n):
            yield (j * 7 + e * 3) % self.n if self.n % 7 else (j + e) % self.n

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.current if self.current is not None else self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.current = int(state["epoch"]), None


class Stateless(torch.utils.data.Sampler):
    """A custom (torch) sampler without state_dict, whose order is always the same."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n - 1, -1, -1))


class OwnRng(Stateless):
    """A custom sampler without state_dict that draws each epoch's order from a numpy
    generator it holds: replayed from the generator's state at the epoch's start."""

    def __init__(self, n: int, seed: int) -> None:
        super().__init__(n)
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rng.permutation(self.n).tolist())


def loader_kw(kind: str, n: int) -> dict[str, Any]:
    """DataLoader arguments for a sampler kind (built fresh on every call)."""
    if kind == "shuffle-seed":
        return {"shuffle": True, "seed": 5}
    if kind == "shuffle-generator":
        return {"shuffle": True, "generator": torch.Generator().manual_seed(5)}
    if kind == "sequential":
        return {"seed": 5}
    if kind == "weighted":
        weights = [1.0 + (i % 3) for i in range(n)]
        return {"sampler": WeightedRandomSampler(weights, n + 3, seed=8), "seed": 5}
    if kind == "weighted-generator":
        weights = [1.0 + (i % 3) for i in range(n)]
        return {"sampler": WeightedRandomSampler(weights, n, generator=torch.Generator().manual_seed(8)), "seed": 5}
    if kind == "subset":
        return {"sampler": SubsetRandomSampler(list(range(0, n, 2)), seed=8), "seed": 5}
    if kind == "random-sampler":
        return {"sampler": RandomSampler(range(n), seed=8), "seed": 5}
    if kind == "custom":
        return {"sampler": Rotating(n), "seed": 5}
    # samplers without state_dict, resumed by replaying them (conveyor.replay)
    tud = torch.utils.data
    if kind == "torch-random":
        return {"sampler": tud.RandomSampler(range(n), generator=torch.Generator().manual_seed(8)), "seed": 5}
    if kind == "torch-weighted":
        weights = [1.0 + (i % 3) for i in range(n)]
        return {"sampler": tud.WeightedRandomSampler(weights, n + 3, generator=torch.Generator().manual_seed(8)),
                "seed": 5}
    if kind == "torch-subset":
        return {"sampler": tud.SubsetRandomSampler(list(range(0, n, 2)), generator=torch.Generator().manual_seed(8)),
                "seed": 5}
    if kind == "own-rng":
        return {"sampler": OwnRng(n, 8), "seed": 5}
    if kind == "list":
        return {"sampler": [(i * 5) % n for i in range(n)], "seed": 5}
    raise AssertionError(kind)


REPLAYED = ["torch-random", "torch-weighted", "torch-subset", "own-rng", "list"]


KINDS = ["shuffle-seed", "shuffle-generator", "sequential", "weighted", "weighted-generator", "subset",
         "random-sampler", "custom", *REPLAYED]


def make(kind: str, n: int = 23, batch_size: int = 4, drop_last: bool = False, **kw: Any) -> DataLoader[Any]:
    return DataLoader(Noisy(n), batch_size=batch_size, drop_last=drop_last, **loader_kw(kind, n), **kw)


# --------------------------------------------------------------------------- the state itself


def _plain(x: Any) -> bool:
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    if isinstance(x, list):
        return all(map(_plain, x))
    return x is None or type(x) in (str, int, float, bool)


@pytest.mark.parametrize("kind", KINDS)
def test_state_is_plain_versioned_json(kind: str) -> None:
    with make(kind) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    assert _plain(state), state
    assert json.loads(json.dumps(state)) == state
    assert isinstance(state.get("version"), int)


def state_sizes(kind: str) -> list[int]:
    """Bytes of JSON of the state after one batch, for 100 samples and for a million."""
    sizes = []
    for n in (100, 1_000_000):
        with make(kind, n=n, batch_size=8) as loader:
            it = iter(loader)
            next(it)
            sizes.append(len(json.dumps(loader.state_dict())))
    return sizes


@pytest.mark.parametrize("kind", ["shuffle-seed", "shuffle-generator", "sequential", "weighted", "subset",
                                  "random-sampler"])
def test_state_size_does_not_grow_with_the_dataset(kind: str) -> None:
    sizes = state_sizes(kind)
    assert sizes[1] < 20_000, sizes
    assert abs(sizes[1] - sizes[0]) < 64, sizes  # only the digits of the length may differ


@pytest.mark.parametrize("kind", REPLAYED)
def test_state_of_a_replayed_sampler_does_not_grow_with_the_dataset(kind: str) -> None:
    # the global RNGs' states (~13 KB of base64) and the sampler's own generator (<7 KB);
    # numpy's is there once numpy.random is imported (Noisy imports it): import it first
    np.random.get_state()
    sizes = state_sizes(kind)
    assert sizes[1] < 24_000, sizes
    assert abs(sizes[1] - sizes[0]) < 64, sizes


# --------------------------------------------------------------------------- exact resume


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("step", [0, 1, 3, 5])
def test_resume_mid_epoch_gives_the_uninterrupted_run(kind: str, step: int) -> None:
    resumes_exactly(lambda: make(kind), step, epochs=EPOCHS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["shuffle-generator", "custom", "torch-random"])
def test_a_state_carried_by_pickle_resumes_as_one_carried_by_json(kind: str) -> None:
    # torch.save(loader.state_dict()) pickles the state: the objects it gives back must load
    resumes_exactly(lambda: make(kind), 5, epochs=EPOCHS, via="pickle")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_resume_at_an_epoch_boundary(kind: str) -> None:
    """Stopped after a whole epoch (no next iterator yet): the next loader starts epoch 1."""
    resumes_exactly(lambda: make(kind), len(make(kind)), epochs=EPOCHS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_state_after_an_epochs_last_batch_names_the_next_epoch(kind: str) -> None:
    """Saved after the last batch, before the iterator's StopIteration (a trainer that counts
    len(loader) batches never asks for it): the same state as after it, the next epoch's
    start, which the trainer asks for next. It named the ended epoch with nothing left, and
    Lightning, which counts that epoch done, lost one."""
    with make(kind) as loader:
        it = iter(loader)
        for _ in range(len(loader)):
            next(it)
        at_last = json.loads(json.dumps(loader.state_dict()))
        assert next(it, None) is None
        after = json.loads(json.dumps(loader.state_dict()))
    assert at_last == after
    assert (at_last["epoch"], at_last["batches"]) == (1, 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_resume_in_a_later_epoch(kind: str) -> None:
    resumes_exactly(lambda: make(kind), len(make(kind)) + 2, epochs=EPOCHS)


@pytest.mark.timeout(60)
def test_resume_from_a_fresh_loader_state() -> None:
    """A state taken before any iteration resumes from the very beginning."""
    ref = run_epochs(make("shuffle-seed"), EPOCHS)
    state = carry(make("shuffle-seed").state_dict(), "json")
    assert resume(make("shuffle-seed"), state, EPOCHS) == ref


# --------------------------------------------------------------------------- samplers without state_dict


class PlainOrder:
    """A sampler that is just an iterable with a length (no base class)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(0, self.n, 2))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sampler", [Stateless(10), PlainOrder(10)], ids=["torch-sampler", "plain"])
@pytest.mark.parametrize("as_batch_sampler", [False, True])
def test_sampler_without_state_dict_resumes_by_replaying(sampler: Any, as_batch_sampler: bool) -> None:
    def build() -> DataLoader[Any]:
        if as_batch_sampler:
            return DataLoader(Noisy(10), batch_sampler=torch.utils.data.BatchSampler(sampler, 2, False), seed=3)
        return DataLoader(Noisy(10), batch_size=2, sampler=sampler, seed=3)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a sampler that replays exactly: no warning
        resumes_exactly(build, len(build()) + 2, epochs=EPOCHS)


class Counting(Stateless):
    """Without state_dict, and its order follows from how often it was iterated: a new
    sampler cannot replay the saved one's later epochs."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.calls = 0

    def __iter__(self) -> Iterator[int]:
        self.calls += 1
        return iter([(i + self.calls) % self.n for i in range(self.n)])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("at_end", [False, True], ids=["mid-epoch", "epoch-end"])
def test_a_sampler_that_does_not_replay_is_a_warning(at_end: bool) -> None:
    def build() -> DataLoader[Any]:
        return DataLoader(Noisy(10), batch_size=2, sampler=Counting(10), seed=3)

    # a whole epoch, then the next one's first batch or all of it (to its StopIteration)
    state = cut(build(), 2 * len(build()) if at_end else len(build()) + 1, exhaust=at_end).state
    with pytest.warns(UserWarning, match="drew other batches"):
        resume(build(), state)


# --------------------------------------------------------------------------- misuse


def test_loading_into_a_running_iterator_raises() -> None:
    first = make("shuffle-seed")
    it = iter(first)
    next(it)
    state = first.state_dict()
    second = make("shuffle-seed")
    it2 = iter(second)
    next(it2)
    with pytest.raises(RuntimeError):
        second.load_state_dict(state)


def test_state_from_another_dataset_length_raises() -> None:
    first = make("shuffle-seed", n=23)
    it = iter(first)
    next(it)
    state = json.loads(json.dumps(first.state_dict()))
    with pytest.raises(ValueError):
        make("shuffle-seed", n=24).load_state_dict(state)


def test_state_of_another_version_raises() -> None:
    state = make("sequential").state_dict()
    state["version"] = 999
    with pytest.raises(ValueError):
        make("sequential").load_state_dict(state)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shuffle", [False, True])
def test_shuffle_flag_with_sequential_sampler_defaults(shuffle: bool) -> None:
    """The loader's own samplers: SequentialSampler or RandomSampler, resumable in both modes."""
    loader = DataLoader(Noisy(11), batch_size=3, shuffle=shuffle, seed=1)
    assert isinstance(loader.sampler, RandomSampler if shuffle else SequentialSampler)
    resumes_exactly(lambda: DataLoader(Noisy(11), batch_size=3, shuffle=shuffle, seed=1), 2, epochs=EPOCHS,
                    first=lambda: loader)


class HoleAt(torch.utils.data.Dataset):
    """Indices 4 and 5 fail: with batches of 2, batch 2 is skipped whole."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        if i in (4, 5):
            raise ValueError(f"bad sample {i}")
        return i


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_order", [True, False])
def test_resume_after_a_batch_skipped_whole(in_order: bool) -> None:
    # the skipped batch's position is done with: no batch comes twice, and the state stays small
    def make_loader() -> DataLoader[Any]:
        return DataLoader(HoleAt(), batch_size=2, on_error="skip", max_failures=10, in_order=in_order)

    got, state, _ = cut(make_loader(), 3)
    assert got == [[0, 1], [2, 3], [6, 7]] and state["batches"] == 4 and "done" not in state
    assert resume(make_loader(), state) == [[[8, 9], [10, 11]]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", [{"batch_size": 3}, {"drop_last": True}])
@pytest.mark.parametrize("kind", ["stream", "torch-sampler", "own-sampler"])
def test_a_state_saved_mid_epoch_refuses_other_batches(kind: str, change: dict[str, Any]) -> None:
    # a position is a count of batches: with another batch_size or drop_last they are other samples
    def make(**kw: Any) -> DataLoader[Any]:
        opts: dict[str, Any] = {"batch_size": 4, **kw}
        if kind == "stream":
            return DataLoader(Stream(11, "torch"), **opts)
        if kind == "torch-sampler":
            return DataLoader(list(range(11)), sampler=torch.utils.data.RandomSampler(range(11)), **opts)
        return DataLoader(list(range(11)), shuffle=True, seed=3, **opts)

    first = make()
    it = iter(first)
    next(it)
    state = json.loads(json.dumps(first.state_dict()))
    with pytest.raises(ValueError, match=next(iter(change))):
        make(**change).load_state_dict(state)
    make().load_state_dict(state)  # the same batches: loads


def test_an_array_dataset_resumes_past_batches_handed_out_of_order() -> None:
    """A state naming positions done out of order ('done'), loaded where batches are gathered
    in the main process: those positions are left out, once."""
    state = {"version": 1, "dataset_len": 32, "seed": 0, "epoch": 0, "batches": 0, "replay": False,
             "done": [1, 3], "sampler": {"version": 1, "class": "BatchSampler", "batch_size": 4,
                                         "drop_last": False,
                                         "sampler": {"version": 1, "class": "SequentialSampler", "n": 32}}}
    loader = DataLoader(ArrayDataset(np.arange(32)), batch_size=4, seed=0)
    loader.load_state_dict(state)
    firsts = [int(b[0][0]) for b in loader]
    assert firsts == [0, 8, 16, 20, 24, 28]


def test_forgetting_set_epoch_on_resume_is_named_as_the_fix() -> None:
    # the warning said to implement state_dict() on torch's own sampler
    def build() -> DataLoader[Any]:
        sampler = torch.utils.data.DistributedSampler(range(20), num_replicas=2, rank=0, shuffle=True, seed=7)
        return DataLoader(Noisy(20), batch_size=3, sampler=sampler)

    loader = build()
    loader.sampler.set_epoch(1)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    again = build()
    again.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"call sampler\.set_epoch\(\) with the epoch the saved run had set"):
        list(again)
    again = build()
    again.load_state_dict(state)
    again.sampler.set_epoch(1)  # as told: no warning, the saved epoch's rest
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(again)) == 3


@pytest.mark.timeout(60)
def test_a_replayed_sampler_notes_only_the_global_rngs_it_draws_from_after_its_first_epoch() -> None:
    # copying numpy's global state costs ~50 us an epoch: noted at the first epoch, then only
    # where the sampler's first draw moved it (torch's is always noted: ~2 us)
    np.random.get_state()  # numpy.random imported, as Noisy would

    class NumpyGlobal(Stateless):
        def __iter__(self) -> Iterator[int]:
            return iter(np.random.permutation(self.n).tolist())

    for kind, kept in (("torch-random", set()), ("own-rng", set()), ("numpy-global", {"numpy"})):
        sampler = {"sampler": NumpyGlobal(23), "seed": 5} if kind == "numpy-global" else loader_kw(kind, 23)
        with DataLoader(Noisy(23), batch_size=4, **sampler) as loader:
            list(loader)
            first = loader.state_dict()["replayed"]["rngs"]
            it = iter(loader)
            next(it)
            later = loader.state_dict()["replayed"]["rngs"]
        assert first["random"] is not None and first["numpy"] is not None
        assert {k for k in ("random", "numpy") if later[k] is not None} == kept
        assert later["torch"] is not None


def _saved(at: int = 3, **kw: Any) -> tuple[dict[str, Any], Callable[[], DataLoader[Any]]]:
    """A state saved after ``at`` batches of a 10-batch shuffled epoch, and how to make its loader."""
    def make() -> DataLoader[Any]:
        return DataLoader(list(range(20)), batch_size=2, shuffle=True, seed=7, output="numpy", **kw)

    loader = make()
    it = iter(loader)
    for _ in range(at):
        next(it)
    return json.loads(json.dumps(loader.state_dict())), make


def _sampler_seed(state: dict[str, Any], seed: int) -> dict[str, Any]:
    state["sampler"]["sampler"]["seed"] = seed
    return state


@pytest.mark.parametrize(("field", "value", "says"), [
    ("batches", -3, r"state\['batches'\] should be a whole number from 0 to 10"),
    ("batches", 11, r"state\['batches'\] should be a whole number from 0 to 10"),
    ("batches", 10**6, r"state\['batches'\] should be a whole number from 0 to 10"),
    ("batches", 2.0, r"state\['batches'\] should be a whole number"),
    ("batches", True, r"state\['batches'\] should be a whole number"),
    ("batches", None, r"state\['batches'\] should be a whole number"),
    ("epoch", 1.5, r"state\['epoch'\] should be a whole number >= 0"),
    ("epoch", -1, r"state\['epoch'\] should be a whole number >= 0"),
    ("epoch", "1", r"state\['epoch'\] should be a whole number >= 0"),
    ("done", [99], r"state\['done'\] should list batch positions from 4 to 9"),
    ("done", [5, 5], r"state\['done'\] should list batch positions from 4 to 9"),
    ("done", [3], r"state\['done'\] should list batch positions from 4 to 9"),
    ("replay", True, r"state\['replay'\] is True.*state\['batches'\] is 3"),
    ("replay", "yes", r"state\['replay'\] should be True or False"),
    ("sampler-seed", 8, r"state\['sampler'\]\['sampler'\]\['seed'\] is 8.*seed 7"),
])
def test_a_state_that_names_no_reachable_position_is_refused(field: str, value: Any, says: str) -> None:
    # each was loaded, and the loader resumed elsewhere without a word (an empty epoch, the
    # epoch from its start, epoch 1 for 1.5, another shuffle), or failed later at iter()
    state, make = _saved()
    if field == "sampler-seed":
        state = _sampler_seed(state, value)
    else:
        state[field] = value
    loader = make()
    with pytest.raises(ValueError, match=says):
        loader.load_state_dict(state)
    # nothing of the refused state was taken: the loader runs its first epoch as a fresh one would
    assert [b.tolist() for b in loader] == [b.tolist() for b in make()]


def test_states_at_the_edges_of_an_epoch_still_load() -> None:
    for at in (0, 1, 9, 10):  # 10: every batch handed out, the next epoch named
        state, make = _saved(at)
        make().load_state_dict(state)
    state, make = _saved(3)
    state["done"] = [4, 9]
    make().load_state_dict(state)
