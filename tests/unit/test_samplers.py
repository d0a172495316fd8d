"""Tests for conveyor.samplers: torch parity, seed mode, checkpoints, weighted draws, sharding.

Tests that need torch call ``pytest.importorskip("torch")``; the module itself imports without torch.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import _torch, samplers
from conveyor.samplers import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)


def _tdata() -> Any:
    torch = pytest.importorskip("torch")
    import torch.utils.data as tud

    return torch, tud


def _json(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


# ---------------------------------------------------------------- torch parity

RANDOM_CASES = [
    (10, False, None),
    (10, False, 4),
    (10, False, 25),
    (7, True, None),
    (7, True, 32),
    (7, True, 70),
    (100, True, 5),
    (1, False, None),
]


@pytest.mark.parametrize(("n", "replacement", "num_samples"), RANDOM_CASES)
@pytest.mark.parametrize("use_gen", [False, True])
def test_random_parity(n: int, replacement: bool, num_samples: int | None, use_gen: bool) -> None:
    torch, tud = _tdata()

    def run(cls: Any) -> list[list[int]]:
        torch.manual_seed(123)
        gen = torch.Generator().manual_seed(7) if use_gen else None
        s = cls(range(n), replacement=replacement, num_samples=num_samples, generator=gen)
        return [list(s) for _ in range(3)] + [torch.rand(2).tolist()]

    assert run(RandomSampler) == run(tud.RandomSampler)


def test_random_draws_lazily_like_torch() -> None:
    torch, tud = _tdata()

    def run(cls: Any) -> list[Any]:
        torch.manual_seed(5)
        it = iter(cls(range(20)))
        noise = torch.rand(3).tolist()  # drawn before the sampler's seed, as in torch
        return [noise, list(it)]

    assert run(RandomSampler) == run(tud.RandomSampler)


@pytest.mark.parametrize("use_gen", [False, True])
def test_subset_parity(use_gen: bool) -> None:
    torch, tud = _tdata()
    indices = [3, 9, 4, 12, 40, 1, 0]

    def run(cls: Any) -> list[list[int]]:
        torch.manual_seed(11)
        gen = torch.Generator().manual_seed(3) if use_gen else None
        s = cls(indices, generator=gen)
        return [list(s) for _ in range(3)]

    assert run(SubsetRandomSampler) == run(tud.SubsetRandomSampler)


@pytest.mark.parametrize("weights", [[0.1, 0.9, 0.4, 0.7, 3.0, 0.6], [1.0, 0.0, 2.0], list(range(1, 50))])
@pytest.mark.parametrize("num_samples", [1, 5, 100])
@pytest.mark.parametrize("use_gen", [False, True])
@pytest.mark.parametrize("replacement", [True, False])
def test_weighted_parity(weights: list[float], num_samples: int, use_gen: bool, replacement: bool) -> None:
    torch, tud = _tdata()
    if not replacement:
        num_samples = min(num_samples, sum(1 for w in weights if w > 0))

    def run(cls: Any) -> tuple[list[list[int]], float]:
        torch.manual_seed(2)
        gen = torch.Generator().manual_seed(9) if use_gen else None
        s = cls(weights, num_samples, replacement=replacement, generator=gen)
        return [list(s) for _ in range(2)], torch.rand(1).item()  # the draws, and the global RNG after

    assert run(WeightedRandomSampler) == run(tud.WeightedRandomSampler)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 3, 10, 11])
def test_batch_parity(drop_last: bool, batch_size: int) -> None:
    torch, tud = _tdata()
    gens = [torch.Generator().manual_seed(1) for _ in range(3)]
    ours = BatchSampler(RandomSampler(range(10), generator=gens[0]), batch_size, drop_last)
    theirs = tud.BatchSampler(tud.RandomSampler(range(10), generator=gens[1]), batch_size, drop_last)
    mixed = BatchSampler(tud.RandomSampler(range(10), generator=gens[2]), batch_size, drop_last)
    assert list(ours) == list(theirs) == list(mixed)
    assert len(ours) == len(theirs) == len(list(ours))


def test_batch_plain() -> None:
    assert list(BatchSampler(range(7), 3, False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(BatchSampler(range(7), 3, True)) == [[0, 1, 2], [3, 4, 5]]
    assert list(BatchSampler(SequentialSampler(range(0)), 3, False)) == []
    assert len(BatchSampler(range(7), 3, False)) == 3


@pytest.mark.parametrize("n", [0, 1, 10, 13])
@pytest.mark.parametrize("world", [1, 3, 4])
@pytest.mark.parametrize(("shuffle", "drop_last"), [(True, False), (True, True), (False, False), (False, True)])
def test_distributed_parity(n: int, world: int, shuffle: bool, drop_last: bool) -> None:
    torch, tud = _tdata()
    if n == 0 and not drop_last:
        pytest.skip("torch divides by zero padding an empty dataset")
    for rank in range(world):
        ours = DistributedSampler(range(n), world, rank, shuffle=shuffle, seed=4, drop_last=drop_last)
        theirs = tud.DistributedSampler(range(n), world, rank, shuffle=shuffle, seed=4, drop_last=drop_last)
        for epoch in (0, 1, 5):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


# ---------------------------------------------------------------- errors

ERROR_CASES = [
    ("RandomSampler", (range(5),), {"replacement": 1}),
    ("RandomSampler", (range(5),), {"num_samples": 0}),
    ("RandomSampler", (range(5),), {"num_samples": -3}),
    ("RandomSampler", (range(5),), {"num_samples": 2.5}),
    ("RandomSampler", (range(0),), {}),
    ("WeightedRandomSampler", ([1.0, 2.0], 0), {}),
    ("WeightedRandomSampler", ([1.0, 2.0], True), {}),
    ("WeightedRandomSampler", ([1.0, 2.0], 1.5), {}),
    ("WeightedRandomSampler", ([1.0, 2.0], 2), {"replacement": 0}),
    ("WeightedRandomSampler", ([[1.0, 2.0]], 2), {}),
    ("WeightedRandomSampler", (3.0, 2), {}),
    ("BatchSampler", (range(5), 0, False), {}),
    ("BatchSampler", (range(5), -1, False), {}),
    ("BatchSampler", (range(5), True, False), {}),
    ("BatchSampler", (range(5), 2.0, False), {}),
    ("BatchSampler", (range(5), 2, 0), {}),
    ("DistributedSampler", (range(5), 2, 2), {}),
    ("DistributedSampler", (range(5), 2, -1), {}),
]


@pytest.mark.parametrize(("name", "args", "kwargs"), ERROR_CASES)
def test_errors_match_torch(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _, tud = _tdata()
    with pytest.raises(Exception) as theirs:
        getattr(tud, name)(*args, **kwargs)
    with pytest.raises(theirs.type):
        globals()[name](*args, **kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda: WeightedRandomSampler([1.0, -1.0], 1),
        lambda: WeightedRandomSampler([0.0, 0.0], 1),
        lambda: WeightedRandomSampler([1.0, float("nan")], 1),
        lambda: WeightedRandomSampler([], 1),
        lambda: WeightedRandomSampler([1.0, 0.0, 2.0], 3, replacement=False),
        lambda: RandomSampler(range(3), seed=-1),
        lambda: DistributedSampler(range(5), 0, 0),
        lambda: DistributedSampler(range(5), 2, 5),
    ],
)
def test_value_errors(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


def test_seed_and_generator_exclusive() -> None:
    torch, _ = _tdata()
    with pytest.raises(ValueError, match="not both"):
        RandomSampler(range(3), generator=torch.Generator(), seed=1)
    with pytest.raises(TypeError):
        RandomSampler(range(3), generator=np.random.default_rng(0))


def test_distributed_world_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="num_replicas"):
        DistributedSampler(range(10))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    s = DistributedSampler(range(10), shuffle=False)
    assert (s.num_replicas, s.rank, list(s)) == (4, 3, [3, 7, 1])


# ---------------------------------------------------------------- checkpoints


def _builders() -> list[tuple[str, Any]]:
    """(id, make(generator_seed)) for every checkpointable sampler in every mode."""
    out: list[tuple[str, Any]] = []
    weights = [0.5, 0.0, 2.0, 1.0, 3.0, 0.25, 1.0, 1.0]
    kinds = {
        "random": lambda **kw: RandomSampler(range(20), **kw),
        "random_repl": lambda **kw: RandomSampler(range(20), replacement=True, num_samples=45, **kw),
        "random_more": lambda **kw: RandomSampler(range(6), num_samples=15, **kw),
        "subset": lambda **kw: SubsetRandomSampler(list(range(100, 120)), **kw),
        "weighted": lambda **kw: WeightedRandomSampler(weights, 30, **kw),
        "weighted_norepl": lambda **kw: WeightedRandomSampler(weights, 6, replacement=False, **kw),
    }
    for name, make in kinds.items():
        out.append((f"{name}-seed", lambda g, make=make: make(seed=42)))
        if _torch.available():  # checked without importing torch at collection time
            out.append((f"{name}-gen", lambda g, make=make: make(generator=_torch.get().Generator().manual_seed(g))))
            out.append((f"{name}-global", lambda g, make=make: make()))
    return out


BUILDERS = _builders()


@pytest.mark.parametrize(("name", "make"), BUILDERS, ids=[b[0] for b in BUILDERS])
@pytest.mark.parametrize("done_epochs", [0, 1])
@pytest.mark.parametrize("consumed", [0, 3])
def test_state_roundtrip(name: str, make: Any, done_epochs: int, consumed: int) -> None:
    torch = _torch.get()
    if torch is not None:
        torch.manual_seed(0)
    s = make(1)
    started = [list(s) for _ in range(done_epochs)]
    # torch mode is lazy: nothing is drawn before the first item, and until then the state is
    # that of a fresh start; seed mode takes its epoch when the iterator is made
    it = iter(s)
    head = list(itertools.islice(it, consumed))
    state = _json(s.state_dict())
    assert state["version"] == 1 and state["class"] == type(s).__name__
    saved_global = torch.get_rng_state() if torch is not None else None
    begun = bool(consumed) or getattr(s, "seed", None) is not None
    if begun:
        started.append(head + list(it))
    after = [list(s), list(s)]
    # the state names the iteration under way, else the one that would start next
    expected, following = (started[-1], after) if begun else (after[0], after[1:])

    if torch is not None:
        torch.manual_seed(999)  # disturb the global RNG; the checkpoint must not depend on it here
    fresh = make(2)
    fresh.load_state_dict(state)
    if torch is not None:
        torch.set_rng_state(saved_global)  # a training checkpoint restores the global RNG too
    assert list(fresh) == expected
    assert [list(fresh) for _ in following] == following


def test_state_small_and_plain() -> None:
    big = range(10**7)
    samplers: list[Sampler[Any]] = [RandomSampler(big, seed=1), SequentialSampler(big)]
    torch = _torch.get()
    if torch is not None:
        samplers += [RandomSampler(big), RandomSampler(big, generator=torch.Generator())]
    for s in samplers:
        text = json.dumps(s.state_dict())
        assert len(text) < 10_000


def test_state_before_iteration_global() -> None:
    torch, tud = _tdata()
    torch.manual_seed(3)
    s = RandomSampler(range(10))
    state = _json(s.state_dict())
    assert state["torch_seed"] is None
    fresh = RandomSampler(range(10))
    fresh.load_state_dict(state)
    torch.manual_seed(3)
    a = list(fresh)
    torch.manual_seed(3)
    assert a == list(tud.RandomSampler(range(10)))


def test_generator_state_restored_after_epoch() -> None:
    torch, _ = _tdata()
    g = torch.Generator().manual_seed(5)
    s = RandomSampler(range(30), generator=g)
    it = iter(s)
    next(it)
    state = _json(s.state_dict())
    list(it)
    after = g.get_state()
    g2 = torch.Generator().manual_seed(77)
    fresh = RandomSampler(range(30), generator=g2)
    fresh.load_state_dict(state)
    list(fresh)
    assert torch.equal(g2.get_state(), after)


@pytest.mark.parametrize(
    ("make", "other"),
    [
        (lambda: RandomSampler(range(10), seed=0), lambda: RandomSampler(range(11), seed=0)),
        (lambda: RandomSampler(range(10), seed=0), lambda: RandomSampler(range(10), num_samples=5, seed=0)),
        (lambda: RandomSampler(range(10), seed=0), lambda: SubsetRandomSampler(range(10), seed=0)),
        (lambda: SequentialSampler(range(10)), lambda: SequentialSampler(range(9))),
        (lambda: WeightedRandomSampler([1, 2], 5, seed=0), lambda: WeightedRandomSampler([1, 2], 6, seed=0)),
        (lambda: WeightedRandomSampler([1, 2], 1, seed=0), lambda: WeightedRandomSampler([1, 2, 3], 1, seed=0)),
        (lambda: DistributedSampler(range(10), 2, 0), lambda: DistributedSampler(range(10), 2, 1)),
        (lambda: DistributedSampler(range(10), 2, 0), lambda: DistributedSampler(range(10), 4, 0)),
        (lambda: DistributedSampler(range(10), 2, 0), lambda: DistributedSampler(range(12), 2, 0)),
        (
            lambda: BatchSampler(SequentialSampler(range(4)), 2, False),
            lambda: BatchSampler(SequentialSampler(range(4)), 3, False),
        ),
    ],
)
def test_load_rejects_mismatch(make: Any, other: Any) -> None:
    with pytest.raises(ValueError):
        other().load_state_dict(_json(make().state_dict()))


def test_load_rejects_mode_mismatch() -> None:
    torch, _ = _tdata()
    state = RandomSampler(range(5), seed=3).state_dict()
    with pytest.raises(ValueError, match="mode"):
        RandomSampler(range(5), generator=torch.Generator()).load_state_dict(state)


def test_batch_state_delegates() -> None:
    inner = RandomSampler(range(23), seed=9)
    b = BatchSampler(inner, 4, False)
    b.set_epoch(3)
    it = iter(b)
    first = next(it)
    state = _json(b.state_dict())
    assert state["sampler"]["epoch"] == 3
    rest = list(it)
    fresh = BatchSampler(RandomSampler(range(23), seed=9), 4, False)
    fresh.load_state_dict(state)
    assert list(fresh) == [first, *rest]


def test_batch_state_needs_inner_state() -> None:
    with pytest.raises(TypeError, match="range must implement state_dict"):
        BatchSampler(range(5), 2, False).state_dict()
    torch, tud = _tdata()
    b = BatchSampler(tud.SequentialSampler(range(5)), 2, False)
    with pytest.raises(TypeError, match="SequentialSampler must implement state_dict"):
        b.state_dict()


def test_distributed_state() -> None:
    s = DistributedSampler(range(50), 3, 1, seed=8)
    s.set_epoch(4)
    state = _json(s.state_dict())
    fresh = DistributedSampler(range(50), 3, 1, seed=8)
    fresh.load_state_dict(state)
    assert fresh.epoch == 4 and list(fresh) == list(s)


# ---------------------------------------------------------------- seed mode


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomSampler(range(50), seed=5),
        lambda: RandomSampler(range(50), replacement=True, num_samples=80, seed=5),
        lambda: SubsetRandomSampler(list(range(50)), seed=5),
        lambda: WeightedRandomSampler(np.arange(1.0, 51.0), 40, seed=5),
        lambda: WeightedRandomSampler(np.arange(1.0, 51.0), 40, replacement=False, seed=5),
    ],
)
def test_seed_mode_pure(make: Any) -> None:
    a, b = make(), make()
    a.set_epoch(2)
    b.set_epoch(2)
    first = list(a)
    assert first == list(b)
    a.set_epoch(3)
    assert list(a) != first
    c = make()
    assert [list(c), list(c)] == [list(_at(make(), 0)), list(_at(make(), 1))]  # epochs advance on their own


def _at(s: Any, epoch: int) -> Any:
    s.set_epoch(epoch)
    return s


def test_seed_mode_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_torch, "available", lambda: False)
    monkeypatch.setattr(_torch, "get", lambda: None)
    a, b = RandomSampler(range(30)), RandomSampler(range(30))
    assert isinstance(a.seed, int) and a.seed != b.seed
    assert sorted(a) == list(range(30))
    state = _json(a.state_dict())
    assert state["mode"] == "seed"
    c = RandomSampler(range(30))
    c.load_state_dict(state)
    a.set_epoch(0)
    assert list(c) == list(a)
    d = DistributedSampler(range(10), 2, 0)
    assert len(d) == 5 and list(d) == list(DistributedSampler(range(10), 2, 0))
    d.set_epoch(1)
    assert list(d) != list(DistributedSampler(range(10), 2, 0))


# ---------------------------------------------------------------- weighted


def test_weighted_beyond_multinomial_limit() -> None:
    w = np.zeros(2**24 + 10)
    w[-4:] = [1.0, 0.0, 2.0, 1.0]
    w[3] = 1e-300
    samplers = [WeightedRandomSampler(w, 50, seed=1)]
    torch = _torch.get()
    if torch is not None:
        samplers.append(WeightedRandomSampler(w, 50, generator=torch.Generator().manual_seed(1)))
    firsts = []
    for s in samplers:
        drawn = list(s)
        firsts.append(drawn)
        assert len(drawn) == 50
        assert set(drawn) <= {3, 2**24 + 6, 2**24 + 8, 2**24 + 9}
    samplers[0].set_epoch(0)
    assert list(samplers[0]) == firsts[0]
    three = list(WeightedRandomSampler(w, 3, replacement=False, seed=0))
    assert sorted(three) == [2**24 + 6, 2**24 + 8, 2**24 + 9]


def test_weighted_without_replacement_fast_and_valid() -> None:
    n = 1_000_000
    w = np.random.default_rng(0).random(n) + 0.01
    s = WeightedRandomSampler(w, n, replacement=False, seed=3)
    start = time.process_time()  # CPU time: robust to other processes sharing the machine
    drawn = list(s)
    assert time.process_time() - start < 1.0
    assert np.array_equal(np.sort(drawn), np.arange(n))


@pytest.mark.parametrize("blocked", [False, True])
def test_weighted_without_replacement_distribution(blocked: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    w = np.array([1.0, 2.0, 0.0, 3.0, 4.0])
    if blocked:  # small blocks exercise the path used for a few draws from very many weights
        monkeypatch.setattr(samplers.random, "NP_BLOCK", 4)
        w = np.concatenate([np.zeros(7), w, np.zeros(6)])
    trials = 2000
    first = np.zeros(len(w))
    second = np.zeros(len(w))
    for seed in range(trials):
        drawn = list(WeightedRandomSampler(w, 2, replacement=False, seed=seed))
        assert len(set(drawn)) == 2 and all(w[i] > 0 for i in drawn)
        first[drawn[0]] += 1
        second[drawn[1]] += 1
    p = w / w.sum()
    assert np.allclose(first / trials, p, atol=0.035)
    # P(second = j) = sum over i != j of p_i * p_j / (1 - p_i)
    expect = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(len(p)) if i != j) for j in range(len(p))])
    assert np.allclose(second / trials, expect, atol=0.035)
    assert list(WeightedRandomSampler(w, 4, replacement=False, seed=1)) == list(
        WeightedRandomSampler(w, 4, replacement=False, seed=1)
    )


def test_weighted_with_replacement_distribution() -> None:
    w = np.array([1.0, 0.0, 3.0, 6.0])
    drawn = np.array(list(WeightedRandomSampler(w, 20000, seed=4)))
    freq = np.bincount(drawn, minlength=4) / len(drawn)
    assert freq[1] == 0
    assert np.allclose(freq, w / w.sum(), atol=0.02)


def test_weighted_without_replacement_torch_mode() -> None:
    torch, _ = _tdata()
    s = WeightedRandomSampler([1.0, 0.0, 2.0, 5.0], 3, replacement=False, generator=torch.Generator().manual_seed(0))
    assert sorted(s) == [0, 2, 3]


# ---------------------------------------------------------------- distributed


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 300), world=st.integers(1, 9), shuffle=st.booleans(), drop_last=st.booleans())
def test_distributed_even_covers(n: int, world: int, shuffle: bool, drop_last: bool) -> None:
    shards = [list(DistributedSampler(range(n), world, r, shuffle=shuffle, drop_last=drop_last)) for r in range(world)]
    size = n // world if drop_last else math.ceil(n / world)
    assert all(len(s) == size for s in shards)
    flat = [i for s in shards for i in s]
    if drop_last:
        assert len(set(flat)) == len(flat)
    else:
        assert set(flat) == set(range(n))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 9), shuffle=st.booleans(), epoch=st.integers(0, 5))
def test_distributed_uneven_partitions(n: int, world: int, shuffle: bool, epoch: int) -> None:
    shards = []
    for r in range(world):
        s = DistributedSampler(range(n), world, r, shuffle=shuffle, seed=1, even=False)
        s.set_epoch(epoch)
        shards.append(list(s))
        assert len(s) == len(shards[-1])
    assert sorted(i for s in shards for i in s) == list(range(n))


def test_sequential() -> None:
    s = SequentialSampler("abcd")
    assert list(s) == [0, 1, 2, 3] and len(s) == 4
    s.set_epoch(3)
    s.load_state_dict(_json(s.state_dict()))
