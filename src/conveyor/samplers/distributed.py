"""``DistributedSampler``: this rank's share of the dataset's indices, padded or cut so that
every rank gets as many (torch's semantics), or a partition with no duplicates (``even=False``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from conveyor import _torch

from .base import Sampler, is_int, np_rng

__all__ = ["DistributedSampler"]


def _world() -> tuple[int | None, int | None]:
    """(world size, rank) from torch.distributed if initialized, else from the environment."""
    torch = _torch.loaded()  # initializing torch.distributed means torch is imported
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
    size, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    return (int(size) if size else None), (int(rank) if rank else None)


class DistributedSampler(Sampler[int]):
    """Yields this rank's share of the dataset indices for distributed training.

    With ``even=True`` (torch's semantics) every rank gets ``ceil(n / world)``
    indices, padding by repeating indices (or dropping the tail with
    ``drop_last``), shuffled by ``seed + epoch`` exactly as
    ``torch.utils.data.DistributedSampler``. With ``even=False`` (for
    evaluation) rank ``r`` gets positions ``r, r + world, ...``: the ranks
    partition the dataset with no duplicates (``drop_last`` still drops the
    tail). Without torch the shuffle is numpy's, from ``(seed, epoch)``.

    Example:
        >>> list(DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False))
        [1, 3, 0]
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        even: bool = True,
    ) -> None:
        if num_replicas is None or rank is None:
            world, own = _world()
            num_replicas = world if num_replicas is None else num_replicas
            rank = own if rank is None else rank
        if num_replicas is None or rank is None:
            raise ValueError(
                "cannot tell num_replicas/rank: torch.distributed is not initialized and "
                "WORLD_SIZE/RANK are not set; pass num_replicas= and rank="
            )
        if not is_int(num_replicas) or num_replicas <= 0:
            raise ValueError(f"num_replicas should be a positive integer, but got num_replicas={num_replicas}")
        if not is_int(rank) or rank < 0 or rank >= num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.even = even
        self.epoch = 0
        n = len(dataset)
        if drop_last and n % self.num_replicas:
            self.num_samples = math.ceil((n - self.num_replicas) / self.num_replicas)
        elif even or drop_last:
            self.num_samples = math.ceil(n / self.num_replicas)
        else:
            self.num_samples = len(range(self.rank, n, self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas if (even or drop_last) else n

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; with ``shuffle`` each epoch has its own order.

        Example:
            >>> DistributedSampler(range(8), num_replicas=2, rank=0).set_epoch(1)
        """
        self.epoch = epoch

    def _order(self, n: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(n)
        torch = _torch.get()
        if torch is None:
            return np_rng(self.seed, self.epoch).permutation(n)
        gen = torch.Generator()
        gen.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=gen).numpy()

    def __iter__(self) -> Iterator[int]:
        order = self._order(len(self.dataset))
        if self.drop_last:
            order = order[: self.total_size]
        elif self.even:
            order = np.resize(order, self.total_size)  # cyclic repeat: torch's padding
        return iter(order[self.rank : self.total_size : self.num_replicas].tolist())

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "n": len(self.dataset),
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "even": self.even,
            "seed": self.seed,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check(
            state,
            n=len(self.dataset),
            num_replicas=self.num_replicas,
            rank=self.rank,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            even=self.even,
        )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
