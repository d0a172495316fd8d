"""Collate: turn a list of samples into one batch, optionally straight into shared memory.

Data flow::

    samples ──> collate(batch, collate_fn_map) ──> dispatch on type(batch[0])
                  │  exact type in the registry? call its function
                  │  else the first registry key it is an instance of
                  │  else containers: Mapping / namedtuple / Sequence, transposed and recursed
                  └─> leaf functions stack one column of leaves:
                        tensors ─ torch.stack            numpy arrays ─ as tensors, then stacked
                        numpy scalars, float, int ─ one tensor     str, bytes ─ left as they are
                        with an allocator active (``use_allocator``), each stacked leaf asks
                        ``alloc(shape, dtype)`` for its output buffer and writes into it

``default_collate`` and ``default_convert`` give exactly what torch's functions of the
same name give when torch is installed; without torch they give numpy arrays.
``numpy_collate`` always gives numpy arrays. This module imports torch only when a
batch needs it, never at import time.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from contextvars import ContextVar
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from conveyor import _torch

from .tensors import AnyTensor, dtype_tables, numpy_dtype_to_torch, sparse_layouts, tensor_to_numpy, torch_dtype_to_numpy

if TYPE_CHECKING:
    import torch as torch_types

__all__ = [
    "Allocator",
    "AnyTensor",
    "CollateFn",
    "collate",
    "collate_float_fn",
    "collate_int_fn",
    "collate_numpy_array_fn",
    "collate_numpy_scalar_fn",
    "collate_str_fn",
    "collate_tensor_fn",
    "current_allocator",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "numpy_collate",
    "numpy_collate_array_fn",
    "numpy_collate_float_fn",
    "numpy_collate_fn_map",
    "numpy_collate_int_fn",
    "numpy_collate_scalar_fn",
    "numpy_collate_tensor_fn",
    "numpy_dtype_to_torch",
    "torch_dtype_to_numpy",
    "use_allocator",
]


class CollateFn(Protocol):
    """A registry entry: collates one column of same-typed leaves."""

    def __call__(
        self, batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
    ) -> Any: ...


CollateFnMap = Mapping[type | tuple[type, ...], CollateFn]
Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray | None]
"""``alloc(shape, dtype)`` returns a writable C-contiguous array of that shape and dtype, or None"""


# --------------------------------------------------------------------------- torch, lazily

_UNSET: Any = object()
_torch_module: Any = _UNSET  # tests set this to None to play "torch is not installed"


def _load_torch() -> ModuleType | None:
    global _torch_module
    mod = _torch_module
    if mod is _UNSET:
        mod = _torch_module = _torch.get()
    return mod


def _torch_loaded() -> ModuleType:
    """torch, for leaves that are tensors (so torch is surely imported)."""
    mod = _torch_module
    if mod is _UNSET or mod is None:
        return sys.modules["torch"]
    return mod


# --------------------------------------------------------------------------- allocator

_allocator: ContextVar[Allocator | None] = ContextVar("conveyor_collate_allocator", default=None)


class use_allocator:  # noqa: N801 - used as a function: ``with use_allocator(alloc):``
    """Make every stacked leaf collated in this context ask ``alloc`` for its buffer.

    ``alloc(shape, dtype)`` is called once per stacked leaf with the full batch
    shape (batch size first); it returns a writable C-contiguous array of that
    shape and dtype, or None to allocate as usual. ``None`` switches it off. An
    allocator with a ``min_bytes`` attribute is not asked for smaller leaves.
    (A class, not a generator: workers enter it once a batch, and a
    ``@contextmanager`` costs ~1.5 us.)

    >>> with use_allocator(lambda shape, dtype: np.empty(shape, dtype)):
    ...     batch = default_collate([np.zeros(3), np.ones(3)])
    """

    __slots__ = ("alloc", "token")

    def __init__(self, alloc: Allocator | None) -> None:
        self.alloc = alloc
        self.token: Any = None

    def __enter__(self) -> None:
        self.token = _allocator.set(self.alloc)

    def __exit__(self, *exc: object) -> None:
        _allocator.reset(self.token)


def current_allocator() -> Allocator | None:
    """The allocator set by the innermost ``use_allocator``, or None.

    >>> current_allocator() is None
    True
    """
    return _allocator.get()


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


def _stack_arrays_into(batch: Sequence[Any], alloc: Allocator) -> np.ndarray | None:
    """np.stack into an allocated buffer, or None when the arrays do not all agree."""
    elem = batch[0]
    dtype, shape = elem.dtype, elem.shape
    floor = getattr(alloc, "min_bytes", 0)
    if floor and elem.nbytes * len(batch) < floor:
        return None
    if not _arrays_agree(batch, exact=False):
        return None
    buf = _buffer(alloc, (len(batch), *shape), dtype)
    if buf is None:
        return None
    np.stack(batch, out=buf)
    return buf


def _stack_tensors_into(
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


def _tensor_into(t: torch_types.Tensor, alloc: Allocator) -> torch_types.Tensor:
    """Copy a small freshly built tensor into an allocated buffer (numbers, numpy scalars)."""
    torch = _torch_loaded()
    np_dtype = dtype_tables(torch)[0].get(t.dtype)
    if np_dtype is None:
        return t
    buf = _buffer(alloc, tuple(t.shape), np_dtype)
    if buf is None:
        return t
    np.copyto(buf, t.numpy())
    return torch.from_numpy(buf)


def _array_into(arr: np.ndarray, alloc: Allocator | None) -> np.ndarray:
    if alloc is None:
        return arr
    buf = _buffer(alloc, arr.shape, arr.dtype)
    if buf is None:
        return arr
    np.copyto(buf, arr)
    return buf


# --------------------------------------------------------------------------- the walker


def _type_error(found: object) -> TypeError:
    return TypeError(
        "default_collate: batch must contain tensors, numpy arrays, numbers, "
        f"dicts or lists; found {found}"
    )


def collate(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Collate ``batch`` by the type of its first sample, looked up in ``collate_fn_map``.

    The exact type is looked up first, then each key in order with ``isinstance``;
    Mappings, namedtuples and Sequences are transposed and recursed into.

    >>> collate([(1, "a"), (2, "b")], collate_fn_map=default_collate_fn_map)
    [tensor([1, 2]), ('a', 'b')]
    """
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        fn = collate_fn_map.get(elem_type)
        if fn is not None:
            return fn(batch, collate_fn_map=collate_fn_map)
        for key, fn in collate_fn_map.items():
            if isinstance(elem, key):
                return fn(batch, collate_fn_map=collate_fn_map)

    # Exact builtin containers first: same result as the generic paths below, fewer checks.
    if elem_type is dict:
        return {
            key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem
        }
    if elem_type is tuple or elem_type is list:
        columns = _transpose(batch)
        return [collate(column, collate_fn_map=collate_fn_map) for column in columns]

    if isinstance(elem, Mapping):
        values = {
            key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem
        }
        return _rebuild_mapping(elem, values)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple: no length check
        columns = zip(*batch)
        return elem_type(*(collate(column, collate_fn_map=collate_fn_map) for column in columns))
    if isinstance(elem, Sequence):
        columns = _transpose(batch)
        items = [collate(column, collate_fn_map=collate_fn_map) for column in columns]
        if isinstance(elem, tuple):
            return items
        return _rebuild_sequence(elem, items)
    raise _type_error(elem_type)


