"""Collating into memory the caller gives: ``use_allocator(alloc)`` makes every stacked leaf
collated in its context ask ``alloc(shape, dtype)`` for its output buffer, and write into it.

    leaf column --> alloc(shape, dtype) --> a writable C-contiguous array | None (allocate as usual)
                --> np.stack / torch.stack(out=) / np.copyto into it
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from .tensors import dtype_tables

if TYPE_CHECKING:
    import torch as torch_types

__all__ = ["Allocator", "active_allocator", "array_into", "arrays_agree", "current_allocator",
           "stack_arrays_into", "stack_tensors_into", "tensor_into", "use_allocator"]

Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray | None]
"""``alloc(shape, dtype)`` returns a writable C-contiguous array of that shape and dtype, or None"""


active_allocator: ContextVar[Allocator | None] = ContextVar("conveyor_collate_allocator", default=None)


class use_allocator:  # noqa: N801 - used as a function: ``with use_allocator(alloc):``
    """Make every stacked leaf collated in this context ask ``alloc`` for its buffer.

    ``alloc(shape, dtype)`` is called once per stacked leaf with the full batch
    shape (batch size first); it returns a writable C-contiguous array of that
    shape and dtype, or None to allocate as usual. ``None`` switches it off. An
    allocator with a ``min_bytes`` attribute is not asked for smaller leaves.
    (A class, not a generator: workers enter it once a batch, and a
    ``@contextmanager`` costs ~1.5 us.)

    >>> from conveyor.collate import default_collate
    >>> with use_allocator(lambda shape, dtype: np.empty(shape, dtype)):
    ...     batch = default_collate([np.zeros(3), np.ones(3)])
    """

    __slots__ = ("alloc", "token")

    def __init__(self, alloc: Allocator | None) -> None:
        self.alloc = alloc
        self.token: Any = None

    def __enter__(self) -> None:
        self.token = active_allocator.set(self.alloc)

    def __exit__(self, *exc: object) -> None:
        active_allocator.reset(self.token)


def current_allocator() -> Allocator | None:
    """The allocator set by the innermost ``use_allocator``, or None.

    >>> current_allocator() is None
    True
    """
    return active_allocator.get()


def _buffer(alloc: Allocator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    buf = alloc(shape, dtype)
    if buf is None:
        return None
    if (
        not isinstance(buf, np.ndarray)
        or buf.shape != shape
        or buf.dtype != dtype
        or not buf.flags.c_contiguous
        or not buf.flags.writeable
    ):
        got = f"{type(buf).__name__} {getattr(buf, 'shape', '?')} {getattr(buf, 'dtype', '?')}"
        raise ValueError(
            f"allocator must return a writable C-contiguous array of shape {shape} "
            f"and dtype {dtype}, or None; got {got}"
        )
    return buf


def stack_arrays_into(batch: Sequence[Any], alloc: Allocator) -> np.ndarray | None:
    """np.stack into an allocated buffer, or None when the arrays do not all agree."""
    elem = batch[0]
    dtype, shape = elem.dtype, elem.shape
    floor = getattr(alloc, "min_bytes", 0)
    if floor and elem.nbytes * len(batch) < floor:
        return None
    if not arrays_agree(batch, exact=False):
        return None
    buf = _buffer(alloc, (len(batch), *shape), dtype)
    if buf is None:
        return None
    np.stack(batch, out=buf)
    return buf


def stack_tensors_into(
    batch: Sequence[Any], torch: ModuleType, alloc: Allocator
) -> torch_types.Tensor | None:
    """torch.stack into an allocated buffer, or None when that could differ from plain stack."""
    elem = batch[0]
    # an allocator may say which leaves it never takes: skip every other check for those
    floor = getattr(alloc, "min_bytes", 0)
    if floor and elem.nbytes * len(batch) < floor:
        return None
    np_dtype = dtype_tables(torch)[0].get(elem.dtype)
    if np_dtype is None or not elem.is_cpu or elem.layout is not torch.strided:
        return None
    # A stack into ``out`` casts to the buffer's dtype where a plain stack would promote,
    # and subclasses may wrap the result: only exact tensors of one dtype go this way.
    # Other differences (shapes, devices, autograd) make ``stack(out=)`` raise; then the
    # plain stack below decides, so results and errors stay those of torch.
    tensor, dtype = torch.Tensor, elem.dtype
    for t in batch:
        if type(t) is not tensor or t.dtype is not dtype:
            return None
    buf = _buffer(alloc, (len(batch), *elem.shape), np_dtype)
    if buf is None:
        return None
    out = torch.from_numpy(buf)
    try:
        torch.stack(batch, 0, out=out)
    except RuntimeError:
        return None
    return out


def tensor_into(t: torch_types.Tensor, torch: ModuleType, alloc: Allocator) -> torch_types.Tensor:
    """Copy a small freshly built tensor into an allocated buffer (numbers, numpy scalars)."""
    np_dtype = dtype_tables(torch)[0].get(t.dtype)
    if np_dtype is None:
        return t
    buf = _buffer(alloc, tuple(t.shape), np_dtype)
    if buf is None:
        return t
    np.copyto(buf, t.numpy())
    return torch.from_numpy(buf)


def array_into(arr: np.ndarray, alloc: Allocator | None) -> np.ndarray:
    if alloc is None:
        return arr
    buf = _buffer(alloc, arr.shape, arr.dtype)
    if buf is None:
        return arr
    np.copyto(buf, arr)
    return buf


def arrays_agree(batch: Sequence[Any], *, exact: bool) -> bool:
    """All numpy arrays (of that very class with ``exact``) of the first one's dtype and shape?"""
    dtype, shape = batch[0].dtype, batch[0].shape
    for arr in batch:
        kind_ok = type(arr) is np.ndarray if exact else isinstance(arr, np.ndarray)
        if not kind_ok or arr.dtype != dtype or arr.shape != shape:
            return False
    return True
