"""conveyor: a fast, self-tuning, crash-safe drop-in for ``torch.utils.data.DataLoader``.

>>> from conveyor import DataLoader
>>> [b.tolist() for b in DataLoader(list(range(6)), batch_size=3, output="numpy")]
[[0, 1, 2], [3, 4, 5]]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .collate import default_collate, default_convert, numpy_collate
from .datasets import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    CSVDataset,
    Dataset,
    ImageFolder,
    IterableDataset,
    StackDataset,
    StringArray,
    Subset,
    TensorDataset,
    random_split,
)
from .device import DevicePrefetcher
from .distributed import ShardedIterable, shard_iterable
from .errors import SlowSettingWarning, StartupError, TooManyFailures, WorkerDied, WorkerError
from .executors.info import WorkerInfo, get_worker_info
from .samplers import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

if TYPE_CHECKING:
    from .loader import DataLoader

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # DataLoader subclasses torch's when torch is installed; it is made (and torch imported)
    # at its first use, so that ``import conveyor`` stays as light as numpy (loader.py)
    if name == "DataLoader":
        from .loader import DataLoader

        return DataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = sorted([
    "ArrayDataset",
    "BatchSampler",
    "CSVDataset",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DevicePrefetcher",
    "DistributedSampler",
    "ImageFolder",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardedIterable",
    "SlowSettingWarning",
    "StackDataset",
    "StringArray",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "StartupError",
    "TooManyFailures",
    "WeightedRandomSampler",
    "WorkerDied",
    "WorkerError",
    "WorkerInfo",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "numpy_collate",
    "random_split",
    "shard_iterable",
])
