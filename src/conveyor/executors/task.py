"""The envelope every executor speaks: ``Task`` in, ``Result`` out.

The main process makes tasks; workers are pure functions from a task to a
result. ``seq`` numbers batches in the order the user receives them and keeps
growing across epochs of one worker pool, so a late result from an abandoned
epoch is recognised and dropped.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, NamedTuple

from .._platform import signals
from ..errors import Failure

__all__ = ["Task", "Result", "Order", "Hello", "Death", "send", "Inbox", "Readable", "Doorbell", "PollSet"]


class Task(NamedTuple):
    """Fetch ``indices`` (``None``: the next batch of an iterable dataset).

    A named tuple: made for every batch on both sides of a pipe, and ``Task._make`` over
    the plain tuple that crossed it is one C call (a frozen dataclass's ``__init__`` costs
    ~4 us with a cold cache, the state a worker is in between batches)."""

    seq: int
    epoch: int
    indices: list[int] | None
    # a DataPipe's shuffle seed for the epoch, drawn in the main process at iter() as torch's
    # loader draws it (from the loader's generator or the global RNG); None: from the epoch
    seed: int | None = None


@dataclass(slots=True)
class Result:
    """What a worker made of a task."""

    seq: int
    worker: int
    batch: Any = None
    failure: Failure | None = None
    exhausted: int = 0  # an iterable dataset's replica ran out (2: right after an item raised)
    empty: bool = False  # every sample of the batch was skipped
    skipped: tuple[Failure, ...] = ()
    start: float = 0.0
    fetched: float = 0.0
    end: float = 0.0
    retired: tuple[int, ...] = ()  # slots the worker dropped from its pool
    warning: str | None = None
    # CPU seconds the worker spent on it (or over ``cpu_span``), with the seconds it waited
    # for a core (``sched``: CPU demand; only waiting on anything else is not)
    cpu: float | None = None
    nbytes: int | None = None  # bytes of array data in the batch
    rss: int | None = None  # the worker's resident memory, now and then
    # (batches, wall seconds, core seconds) ``cpu`` covers when it spans the worker's last
    # batches, idle time between them included, and the seconds of its core the worker held
    # or waited for meanwhile (``sched.process_clocks``); None: ``cpu`` is this batch's alone
    cpu_span: tuple[int, float, float] | None = None
    samples: int = 0  # samples the batch was made of, skipped ones included (0: not told)
    # lane-seconds of its fetches, when fetch threads made them (ahead of the batch's turn:
    # its own wall time then says little of what a batch costs); None otherwise
    work: float | None = None

    def fields(self) -> tuple[Any, ...]:
        """Every field, in order: ``Result(*r.fields())`` is ``r`` again. A process worker
        sends this plain tuple: pickling it costs a fifth of pickling the object (no class to
        look up and check on either side, no ``__reduce__`` to call)."""
        return (self.seq, self.worker, self.batch, self.failure, self.exhausted, self.empty,
                self.skipped, self.start, self.fetched, self.end, self.retired, self.warning,
                self.cpu, self.nbytes, self.rss, self.cpu_span, self.samples, self.work)

    def __reduce__(self) -> tuple[Any, ...]:
        return Result, self.fields()


@dataclass(frozen=True, slots=True)
class Order:
    """Main -> process worker: tasks to run and slots the main no longer uses."""

    tasks: tuple[Task, ...] = ()
    freed: tuple[int, ...] = ()
    stop: bool = False
    threads: int = 0  # when > 0: fetch this many samples at once from now on
    rng: Any = None  # global RNG states to take over (batches the main process made in its name)

    def __reduce__(self) -> tuple[Any, ...]:
        return Order, (self.tasks, self.freed, self.stop, self.threads, self.rng)


@dataclass(frozen=True, slots=True)
class Hello:
    """Process worker -> main: start-up finished (or failed)."""

    worker: int
    pid: int
    failure: Failure | None = None


@dataclass(frozen=True, slots=True)
class Death:
    """A worker process ended without being asked to."""

    worker: int
    pid: int | None
    exitcode: int | None
    tasks: tuple[Task, ...] = field(default=())
    cause: str | None = None  # why the loader killed it itself (restart_hung), if it did
    stack: str | None = None  # its Python stack just before, when it could tell

    def describe(self) -> str:
        import signal

        code = self.exitcode
        if self.cause is not None:
            how = f"was killed by the loader: {self.cause}"
        elif code is None:
            how = "stopped responding"
        elif code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited unexpectedly with exit code {code}"
        return f"worker {self.worker} (pid {self.pid}) {how}"

    def torch_words(self) -> str:
        """The death as torch's loader words it ("DataLoader worker (pid 12) is killed by
        signal: Killed."), which users and tools match on."""
        import signal

        code = self.exitcode
        if self.cause is not None:
            how = "was killed by the loader"
        elif code is None:
            how = "stopped responding"
        elif code < 0:
            try:
                how = f"is killed by signal: {signal.strsignal(-code) or -code}"
            except ValueError:
                how = f"is killed by signal: {-code}"
        else:
            how = f"exited unexpectedly with exit code {code}"
        return f"DataLoader worker (pid {self.pid}) {how}."


