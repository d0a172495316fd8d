"""Datasets for test_shared_containers, importable by name in spawned and forkserver workers.

Each sample says, beside its data, which process made it and which file the memory it read
is mapped from ((device, inode), None for the private heap), so a test can tell a buffer
the worker maps from shared memory (or a file) from one it unpickled.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from conveyor.datasets import ArrayDataset, CSVDataset, StringArray, TensorDataset
from conveyor.transport import share

ROWS = 1024  # rows of 1 KiB: 1 MiB an array, the least that goes by shared memory


def where(a: np.ndarray) -> tuple[int, int] | None:
    """(device, inode) of the file ``a``'s memory is mapped from in this process, if any."""
    found = share._mapped_inode(int(a.__array_interface__["data"][0]))
    return found if found is not None and found[1] != 0 else None


def buffers_of(c: Any) -> list[np.ndarray]:
    """The numpy buffers a container holds."""
    if isinstance(c, StringArray):
        return [c.data]
    if isinstance(c, TensorDataset):
        return [t for t in c.tensors if isinstance(t, np.ndarray)]
    if isinstance(c, ArrayDataset):
        return [a for a in c.arrays if isinstance(a, np.ndarray)]
    return [c.big]


class Plain:
    """A user's own dataset holding a large numpy array (no conveyor container)."""

    def __init__(self, big: np.ndarray) -> None:
        self.big = big

    def __len__(self) -> int:
        return len(self.big)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.big[i]


class Zoo:
    """Every container at once: sample i is each one's item i, with the worker's pid and
    where each container's buffer is mapped from in that process."""

    def __init__(self, **containers: Any) -> None:
        self.containers = containers

    def __len__(self) -> int:
        return min(len(c) for c in self.containers.values())

    def __getitem__(self, i: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, c in self.containers.items():
            item = c[i]
            if isinstance(item, tuple):
                item = item[0]
            out[name] = item if isinstance(item, str) else np.asarray(item).copy()
            out[f"{name}_at"] = str(where(buffers_of(c)[0]))
        out["pid"] = os.getpid()
        return out


def make_csv(path: str) -> str:
    """A numeric CSV of ROWS * 32 rows and 9 columns: 1.1 MiB of float32 features."""
    n = ROWS * 32
    table = np.column_stack([np.arange(n * 8, dtype=np.float32).reshape(n, 8) % 1000, np.arange(n) % 3])
    np.savetxt(path, table, fmt="%d", delimiter=",")
    return path


def zoo(tmp: str) -> Zoo:
    rows = np.arange(ROWS * 1024, dtype=np.uint8).reshape(ROWS, 1024)
    mapped_path = os.path.join(tmp, "mapped.npy")
    np.save(mapped_path, rows + 1)
    strings = StringArray([f"{i:07d}/" + "x" * 1017 for i in range(ROWS)])  # 1 KiB a string
    return Zoo(
        array=ArrayDataset(rows.copy(), np.arange(ROWS)),
        mapped=ArrayDataset(np.load(mapped_path, mmap_mode="r")),
        strings=strings,
        csv=CSVDataset(make_csv(os.path.join(tmp, "table.csv"))),
        tensors=TensorDataset(rows.copy() + 2),
        plain=Plain(rows.copy() + 3),
    )


class Raises:
    """Rows of a 1 MiB ArrayDataset; index ``bad`` raises."""

    def __init__(self, bad: int) -> None:
        self.rows = ArrayDataset(np.zeros((ROWS, 1024), dtype=np.uint8))
        self.bad = bad

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> Any:
        if i == self.bad:
            raise KeyError(i)
        return self.rows[i][0]


def private_dirty(a: np.ndarray) -> int:
    """Bytes of the mappings holding ``a`` that this process has written privately (copied on
    write from its parent's pages, or its own): /proc/self/smaps' Private_Dirty, summed over
    every mapping ``a`` spans (numpy's huge-page advice splits a large allocation in several)."""
    lo_a = int(a.__array_interface__["data"][0])
    hi_a = lo_a + a.nbytes
    inside = False
    total = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < hi_a and hi > lo_a
            elif inside and head == "Private_Dirty:":
                total += int(line.split()[1]) * 1024
    return total


class ForkRows:
    """64 MiB of rows in an ArrayDataset (its own mapping: past malloc's largest heap
    allocation); sample i reads row i and says how much of the rows' mapping this process
    holds privately by then."""

    def __init__(self) -> None:
        self.rows = ArrayDataset(np.ones((ROWS * 64, 1024), dtype=np.uint8))

    def __len__(self) -> int:
        return ROWS * 64

    def __getitem__(self, i: int) -> tuple[int, int]:
        # (smaps is read at the end of each batch of 4096 only: a read costs milliseconds)
        dirty = private_dirty(self.rows.arrays[0]) if i % 4096 == 4095 else 0
        return int(self.rows[i][0].sum()), dirty


class ImportsTorch(ArrayDataset):
    """An ArrayDataset whose own gather imports torch (in a worker that started without it)
    and adds, for each row, what torch then says: its seed, its thread count, and the
    worker's seed."""

    def gather(self, indices: Any, output: Any = "auto") -> list[Any]:
        columns = super().gather(indices, output=output)
        import torch

        import conveyor

        info = conveyor.get_worker_info()
        said = np.array([[torch.initial_seed(), torch.get_num_threads(), info.seed if info else -1]] * len(indices),
                        dtype=np.int64)
        return columns + [torch.from_numpy(said) if output == "torch" else said]