def _transpose(batch: Sequence[Any]) -> list[tuple[Any, ...]]:
    # zip checks the lengths itself: a loop of len() calls costs ~1 us of ~16 for a batch of 32 pairs
    try:
        return list(zip(*batch, strict=True))
    except ValueError:
        size = len(batch[0])
        for sample in batch:
            if len(sample) != size:
                raise RuntimeError(  # torch's words first: code may match them
                    "each element in list of batch should be of equal size: samples of "
                    f"{size} and {len(sample)} elements in one batch"
                ) from None
        raise


def _rebuild_mapping(elem: Mapping[Any, Any], values: dict[Any, Any]) -> Any:
    """A mapping like ``elem`` holding ``values``; a plain dict if its type will not allow it."""
    try:
        if isinstance(elem, MutableMapping):
            clone = copy.copy(elem)  # keeps extra state, e.g. defaultdict's factory
            clone.update(values)
            return clone
        return type(elem)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def _rebuild_sequence(elem: Sequence[Any], items: list[Any]) -> Any:
    """A sequence like ``elem`` holding ``items``; a plain list if its type will not allow it."""
    try:
        if isinstance(elem, MutableSequence):
            clone = copy.copy(elem)
            for i, item in enumerate(items):
                clone[i] = item
            return clone
        return type(elem)(items)  # type: ignore[call-arg]
    except TypeError:
        return items


