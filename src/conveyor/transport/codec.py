"""Encoding a batch tree for the trip from a worker to the main process.

Array leaves (numpy arrays and CPU torch tensors with a numpy dtype) become
:class:`Leaf` records: either a place in a shared-memory slot (large leaves;
zero-copy when collate already wrote them there) or the array itself, pickled
inline (small leaves, where a pickle is cheaper than a mapping). Everything
else (scalars, strings, custom objects) travels as it is, beside them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._tree import tree_map
from ..collate import _dtype_tables, tensor_to_numpy
from .slots import Views, Writer

__all__ = ["Leaf", "Packed", "encode", "decode", "INLINE_BYTES"]

INLINE_BYTES = 1 << 15  # leaves smaller than this travel inline in the message


@dataclass(frozen=True, slots=True)
class Leaf:
    """One array leaf: at ``offset`` in slot ``slot``, or in the message's blob (``slot == -1``)."""

    tensor: bool
    dtype: str
    shape: tuple[int, ...]
    slot: int = -1
    offset: int = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return Leaf, (self.tensor, self.dtype, self.shape, self.slot, self.offset)


@dataclass(frozen=True, slots=True)
class Packed:
    """A batch as it crosses the process boundary."""

    tree: Any
    slots: tuple[tuple[int, str], ...]  # (slot id, segment name) the leaves use
    gen: int
    worker: int
    blob: bytearray | None = None  # the small leaves, back to back

    def __reduce__(self) -> tuple[Any, ...]:
        return Packed, (self.tree, self.slots, self.gen, self.worker, self.blob)


def _as_numpy(obj: Any) -> tuple[np.ndarray, bool] | None:
    if type(obj) is np.ndarray:
        if obj.dtype.hasobject or obj.dtype.kind in "UVSMm":
            return None
        return obj, False
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is torch.Tensor:
        try:
            # one call for a plain CPU tensor; numpy() refuses every other kind (a device,
            # autograd, sparse or quantized tensor, a conj or neg bit, dtypes numpy lacks)
            return obj.numpy(), True
        except (TypeError, RuntimeError):
            pass
        if obj.device.type != "cpu" or obj.requires_grad or obj.is_sparse or obj.is_quantized:
            return None
        if obj.is_conj() or obj.is_neg():
            obj = obj.resolve_conj().resolve_neg()
        try:
            return obj.numpy(), True
        except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks
            return None
    return None


def encode(batch: Any, writer: Writer | None) -> tuple[Any, bytearray | None]:
    """Replace array leaves of ``batch`` with :class:`Leaf` records; small leaves go to a blob."""
    small: list[np.ndarray] = []
    size = 0

    def leaf(obj: Any) -> Any:
        nonlocal size
        got = _as_numpy(obj)
        if got is None:
            return obj
        arr, is_tensor = got
        nbytes = arr.nbytes
        if writer is None or nbytes < INLINE_BYTES:
            small.append(arr)
            offset = size
            size = (size + nbytes + 15) & ~15
            return Leaf(is_tensor, arr.dtype.str, arr.shape, -1, offset)
        if arr.flags.c_contiguous:
            where = writer.locate(arr.__array_interface__["data"][0], nbytes)
            if where is not None:
                return Leaf(is_tensor, arr.dtype.str, arr.shape, slot=where[0], offset=where[1])
        out = writer.alloc(arr.shape, arr.dtype)  # large enough: never refused for size
        if out is None:  # no shared memory to be had: the blob carries it
            small.append(arr)
            offset = size
            size = (size + nbytes + 15) & ~15
            return Leaf(is_tensor, arr.dtype.str, arr.shape, -1, offset)
        np.copyto(out, arr, casting="no")
        where = writer.locate(out.__array_interface__["data"][0], nbytes)
        assert where is not None
        return Leaf(is_tensor, arr.dtype.str, arr.shape, slot=where[0], offset=where[1])

    tree = tree_map(leaf, batch)
    if not small:
        return tree, None
    # each leaf's bytes in C order, padded to 16: one call a leaf (numpy slicing into a
    # preallocated blob took five, each costly with the cold cache a worker has here)
    parts = []
    for arr in small:
        data = arr.tobytes()
        parts.append(data)
        pad = -len(data) & 15
        if pad:
            parts.append(_ZEROS[:pad])
    return tree, bytearray().join(parts)


_ZEROS = bytes(16)


def decode(packed: Packed, views: Views, *, output: str) -> Any:
    """Rebuild the batch in the main process as views over the slots (and the message's blob).

    Each leaf is one or two calls, each cheap with a cold cache (the main process decodes
    right after a training step): ``np.ndarray`` over the buffer, then ``torch.from_numpy``;
    a 1-D tensor is one ``torch.frombuffer``. (Slicing and ``.view`` cost several times
    more there: every torch op goes through the dispatcher.) A leaf's array keeps its slot's
    root array alive, whose finalizer returns the slot once no view is left.
    """
    roots: dict[int, Any] = {}
    for slot_id, name in packed.slots:
        roots[slot_id] = views.root((packed.worker, packed.gen, slot_id), name)
    if packed.blob is not None:
        roots[-1] = packed.blob
    torch = sys.modules.get("torch") if output == "torch" else None
    # numpy dtype string (native order) -> torch dtype: collate's table, built once
    torch_dtypes = _dtype_tables(torch)[1] if torch is not None else {}

    def leaf(obj: Any) -> Any:
        if type(obj) is not Leaf:
            return obj
        buf, shape = roots[obj.slot], obj.shape
        if torch is not None and obj.tensor:
            if len(shape) == 1 and shape[0]:
                tdtype = torch_dtypes.get(obj.dtype)
                if tdtype is not None:
                    return torch.frombuffer(buf, dtype=tdtype, count=shape[0], offset=obj.offset)
            return torch.from_numpy(np.ndarray(shape, _np_dtype(obj.dtype), buffer=buf, offset=obj.offset))
        return np.ndarray(shape, _np_dtype(obj.dtype), buffer=buf, offset=obj.offset)

    return tree_map(leaf, packed.tree)


_np_dtypes: dict[str, np.dtype] = {}


def _np_dtype(name: str) -> np.dtype:
    dtype = _np_dtypes.get(name)
    if dtype is None:
        dtype = _np_dtypes[name] = np.dtype(name)
    return dtype


def to_numpy(batch: Any) -> Any:
    """Turn every torch tensor leaf of ``batch`` into a numpy array (no copy on CPU)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return batch

    def leaf(obj: Any) -> Any:
        return tensor_to_numpy(obj) if isinstance(obj, torch.Tensor) else obj

    return tree_map(leaf, batch)
