"""POSIX shared-memory segments, without the resource tracker.

``multiprocessing.shared_memory`` registers every segment it opens with the
resource tracker (attaching included, before Python 3.13), which unlinks
segments under live readers and warns about "leaks" it caused. conveyor owns
the lifetime of its segments itself: every name starts with a per-loader
prefix, workers unlink what they create, and the main process sweeps the
prefix on close and after a worker dies. What no one was left to unlink (a
process group killed at once) goes when the next process starts workers
(``sweep_stale``: the prefix names the process and its PID namespace).
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
from collections.abc import Callable

try:  # CPython's own binding of shm_open/shm_unlink (POSIX only)
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = ["Segment", "available", "is_segment_path", "new_prefix", "sweep", "sweep_stale", "shm_dir_free"]

_SHM_DIR = "/dev/shm"
PAGE = mmap.PAGESIZE


def available() -> bool:
    return _posixshmem is not None


def _pid_namespace() -> str:
    """This process's PID namespace ("" where it cannot be told): a pid in a name means a
    process only within it (containers sharing /dev/shm each count their own pids)."""
    try:
        return format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except (OSError, AttributeError):
        return ""


_NAMESPACE = _pid_namespace()


def new_prefix() -> str:
    """A name prefix unique to one loader of this process: its pid, its PID namespace and a
    random token (``sweep_stale`` reads the first two)."""
    return f"conveyor_{os.getpid()}_{_NAMESPACE or '0'}_{secrets.token_hex(4)}_"


def is_segment_path(path: str) -> bool:
    """Is ``path`` (a file's, as ``/proc/self/fd`` names it) one of conveyor's segments?"""
    return os.path.dirname(path) == _SHM_DIR and os.path.basename(path).startswith("conveyor_")


def _dead_owner(name: str) -> bool:
    """Was ``name`` made by a loader of a process of this PID namespace that is gone?"""
    parts = name.split("_", 4)
    if len(parts) < 5 or parts[0] != "conveyor" or not parts[1].isdigit() or parts[2] != _NAMESPACE:
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def sweep_stale(dirs: tuple[str, ...] | None = None) -> int:
    """Remove the segments and stack files that loaders of dead processes left: a process
    group killed at once (SIGKILL to every process: a job scheduler, ``timeout -s KILL``)
    leaves no one to unlink them, and /dev/shm is memory. Only this user's entries of this
    PID namespace whose process no longer exists; returns how many were removed."""
    if not _NAMESPACE:
        return 0
    if dirs is None:
        import tempfile

        dirs = (_SHM_DIR, tempfile.gettempdir())
    uid = os.geteuid()
    n = 0
    for folder in dirs:
        try:
            names = [e for e in os.listdir(folder) if e.startswith("conveyor_")]
        except OSError:
            continue
        for name in names:
            if folder != _SHM_DIR and not name.endswith(".stack"):
                continue
            path = os.path.join(folder, name)
            try:
                if os.stat(path).st_uid != uid or not _dead_owner(name):
                    continue
                os.unlink(path)
                n += 1
            except OSError:
                pass
    return n


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


def _reserve(fd: int, size: int) -> None:
    """Size a new segment's file to ``size``, reserving its pages where the file system can:
    out of memory (a full /dev/shm) fails here with ENOSPC instead of a SIGBUS at the first
    touch later. Where it cannot (EOPNOTSUPP, EINVAL), the file is only sized."""
    try:
        os.posix_fallocate(fd, 0, size)
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (None, 95, 22):
            raise
        os.ftruncate(fd, size)


class Segment:
    """One mapped shared-memory segment.

    >>> seg = Segment.create("conveyor_doc_seg", 4096)
    >>> seg.buf[0] = 7; Segment.attach("conveyor_doc_seg").buf[0]
    7
    >>> seg.unlink(); seg.close()
    True
    """

    __slots__ = ("name", "size", "mm", "buf", "fd", "__weakref__")

    def __init__(self, name: str, size: int, mm: mmap.mmap, fd: int = -1) -> None:
        self.name = name
        self.size = size
        self.mm = mm
        self.buf = memoryview(mm)
        self.fd = fd  # a segment without a name is reached through its descriptor

    @classmethod
    def anonymous(cls, size: int, fill: Callable[[int], None] | None = None) -> Segment:
        """A segment no name leads to: only its descriptor (``fd``, kept open) and mappings
        reach it, and it goes with the last of them, however the processes end. memfd_create
        where there is one (Linux; outside /dev/shm's size limit too), else a name of this
        process unlinked at once (``sweep_stale`` finds one a kill left in between).

        ``fill(fd)``, where given, writes the contents through the descriptor before the
        mapping is made: the kernel allocates each page as it writes it, where a copy through
        the mapping faults every page in (docs/decisions/copy-while-workers-start.md), and the
        mapping stays unfaulted here until read."""
        if _posixshmem is None and not hasattr(os, "memfd_create"):
            raise OSError("POSIX shared memory is not available on this platform")
        size = max(PAGE, -(-size // PAGE) * PAGE)
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("conveyor", getattr(os, "MFD_CLOEXEC", 0))
        else:  # pragma: no cover - macOS, the BSDs
            name = new_prefix() + "anon"
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            _posixshmem.shm_unlink("/" + name)
        try:
            if fill is None:
                _reserve(fd, size)
            else:
                os.ftruncate(fd, size)
                fill(fd)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls("", size, mm, fd)

    @classmethod
    def from_fd(cls, fd: int, size: int) -> Segment:
        """Map a segment passed as a descriptor copy-on-write: its pages are read where they
        are, and a write makes a private copy of the page written (the caller keeps ``fd``)."""
        return cls("", size, mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE))

    @classmethod
    def create(cls, name: str, size: int, *, prefault: bool = True) -> Segment:
        """Create a segment of ``size`` bytes; raises OSError when /dev/shm is full."""
        if _posixshmem is None:
            raise OSError("POSIX shared memory is not available on this platform")
        size = max(PAGE, -(-size // PAGE) * PAGE)
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            _reserve(fd, size)
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
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
            try:
                size = os.fstat(fd).st_size
                mm = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                exc.add_note("Each batch from a process worker that is still held maps a shared-memory "
                             "segment, and each mapping keeps a file descriptor: hold fewer batches (copy "
                             "those you keep with .clone()), or raise the limit (ulimit -n).")
            raise
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
