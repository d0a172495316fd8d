"""CPU demand clocks: CPU time plus the time spent runnable but not running.

A fetch on a machine whose cores are busy with other work (another job, more
processes than cores) waits for a core as well as computing. Its CPU time alone
over its wall time then reads low, as a fetch waiting on storage does, and "auto"
gives a computing worker the fetch threads of one that waits
(docs/decisions/tuner-reads-lane-time-and-core-share.md). Time spent waiting for a
core is CPU demand, not waiting on storage: Linux's schedstat says how much (its
second field, nanoseconds runnable on a run queue). Elsewhere the clocks are plain
CPU time.
"""

from __future__ import annotations

import os
import threading
import time

from .._platform import process

_TASKS = "/proc/self/task"


def read_small(path: str, size: int = 1 << 16) -> bytes | None:
    """A small kernel file's bytes (up to ``size``); None where it cannot be read. ``os.open``,
    not ``open()``: no file object to build (8-15 us a read where ``open()`` takes 15-80, its
    first call in a process the most), and bytes: a text file's codec lookup imports
    encodings.ascii, ~0.5 ms of a fresh process's first loader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _queued(path: str) -> int | None:
    """Nanoseconds the task of ``path`` (a schedstat file) spent runnable, not running."""
    raw = read_small(path, 256)
    try:
        return None if raw is None else int(raw.split()[1])
    except (ValueError, IndexError):
        return None


def runqueue_wait() -> float | None:
    """Seconds this thread has spent runnable but not running; None where that is unknown."""
    ns = _queued("/proc/thread-self/schedstat")
    return None if ns is None else ns / 1e9


class _Waits:
    """Run-queue waits of this process's threads, kept as running totals across reads.

    A thread that ended takes its schedstat with it: summed over the live threads, the
    clock would step back whenever "auto" replaces a worker's fetch threads (a span reads
    negative CPU, and the tuner takes the worker for one that computes nothing). Each read
    adds what every live thread waited since the last read instead (a new thread: all of
    it), so the totals only grow; an ended thread's waits since its last read are lost."""

    __slots__ = ("lock", "seen", "total", "most")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}  # nanoseconds each thread had waited at the last read
        self.total = 0  # nanoseconds waited, added up over threads
        self.most = 0  # nanoseconds: between two reads, the longest wait of one thread, added up

    def read(self) -> tuple[int, int]:
        try:
            tids = os.listdir(_TASKS)
        except OSError:
            return self.total, self.most
        now = {tid: _queued(f"{_TASKS}/{tid}/schedstat") or 0 for tid in tids}
        with self.lock:
            seen = self.seen
            steps = [max(0, ns - seen.get(tid, 0)) for tid, ns in now.items()]
            self.total += sum(steps)
            self.most += max(steps, default=0)
            self.seen = now
            return self.total, self.most


_waits = _Waits()


def _forked() -> None:
    global _waits
    _waits = _Waits()  # a new process: other threads, and a lock no thread of it holds


process.on_fork_child(_forked)


def _process_queued() -> tuple[int, int]:
    """Nanoseconds this process's threads have spent runnable but not running: added up,
    and (over the stretches between reads) the most of any one thread. Both only grow."""
    return _waits.read()


def thread_demand() -> float:
    """This thread's CPU seconds, plus the seconds it waited for a core."""
    return time.thread_time() + (runqueue_wait() or 0.0)


def process_demand() -> float:
    """This process's CPU seconds, plus the seconds its threads waited for a core."""
    return time.process_time() + _process_queued()[0] / 1e9


def process_clocks() -> tuple[float, float]:
    """``process_demand()``, and the seconds of a core the process held or waited for: its
    CPU seconds plus the longest wait of any one thread.

    Each fetch's own wait for a core is CPU demand of that fetch (the first clock), but
    its threads wait at once: many fetch threads that wake together queue behind each
    other, and their waits added up come to seconds a second. Read as the share of its
    core a worker used, that asks for fewer threads on a core that is idle between the
    wake-ups. The longest wait of one thread is a share a core could have had (a lower
    bound of the time any thread waited)."""
    total, most = _process_queued()
    cpu = time.process_time()
    return cpu + total / 1e9, cpu + most / 1e9
