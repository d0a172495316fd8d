"""Run by ``torchrun --nproc_per_node 2`` from test_distributed.py: one rank's view.

Each rank writes ``<out>/rank<r>.json`` with, for ``even`` False and True, the
indices it loaded in epochs 0 and 1 (after ``set_epoch``), the indices of
epoch 1 after resuming from a JSON state saved at batch 2 in a new loader,
and the items a :class:`conveyor.distributed.ShardedIterable` gave it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from conveyor import DataLoader, DistributedSampler
from conveyor.distributed import ShardedIterable, rank_and_world

N = 23
BATCH = 3


class Index(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


def loader(even: bool, workers: int) -> DataLoader[Any]:
    sampler = DistributedSampler(Index(), shuffle=True, seed=3, even=even)
    return DataLoader(Index(), batch_size=BATCH, sampler=sampler, num_workers=workers, worker_type="thread")


def flat(batches: Any) -> list[int]:
    return [i for b in batches for i in b.tolist()]


def rank_warnings() -> dict[str, int]:
    """How many "every rank will see the whole dataset" warnings each loader gave over two epochs."""
    import warnings

    from conveyor import BatchSampler

    torch_sampler = torch.utils.data.DistributedSampler(Index(), shuffle=True, seed=3)
    loaders = {
        "shuffle": lambda: DataLoader(Index(), batch_size=BATCH, shuffle=True),
        "sequential": lambda: DataLoader(Index(), batch_size=BATCH),
        "conveyor_sampler": lambda: DataLoader(Index(), batch_size=BATCH, sampler=DistributedSampler(Index())),
        "torch_sampler": lambda: DataLoader(Index(), batch_size=BATCH, sampler=torch_sampler),
        "torch_batch_sampler": lambda: DataLoader(
            Index(), batch_sampler=torch.utils.data.BatchSampler(torch_sampler, BATCH, False)),
        "conveyor_batch_sampler": lambda: DataLoader(
            Index(), batch_sampler=BatchSampler(DistributedSampler(Index()), BATCH, False)),
        "sharded_stream": lambda: DataLoader(ShardedIterable(range(40)), batch_size=4),
    }
    counts = {}
    for name, make in loaders.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make()
            for _ in range(2):
                flat(loader)
        counts[name] = sum("every rank will see the whole dataset" in str(w.message)
                           and "conveyor.DistributedSampler" in str(w.message) for w in caught)
    return counts


def datapipe_epochs(rank: int) -> list[list[int]]:
    """Two epochs of a shuffled DataPipe without seed=, each rank's global RNG seeded apart:
    the ranks must still shuffle alike before taking their shards."""
    import warnings

    from torch.utils.data.datapipes.iter import IterableWrapper

    torch.manual_seed(100 + rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = IterableWrapper(range(40)).shuffle().sharding_filter()
        loader = DataLoader(pipe, batch_size=4, shuffle=True, num_workers=2)
        return [flat(loader) for _ in range(2)]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = rank_and_world()
    assert (rank, world) == (dist.get_rank(), dist.get_world_size())
    report: dict[str, Any] = {"rank": rank, "world": world}
    for even in (False, True):
        first = loader(even, 0)
        epochs = []
        for epoch in range(2):
            first.sampler.set_epoch(epoch)
            epochs.append(flat(first))
        # resume epoch 1 at batch 2, in a new loader with another worker count
        cut = loader(even, 2)
        cut.sampler.set_epoch(1)
        it = iter(cut)
        head = flat([next(it), next(it)])
        state = json.loads(json.dumps(cut.state_dict()))
        cut.close()
        resumed = loader(even, 0)
        resumed.load_state_dict(state)
        report[f"even={even}"] = {"epochs": epochs, "head": head, "rest": flat(resumed)}
    stream = DataLoader(ShardedIterable(range(40)), batch_size=4, num_workers=2, worker_type="thread")
    report["stream"] = flat(stream)
    report["warned"] = rank_warnings()
    report["datapipe"] = datapipe_epochs(rank)
    dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
