"""Encoding a batch tree for the trip from a worker to the main process.

Array leaves (numpy arrays and CPU torch tensors; a dtype numpy lacks, such as
bfloat16 or float8, travels as its bytes) become
:data:`Leaf` records: either a place in a shared-memory slot (large leaves;
zero-copy when collate already wrote them there) or the array itself, inline in
the message's blob (small leaves, where a copy is cheaper than a mapping).
Everything else (scalars, strings, custom objects) travels as it is, beside them.

The message is built of plain tuples, lists and numbers only: pickling an object
of a class of ours costs a class lookup on each side and a ``__reduce__`` call
(a batch of one small tensor: ~25 us of a worker's CPU with a cold cache, against
~4 us for the same fields as tuples).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import _torch
from .._tree import tree_map
from ..tensors import dtype_tables, tensor_to_numpy
from .slots import Views, Writer

__all__ = ["Leaf", "Packed", "TensorLater", "encode", "decode", "INLINE_BYTES"]

INLINE_BYTES = 1 << 15  # leaves smaller than this travel inline in the message
# ... and so do leaves up to SIDE_BYTES beside SIDE_SHARE times as much in shared memory: a slot
# goes back to its worker only once no view of it is left, so keeping a batch's labels or
# ids (epoch-end metrics) would keep its images too (docs/decisions/small-leaves-travel-beside-large.md)
SIDE_BYTES = 1 << 20
SIDE_SHARE = 8
SAME = -2  # a record's slot: the leaf is an earlier one, the object itself
_TORCH = "t"  # a record's dtype "t<name>": a torch dtype numpy lacks (numpy's begin <, >, | or =)

# One array leaf: (is a torch tensor, numpy dtype string, shape, slot id, offset), at
# ``offset`` in slot ``slot`` or in the message's blob (``slot == -1``). A tensor sent in its
# own memory order has, for "is a torch tensor", the permutation that ordered it. A leaf
# that is the very object of an earlier one has ``slot == SAME`` and that leaf's index as
# its offset: it comes back as that object, as a pickle's memo gives it back
# (``{"input_ids": ids, "labels": ids}``: an in-place edit of one is an edit of both).
Leaf = tuple[bool | tuple[int, ...], str, tuple[int, ...], int, int]


class Packed(NamedTuple):
    """A batch as it crosses the process boundary (sent as the plain tuple of its fields).

    ``tree`` is the batch with each array leaf replaced by None; ``holes`` are the positions
    of those leaves among all of the tree's leaves (``tree_map`` order), ``leaves`` their
    records, in the same order."""

    tree: Any
    holes: tuple[int, ...]
    leaves: tuple[Leaf, ...]
    slots: tuple[tuple[int, str], ...]  # (slot id, segment name) the leaves use
    gen: int
    worker: int
    blob: bytearray | None = None  # the small leaves, back to back


class TensorLater(np.ndarray):
    """A numpy array the main process receives as a tensor (``torch.from_numpy`` of it): what a
    worker that has not imported torch sends where the batch is tensors (``executors.torchless``).
    Only a marker for ``encode``: a view, made for the trip."""


def _as_numpy(obj: Any) -> tuple[np.ndarray, bool | str] | None:
    """``obj``'s memory as a numpy array and what it was: False (an array), True (a tensor),
    or the record's dtype of a tensor whose dtype numpy lacks, sent as its bytes."""
    if type(obj) is np.ndarray:
        if obj.dtype.hasobject or obj.dtype.kind in "UVSMm":
            return None
        return obj, False
    if type(obj) is TensorLater:
        return obj.view(np.ndarray), True
    torch = _torch.loaded()
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
            pass
        if obj.layout != torch.strided or obj.is_nested:
            return None
        # its bytes, as uint8 (pickle, the way left, copies bfloat16 through the pipe and
        # cannot rebuild float8 or complex32 at all); the record names the torch dtype
        try:
            raw = obj.contiguous().reshape(-1).view(torch.uint8).numpy()
        except (TypeError, RuntimeError):
            return None
        return raw, _TORCH + str(obj.dtype).removeprefix("torch.")
    return None


