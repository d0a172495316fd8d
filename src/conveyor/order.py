"""The order of an epoch: the sampler's batches of indices, as the loader reads them.

``Repeat`` stands in for an iterable dataset's sampler; ``ReadAhead`` reads a sampler as
far ahead as torch's loader with workers does; ``Slices`` cuts a seeded order into batches
without a Python int per index (datasets with ``gather``); the rest say how a batch
sampler's indices travel in a task, and whether a sampler may be read further ahead.
"""

from __future__ import annotations

import array
import collections
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _torch, replay
from .samplers import BatchSampler

if TYPE_CHECKING:
    from .loader import DataLoader

__all__ = ["Repeat", "ReadAhead", "Slices", "torch_split", "bulk_batches", "digested", "is_stateless",
           "reads_ahead_freely", "sized", "fresh_batches", "own_indices", "task_indices"]


class Repeat:
    """The index sampler of an iterable dataset: 'the next batch', forever."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


class ReadAhead:
    """A sampler's batches read ``len(head)`` ahead of the batches made, as torch's loader
    with workers reads them: it takes ``prefetch_factor * num_workers`` at iter() and one
    more for each batch it hands out. Batches made in the main process (adaptive, with the
    user's workers kept back) read the sampler only as far as the batch being made, so an
    epoch that ended without the StopIteration (``zip(range(len(loader)), loader)``, a
    trainer counting ``len(loader)`` batches, a break in its last few) never ran the sampler
    out: torch's RandomSampler draws one more permutation from the generator then, and every
    later epoch's order differed from torch's. While the pool's workers make the batches
    they read ahead as they are sent batches (``Run._fill``), and ``top_up`` reads the rest
    of torch's count when a batch is handed out: a worker still holding its share (its results
    not yet read from the pipe) is sent nothing then, and how far the sampler had been read
    when an epoch was left depended on the workers' timing."""

    __slots__ = ("buf", "src", "made_here", "done", "drawn")

    def __init__(self, head: list[Any], src: Iterator[Any], made_here: Callable[[], bool]) -> None:
        self.buf = collections.deque(head)
        self.src = src
        self.made_here = made_here  # are the batches made in the main process now?
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

    def __iter__(self) -> ReadAhead:
        return self

    def __next__(self) -> Any:
        buf = self.buf
        if not self.done and self.made_here():
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


class Slices:
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
    def of(cls, loader: DataLoader[Any], skip: int) -> Slices | None:
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

    def __iter__(self) -> Slices:
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


def torch_split() -> Callable[[Any, int], Any]:
    """``torch.split`` without the Python wrapper around it (a third of its cost on small tensors)."""
    torch = _torch.get()
    assert torch is not None
    return getattr(getattr(torch, "_VF", None), "split", None) or torch.split


def bulk_batches(dataset: Any, size: int, budget: int = 8 << 20) -> int:
    """How many batches to gather at once: up to 64, within ``budget`` bytes."""
    row = sum(a[:1].nbytes if hasattr(a, "nbytes") else a[:1].element_size() * a[:1].numel()
              for a in getattr(dataset, "arrays", ()))
    return max(1, min(64, budget // max(1, row * size)))


def digested(batches: Iterator[Any], digests: array.array, d: int, learn: tuple[Any, Any] | None) -> Iterator[Any]:
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


def is_stateless(sampler: Any) -> bool:
    inner = getattr(sampler, "sampler", sampler)
    return type(inner).__name__ == "SequentialSampler"


def reads_ahead_freely(loader: DataLoader[Any]) -> bool:
    """May the sampler be read further ahead than torch's loader reads it (grouped tasks)?

    Only where its draws do not depend on how far it was read: a sequential order, or the
    loader's own sampler under ``seed=`` (a function of seed and epoch). A shuffle drawn from
    a generator or torch's global RNG draws its next permutation when it runs out, so an epoch
    left a few batches before its end would move later epochs' orders away from torch's
    (docs/determinism.md)."""
    if loader._own_sampler and loader.seed is not None:
        return True
    return is_stateless(loader._index_sampler)


def sized(obj: Any) -> int | None:
    """``len(obj)``, or None for an object without a length."""
    try:
        return int(len(obj))
    except (TypeError, NotImplementedError):
        return None


def fresh_batches(sampler: Any) -> bool:
    """Does this batch sampler yield a new object for every batch (conveyor's and torch's own)?"""
    kind = type(sampler)
    return kind is BatchSampler or (kind.__name__ == "BatchSampler"
                                    and kind.__module__ == "torch.utils.data.sampler")


def own_indices(indices: Any) -> Any:
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


def task_indices(indices: Any) -> Any:
    """A batch sampler's indices as a task carries them: a list, tuple, range, numpy array or
    tensor as it is (a dataset's ``__getitems__`` gets it so in a worker, as under torch),
    anything else (a generator) as a list."""
    if type(indices) in (list, tuple, range) or isinstance(indices, np.ndarray) or _torch.is_tensor(indices):
        return indices
    return list(indices)

