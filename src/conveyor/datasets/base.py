"""Dataset bases and combinators with the semantics of ``torch.utils.data``.

A map-style dataset answers ``dataset[i]`` (and optionally the batched
``dataset.__getitems__(indices)``); an iterable dataset answers ``iter(dataset)``.
The loader asks for a batch of indices at a time:

    indices ──> dataset.__getitems__(indices)      (when the dataset has it)
            └─> [dataset[i] for i in indices]      (otherwise)

``Subset`` and ``ConcatDataset`` re-map indices and forward to the datasets they
wrap; ``ChainDataset`` chains iterables; ``random_split`` draws the same
permutation as torch for the same generator, so splits agree with torch's.
Nothing here imports torch at module import time.
"""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from conveyor import _torch
from conveyor.transport import guard

if TYPE_CHECKING:
    import torch

__all__ = [
    "BatchedDataset",
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "MapDataset",
    "StackDataset",
    "Subset",
    "TensorDataset",
    "random_split",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class MapDataset(Protocol[T_co]):
    """What a loader needs from a map-style dataset: indexing and a length.

    >>> isinstance([1, 2, 3], MapDataset)
    True
    """

    def __getitem__(self, index: int, /) -> T_co: ...

    def __len__(self) -> int: ...


@runtime_checkable
class BatchedDataset(MapDataset[T_co], Protocol[T_co]):
    """A map-style dataset that also fetches a whole batch of indices at once.

    ``__getitems__`` returns one sample per index (a list, as torch expects).

    >>> class Squares:
    ...     def __len__(self) -> int: return 10
    ...     def __getitem__(self, i: int) -> int: return i * i
    ...     def __getitems__(self, indices: list[int]) -> list[int]: return [i * i for i in indices]
    >>> isinstance(Squares(), BatchedDataset)
    True
    """

    def __getitems__(self, indices: list[int], /) -> Any: ...


class Dataset(Generic[T_co]):
    """Base class for map-style datasets: subclasses implement ``__getitem__``.

    Subclasses usually add ``__len__``, and may add ``__getitems__`` to fetch a
    batch of indices in one call. ``a + b`` concatenates two datasets.

    >>> class Squares(Dataset[int]):
    ...     def __len__(self) -> int: return 4
    ...     def __getitem__(self, i: int) -> int: return i * i
    >>> (Squares() + Squares())[5]
    1
    """

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co], Iterable[T_co]):
    """Base class for stream datasets: subclasses implement ``__iter__``.

    With several workers each one iterates its own copy, so a subclass that
    must not repeat samples splits its stream by worker id. ``a + b`` chains.

    >>> class Count(IterableDataset[int]):
    ...     def __init__(self, n: int) -> None: self.n = n
    ...     def __iter__(self) -> Iterator[int]: return iter(range(self.n))
    >>> list(Count(2) + Count(3))
    [0, 1, 0, 1, 2]
    """

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")

    def __add__(self, other: Dataset[T_co]) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


def is_iterable_dataset(dataset: object) -> bool:
    """True for conveyor's and (when torch is loaded) torch's IterableDataset."""
    if isinstance(dataset, IterableDataset):
        return True
    torch = _torch.loaded()
    return torch is not None and isinstance(dataset, torch.utils.data.IterableDataset)


def _first_dim(array: Any) -> int:
    shape = getattr(array, "shape", None)
    if shape is None or len(shape) == 0:
        raise TypeError(f"expected an array or tensor with a first dimension, got {type(array).__name__}")
    return int(shape[0])


