"""Sharding iterable datasets by rank and worker for distributed training.

::

    stream: a0 a1 a2 a3 a4 a5 a6 a7 ...
    rank 0 / worker 0 takes a0 a4 ...      stride = world_size * num_workers
    rank 1 / worker 0 takes a1 a5 ...      offset = rank + world_size * worker_id
    rank 0 / worker 1 takes a2 a6 ...
    rank 1 / worker 1 takes a3 a7 ...

Map-style datasets shard with :class:`conveyor.DistributedSampler`; streams
cannot be indexed, so each (rank, worker) pair reads the whole stream and
keeps every ``stride``-th item. A rank's share is every ``world_size``-th item
whatever its worker count (its workers split that share), so ranks may run
different worker counts ("auto" on machines of other sizes). Rank and world
size come from ``torch.distributed`` when it is initialised, else from the
``RANK`` and ``WORLD_SIZE`` environment variables (set by ``torchrun``), else,
in a loader's process worker, from its main process, else ``0`` and ``1``.
The worker comes from :func:`conveyor.get_worker_info` (or torch's).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .datasets import IterableDataset
from .executors import worker as _worker
from .executors.info import get_worker_info

__all__ = ["ShardedIterable", "gives_rank_shares", "group_world_size", "rank_and_world", "shard_iterable",
           "worker_and_count"]

T = TypeVar("T")


def rank_and_world() -> tuple[int, int]:
    """This process's ``(rank, world_size)``: torch.distributed, else RANK/WORLD_SIZE, else (0, 1).

    >>> rank, world = rank_and_world()
    """
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if not rank and not world and _worker.main_rank_world is not None:
        return _worker.main_rank_world  # a spawned worker: its main process's
    return (int(rank) if rank else 0), (int(world) if world else 1)


def group_world_size() -> int:
    """The world size of torch.distributed's process group when one is initialised, else 1
    (never imports torch).

    >>> group_world_size()
    1
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return int(dist.get_world_size())


def gives_rank_shares(order: Any) -> bool:
    """Does the sampler or batch sampler ``order`` give each rank its own share? conveyor's and
    torch's ``DistributedSampler`` (and subclasses: Lightning's wrapper) do, and so does any
    sampler that says how many replicas it splits the data for (``num_replicas``, or
    ``num_processes`` as accelerate's batch sampler names it), or a batch sampler over one.

    >>> from conveyor import DistributedSampler, SequentialSampler
    >>> gives_rank_shares(DistributedSampler(range(4), num_replicas=2, rank=0))
    True
    >>> gives_rank_shares(SequentialSampler(range(4)))
    False
    """
    from .samplers import DistributedSampler

    for obj in (order, getattr(order, "sampler", None)):
        if obj is None:
            continue
        if isinstance(obj, DistributedSampler):
            return True
        theirs = sys.modules.get("torch.utils.data.distributed")
        if theirs is not None and isinstance(obj, theirs.DistributedSampler):
            return True
        if any(isinstance(getattr(obj, name, None), int) for name in ("num_replicas", "num_processes")):
            return True
    return False


def worker_and_count() -> tuple[int, int]:
    """The current loader worker's ``(id, num_workers)``; ``(0, 1)`` outside workers.

    >>> worker_and_count()
    (0, 1)
    """
    info: Any = get_worker_info()
    if info is None:
        torch = sys.modules.get("torch")
        if torch is not None:
            info = torch.utils.data.get_worker_info()
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)


def _check(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size should be a positive integer, but got world_size={world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank should be in [0, {world_size - 1}], but got rank={rank}")


def shard_iterable(iterable: Iterable[T], *, rank: int | None = None, world_size: int | None = None) -> Iterator[T]:
    """The items of ``iterable`` that belong to this rank and this loader worker.

    Call it inside ``IterableDataset.__iter__``, where the worker is known.

    >>> list(shard_iterable(range(10), rank=1, world_size=3))
    [1, 4, 7]
    """
    own_rank, own_world = rank_and_world()
    rank = own_rank if rank is None else rank
    world_size = own_world if world_size is None else world_size
    _check(rank, world_size)
    worker, workers = worker_and_count()
    # a rank's share does not depend on its worker count: ranks may run different counts
    return itertools.islice(iter(iterable), rank + world_size * worker, None, world_size * workers)


class ShardedIterable(IterableDataset[T]):
    """An iterable dataset split by rank and worker: every pair sees a disjoint share.

    ``source`` is an iterable (iterated afresh each epoch) or a function
    returning one. Rank and world size, unless given, are read each time
    iteration starts, as the worker is: a wrapper built before
    ``init_process_group`` (a common order under ``mp.spawn``) would give every
    rank the whole stream if they were read as it is built.

    >>> list(ShardedIterable(range(7), rank=0, world_size=2))
    [0, 2, 4, 6]
    """

    def __init__(
        self,
        source: Iterable[T] | Callable[[], Iterable[T]],
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if isinstance(source, Iterator) and type(source).__module__ in ("builtins", "itertools"):
            # a generator, or a built-in iterator (map, zip, iter(list)): one pass, then nothing
            raise TypeError("ShardedIterable needs a source it can iterate afresh each epoch (a list, a "
                            "range, a dataset), or a function returning one: a generator or iterator is "
                            "used up by the first epoch, and shared by the workers")
        self.source = source
        self._rank = None if rank is None else int(rank)
        self._world_size = None if world_size is None else int(world_size)
        _check(self.rank, self.world_size)

    @property
    def rank(self) -> int:
        """The rank whose share this is: the one given, else this process's now."""
        return rank_and_world()[0] if self._rank is None else self._rank

    @property
    def world_size(self) -> int:
        """The world size: the one given, else this process's now."""
        return rank_and_world()[1] if self._world_size is None else self._world_size

    def __iter__(self) -> Iterator[T]:
        items = self.source() if callable(self.source) and not hasattr(self.source, "__iter__") else self.source
        return shard_iterable(items, rank=self._rank, world_size=self._world_size)  # type: ignore[arg-type]
