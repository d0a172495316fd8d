"""Process-wide: glibc's malloc thresholds fixed (``mallopt`` through ctypes), in
conveyor's own worker processes only (``steady_malloc``).
"""

from __future__ import annotations

import os

__all__ = ["WORKER_HEAP_KEEP_MB", "steady_malloc"]

# MB of freed heap a process worker keeps instead of handing it back to the kernel (0: glibc's
# own heuristics). See ``steady_malloc``.
WORKER_HEAP_KEEP_MB = int(os.environ.get("CONVEYOR_WORKER_HEAP_KEEP_MB", "64"))


def steady_malloc(keep_mb: int = WORKER_HEAP_KEEP_MB) -> bool:
    """Keep glibc from returning freed batch memory to the kernel in this process (a worker).

    A collate_fn that calls ``torch.stack`` itself allocates each batch with malloc. Left to its
    dynamic thresholds, glibc sometimes hands the freed batch back to the kernel (a trim, or an
    mmap'd chunk) and faults every page of the next batch in again, and sometimes reuses it:
    which one depends on the heap's history, so whole runs split in two (detection, batch 16
    of 3x256x256: 0.06 s or 0.25 s for 256 batches with 2 workers). Fixing the thresholds at
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
