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
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _torch, replay
from .samplers import BatchSampler

if TYPE_CHECKING:
    from .loader import DataLoader

__all__ = ["EpochOrder", "StreamReplicas", "Repeat", "ReadAhead", "Slices", "digested", "is_stateless",
           "reads_ahead_freely", "sized", "fresh_batches", "own_indices", "task_indices"]


class Repeat:
    """The index sampler of an iterable dataset: 'the next batch', forever."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


class ReadAhead:
    """A sampler's batches read ``len(head)`` ahead of the batches made, as torch's loader
    with workers reads them: it takes ``prefetch_factor * num_workers`` at iter() and one
    more for each batch it hands out. Without it, batches made in the main process (adaptive,
    with the user's workers kept back) would read the sampler only as far as the batch being
    made, so an epoch that ends without the StopIteration (``zip(range(len(loader)), loader)``,
    a trainer counting ``len(loader)`` batches, a break in its last few) would never run the
    sampler out: torch's RandomSampler draws one more permutation from the generator then, and
    every later epoch's order would differ from torch's. While the pool's workers make the
    batches they read ahead as they are sent batches (``Run._fill``), and ``top_up`` reads the
    rest of torch's count when a batch is handed out: a worker still holding its share (its
    results not yet read from the pipe) is sent nothing then, and how far the sampler is read
    when an epoch is left would otherwise depend on the workers' timing
    (docs/decisions/sampler-read-ahead-as-torch.md)."""

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


def digested(batches: Iterator[Any], digests: array.array, d: int, learn: tuple[Any, Any] | None) -> Iterator[Any]:
    """``batches``, each extending the digest in ``digests``; with ``learn`` (the loader, weakly,
    and the RNG mark), the global RNGs the sampler's first draw moved: later epochs' marks take
    those alone (and torch's, cheap to copy); see replay.Mark.

    A function, not a method of the run: the run holds this generator, and a generator of its
    own would hold the run, a cycle that keeps an epoch broken off early (a torch sampler, a
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

    Only where its draws do not depend on how far it was read: a sequential order, the
    loader's own sampler under ``seed=`` (a function of seed and epoch), or its own shuffle
    without a generator: that draws one seed from the global RNG at its first read, as
    torch's RandomSampler does, and everything after from a generator of its own. A shuffle
    drawn from the user's generator draws its next permutation from it when it runs out, so
    an epoch left a few batches before its end would move later epochs' orders away from
    torch's (docs/determinism.md, docs/decisions/worker-path-profile.md)."""
    if loader._own_sampler and loader.generator is None:
        # (a seed the loader takes from a generator is no seed mode: its shuffle draws from
        # the generator, and grouped tasks would read it to its end early: the next epoch's order
        # and the workers' seeds would differ from torch's after an epoch left a few batches early)
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


class EpochOrder:
    """An epoch's batches of indices, read as the loader reads them, and its position: the
    batch numbers handed out (or skipped whole), all below ``prefix`` and the few in ``ahead``
    beyond it (batches handed out of order, or left out of a resumed epoch because an
    out-of-order run had handed them out). A sampler without ``state_dict`` is read under
    noted RNG states, each batch extending a digest (``replay``), so that a resumed epoch can
    draw its batches again and check them."""

    def __init__(self, loader: DataLoader[Any], skip: int, done: Iterable[int], replayed: dict[str, Any] | None,
                 *, gather: bool, first_seq: int, made_here: Callable[[], bool]) -> None:
        self.loader = loader
        iterable = loader._iterable
        self.first_seq = first_seq
        self.ahead: set[int] = set() if iterable else {p for p in done if p > skip}
        self.prefix = skip
        self.positions: list[int] | None = None  # position of each batch of this run, when some are left out
        self.prefix_base = skip  # position of this run's first batch (map-style, none left out)
        self.slices = Slices.of(loader, skip) if gather and not self.ahead else None
        self.rngs: replay.Mark | dict[str, Any] | None = None  # a sampler without state_dict: _replayed_batches
        # torch's iterator with workers takes its first prefetch_factor * num_workers batches of
        # indices when it is made (drawing the order then, and from a shared generator before
        # the next iterator's seed); without workers it waits for the first next(). Seed-mode
        # samplers take their epoch when iterated, so a second live iterator cannot change it.
        primed = 0
        if not iterable and loader.num_workers > 0:
            primed = loader.num_workers * (loader.prefetch_factor or 2)
        self.primed = primed
        if self.slices is not None:
            self.batches: Iterator[Any] = self.slices
            self.slices.begin(primed > 0)
        else:
            from . import position  # (it reads this module's helpers)

            start = 0  # position of the sampler's next batch
            if position.replays(loader):
                self.batches, start = self._replayed_batches(skip, replayed)
            else:
                self.batches = iter(loader._index_sampler)  # a stream's: placeholders, never skipped
            if not iterable and loader._auto_collation and not fresh_batches(loader._index_sampler):
                # a batch sampler may yield one list refilled in place: each batch is copied as it
                # is drawn, or batches read ahead (and tasks not yet sent) change under the loader
                self.batches = map(own_indices, self.batches)
            if self.ahead:
                self.positions = []
                # a copy: ``ahead`` loses each position as the prefix passes it, and the
                # sampler is read lazily (without workers, up to the batch being made)
                self.batches = self._leave_out(self.batches, skip, frozenset(self.ahead), self.positions, start)
            elif skip > start and not iterable:
                self.batches = itertools.islice(self.batches, skip - start, None)
            if primed:
                head = list(itertools.islice(self.batches, primed))
                self.batches = ReadAhead(head, self.batches, made_here)
        self.sampler_done = False
        # has the sampler's iteration begun? With workers it begins here (``primed``); without,
        # at the first batch, as torch's does, or when a state is asked for first (``begin``)
        self.begun = primed > 0 or iterable or self.slices is not None or skip > 0 or bool(self.ahead)

    def begin(self) -> None:
        """Begin the sampler's iteration now (see ``Run.begin``)."""
        if self.begun:
            return
        self.begun = True
        head = list(itertools.islice(self.batches, 1))
        self.batches = itertools.chain(head, self.batches)

    def _replayed_batches(self, skip: int, replayed: dict[str, Any] | None) -> tuple[Iterator[Any], int]:
        """The batches of a sampler without state_dict (``position.replays``), and the
        position of the first: the RNG states its iteration begins with are noted, and each
        batch drawn extends a digest (``replay``). A resumed epoch (``replayed``) draws its
        first ``skip`` batches and one more under the saved RNG states, checks them, and
        goes on from position ``skip``."""
        sampler = self.loader._index_sampler
        self.digests = array.array("I")  # the digest after each position from ``digest_base`` on
        if replayed is None:
            self.rngs = replay.Mark(sampler, self.loader._rng_use or replay.GLOBALS)
            self.digest_base, self.digest_at_base = 0, 0
            return self._digesting(iter(sampler)), 0
        self.rngs = replayed["rngs"]
        got = n = 0
        with replay.Replaying(self.rngs, sampler):
            raw = iter(sampler)
            for b in itertools.islice(raw, skip):
                got = replay.digest(got, b)
                n += 1
            # the first batch after them is drawn here too: a sampler may draw its order from
            # a global RNG at its first batch (torch's RandomSampler does)
            head = list(itertools.islice(raw, 1))
        problem = replay.check(sampler, replayed.get("digest"), got, n, skip)
        if problem:
            warnings.warn(problem, UserWarning, stacklevel=5)
        self.digest_base, self.digest_at_base = n, got
        return self._digesting(itertools.chain(head, raw)), n


    def run_out(self) -> None:
        """A new epoch begins and this one has handed out every batch without reaching the
        end of its sampler (a trainer that counts len(loader) batches never asks for the
        StopIteration): take the sampler to its end now. torch's RandomSampler (and the
        loader's own in torch mode) draws one more permutation when its iterator runs out,
        and a resumed epoch, which looks ahead from where it starts, may run it out where
        the saved one did not: ending every such epoch alike keeps the next epochs' draws
        the same in both (as torch's loader with workers, which looks ahead too, does)."""
        from . import position

        if self.sampler_done or self.loader._device_stage is not None or not position.handed_all(self.loader, self.prefix):
            return
        try:
            extra = next(self.batches)
        except StopIteration:
            self.sampler_done = True
            return
        self.batches = itertools.chain([extra], self.batches)  # its length was wrong: keep it


    def _digesting(self, batches: Iterator[Any]) -> Iterator[Any]:
        learn = isinstance(self.rngs, replay.Mark) and self.loader._rng_use is None
        return digested(batches, self.digests, self.digest_at_base,
                         (weakref.ref(self.loader), self.rngs) if learn else None)


    def replayed_where(self) -> dict[str, Any]:
        """How a resumed epoch replays this run's sampler up to the position handed out (the
        RNG states are written as JSON when a state is asked for: position.position)."""
        k = self.prefix - self.digest_base
        d = self.digest_at_base if k <= 0 else self.digests[k - 1]
        return {"rngs": self.rngs, "batches": self.prefix, "digest": d}


    @staticmethod
    def _leave_out(batches: Iterator[Any], skip: int, done: frozenset[int], positions: list[int],
                   start: int = 0) -> Iterator[Any]:
        """The batches from ``skip`` on but those at ``done``, noting each one's position
        (the first of ``batches`` is at ``start``)."""
        for p, b in enumerate(batches, start):
            if p >= skip and p not in done:
                positions.append(p)
                yield b


    def handed(self, seq: int) -> None:
        """The batch of ``seq`` reached the user, or was skipped whole: advance the position."""
        k = seq - self.first_seq
        pos = self.positions[k] if self.positions is not None else self.prefix_base + k
        if pos != self.prefix:
            self.ahead.add(pos)
            return
        self.prefix += 1
        ahead = self.ahead
        while self.prefix in ahead:
            ahead.discard(self.prefix)
            self.prefix += 1


class StreamReplicas:
    """A stream's position: the batches each replica (a worker's copy of the stream) handed
    out. A stream cannot seek: a resumed epoch makes those batches again and drops them,
    exact where each replica's stream is deterministic (replicas are handed out in order,
    whatever ``in_order``). Saved from another worker count, the stream shards otherwise:
    the batches to drop are counted from any replica."""

    __slots__ = ("done", "drop_counts", "drop_any", "dropping")

    def __init__(self, workers: int, skip: int, saved: Iterable[int] | None) -> None:
        self.done = [0] * max(1, workers)
        self.drop_counts: list[int] = []  # batches to drop, per replica
        self.drop_any = 0  # or from any replica
        if skip:
            counts = list(saved or ())
            if len(counts) == len(self.done):
                self.drop_counts = counts
            else:
                self.drop_any = skip
        self.dropping = self.drop_any + sum(self.drop_counts)  # batches still to drop

    def drop(self, w: int) -> bool:
        """Drop the batch replica ``w`` just made if the user had received it before the
        resume (it counts as handed out); False when it is to be handed out."""
        if self.drop_counts:
            if not self.drop_counts[w]:
                return False
            self.drop_counts[w] -= 1
        else:
            self.drop_any -= 1
        self.done[w] += 1
        self.dropping -= 1
        return True