# --------------------------------------------------------------------------- leaf functions


def collate_tensor_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Stack tensors along a new first dimension.

    >>> import torch
    >>> collate_tensor_fn([torch.zeros(2), torch.ones(2)]).shape
    torch.Size([2, 2])
    """
    torch = _torch_loaded()
    elem = batch[0]
    if elem.is_nested:
        raise RuntimeError(  # torch's words, which users match on
            "Batches of nested tensors are not currently supported by the default collate_fn; "
            "please provide a custom collate_fn to handle them appropriately."
        )
    if elem.layout in sparse_layouts(torch):
        raise RuntimeError(
            "Batches of sparse tensors are not currently supported by the default collate_fn; "
            "pass a collate_fn that handles them"
        )
    alloc = _allocator.get()
    if alloc is not None:
        out = _stack_tensors_into(batch, torch, alloc)
        if out is not None:
            return out
    return torch.stack(batch, 0)


def collate_numpy_array_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Numpy arrays become one tensor (numpy array without torch); str/object arrays raise.

    >>> collate_numpy_array_fn([np.zeros(2), np.ones(2)], collate_fn_map=default_collate_fn_map).dtype
    torch.float64
    """
    elem = batch[0]
    if elem.dtype.kind in "SUO":
        raise _type_error(elem.dtype)
    torch = _load_torch()
    if torch is None:
        return _numpy_stack(batch, _allocator.get())
    alloc = _allocator.get()
    tdtype = dtype_tables(torch)[1].get(elem.dtype.str)
    if tdtype is not None and collate_fn_map is not None and _tensor_handler(collate_fn_map) is collate_tensor_fn:
        if alloc is not None:
            buf = _stack_arrays_into(batch, alloc)
            if buf is not None:
                return torch.from_numpy(buf)
        out = _stack_arrays_torch(batch, torch, tdtype)
        if out is not None:
            return out
    return collate([torch.as_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def _arrays_agree(batch: Sequence[Any], *, exact: bool) -> bool:
    """All numpy arrays (of that very class with ``exact``) of the first one's dtype and shape?"""
    dtype, shape = batch[0].dtype, batch[0].shape
    for arr in batch:
        kind_ok = type(arr) is np.ndarray if exact else isinstance(arr, np.ndarray)
        if not kind_ok or arr.dtype != dtype or arr.shape != shape:
            return False
    return True


def _stack_arrays_torch(batch: Sequence[Any], torch: ModuleType, tdtype: Any) -> Any:
    """np.stack into a new torch tensor, or None when the arrays do not all agree.

    torch's way, a tensor per array and then torch.stack, costs ~1.4 us an array before
    the stack (docs/decisions/collate-numpy-with-np-stack.md). The values, dtype and shape
    are torch's, contiguous; as with every batch conveyor builds through numpy, the storage
    cannot be resized (``resize_``)."""
    if not _arrays_agree(batch, exact=True):
        return None
    out = torch.empty((len(batch), *batch[0].shape), dtype=tdtype)
    np.stack(batch, out=out.numpy())
    return out


def _tensor_handler(collate_fn_map: CollateFnMap) -> Any:
    torch = _torch.loaded()
    fn = collate_fn_map.get(torch.Tensor) if torch is not None else None
    return fn if fn is not None else collate_fn_map.get(AnyTensor)


def collate_numpy_scalar_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Numpy scalars become one 1-d tensor (numpy array without torch).

    >>> collate_numpy_scalar_fn([np.float32(1), np.float32(2)]).dtype
    torch.float32
    """
    torch = _load_torch()
    if torch is None:
        return _array_into(_numpy_scalars(batch), _allocator.get())
    out = torch.as_tensor(batch)
    alloc = _allocator.get()
    return out if alloc is None else _tensor_into(out, alloc)


def collate_float_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python floats become one float64 tensor (numpy array without torch).

    >>> collate_float_fn([1.0, 2.5])
    tensor([1.0000, 2.5000], dtype=torch.float64)
    """
    torch = _load_torch()
    if torch is None:
        return _array_into(_numpy_floats(batch), _allocator.get())
    out = torch.tensor(batch, dtype=torch.float64)
    alloc = _allocator.get()
    return out if alloc is None else _tensor_into(out, alloc)


def collate_int_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python ints (or bools) become one int64 (or bool) tensor (numpy array without torch).

    >>> collate_int_fn([1, 2])
    tensor([1, 2])
    """
    torch = _load_torch()
    if torch is None:
        return _array_into(_numpy_ints(batch), _allocator.get())
    out = torch.tensor(batch)
    alloc = _allocator.get()
    return out if alloc is None else _tensor_into(out, alloc)


def collate_str_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Strings and bytes are returned as they came.

    >>> collate_str_fn(["a", "b"])
    ['a', 'b']
    """
    return batch


# numpy-only leaves: same dtypes as the torch leaves give, as numpy arrays.


def _numpy_stack(batch: Sequence[Any], alloc: Allocator | None) -> np.ndarray:
    if alloc is not None:
        buf = _stack_arrays_into(batch, alloc)
        if buf is not None:
            return buf
    if any(type(arr) is not np.ndarray for arr in batch):
        # a subclass (a masked array, a memmap) stacks into its own kind; torch's batch,
        # which this is the numpy form of, holds the plain values
        batch = [np.asarray(arr) for arr in batch]
    try:
        return np.stack(batch)
    except ValueError as exc:
        shape = np.shape(batch[0])
        for arr in batch:
            if np.shape(arr) != shape:
                raise RuntimeError(
                    f"stack expects each array to be equal size, but got {shape} "
                    f"and {np.shape(arr)}"
                ) from exc
        raise


def _checked(arr: np.ndarray, batch: Sequence[Any]) -> np.ndarray:
    if arr.dtype.kind not in "biufc":
        raise _type_error(type(batch[0]))
    return arr


def _numpy_scalars(batch: Sequence[Any]) -> np.ndarray:
    return _checked(np.array(batch), batch)


def _numpy_floats(batch: Sequence[Any]) -> np.ndarray:
    return _checked(np.array(batch, dtype=np.float64), batch)


def _numpy_ints(batch: Sequence[Any]) -> np.ndarray:
    arr = _checked(np.array(batch), batch)
    kind = arr.dtype.kind
    if kind in "iu":
        return arr.astype(np.int64, copy=False)
    if kind == "f":  # torch builds ints mixed with floats in its default dtype
        return arr.astype(np.float32)
    if kind == "c":
        return arr.astype(np.complex64)
    return arr


def numpy_collate_tensor_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Tensors become numpy arrays (``.numpy()``), then are collated as arrays.

    >>> import torch
    >>> numpy_collate_tensor_fn([torch.zeros(2), torch.ones(2)], collate_fn_map=numpy_collate_fn_map).shape
    (2, 2)
    """
    return collate([tensor_to_numpy(t) for t in batch], collate_fn_map=collate_fn_map)


def numpy_collate_array_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Numpy arrays are stacked into one array; str/object arrays raise TypeError.

    >>> numpy_collate_array_fn([np.zeros(2), np.ones(2)]).shape
    (2, 2)
    """
    elem = batch[0]
    if elem.dtype.kind in "SUO":
        raise _type_error(elem.dtype)
    return _numpy_stack(batch, _allocator.get())


def numpy_collate_scalar_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Numpy scalars become one 1-d array.

    >>> numpy_collate_scalar_fn([np.int8(1), np.int8(2)]).dtype
    dtype('int8')
    """
    return _array_into(_numpy_scalars(batch), _allocator.get())


def numpy_collate_float_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Python floats become one float64 array.

    >>> numpy_collate_float_fn([1.0, 2.0]).dtype
    dtype('float64')
    """
    return _array_into(_numpy_floats(batch), _allocator.get())


def numpy_collate_int_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> Any:
    """Python ints become one int64 array (bool when all are bools).

    >>> numpy_collate_int_fn([1, 2]).dtype
    dtype('int64')
    """
    return _array_into(_numpy_ints(batch), _allocator.get())


_NUMPY_SCALARS = (np.bool_, np.number, np.object_)

default_collate_fn_map: dict[type | tuple[type, ...], CollateFn] = {
    AnyTensor: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,  # memmap too
    _NUMPY_SCALARS: collate_numpy_scalar_fn,  # not numpy's str_/bytes_, which are str/bytes
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}
"""Registry used by ``default_collate``; ``AnyTensor`` stands for ``torch.Tensor``."""

numpy_collate_fn_map: dict[type | tuple[type, ...], CollateFn] = {
    AnyTensor: numpy_collate_tensor_fn,
    np.ndarray: numpy_collate_array_fn,
    _NUMPY_SCALARS: numpy_collate_scalar_fn,
    float: numpy_collate_float_fn,
    int: numpy_collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}
"""Registry used by ``numpy_collate``: every stacked leaf comes out as a numpy array."""


def default_collate(batch: Sequence[Any]) -> Any:
    """Collate samples into a batch exactly as ``torch.utils.data.default_collate`` does.

    Tensors, numpy arrays and numbers are stacked along a new first dimension,
    str/bytes are kept, and Mappings, namedtuples, lists and tuples (as lists) are
    transposed. Without torch installed the stacked leaves are numpy arrays.
    Functions registered in torch's ``default_collate_fn_map`` (torch's documented
    way to extend ``default_collate``: a new type, or its own entry replaced) are
    used here as torch uses them.

    >>> default_collate([{"y": 1, "s": "a"}, {"y": 2, "s": "b"}])
    {'y': tensor([1, 2]), 's': ['a', 'b']}
    """
    return collate(batch, collate_fn_map=_effective_map())


# torch's stock entries and the conveyor function standing in for each
_TORCH_STOCK = {
    "collate_tensor_fn": collate_tensor_fn,
    "collate_numpy_array_fn": collate_numpy_array_fn,
    "collate_numpy_scalar_fn": collate_numpy_scalar_fn,
    "collate_float_fn": collate_float_fn,
    "collate_int_fn": collate_int_fn,
    "collate_str_fn": collate_str_fn,
}
_torch_map_seen: dict[Any, Any] | None = None  # torch's table as last looked at
_torch_map_effective: dict[Any, CollateFn] = default_collate_fn_map


def _effective_map() -> dict[Any, CollateFn]:
    """conveyor's table, or, once the user has registered functions in torch's, torch's table
    with its stock entries standing for conveyor's. Costs one dict comparison a batch."""
    global _torch_map_seen, _torch_map_effective
    mod = sys.modules.get("torch.utils.data._utils.collate")
    table = getattr(mod, "default_collate_fn_map", None) if mod is not None else None
    if not isinstance(table, dict):
        return default_collate_fn_map
    if table != _torch_map_seen:
        effective: dict[Any, CollateFn] = {}
        users = False
        for key, fn in table.items():
            ours = _stock(mod, fn)
            users = users or ours is None
            effective[key] = fn if ours is None else ours
        _torch_map_seen = dict(table)
        _torch_map_effective = effective if users else default_collate_fn_map
    return _torch_map_effective


def _stock(mod: Any, fn: Any) -> CollateFn | None:
    """conveyor's function for one of torch's own entries (or conveyor's, put there in its
    workers), None for a function of the user's."""
    if getattr(fn, "__module__", None) == __name__:
        return fn  # type: ignore[no-any-return]
    name = getattr(fn, "__name__", None)
    if name in _TORCH_STOCK and getattr(mod, name, None) is fn:
        return _TORCH_STOCK[name]
    return None


def numpy_collate(batch: Sequence[Any]) -> Any:
    """Collate like ``default_collate`` but always produce numpy arrays.

    Never imports torch; tensors in the samples are converted with ``.numpy()``.

    >>> numpy_collate([(1, 2.0), (3, 4.0)])
    [array([1, 3]), array([2., 4.])]
    """
    return collate(batch, collate_fn_map=numpy_collate_fn_map)


# --------------------------------------------------------------------------- convert


def default_convert(data: Any) -> Any:
    """Turn numpy arrays and scalars inside ``data`` into tensors, as torch's ``default_convert``.

    Containers are rebuilt (tuples become lists); other leaves are left alone.
    Without torch installed only the containers change.

    >>> default_convert({"x": np.zeros(2), "name": "a"})
    {'x': tensor([0., 0.], dtype=torch.float64), 'name': 'a'}
    """
    if _torch.is_tensor(data):
        return data
    data_type = type(data)
    if data_type.__module__ == "numpy" and data_type.__name__ not in ("str_", "string_"):
        if data_type.__name__ == "ndarray" and data.dtype.kind in "SUO":
            return data
        torch = _load_torch()
        return data if torch is None else torch.as_tensor(data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return data_type(*(default_convert(d) for d in data))
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data
