"""torch and numpy side by side, without importing torch: the dtypes that share a memory
layout, a tensor as a numpy array, and a registry key that stands for ``torch.Tensor``.

    dtype_tables(torch) --> ({torch dtype: numpy dtype}, {numpy dtype.str: torch dtype})
    torch_dtype_to_numpy(dtype), numpy_dtype_to_torch(dtype): one dtype at a time
    tensor_to_numpy(t)  --> np.ndarray (no copy for a plain CPU tensor)
    AnyTensor           --> isinstance(x, AnyTensor) is isinstance(x, torch.Tensor), torch unimported
"""

from __future__ import annotations

import abc
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor import _torch

if TYPE_CHECKING:
    import torch as torch_types

__all__ = ["AnyTensor", "dtype_tables", "numpy_dtype_to_torch", "sparse_layouts", "tensor_to_numpy",
           "torch_dtype_to_numpy"]


class AnyTensor(abc.ABC):
    """Registry key that matches every ``torch.Tensor`` without importing torch.

    >>> isinstance([1], AnyTensor)
    False
    """

    @classmethod
    def __subclasshook__(cls, sub: type) -> bool:
        torch = _torch.loaded()
        tensor = getattr(torch, "Tensor", None) if torch is not None else None
        if isinstance(tensor, type) and issubclass(sub, tensor):
            return True
        return NotImplemented


_SPARSE_LAYOUT_NAMES = ("sparse_coo", "sparse_csr", "sparse_bsr", "sparse_csc", "sparse_bsc")
_sparse_layouts: frozenset[Any] | None = None


def sparse_layouts(torch: ModuleType) -> frozenset[Any]:
    """torch's sparse layouts (those this torch has), which collate refuses."""
    global _sparse_layouts
    if _sparse_layouts is None:
        _sparse_layouts = frozenset(
            getattr(torch, name) for name in _SPARSE_LAYOUT_NAMES if hasattr(torch, name)
        )
    return _sparse_layouts


_DTYPE_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
)  # fmt: skip
_torch_to_numpy: dict[Any, np.dtype] | None = None
_numpy_to_torch: dict[str, Any] | None = None


def dtype_tables(torch: ModuleType) -> tuple[dict[Any, np.dtype], dict[str, Any]]:
    """The dtypes torch and numpy share a memory layout for: {torch dtype: numpy dtype} and
    {numpy dtype.str: torch dtype}, built at the first call.

    >>> import torch
    >>> dtype_tables(torch)[0][torch.int16]
    dtype('int16')
    """
    global _torch_to_numpy, _numpy_to_torch
    if _torch_to_numpy is None or _numpy_to_torch is None:
        t2n: dict[Any, np.dtype] = {}
        n2t: dict[str, Any] = {}
        for name in _DTYPE_NAMES:
            tdt = getattr(torch, name, None)
            if tdt is None:
                continue
            ndt = np.dtype(name)
            t2n[tdt] = ndt
            n2t[ndt.str] = tdt
        _torch_to_numpy, _numpy_to_torch = t2n, n2t
    return _torch_to_numpy, _numpy_to_torch


def torch_dtype_to_numpy(dtype: torch_types.dtype) -> np.dtype | None:
    """The numpy dtype that shares ``dtype``'s memory layout, or None (bfloat16, ...).

    >>> import torch
    >>> torch_dtype_to_numpy(torch.float32)
    dtype('float32')
    """
    torch = _torch.loaded()
    return None if torch is None else dtype_tables(torch)[0].get(dtype)


def numpy_dtype_to_torch(dtype: np.dtype | type | str) -> torch_types.dtype | None:
    """The torch dtype for a native-byte-order numpy dtype, or None (also without torch).

    >>> numpy_dtype_to_torch(np.int64)
    torch.int64
    """
    torch = _torch.get()
    if torch is None:
        return None
    try:
        key = np.dtype(dtype).str
    except TypeError:
        return None
    return dtype_tables(torch)[1].get(key)


def tensor_to_numpy(t: Any) -> np.ndarray:
    """A tensor as a numpy array: no copy for a plain CPU tensor; detached, moved to the CPU,
    and widened where numpy lacks the dtype (bfloat16 -> float32) otherwise.

    >>> import torch
    >>> tensor_to_numpy(torch.ones(2, dtype=torch.bfloat16, requires_grad=True)).dtype
    dtype('float32')
    """
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    try:
        return t.numpy()
    except TypeError:
        return t.float().numpy()