# -- on the wire ----------------------------------------------------------------

# A message is written to a worker's pipe in pieces of at most this, its bell rung after
# each: half a pipe's default capacity, so a piece always fits a pipe the worker has emptied.
PIECE = 1 << 15


def send(conn: Any, msg: Any, bell: Doorbell | None = None, full: Callable[[], None] | None = None) -> None:
    """Send ``msg`` on a multiprocessing Connection as a plain pickle (``recv()`` reads it).

    ``Connection.send`` pickles with ForkingPickler, which costs ~60% more per small
    message and would move a stray torch tensor by file descriptor; conveyor's messages
    carry arrays in shared memory or in their blob, never that way. The frame (a 4-byte
    big-endian length, then the pickle) is Connection's, written with one ``os.write``
    instead of Connection's layers of Python: the main process sends one order per batch.

    With the reader's ``bell``, the bell is rung after each piece of at most ``PIECE``
    bytes. A worker sleeps on its bell only once it has emptied the pipe and holds no part
    of a message (it waits on the pipe while it does): a write larger than the pipe would
    otherwise block for ever on a worker asleep on a bell that rings only after it.

    ``full``: the pipe is non-blocking, and ``full()`` is called while it is full, to wait
    for room (a worker reads its orders meanwhile: see ``serve.Drain``).
    """
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    n = len(data)
    head = n.to_bytes(4, "big") if n < 0x7FFFFFFF else b"\xff\xff\xff\xff" + n.to_bytes(8, "big")
    fd = conn.fileno()
    view = memoryview(head + data)
    if signals.HOLD_SIGPIPE and signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL:
        with signals.no_sigpipe():
            _write(fd, view, bell, full)
    else:
        _write(fd, view, bell, full)


def _write(fd: int, view: memoryview, bell: Doorbell | None, full: Callable[[], None] | None) -> None:
    """Write the whole frame. A Ctrl-C in the middle is raised once the frame is out: a frame
    cut short leaves the worker reading the next orders (the stop, the next epoch's tasks)
    as its rest, and a persistent worker waits for bytes that never come or fails to unpickle."""
    stop: BaseException | None = None
    while view:
        try:
            if full is not None:
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    full()
            elif bell is None:
                view = view[os.write(fd, view):]
            else:
                view = view[os.write(fd, view[:PIECE]):]
                bell.ring()
        except KeyboardInterrupt as e:  # (raised by os.write's retry on EINTR, nothing written)
            stop = stop or e
        except OSError:
            if stop is not None:  # the worker is gone meanwhile: the Ctrl-C is what the caller must see
                raise stop from None
            raise
    if stop is not None:
        raise stop


