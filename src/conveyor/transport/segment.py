"""POSIX shared-memory segments, without the resource tracker.

``multiprocessing.shared_memory`` registers every segment it opens with the
resource tracker (attaching included, before Python 3.13), which unlinks
segments under live readers and warns about "leaks" it caused. conveyor owns
the lifetime of its segments itself: every name starts with a per-loader
prefix, workers unlink what they create, and the main process sweeps the
prefix on close and after a worker dies.
"""

from __future__ import annotations

import mmap
import os
import secrets

try:  # CPython's own binding of shm_open/shm_unlink (POSIX only)
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = ["Segment", "available", "new_prefix", "sweep", "shm_dir_free"]

_SHM_DIR = "/dev/shm"
PAGE = mmap.PAGESIZE


def available() -> bool:
    return _posixshmem is not None


def new_prefix() -> str:
    """A name prefix unique to one loader of this process."""
    return f"conveyor_{os.getpid()}_{secrets.token_hex(4)}_"


def shm_dir_free() -> int | None:
    """Free bytes in /dev/shm, or None where that cannot be told."""
    try:
        st = os.statvfs(_SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def sweep(prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix``; returns how many."""
    if not prefix or _posixshmem is None:
        return 0
    n = 0
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix):
            try:
                _posixshmem.shm_unlink("/" + name)
                n += 1
            except OSError:
                pass
    return n


class Segment:
    """One mapped shared-memory segment.

    >>> seg = Segment.create("conveyor_doc_seg", 4096)
    >>> seg.buf[0] = 7; Segment.attach("conveyor_doc_seg").buf[0]
    7
    >>> seg.unlink(); seg.close()
    True
    """

    __slots__ = ("name", "size", "mm", "buf", "__weakref__")

    def __init__(self, name: str, size: int, mm: mmap.mmap) -> None:
        self.name = name
        self.size = size
        self.mm = mm
        self.buf = memoryview(mm)

    @classmethod
    def create(cls, name: str, size: int, *, prefault: bool = True) -> Segment:
        """Create a segment of ``size`` bytes; raises OSError when /dev/shm is full."""
        if _posixshmem is None:
            raise OSError("POSIX shared memory is not available on this platform")
        size = max(PAGE, -(-size // PAGE) * PAGE)
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            try:
                # posix_fallocate reserves the pages now, so a full /dev/shm fails
                # here with ENOSPC instead of a SIGBUS on first touch later.
                os.posix_fallocate(fd, 0, size)
            except (AttributeError, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno not in (None, 95, 22):  # EOPNOTSUPP, EINVAL
                    raise
                os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            try:
                _posixshmem.shm_unlink("/" + name)
            except OSError:
                pass
            raise
        os.close(fd)
        seg = cls(name, size, mm)
        if prefault:
            seg.prefault()
        return seg

    @classmethod
    def attach(cls, name: str) -> Segment:
        if _posixshmem is None:
            raise OSError("POSIX shared memory is not available on this platform")
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mm)

    def prefault(self) -> None:
        """Touch every page once, so the first batch does not pay page faults."""
        try:
            import numpy as np

            a = np.frombuffer(self.buf, dtype=np.uint8)
            a[::PAGE] = 0
            del a
        except Exception:  # pragma: no cover - best effort
            pass

    def unlink(self) -> None:
        if _posixshmem is not None:
            try:
                _posixshmem.shm_unlink("/" + self.name)
            except FileNotFoundError:
                pass

    def close(self) -> bool:
        """Unmap; returns False (and stays mapped) while views still use it."""
        try:
            self.buf.release()
            self.mm.close()
        except BufferError:
            return False
        return True
