"""ArrayDataset: rows of in-memory arrays, fetched a whole batch at a time.

    indices ──> gather: one take / index_select per array ──> [batch_0, batch_1, ...]
                (what default_collate makes of the rows, without the per-row work)
    index   ──> dataset[i] = (a_0[i], a_1[i], ...)

The loader uses ``gather`` when the dataset says ``gatherable = True`` (a protocol:
``gather(indices, output=)`` returns what ``default_collate`` would make of the rows)
and the collate function is the default one; any other collate gets
``__getitems__``'s list of samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from conveyor import _torch
from conveyor.datasets.base import Dataset
from conveyor.transport import guard, move, share

__all__ = ["ArrayDataset"]

Output = Literal["auto", "torch", "numpy"]


class ArrayDataset(Dataset[tuple[Any, ...]]):
    """Samples are tuples of rows of numpy arrays or torch tensors.

    All arrays must share their first dimension. ``dataset[i]`` is
    ``(a[i] for a in arrays)`` as a tuple, like ``TensorDataset``;
    ``gather(indices)`` builds the collated batch with one gather per array.
    Spawned and forkserver workers map the arrays from shared memory (the
    first such start moves them there) or from the file an ``np.memmap`` /
    ``np.load(mmap_mode=...)`` array reads: no copy per worker.

    >>> ds = ArrayDataset(np.arange(8.0).reshape(4, 2), np.array([0, 1, 1, 0]))
    >>> ds.gather([3, 1], output="numpy")
    [array([[6., 7.],
           [2., 3.]]), array([0, 1])]
    """

    collated_getitems = False
    """``__getitems__`` returns a list of samples, not an already collated batch."""

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        converted = tuple(a if _torch.is_tensor(a) or isinstance(a, np.ndarray) else np.asarray(a) for a in arrays)
        for k, a in enumerate(converted):
            if len(a.shape) == 0:
                raise ValueError(f"ArrayDataset array {k} is 0-dimensional; every array needs a first (sample) dimension")
        lengths = [int(a.shape[0]) for a in converted]
        if len(set(lengths)) != 1:
            raise ValueError(f"ArrayDataset arrays must have the same first dimension, got lengths {lengths}")
        self.arrays = converted
        self._length = lengths[0]
        # the loader gathers whole batches only when every column becomes a tensor as it is;
        # strings, bytes or objects go row by row through the collate function, as torch's do
        self.gatherable = bool(all(_torch.is_tensor(a) or a.dtype.kind not in "USOVMm" for a in converted))

    def __len__(self) -> int:
        return self._length

    @property
    def arrays(self) -> tuple[Any, ...]:
        """The arrays, as passed in (or their shared copies, once the dataset was sent to
        spawned or forkserver workers). In such a worker, while the main process is still
        copying them, this waits until they are whole (the dataset's own reads wait only
        for the rows they read)."""
        if guard.copying:
            guard.whole(self._arrays)
        return self._arrays

    @arrays.setter
    def arrays(self, arrays: tuple[Any, ...]) -> None:
        self._arrays = arrays

    def _conveyor_ship_(self) -> Any:
        """Sent to a spawned or forkserver worker: large numpy arrays move, once, into shared
        memory that this dataset keeps as its data from then on, and travel by reference
        (``conveyor.transport.share``), marked as read through this dataset's checks while
        they are being copied. The dataset then holds its own copy: changes made afterwards
        to an array passed in no longer show in it."""
        return share.ship_container(self, "_arrays", self._take_copies)

    def _conveyor_first_(self, indices: list[int]) -> None:
        """The loader is about to ask for these rows while the arrays are being copied: their
        bytes are copied first."""
        for a in self._arrays:
            move.want(a, indices)

    def _take_copies(self, copies: tuple[Any, ...]) -> None:
        """The shared copies are whole: they are this dataset's data from now on (the arrays
        passed in are let go)."""
        self._arrays = copies

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        if guard.copying:
            guard.rows(self._arrays, (index,) if isinstance(index, (int, np.integer)) else None)
        return tuple(a[index] for a in self._arrays)

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, ...]]:
        """One sample tuple per index, cut from one gather per array."""
        if guard.copying:
            guard.rows(self._arrays, indices)
        columns = [_take(a, indices) for a in self._arrays]
        return list(zip(*columns, strict=True))

    def gather(self, indices: Sequence[int], output: Output = "auto") -> list[Any]:
        """The batch ``default_collate`` would build from these rows, gathered directly.

        ``output="torch"`` gives tensors (numpy arrays converted after the
        gather, dtype kept), ``"numpy"`` gives numpy arrays, and ``"auto"``
        gives tensors when torch is installed and numpy arrays otherwise.

        >>> ArrayDataset(np.array([5, 6, 7])).gather([2, 0], output="numpy")
        [array([7, 5])]
        """
        if output == "auto":
            output = "torch" if _torch.available() else "numpy"
        if output not in ("torch", "numpy"):
            raise ValueError(f"output must be 'auto', 'torch' or 'numpy', got {output!r}")
        if guard.copying:
            guard.rows(self._arrays, indices)
        batch = _take_all(self._arrays, indices)
        if output == "numpy":
            return [b.numpy() if _torch.is_tensor(b) else b for b in batch]
        torch = _torch.get()
        if torch is None:
            raise ImportError("gather(output='torch') needs torch: pip install conveyor[torch]")
        return [b if _torch.is_tensor(b) else _to_tensor(torch, b) for b in batch]


def _to_tensor(torch: Any, b: np.ndarray) -> Any:
    """A gathered numpy column as default_collate would make it: a tensor (in native byte
    order), or for strings, bytes and objects whatever default_collate makes of the rows."""
    if b.dtype.kind in "USOVMm":
        from conveyor.collate import default_collate

        return default_collate(list(b))
    if not b.dtype.isnative:
        b = b.astype(b.dtype.newbyteorder("="))
    return torch.from_numpy(b)


def _take_all(arrays: tuple[Any, ...], indices: Sequence[int] | np.ndarray) -> list[Any]:
    """One gather per array, converting the indices once (this runs once per batch)."""
    if not isinstance(indices, np.ndarray):
        indices = np.fromiter(indices, dtype=np.int64, count=len(indices))
    if len(indices) and indices.min() < 0:
        indices = np.where(indices < 0, indices + len(arrays[0]), indices)
    idx_t: Any = None
    out = []
    for a in arrays:
        if _torch.is_tensor(a):
            if idx_t is None:
                torch = _torch.get()
                assert torch is not None
                idx_t = torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int64))
            out.append(a.index_select(0, idx_t))
        else:
            out.append(a.take(indices, axis=0))
    return out


def _take(array: Any, indices: Sequence[int]) -> Any:
    if _torch.is_tensor(array):
        torch = _torch.get()
        assert torch is not None
        idx = torch.as_tensor(indices, dtype=torch.long)
        if idx.numel() and bool((idx < 0).any()):
            idx = torch.where(idx < 0, idx + array.shape[0], idx)
        return array.index_select(0, idx)
    return np.take(array, np.asarray(indices, dtype=np.intp), axis=0)
