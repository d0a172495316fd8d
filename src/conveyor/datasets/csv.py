"""CSVDataset: a numeric CSV file read once into arrays, served as (features, labels).

    file ──> header? (names) ──> np.loadtxt of the chosen columns ──> features[n, ...], labels[n, ...]
                                                                 └─> ArrayDataset (gather, __getitems__)
"""

from __future__ import annotations

import csv
import gzip
import os
import warnings
from collections.abc import Sequence
from typing import IO

import numpy as np
from numpy.typing import DTypeLike

from conveyor.datasets.arrays import ArrayDataset

__all__ = ["CSVDataset"]

Columns = int | str | slice | Sequence[int | str]


# utf-8-sig: a CSV saved by Excel starts with a byte-order mark, which utf-8 would keep in
# the first column's name (or make the first number unreadable)
ENCODING = "utf-8-sig"


def _open(path: str | os.PathLike[str]) -> IO[str]:
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding=ENCODING)
    return open(path, encoding=ENCODING)


def _split(line: str, delimiter: str | None) -> list[str]:
    """The fields of one line: quoted ones whole (``"height, cm"`` is one name)."""
    line = line.rstrip("\r\n")
    if delimiter is not None and len(delimiter) == 1:
        fields = next(csv.reader([line], delimiter=delimiter, skipinitialspace=True), [])
        return [f.strip().strip("'") for f in fields]
    return [f.strip().strip('"').strip("'") for f in line.split(delimiter)]


def _hint(first: str, delimiter: str | None, message: str) -> str:
    """What may be wrong with a CSV numpy could not read."""
    if delimiter is not None and delimiter not in first:
        seen = [d for d in (";", "\t", "|", ",") if d != delimiter and d in first]
        if seen:
            return f" (the first line has no {delimiter!r} but has {seen[0]!r}: pass delimiter={seen[0]!r})"
    if "string ''" in message:
        return " (an empty field: fill in the missing values first)"
    if "could not convert" in message:
        return (" (CSVDataset reads numbers only: encode text columns first, or leave them out with "
                "feature_columns and label_columns)")
    return ""


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


class CSVDataset(ArrayDataset):
    """A numeric CSV as an ArrayDataset of ``(features, labels)`` rows.

    Columns are chosen by index, slice, name (when the file has a header) or a
    list of those. A single int or name gives a 1-D array (``(n,)``); a list,
    tuple or slice gives a 2-D one (``(n, k)``), so the default ``(-1,)`` puts
    the last column in labels of shape ``(n, 1)`` and every other column in
    the features. ``label_columns=None`` keeps features only (1-tuples).
    ``skip_header=None`` detects a header: a first line that is not all numbers.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = os.path.join(folder, "rows.csv")
    ...     _ = open(path, "w").write("0.1,0.2,1\\n0.3,0.4,0\\n")
    ...     ds = CSVDataset(path)
    >>> ds.features.shape, ds.labels.shape, ds[1][1]
    ((2, 2), (2, 1), array([0.], dtype=float32))
    """

    columns: list[str] | None
    """Column names from the header, or None without one."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        feature_columns: Columns | None = None,
        label_columns: Columns | None = (-1,),
        delimiter: str | None = ",",
        skip_header: bool | None = None,
        dtype: DTypeLike = np.float32,
        label_dtype: DTypeLike | None = None,
        comments: str | None = "#",
    ) -> None:
        self.path = os.fspath(path)
        try:
            first, at = self._first_line(comments)
        except UnicodeDecodeError as e:
            e.add_note(f"{self.path} is not UTF-8 text (a spreadsheet's export in another encoding?): "
                       "save it as UTF-8 and read it again")
            raise
        fields = _split(first, delimiter)
        if skip_header is None:
            skip_header = not all(_is_number(f) for f in fields)
        self.columns = fields if skip_header else None
        ncols = len(fields)

        labels_idx = None if label_columns is None else self._resolve(label_columns, ncols)
        if feature_columns is None:
            taken = set(labels_idx or [])
            feature_idx = [c for c in range(ncols) if c not in taken]
            features_1d = False
        else:
            feature_idx = self._resolve(feature_columns, ncols)
            features_1d = isinstance(feature_columns, (int, str))
        labels_1d = isinstance(label_columns, (int, str))

        used = sorted(set(feature_idx) | set(labels_idx or []))
        where = {c: k for k, c in enumerate(used)}
        label_dt = np.dtype(dtype if label_dtype is None else label_dtype)
        load_dt = np.dtype(dtype) if label_dt == np.dtype(dtype) else np.float64
        try:
            with warnings.catch_warnings():  # a header alone: said below, as an error
                warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
                table = np.loadtxt(
                    self.path,
                    delimiter=delimiter,
                    # past the header, whatever comments or blank lines came before it
                    skiprows=at + 1 if skip_header else 0,
                    usecols=used,
                    dtype=load_dt,
                    ndmin=2,
                    comments=comments,
                    encoding=ENCODING,
                    quotechar='"',  # "1.5" as exported with every field quoted
                )
        except UnicodeDecodeError as e:  # past the first line: a byte of another encoding further down
            e.add_note(f"{self.path} is not UTF-8 text (a spreadsheet's export in another encoding?): "
                       "save it as UTF-8 and read it again")
            raise
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}{_hint(first, delimiter, str(e))}") from e
        if len(table) == 0:
            raise ValueError(f"{self.path} holds a header but no rows")
        features = np.ascontiguousarray(table[:, [where[c] for c in feature_idx]], dtype=dtype)
        arrays: list[np.ndarray] = [features[:, 0] if features_1d else features]
        if labels_idx is not None:
            labels = np.ascontiguousarray(table[:, [where[c] for c in labels_idx]], dtype=label_dt)
            arrays.append(labels[:, 0] if labels_1d else labels)
        super().__init__(*arrays)

    @property
    def features(self) -> np.ndarray:
        """The feature array, one row per sample."""
        return self.arrays[0]

    @property
    def labels(self) -> np.ndarray | None:
        """The label array, or None when ``label_columns`` was None."""
        return self.arrays[1] if len(self.arrays) > 1 else None

    def _first_line(self, comments: str | None) -> tuple[str, int]:
        """The first line that is neither blank nor a comment, and its number (from 0)."""
        with _open(self.path) as f:
            for k, line in enumerate(f):
                stripped = line.strip()
                if stripped and not (comments and stripped.startswith(comments)):
                    return line, k
        raise ValueError(f"{self.path} holds no rows")

    def _resolve(self, spec: Columns, ncols: int) -> list[int]:
        if isinstance(spec, slice):
            return list(range(ncols))[spec]
        items: Sequence[int | str] = [spec] if isinstance(spec, (int, str)) else spec
        out: list[int] = []
        for item in items:
            if isinstance(item, str):
                if self.columns is None:
                    raise ValueError(f"column {item!r} named, but {self.path} has no header")
                if item not in self.columns:
                    raise KeyError(f"no column {item!r} in {self.path}; columns are {self.columns}")
                out.append(self.columns.index(item))
            else:
                c = int(item)
                if not -ncols <= c < ncols:
                    raise IndexError(f"column {c} out of range for {ncols} columns")
                out.append(c % ncols)
        return out

    def __repr__(self) -> str:
        shapes = ", ".join(str(a.shape) for a in self.arrays)
        return f"CSVDataset({self.path!r}, shapes=[{shapes}])"
