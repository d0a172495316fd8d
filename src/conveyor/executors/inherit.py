"""Files the main process opened through the dataset, made private to each forked worker.

A common dataset opens its file lazily, in ``__getitem__`` (``if self.f is None: self.f =
open(path)``), so that each of torch's workers opens its own: torch never calls
``__getitem__`` in the main process when it has workers. conveyor's adaptive loader does
(it times the first batches there), so the file is already open when the workers are
forked, and every worker would share one open file description, one offset: one worker's
``seek`` moves the others' reads. Before the main process first makes a batch, the loader
notes which descriptors are open (``open_fds``); a worker forked later reopens each regular
file opened since, at the same descriptor number, flags and offset (``reopen_private``), so
the dataset's file object in the worker reads through its own description, as if the
worker had opened it. Linux only (``/proc/self/fd``); elsewhere nothing is done.
"""

from __future__ import annotations

import os
import stat

from ..transport.segment import is_segment_path

_FD_DIR = "/proc/self/fd"
# reopening must not create, truncate or fail on an existing file
_DROP = os.O_CREAT | os.O_EXCL | os.O_TRUNC | getattr(os, "O_NOCTTY", 0)


def open_fds() -> dict[int, tuple[int, int]] | None:
    """This process's open descriptors, each with its file's identity (device, inode), or None
    where that cannot be told. (A number alone could be closed and reused meanwhile.)"""
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return None
    out = {}
    for name in names:
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):
            continue  # the listing's own descriptor, closed by now
        out[int(name)] = (st.st_dev, st.st_ino)
    return out


def opened_since(before: dict[int, tuple[int, int]] | None) -> tuple[int, ...]:
    """Regular files open now that were not at ``before`` (none when ``before`` is None)."""
    if before is None:
        return ()
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return ()
    out = []
    for name in names:
        try:
            fd = int(name)
            st = os.fstat(fd)
        except (OSError, ValueError):
            continue
        if before.get(fd) != (st.st_dev, st.st_ino) and stat.S_ISREG(st.st_mode) and st.st_nlink > 0:
            if not _ours(fd):
                out.append(fd)
    return tuple(sorted(out))


def _ours(fd: int) -> bool:
    """Is ``fd`` a shared-memory segment of conveyor's own (a batch slot the main process
    has mapped), not a file of the dataset? Counted as the dataset's, with persistent
    workers they would tell "auto" the dataset keeps files open: one fetch thread a worker."""
    try:
        path = os.readlink(f"{_FD_DIR}/{fd}")
    except OSError:
        return False
    return is_segment_path(path)


def reopen_private(fds: tuple[int, ...]) -> None:
    """In a forked child: give each of ``fds`` an open file description of its own."""
    for fd in fds:
        try:
            path = os.readlink(f"{_FD_DIR}/{fd}")
            flags, pos = _flags_and_pos(fd)
            if flags is None or not os.path.isabs(path):
                continue
            fresh = os.open(path, flags & ~_DROP)
            try:
                if pos:
                    os.lseek(fresh, pos, os.SEEK_SET)
                os.dup2(fresh, fd, inheritable=os.get_inheritable(fd))
            finally:
                os.close(fresh)
        except OSError:
            continue  # gone, renamed, or not ours to open: left shared, as it was


def _flags_and_pos(fd: int) -> tuple[int | None, int]:
    flags: int | None = None
    pos = 0
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "flags":
                flags = int(value.strip(), 8)
            elif key == "pos":
                pos = int(value.strip())
    return flags, pos
