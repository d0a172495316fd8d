"""Batches keep their containers' types and attributes across the trip from a worker,
``output="numpy"`` gives numpy arrays whatever runs the batch, and a user's entry in
torch's collate table is honoured in process workers too.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from torch.utils.data._utils import collate as torch_collate

import conveyor
from conveyor._tree import tree_map
from test_collate import ReadOnlyMap

SETTINGS = [{"num_workers": 0}, {"num_workers": 2, "adaptive": False},
            {"num_workers": 2, "worker_type": "thread", "adaptive": False}]
IDS = ["main", "processes", "threads"]


class AttrDict(dict):  # type: ignore[type-arg]
    def __init__(self, *args: Any, tag: str = "t", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.tag = tag


class MyList(list):  # type: ignore[type-arg]
    pass


class Shaped(tud.Dataset):
    """Samples of odd containers; the collate_fn keeps them (as a detection collate might)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        dd: collections.defaultdict[str, list[int]] = collections.defaultdict(list)
        dd["x"].append(i)
        return {"attr": AttrDict(a=torch.full((3,), float(i)), tag="hello"), "dd": dd,
                "list": MyList([torch.zeros(40_000), i]), "size": torch.Size([i, 2]),
                "od": collections.OrderedDict(b=1, a=torch.ones(2))}


def _first(samples: list[Any]) -> Any:
    return samples[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", SETTINGS, ids=IDS)
def test_containers_keep_their_type_and_attributes(kw: dict[str, Any]) -> None:
    with conveyor.DataLoader(Shaped(), batch_size=1, collate_fn=_first, **kw) as loader:
        got = list(loader)
    for i, b in enumerate(got):
        assert type(b["attr"]) is AttrDict and b["attr"].tag == "hello" and torch.equal(b["attr"]["a"], torch.full((3,), float(i)))
        assert type(b["dd"]) is collections.defaultdict and b["dd"]["missing"] == [] and b["dd"]["x"] == [i]
        assert type(b["list"]) is MyList and b["list"][1] == i and b["list"][0].shape == (40_000,)
        assert type(b["size"]) is torch.Size and b["size"] == torch.Size([i, 2])
        assert type(b["od"]) is collections.OrderedDict and list(b["od"]) == ["b", "a"]


def test_tree_map_keeps_other_mappings_when_it_can() -> None:
    out = tree_map(lambda x: x * 2, collections.UserDict(a=1))
    assert type(out) is collections.UserDict and out["a"] == 2  # made from the new items
    out = tree_map(lambda x: x * 2, ReadOnlyMap(("a", 1)))
    assert type(out) is dict and out == {"a": 2}  # its constructor refuses them: a plain dict


def test_tree_map_asks_the_mapping_abcs_only_about_types_with_items() -> None:
    """A registered (virtual) Mapping is still walked as one, a proxy whose ``items`` comes
    through ``__getattr__`` too. A leaf without either (a tensor, an array) is never checked
    against the Mapping ABCs: that check asks every
    Mapping subclass in the process, ~230 us the first time a tensor met it in a freshly
    forked process, paid by "auto"'s first probing batch."""
    asked: list[type] = []

    class Spy(Mapping):  # type: ignore[type-arg]
        """A Mapping subclass: the ABC check of a type against Mapping asks this one too."""

        @classmethod
        def __subclasshook__(cls, other: type) -> Any:
            asked.append(other)
            return NotImplemented

    class Leaf:  # a new type: no ABC cache knows it yet
        nbytes = 8

    class Virtual:  # a Mapping by registration alone: tree_map needs its items()
        def __init__(self, **items: Any) -> None:
            self._items = items

        def items(self) -> Any:
            return self._items.items()

    class Proxy:  # registered too, its items() found through __getattr__ on the instance
        def __init__(self, target: dict[str, Any]) -> None:
            self._target = target

        def __getattr__(self, name: str) -> Any:
            return getattr(self._target, name)

    Mapping.register(Virtual)
    Mapping.register(Proxy)
    assert tree_map(lambda x: x * 2, Virtual(a=1)) == {"a": 2}  # made from the new items
    out = tree_map(lambda x: x * 2, Proxy({"a": 1}))
    assert type(out) is Proxy and out._target == {"a": 2}  # rebuilt around the new items
    leaf = Leaf()
    assert tree_map(lambda x: x, [leaf, (leaf,)]) == [leaf, (leaf,)]
    assert Leaf not in asked
    assert issubclass(Leaf, Mapping) is False and Leaf in asked  # the spy sees a check that is made
    del Spy


class Tensors(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return {"t": torch.ones(3) * i, "big": torch.zeros(20_000), "bf": torch.ones(2, dtype=torch.bfloat16)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", SETTINGS, ids=IDS)
@pytest.mark.parametrize("batch_size", [None, 2])
def test_numpy_output_is_numpy_whatever_makes_the_batch(kw: dict[str, Any], batch_size: int | None) -> None:
    with conveyor.DataLoader(Tensors(), batch_size=batch_size, output="numpy", **kw) as loader:
        for b in loader:
            assert all(type(v) is np.ndarray for v in b.values()), {k: type(v) for k, v in b.items()}
            assert b["bf"].dtype == np.float32  # numpy has no bfloat16


def _pad(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    n = max(len(t) for t in batch)
    return torch.stack([torch.nn.functional.pad(t, (0, n - len(t))) for t in batch])


class Ragged(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(i + 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", SETTINGS, ids=IDS)
def test_a_users_entry_in_torchs_collate_table_is_used(kw: dict[str, Any]) -> None:
    # torch's documented extension point: process workers used to put conveyor's own entry
    # over it, and stack the ragged samples (an error)
    table = torch_collate.default_collate_fn_map
    saved = table[torch.Tensor]
    table[torch.Tensor] = _pad
    try:
        with conveyor.DataLoader(Ragged(), batch_size=2, collate_fn=tud.default_collate, **kw) as loader:
            shapes = [tuple(b.shape) for b in loader]
    finally:
        table[torch.Tensor] = saved
    assert shapes == [(2, 2), (2, 4)]


class Pair(tuple):  # type: ignore[type-arg]
    """A tuple subclass whose constructor takes its items one by one."""

    def __new__(cls, a: Any, b: Any) -> Pair:
        return super().__new__(cls, (a, b))


def test_tuple_subclasses_keep_their_items_whatever_their_constructor() -> None:
    out = tree_map(lambda x: x + 10, Pair(1, 2))
    assert type(out) is Pair and tuple(out) == (11, 12)
    assert type(tree_map(lambda x: x, torch.Size([3, 4]))) is torch.Size


class SparseSamples(tud.Dataset):
    """A sparse COO tensor (which refuses ``nbytes``) beside a dense one, per sample."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"s": torch.eye(3).to_sparse() * (i + 1), "d": torch.full((4,), float(i))}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kw", [*SETTINGS, {"num_workers": 2}, {"num_workers": "auto"}],
                         ids=[*IDS, "adaptive", "auto"])
def test_sparse_tensors_pass_unbatched_as_torchs_loader_passes_them(kw: dict[str, Any]) -> None:
    # the adaptive probe measured every leaf's nbytes, and a sparse tensor raised RuntimeError
    want = list(tud.DataLoader(SparseSamples(), batch_size=None))
    with conveyor.DataLoader(SparseSamples(), batch_size=None, **kw) as loader:
        got = list(loader)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a["s"].layout == torch.sparse_coo
        assert torch.equal(a["s"].to_dense(), b["s"].to_dense()) and torch.equal(a["d"], b["d"])
