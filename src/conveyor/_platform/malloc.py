"""Process-wide: glibc's malloc thresholds, through ctypes. In conveyor's own worker
processes they are fixed (``mallopt``: ``steady_malloc``); in the main process, glibc's own
dynamic thresholds are raised as freeing a batch would raise them (``as_if_freed``).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["WORKER_HEAP_KEEP_MB", "as_if_freed", "steady_malloc"]

# MB of freed heap a process worker keeps instead of handing it back to the kernel (0: glibc's
# own heuristics). See ``steady_malloc``.
WORKER_HEAP_KEEP_MB = int(os.environ.get("CONVEYOR_WORKER_HEAP_KEEP_MB", "64"))


def steady_malloc(keep_mb: int = WORKER_HEAP_KEEP_MB) -> bool:
    """Keep glibc from returning freed batch memory to the kernel in this process (a worker).

    A collate_fn that calls ``torch.stack`` itself allocates each batch with malloc. Left to its
    dynamic thresholds, glibc sometimes hands the freed batch back to the kernel (a trim, or an
    mmap'd chunk) and faults every page of the next batch in again, and sometimes reuses it:
    which one depends on the heap's history, so the same run is fast or slow by chance
    (docs/decisions/fixed-malloc-thresholds-in-workers.md). Fixing the thresholds at
    the values glibc's own heuristic may reach (mmap above ``keep_mb``/2, at most 32 MB; trim
    above ``keep_mb``) makes the reuse certain, for at most ``keep_mb`` of idle heap per worker.
    Only in conveyor's own worker processes, never the user's; a malloc the user tuned through
    the environment is left as it is. True when the thresholds were set."""
    if keep_mb <= 0 or "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ \
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own allocator stays
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    keep = keep_mb << 20
    return bool(mallopt(m_mmap_threshold, min(keep // 2, 32 << 20))) and bool(mallopt(m_trim_threshold, keep))


_libc: Any = None  # glibc's malloc and free (False: another C library)


def as_if_freed(nbytes: int) -> None:
    """Tell glibc's malloc what freeing a batch of ``nbytes`` would have told it.

    Freeing a large (mmapped) chunk makes glibc raise its mmap threshold to that size and
    its trim threshold to twice it, so that the heap stops going back to the kernel after
    every batch. A kept buffer is never freed, so that does not happen on its own: each
    batch's samples are faulted in anew (docs/decisions/recycle-large-batch-memory.md).
    Freeing a chunk of the same size, never touched, does it (glibc does nothing where the user has
    set the thresholds, or past its 32 MB cap)."""
    global _libc
    if _libc is None:
        _libc = False
        try:
            import ctypes
            import platform

            if platform.libc_ver()[0] == "glibc":
                lib = ctypes.CDLL(None)
                lib.malloc.restype, lib.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
                lib.free.restype, lib.free.argtypes = None, [ctypes.c_void_p]
                _libc = lib
        except (OSError, AttributeError):
            pass
    if _libc:
        _libc.free(_libc.malloc(nbytes))