class Inbox:
    """The messages waiting in a pipe, framed as ``Connection.send`` frames them (a 4-byte
    big-endian length, or -1 and 8 bytes of length, then the pickle), taken many at once:
    one ``os.read`` where ``Connection.recv`` makes two system calls per message and a
    ``poll`` one more to learn whether another follows.

    Every read of the pipe must go through its Inbox: bytes of a message still being
    written wait here for the rest.
    """

    __slots__ = ("fd", "buf", "eof")

    def __init__(self, conn: Any) -> None:
        self.fd = conn.fileno()
        self.buf = bytearray()
        self.eof = False  # the other end is closed (its process is gone)

    def take(self) -> list[Any]:
        """Every complete message, after one read. Call it only when the pipe is readable or
        hung up (``poll`` said so), or is non-blocking, so that the read does not block; at
        the end of the pipe ``eof`` is set (a message cut short there is dropped)."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:  # a non-blocking pipe with nothing in it
            return []
        if not chunk:
            self.eof = True
            return []
        buf = self.buf
        buf += chunk
        out = []
        pos, n = 0, len(buf)
        while n - pos >= 4:
            size = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
            start = pos + 4
            if size == -1:
                if n - pos < 12:
                    break
                size, start = int.from_bytes(buf[pos + 4:pos + 12], "big"), pos + 12
            if n < start + size:
                break  # its writer is still writing it: the rest comes with a later read
            out.append(pickle.loads(buf[start:start + size]))
            pos = start + size
        del buf[:pos]
        return out


class Readable:
    """``readable(timeout)``: has ``conn`` something to read (or hung up)? One poll object per
    connection: ``Connection.poll()`` builds a selector for every call (8x the cost)."""

    __slots__ = ("conn", "poller")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.poller = select.poll() if hasattr(select, "poll") else None
        if self.poller is not None:
            self.poller.register(conn.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)

    def __call__(self, timeout: float = 0.0) -> bool:
        if self.poller is None:  # pragma: no cover - no poll() on this OS
            return bool(self.conn.poll(timeout))
        return bool(self.poller.poll(max(0, int(timeout * 1000))))


class Doorbell:
    """What wakes a process worker waiting for orders: a Linux eventfd beside the pipe
    that carries them. The main process writes an order, then rings; the worker sleeps on
    the bell alone and reads the pipe once it rings.

    A write to a pipe wakes its reader *synchronously*: the kernel takes it that the writer
    is about to sleep, and puts the reader on the writer's core if that core runs nothing
    else. The main process writes an order and goes on training, so a worker woken by the
    pipe wakes behind the training loop, on its core, preempting it, while the other core
    can sit idle until the load balancer moves the worker (milliseconds;
    docs/decisions/doorbell-eventfd-for-orders.md). An eventfd's wake-up carries no such
    hint: the worker wakes where it last ran, or wherever is idle.
    """

    __slots__ = ("fd", "poller")

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.poller: Any = None

    @classmethod
    def make(cls) -> Doorbell | None:
        """A new bell, or None where there is no eventfd (not Linux): the pipe wakes then."""
        if not hasattr(os, "eventfd") or not hasattr(select, "poll"):
            return None
        try:
            return cls()
        except OSError:
            return None

    def ring(self) -> None:
        if self.fd < 0:
            return
        try:
            os.eventfd_write(self.fd, 1)
        except OSError:  # the count is full: it has been rung already
            pass

    def wait(self, timeout: float) -> bool:
        """Sleep until rung or ``timeout`` seconds; True (and silent again) when rung."""
        if self.poller is None:
            self.poller = select.poll()
            self.poller.register(self.fd, select.POLLIN)
        if not self.poller.poll(max(0, int(timeout * 1000))):
            return False
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:  # pragma: no cover - only this process reads it
            pass
        return True

    def close(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1  # (-1 also for one whose __init__ was cut short)
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        # a close cut short by a Ctrl-C (after the worker's pipes, before its bell) would leave
        # the descriptor open once its worker is forgotten: the bell owns it, and closes it last
        try:
            self.close()
        except OSError:
            pass


class PollSet:
    """Every process worker's result pipe and sentinel in one poll set, kept across waits
    (``ready``): a worker that dies is seen the moment the main process waits. Where there is
    no ``select.poll``, the wait list is built at each wait."""

    def __init__(self) -> None:
        self.poller = select.poll() if hasattr(select, "poll") else None
        self.fds: dict[int, tuple[int, bool]] = {}  # fd -> (worker, is its sentinel)

    def ready(self, workers: list[Any], timeout: float | None) -> list[tuple[int, bool]]:
        """(worker, is its sentinel) for every pipe or sentinel ready within ``timeout``."""
        if self.poller is None:  # no select.poll here: build the wait list each time
            conns: dict[Any, tuple[int, bool]] = {}
            for w, wk in enumerate(workers):
                if wk is not None:
                    conns[wk.results] = (w, False)
                    conns[wk.proc.sentinel] = (w, True)
            return [conns[obj] for obj in wait(list(conns), timeout)] if conns else []
        if not self.fds:
            return []
        ms = -1 if timeout is None else max(0, math.ceil(timeout * 1000))
        while True:
            try:
                ready = self.poller.poll(ms)
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries on its own
                continue
        return [self.fds[fd] for fd, _ in ready if fd in self.fds]

    def watch(self, w: int, wk: Any) -> None:
        if self.poller is not None:
            for fd, sentinel in ((wk.results.fileno(), False), (wk.proc.sentinel, True)):
                self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
                self.fds[fd] = (w, sentinel)

    def unwatch(self, workers: list[Any], wk: Any) -> None:
        if self.poller is not None:
            for fd in [fd for fd, (w, _) in self.fds.items() if workers[w] is wk]:
                self.poller.unregister(fd)
                del self.fds[fd]