def encode(batch: Any, writer: Writer | None) -> tuple[Any, tuple[int, ...], tuple[Leaf, ...], bytearray | None]:
    """Take the array leaves out of ``batch``: (the tree with None in their place, their
    positions, their :data:`Leaf` records, the blob of the small ones)."""
    small: list[np.ndarray] = []
    size = 0
    holes: list[int] = []
    records: list[Leaf] = []
    shared: list[tuple[int, np.ndarray]] = []  # (record, array) of each leaf put in a slot
    seen: dict[int, int] = {}  # id of an array leaf -> its record (the batch keeps each alive)
    pos = -1

    def leaf(obj: Any) -> Any:
        nonlocal size, pos
        pos += 1
        first = seen.get(id(obj))
        if first is not None:  # the same object again: sent once
            holes.append(pos)
            records.append((False, "", (), SAME, first))
            return None
        got = _as_numpy(obj)
        if got is None:
            return obj
        seen[id(obj)] = len(records)
        arr, kind = got
        if kind is True and arr.ndim > 1 and not arr.flags.c_contiguous:
            # a channels_last or transposed tensor (batch_size=None): its memory in its own
            # order, and the permutation that gives it back its strides, as torch's pickle does
            strides = arr.strides
            perm = tuple(sorted(range(arr.ndim), key=lambda d: -strides[d]))
            inner = arr.transpose(perm)
            if inner.flags.c_contiguous:
                arr, kind = inner, perm
        nbytes = arr.nbytes
        holes.append(pos)
        where = _in_slot(arr, nbytes, writer) if writer is not None and nbytes >= INLINE_BYTES else None
        if where is None:  # small, or no shared memory to be had: the blob carries it
            small.append(arr)
            where = (-1, size)
            size = (size + nbytes + 15) & ~15
        else:
            shared.append((len(records), arr))
        if kind.__class__ is str:  # a dtype numpy lacks: its bytes, the tensor's shape
            records.append((True, kind, tuple(obj.shape), where[0], where[1]))
        else:
            records.append((kind, _dtype_str(arr.dtype), arr.shape, where[0], where[1]))
        return None

    tree = tree_map(leaf, batch)
    if len(shared) > 1:
        total = sum(arr.nbytes for _, arr in shared)
        for k, arr in shared:
            if arr.nbytes <= SIDE_BYTES and arr.nbytes * SIDE_SHARE <= total:
                small.append(arr)  # a side leaf: its own copy, which keeps no slot (SIDE_BYTES)
                records[k] = records[k][:3] + (-1, size)
                size = (size + arr.nbytes + 15) & ~15
    if not small:
        return tree, tuple(holes), tuple(records), None
    if len(small) == 1:
        # one copy, in C order, through the buffer protocol: bytearray(arr) itself would read
        # a 0-d integer array as a length (its __index__), giving that many zero bytes
        return tree, tuple(holes), tuple(records), bytearray(memoryview(small[0]))
    # each leaf's bytes in C order, padded to 16: one call a leaf (numpy slicing into a
    # preallocated blob takes five, each costly with the cold cache a worker has here)
    parts = []
    for arr in small:
        data = arr.tobytes()
        parts.append(data)
        pad = -len(data) & 15
        if pad:
            parts.append(_ZEROS[:pad])
    return tree, tuple(holes), tuple(records), bytearray().join(parts)


def _in_slot(arr: np.ndarray, nbytes: int, writer: Writer) -> tuple[int, int] | None:
    """(slot id, offset) of a large leaf: where collate wrote it, else a copy put there;
    None when no shared memory is to be had."""
    if arr.flags.c_contiguous:
        where = writer.locate(arr.__array_interface__["data"][0], nbytes)
        if where is not None:
            return where
    out = writer.alloc(arr.shape, arr.dtype)  # large enough: never refused for size
    if out is None:
        return None
    np.copyto(out, arr, casting="no")
    where = writer.locate(out.__array_interface__["data"][0], nbytes)
    assert where is not None
    return where


_ZEROS = bytes(16)
# id(dtype) -> (dtype, its ``str``): ``dtype.str`` builds a new string at each call (~5 us
# with a cold cache); the entry holds the dtype, so no other dtype can take its id
_dtype_strs: dict[int, tuple[np.dtype, str]] = {}


