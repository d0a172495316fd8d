"""The built-in data of ``conveyor demo`` (and of the benchmarks' diabetes scenarios): a
deterministic stand-in for the diabetes.csv of a published PyTorch DataLoader tutorial.

    make_diabetes(rows, seed) --> (x: rows x 8 float32 in [-1, 1], y: rows x 1 float32 0/1)
    Diabetes(tensors)         --> map-style data set of (features, label) pairs
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _torch

__all__ = ["FEATURES", "ROWS", "Diabetes", "make_diabetes"]

ROWS, FEATURES = 759, 8


def make_diabetes(rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stand-in for the diabetes.csv of a published PyTorch DataLoader tutorial
    (the demo's experiment): ``rows`` x 8 float32 features in [-1, 1], 0/1 labels.

    >>> x, y = make_diabetes(); x.shape, y.shape, x.dtype.name
    ((759, 8), (759, 1), 'float32')
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(rows, FEATURES)).astype(np.float32)
    w = rng.normal(0.0, 1.5, size=FEATURES)
    logits = x.astype(np.float64) @ w + 0.6 + rng.normal(0.0, 0.5, size=rows)
    y = (logits > 0).astype(np.float32)[:, None]
    return x, y


class Diabetes:
    """The demo's map-style data set: ``(features, label)`` pairs, torch tensors when torch is installed.

    Like that tutorial's ``DiabetesDataset`` (a ``torch.utils.data.Dataset``): ``__getitem__`` and ``__len__``.

    >>> ds = Diabetes(tensors=False); len(ds), ds[0][0].shape
    (759, (8,))
    """

    def __init__(self, tensors: bool | None = None) -> None:
        x, y = make_diabetes()
        self.len = x.shape[0]
        if tensors is None:
            tensors = _torch.available()
        if tensors:
            torch = _torch.get()
            assert torch is not None
            self.x_data: Any = torch.from_numpy(x)
            self.y_data: Any = torch.from_numpy(y)
        else:
            self.x_data, self.y_data = x, y

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return self.x_data[index], self.y_data[index]

    def __len__(self) -> int:
        return self.len
