"""conveyor.replay: the RNG states a sampler without state_dict begins from, as JSON, and
the digest of what it drew (the loader's use of them is in test_resume.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
import torch

from conveyor import replay


class Holder:
    """A sampler holding one generator of each kind, and a batch sampler around it."""

    def __init__(self) -> None:
        self.py = random.Random(1)
        self.pcg = np.random.default_rng(2)
        self.mt = np.random.Generator(np.random.MT19937(3))
        self.legacy = np.random.RandomState(4)
        self.gen = torch.Generator().manual_seed(5)
        self.not_an_rng = 7

    def draws(self) -> list[Any]:
        return [self.py.random(), self.pcg.random(), self.mt.random(), self.legacy.rand(),
                torch.rand(1, generator=self.gen).item()]


class Batches:
    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler


def global_draws() -> list[float]:
    return [random.random(), float(np.random.rand()), torch.rand(1).item()]


@pytest.mark.parametrize("nested", [False, True], ids=["sampler", "batch-sampler"])
def test_a_mark_through_json_puts_every_rng_back(nested: bool) -> None:
    holder = Holder()
    sampler = Batches(holder) if nested else holder
    holder.draws()
    np.random.seed(11), random.seed(12), torch.manual_seed(13)
    mark = json.loads(json.dumps(replay.Mark(sampler).json()))
    kinds = sorted(kind for _, _, kind, _ in mark["own"])
    assert kinds == ["numpy", "numpy", "numpy_legacy", "random", "torch"]
    want_own, want_global = holder.draws(), global_draws()

    fresh = Holder()  # another process's sampler: its generators at their seeds
    other = Batches(fresh) if nested else fresh
    np.random.seed(21), random.seed(22), torch.manual_seed(23)
    caller = global_draws()  # what the caller's RNGs give next, untouched by the replay
    np.random.seed(21), random.seed(22), torch.manual_seed(23)
    with replay.Replaying(mark, other):
        assert fresh.draws() == want_own
        assert global_draws() == want_global
    assert global_draws() == caller  # the global RNGs are the caller's again
    # the sampler's own generators stay where the replay left them, as the saved run's did
    assert fresh.draws() == holder.draws()


def test_python_rng_state_is_written_compactly() -> None:
    random.seed(3)
    mark = replay.Mark(object()).json()
    assert len(json.dumps(mark["random"])) < 3_500  # 625 words: 7 KB as decimal JSON
    assert replay._dec(json.loads(json.dumps(mark["random"]))) == random.getstate()


def test_equal_indices_digest_alike_whatever_their_type() -> None:
    # 0-d tensor views pickle with their storage, which differs from run to run: a sampler
    # yielding randperm(n).unbind() warned on every resume that it drew other batches
    views = list(torch.randperm(6, generator=torch.Generator().manual_seed(2)).unbind())
    again = list(torch.randperm(6, generator=torch.Generator().manual_seed(2)).unbind())
    ints = [int(v) for v in views]
    want = replay.digest(0, ints)
    assert replay.digest(0, views[:3]) != replay.digest(0, again[3:])
    for same in (views, again, [np.int64(i) for i in ints], np.array(ints), torch.tensor(ints)):
        assert replay.digest(0, same) == want
    assert replay.digest(0, torch.tensor(4)) == replay.digest(0, 4)


def test_check_names_what_went_wrong() -> None:
    sampler = Batches(Holder())
    assert replay.check(sampler, 5, 5, 3, 3) is None
    assert "drew other batches" in replay.check(sampler, 5, 6, 3, 3)
    assert "gave 2 batches" in replay.check(sampler, 5, 5, 2, 3)
    assert "Holder" in replay.check(sampler, 5, 6, 3, 3)