def _dtype_str(dtype: np.dtype) -> str:
    got = _dtype_strs.get(id(dtype))
    if got is not None and got[0] is dtype:
        return got[1]
    if len(_dtype_strs) > 256:  # dtypes made on the fly (structured ones): keep it small
        _dtype_strs.clear()
    text = dtype.str
    _dtype_strs[id(dtype)] = (dtype, text)
    return text


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
    torch = _torch.loaded() if output == "torch" else None
    if torch is None and output == "torch" and any(rec[0] for rec in packed.leaves):
        # the worker made tensors in a process that has not imported torch yet (a script
        # of numpy datasets): they stay tensors, as without workers
        torch = _torch.get()
    # numpy dtype string (native order) -> torch dtype: collate's table, built once
    torch_dtypes = dtype_tables(torch)[1] if torch is not None else {}

    def array(rec: Leaf) -> Any:
        is_tensor, dtype, shape, slot, offset = rec
        buf = roots[slot]
        if is_tensor.__class__ is tuple:  # kept in its own memory order (see encode)
            # (not a call of array(): a closure calling itself is a cycle, and it would keep
            # ``roots``, so every slot of the batch, until the cyclic collector ran)
            return _reordered(buf, dtype, shape, offset, is_tensor, torch)
        if dtype[0] == _TORCH:
            return _torch_bytes(buf, dtype, shape, offset)
        if torch is not None and is_tensor:
            if len(shape) == 1 and shape[0]:
                tdtype = torch_dtypes.get(dtype)
                if tdtype is not None:
                    return torch.frombuffer(buf, dtype=tdtype, count=shape[0], offset=offset)
            return torch.from_numpy(np.ndarray(shape, _np_dtype(dtype), buffer=buf, offset=offset))
        return np.ndarray(shape, _np_dtype(dtype), buffer=buf, offset=offset)

    holes, records = packed.holes, packed.leaves
    tree = packed.tree
    if tree is None and holes == (0,):
        return array(records[0])  # the batch is one array
    if not holes:
        return tree
    cls = tree.__class__
    if (cls is list or cls is tuple) and len(holes) == len(tree) and holes[-1] == len(tree) - 1:
        # a plain list or tuple of arrays ((images, labels)): no walk of the tree. Its holes
        # are 0..n-1 only if every item is a leaf (an item that is a container has as many
        # positions as it has leaves), and those are arrays only if each is None here
        if all(item is None for item in tree) and all(rec[3] != SAME for rec in records):
            out = [array(rec) for rec in records]
            return out if cls is list else tuple(out)
    pos, k = -1, 0
    made: list[Any] = []  # the leaves so far, by record

    def leaf(obj: Any) -> Any:
        nonlocal pos, k
        pos += 1
        if k < len(holes) and holes[k] == pos:
            rec = records[k]
            k += 1
            out = made[rec[4]] if rec[3] == SAME else array(rec)
            made.append(out)
            return out
        return obj

    return tree_map(leaf, tree)


def _reordered(buf: Any, dtype: str, shape: tuple[int, ...], offset: int, perm: tuple[int, ...], torch: Any) -> Any:
    """A tensor sent in its own memory order (``shape`` permuted by ``perm``), its strides back."""
    inv = tuple(int(d) for d in np.argsort(perm))
    arr = np.ndarray(shape, _np_dtype(dtype), buffer=buf, offset=offset)
    return torch.from_numpy(arr).permute(inv) if torch is not None else arr.transpose(inv)


def _torch_bytes(buf: Any, dtype: str, shape: tuple[int, ...], offset: int) -> Any:
    """A tensor of a dtype numpy lacks (``"t" + its torch name``) over its bytes in ``buf``."""
    torch = _torch.get()
    tdtype = getattr(torch, dtype[1:])
    n = math.prod(shape)
    if not n:
        return torch.empty(shape, dtype=tdtype)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=n * tdtype.itemsize, offset=offset)
    return raw.view(tdtype).view(shape)


_np_dtypes: dict[str, np.dtype] = {}


def _np_dtype(name: str) -> np.dtype:
    dtype = _np_dtypes.get(name)
    if dtype is None:
        dtype = _np_dtypes[name] = np.dtype(name)
    return dtype


def to_numpy(batch: Any) -> Any:
    """Turn every torch tensor leaf of ``batch`` into a numpy array (no copy on CPU)."""
    torch = _torch.loaded()
    if torch is None:
        return batch

    def leaf(obj: Any) -> Any:
        return tensor_to_numpy(obj) if isinstance(obj, torch.Tensor) else obj

    return tree_map(leaf, batch)
