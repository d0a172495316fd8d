"""StringArray: a read-only list of strings kept in two numpy buffers.

Why: a forked worker that reads ``paths[i]`` from a Python list bumps the
reference count of the string object, which writes to the page holding it,
so page by page every worker ends up with a private copy of the whole list
(copy-on-read). A StringArray keeps its strings as

    data:    uint8[total_bytes]   every string's UTF-8 bytes, end to end
    offsets: int64[n + 1]         string i is data[offsets[i]:offsets[i + 1]]

and builds a fresh ``str`` on each access, so the big buffers are only ever
read and stay shared between the parent and its workers. It pickles as the
two buffers, and spawned or forkserver workers map those from shared memory
(``conveyor.transport.share``): no copy per worker, not millions of objects.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

import numpy as np

from conveyor.transport import guard, move, share

__all__ = ["StringArray"]

_ERRORS = "surrogatepass"


class StringArray(Sequence[str]):
    """An immutable sequence of strings backed by a byte buffer and offsets.

    Indexing gives ``str`` (negative indices allowed), slicing gives a
    StringArray sharing the same buffer, and it compares equal to a list or
    tuple holding the same strings.

    >>> names = StringArray(["cat/1.jpg", "dog/2.jpg", "émeu/3.jpg"])
    >>> names[-1], list(names[:2]), names == ["cat/1.jpg", "dog/2.jpg", "émeu/3.jpg"]
    ('émeu/3.jpg', ['cat/1.jpg', 'dog/2.jpg'], True)
    """

    __slots__ = ("_data", "_offsets")

    _data: np.ndarray
    _offsets: np.ndarray

    def __init__(self, strings: Iterable[str] = ()) -> None:
        if isinstance(strings, StringArray):
            self._data, self._offsets = strings._data, strings._offsets
            return
        items = strings if isinstance(strings, (list, tuple)) else list(strings)
        joined = "".join(items)
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        if joined.isascii():
            # One byte per character: lengths in characters are lengths in bytes.
            np.cumsum(np.fromiter(map(len, items), dtype=np.int64, count=len(items)), out=offsets[1:])
            blob = joined.encode("ascii")
        else:
            encoded = [s.encode("utf-8", _ERRORS) for s in items]
            np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(items)), out=offsets[1:])
            blob = b"".join(encoded)
        # A view on the bytes object, no copy: its refcount sits in the header page only.
        data = np.frombuffer(blob, dtype=np.uint8)
        self._set(data, offsets)

    def _set(self, data: np.ndarray, offsets: np.ndarray) -> None:
        data, offsets = data.view(), offsets.view()  # flags on our own views only
        data.flags.writeable = False
        offsets.flags.writeable = False
        self._data, self._offsets = data, offsets

    @classmethod
    def from_buffers(cls, data: np.ndarray, offsets: np.ndarray) -> StringArray:
        """Wrap existing buffers (uint8 UTF-8 bytes, int64 offsets of length n + 1).

        >>> StringArray.from_buffers(np.frombuffer(b"abcd", np.uint8), np.array([0, 1, 4]))[1]
        'bcd'
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) == 0:
            raise ValueError("offsets must be a 1-D array of length n + 1")
        if np.any(np.diff(offsets) < 0) or offsets[0] < 0 or offsets[-1] > len(data):
            raise ValueError("offsets must be non-decreasing and within the data buffer")
        out = cls.__new__(cls)
        out._set(np.asarray(data, dtype=np.uint8), offsets)
        return out

    @property
    def data(self) -> np.ndarray:
        """The read-only UTF-8 byte buffer (may extend past this array's strings)."""
        if guard.copying:
            guard.whole((self._data,))
        return self._data

    @property
    def offsets(self) -> np.ndarray:
        """The read-only int64 offsets, one more than there are strings."""
        if guard.copying:
            guard.whole((self._offsets,))
        return self._offsets

    def _ready(self, idx: Any) -> None:
        """Wait (in a worker, while the buffers are being copied) for the strings ``idx``
        (None: all of them)."""
        if idx is None:
            guard.whole((self._data, self._offsets))
            return
        idx = np.asarray(idx, dtype=np.int64)
        guard.rows((self._offsets,), np.concatenate((idx, idx + 1)))
        guard.between(self._data, self._offsets[idx], self._offsets[idx + 1])

    @property
    def nbytes(self) -> int:
        """Bytes held by the two buffers."""
        return int(self._data.nbytes + self._offsets.nbytes)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: SupportsIndex) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> StringArray: ...

    def __getitem__(self, index: SupportsIndex | slice) -> str | StringArray:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                stop = max(start, stop)
                out = type(self).__new__(type(self))
                out._data, out._offsets = self._data, self._offsets[start : stop + 1]
                return out
            return self.take(range(start, stop, step))
        try:
            i = operator.index(index)
        except TypeError:  # as a list says it (a float, a list of indices: take() takes those)
            raise TypeError(f"StringArray indices must be integers or slices, not {type(index).__name__}; "
                            "use take() for many") from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"StringArray index {index} out of range for length {n}")
        if guard.copying:
            self._ready((i,))
        offsets = self._offsets
        return str(memoryview(self._data)[offsets[i] : offsets[i + 1]], "utf-8", _ERRORS)

    def take(self, indices: Iterable[SupportsIndex]) -> StringArray:
        """A new StringArray of the strings at ``indices`` (copies their bytes).

        >>> list(StringArray(["a", "bb", "ccc"]).take([2, 0]))
        ['ccc', 'a']
        """
        idx = np.fromiter((i.__index__() for i in indices), dtype=np.int64)
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"StringArray index out of range for length {n}")
        if guard.copying:
            self._ready(idx)
        starts, ends = self._offsets[idx], self._offsets[idx + 1]
        lengths = ends - starts
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Positions in the source buffer of every output byte, gathered at once.
        positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        out = type(self).__new__(type(self))
        out._set(self._data[positions], offsets)
        return out

    def __iter__(self) -> Iterator[str]:
        if guard.copying:
            self._ready(None)
        view = memoryview(self._data)
        bounds = self._offsets.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            yield str(view[start:end], "utf-8", _ERRORS)

    def tolist(self) -> list[str]:
        """The strings as a Python list."""
        return list(self)

    def _packed(self) -> tuple[np.ndarray, np.ndarray]:
        """Buffers trimmed to this array's own bytes, offsets starting at 0."""
        if guard.copying:
            self._ready(None)
        first, last = int(self._offsets[0]), int(self._offsets[-1])
        if first == 0 and last == len(self._data):
            return self._data, self._offsets
        return self._data[first:last], self._offsets - first

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            mine, theirs = self._packed(), other._packed()
            return np.array_equal(mine[1], theirs[1]) and np.array_equal(mine[0], theirs[0])
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def _conveyor_ship_(self) -> tuple[Any, ...]:
        """Sent to a spawned or forkserver worker: the two buffers move, once, into shared
        memory this array keeps, and travel by reference (``conveyor.transport.share``)."""
        share.adopt((self._data, self._offsets), then=self._take_copies)
        return (_from_buffers, (share.Guarded(self._data), share.Guarded(self._offsets)))

    def _conveyor_first_(self, indices: list[int]) -> None:
        """The loader is about to ask for these strings while the buffers are being copied:
        their bytes are copied first."""
        idx = np.asarray(indices, dtype=np.int64)
        idx = np.where(idx < 0, idx + len(self), idx)
        move.want(self._offsets, np.concatenate((idx, idx + 1)))
        move.want_bytes(self._data, self._offsets[idx], self._offsets[idx + 1])

    def _take_copies(self, copies: tuple[np.ndarray, np.ndarray]) -> None:
        """The shared copies are whole: this array's buffers from now on."""
        self._data, self._offsets = copies

    def __reduce__(self) -> tuple[Any, ...]:
        # Ship the bytes and each string's length in the smallest unsigned dtype
        # that fits (usually 1 byte a string), not 8-byte offsets.
        data, offsets = self._packed()
        lengths = np.diff(offsets)
        longest = int(lengths.max()) if len(lengths) else 0
        small = np.min_scalar_type(longest)
        return (_rebuild, (data, lengths.astype(small)))

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(repr(s) for s in self[: min(n, 3)])
        more = f", ... ({n} strings)" if n > 3 else ""
        return f"StringArray([{head}{more}])"


def _from_buffers(data: np.ndarray, offsets: np.ndarray) -> StringArray:
    out = StringArray.__new__(StringArray)
    out._set(data, offsets)
    return out


def _rebuild(data: np.ndarray, lengths: np.ndarray) -> StringArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, dtype=np.int64, out=offsets[1:])
    out = StringArray.__new__(StringArray)
    out._set(data, offsets)
    return out
