"""Datasets: torch's map-style and iterable bases and combinators, plus fast in-memory ones.

    Dataset / IterableDataset        bases (``+`` concatenates / chains)
    Subset, ConcatDataset, ChainDataset, StackDataset, random_split
    TensorDataset, ArrayDataset      rows of arrays; ArrayDataset.gather collates in one go
    CSVDataset                       a numeric CSV read once into arrays
    ImageFolder                      class-per-folder images (Pillow, JPEG draft decoding)
    StringArray                      strings in numpy buffers: no copy-on-read in forked workers
    MapDataset, BatchedDataset       Protocols for typing what a loader accepts

Nothing here imports torch or Pillow until it is used.
"""

from __future__ import annotations

from conveyor.datasets.arrays import ArrayDataset
from conveyor.datasets.base import (
    BatchedDataset,
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    MapDataset,
    StackDataset,
    Subset,
    TensorDataset,
    is_iterable_dataset,
    random_split,
)
from conveyor.datasets.csv import CSVDataset
from conveyor.datasets.image import IMG_EXTENSIONS, ImageFolder, find_classes, pil_loader
from conveyor.datasets.strings import StringArray

__all__ = [
    "IMG_EXTENSIONS",
    "ArrayDataset",
    "BatchedDataset",
    "CSVDataset",
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "ImageFolder",
    "IterableDataset",
    "MapDataset",
    "StackDataset",
    "StringArray",
    "Subset",
    "TensorDataset",
    "find_classes",
    "is_iterable_dataset",
    "pil_loader",
    "random_split",
]