class TensorDataset(Dataset[tuple[Any, ...]]):
    """Rows of several tensors (or numpy arrays) sharing their first dimension.

    ``dataset[i]`` is ``tuple(t[i] for t in tensors)``, exactly like torch's.

    >>> ds = TensorDataset(np.arange(6).reshape(3, 2), np.array([0, 1, 0]))
    >>> ds[1]
    (array([2, 3]), np.int64(1))
    """

    def __init__(self, *tensors: Any) -> None:
        first = _first_dim(tensors[0])
        if any(_first_dim(t) != first for t in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    @property
    def tensors(self) -> tuple[Any, ...]:
        """The tensors (or arrays). In a spawned or forkserver worker, while the main process
        is still copying its numpy arrays into shared memory, this waits until they are whole
        (the dataset's own reads wait only for the rows they read)."""
        if guard.copying:
            guard.whole(self._tensors)
        return self._tensors

    @tensors.setter
    def tensors(self, tensors: tuple[Any, ...]) -> None:
        self._tensors = tensors

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        if guard.copying:
            guard.rows(self._tensors, (index,) if isinstance(index, (int, np.integer)) else None)
        return tuple(t[index] for t in self._tensors)

    def __len__(self) -> int:
        return _first_dim(self._tensors[0])

    def _conveyor_ship_(self) -> Any:
        """Sent to a spawned or forkserver worker: large numpy arrays move, once, into shared
        memory kept as this dataset's data (tensors go to shared memory through torch), read
        through this dataset's checks while they are being copied."""
        from conveyor.transport import share

        return share.ship_container(self, "_tensors", self._take_copies)

    def _conveyor_first_(self, indices: list[int]) -> None:
        """The loader is about to ask for these rows while the arrays are being copied: their
        bytes are copied first."""
        from conveyor.transport import move

        for t in self._tensors:
            move.want(t, indices)

    def _take_copies(self, copies: tuple[Any, ...]) -> None:
        """The shared copies are whole: this dataset's data from now on."""
        self._tensors = copies


class StackDataset(Dataset[Any]):
    """Zips datasets of equal length: positional ones give tuples, named ones dicts.

    >>> StackDataset(x=[1, 2], y=["a", "b"])[1]
    {'x': 2, 'y': 'b'}
    """

    datasets: tuple[Any, ...] | dict[str, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and kwargs:
            raise ValueError("StackDataset takes positional datasets (tuples) or named ones (dicts), not both")
        parts = list(args) if args else list(kwargs.values())
        if not parts:
            raise ValueError("At least one dataset should be passed")
        self._length = len(parts[0])
        if any(len(d) != self._length for d in parts):
            raise ValueError("Size mismatch between datasets")
        self.datasets = args if args else kwargs

    def __getitem__(self, index: Any) -> Any:
        if isinstance(self.datasets, dict):
            return {name: d[index] for name, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __getitems__(self, indices: list[int]) -> list[Any]:
        named = isinstance(self.datasets, dict)
        parts = self.datasets.values() if isinstance(self.datasets, dict) else self.datasets
        columns = [_fetch_many(d, indices) for d in parts]
        if named:
            keys = list(self.datasets)
            return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
        return [tuple(row) for row in zip(*columns, strict=True)]

    def __len__(self) -> int:
        return self._length


def _fetch_many(dataset: Any, indices: list[int]) -> list[Any]:
    getitems = getattr(dataset, "__getitems__", None)
    if callable(getitems):
        items = getitems(indices)
        if len(items) != len(indices):
            raise ValueError(f"Nested dataset's output size mismatch. Expected {len(indices)}, got {len(items)}")
        return list(items)
    return [dataset[i] for i in indices]


class ConcatDataset(Dataset[T_co]):
    """Several map-style datasets seen end to end as one.

    ``cumulative_sizes[k]`` is the total length of the first ``k + 1`` datasets.

    >>> ds = ConcatDataset([[0, 1, 2], [10, 11]])
    >>> ds.cumulative_sizes, ds[3], ds[-1]
    ([3, 5], 10, 11)
    """

    datasets: list[Any]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence: Iterable[Any]) -> list[int]:
        """Running totals of the lengths of ``sequence``'s items."""
        return list(itertools.accumulate(len(d) for d in sequence))

    def __init__(self, datasets: Iterable[Any]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        if any(is_iterable_dataset(d) for d in self.datasets):
            raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> T_co:
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        offset = self.cumulative_sizes[which - 1] if which > 0 else 0
        return self.datasets[which][idx - offset]


class ChainDataset(IterableDataset[Any]):
    """Iterable datasets streamed one after the other, lazily.

    >>> class Count(IterableDataset[int]):
    ...     def __init__(self, n: int) -> None: self.n = n
    ...     def __iter__(self) -> Iterator[int]: return iter(range(self.n))
    >>> list(ChainDataset([Count(1), Count(2)]))
    [0, 0, 1]
    """

    def __init__(self, datasets: Iterable[Any]) -> None:
        self.datasets = datasets

    @staticmethod
    def _check(dataset: object) -> None:
        if not is_iterable_dataset(dataset):
            raise AssertionError("ChainDataset only supports IterableDataset")

    def __iter__(self) -> Iterator[Any]:
        for d in self.datasets:
            self._check(d)
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            self._check(d)
            total += len(d)
        return total


class Subset(Dataset[T_co]):
    """The items of ``dataset`` at ``indices``, in that order.

    A subclass that overrides ``__getitem__`` must override ``__getitems__``
    too, since loaders fetch through ``__getitems__``.

    >>> Subset(["a", "b", "c", "d"], [3, 0])[0]
    'd'
    """

    dataset: Any
    indices: Sequence[int]

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        cls = type(self)
        if cls.__getitem__ is not Subset.__getitem__ and cls.__getitems__ is Subset.__getitems__:
            raise NotImplementedError(
                f"{cls.__name__} overrides __getitem__ but not __getitems__; loaders fetch "
                "through __getitems__, so define it as well, e.g.\n\n"
                "def __getitems__(self, indices):\n"
                "    return [self[i] for i in indices]"
            )

    def __getitem__(self, idx: Any) -> T_co:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def _conveyor_first_(self, indices: list[int]) -> None:
        """The loader is about to ask for these items while the data is being copied."""
        from conveyor.transport import move

        move.rows_first(self.dataset, [self.indices[i] for i in indices])

    def __getitems__(self, indices: list[int]) -> Any:
        mapped = [self.indices[i] for i in indices]
        getitems = getattr(self.dataset, "__getitems__", None)
        if callable(getitems):
            return getitems(mapped)
        return [self.dataset[i] for i in mapped]

    def __len__(self) -> int:
        return len(self.indices)


def _split_lengths(total: int, lengths: Sequence[int | float]) -> list[int]:
    """Turn fractions summing to 1 into counts (remainder spread round-robin)."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        counts: list[int] = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            counts.append(math.floor(total * frac))
        for i in range(total - sum(counts)):
            counts[i % len(counts)] += 1
        for i, n in enumerate(counts):
            if n == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.", stacklevel=3)
        return counts
    return [int(n) for n in lengths]


def random_split(
    dataset: Any,
    lengths: Sequence[int | float],
    generator: torch.Generator | np.random.Generator | None = None,
) -> list[Subset[Any]]:
    """Split ``dataset`` into disjoint random subsets of the given lengths.

    ``lengths`` are counts, or fractions summing to 1 (floored, with the
    remainder handed out one by one from the first split). With torch installed
    the permutation is ``torch.randperm`` on ``generator`` (the global one when
    None), so the split equals torch's for the same seed; a numpy Generator, or
    no torch, draws the permutation with numpy.

    >>> a, b = random_split(range(10), [0.3, 0.7], generator=np.random.default_rng(0))
    >>> len(a), len(b), sorted(list(a) + list(b)) == list(range(10))
    (3, 7, True)
    """
    counts = _split_lengths(len(dataset), lengths)
    total = sum(counts)
    if total != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    if isinstance(generator, np.random.Generator):
        order: list[int] = generator.permutation(total).tolist()
    else:
        torch = _torch.get()
        if torch is not None:
            order = torch.randperm(total, generator=generator).tolist()
        elif generator is None:
            order = np.random.default_rng().permutation(total).tolist()
        else:
            raise TypeError(f"generator must be a torch.Generator or numpy Generator, got {type(generator).__name__}")
    return [
        Subset(dataset, order[end - n : end])
        for end, n in zip(itertools.accumulate(counts), counts, strict=True)
    ]
