"""The envelope every executor speaks: ``Task`` in, ``Result`` out.

The main process makes tasks; workers are pure functions from a task to a
result. ``seq`` numbers batches in the order the user receives them and keeps
growing across epochs of one worker pool, so a late result from an abandoned
epoch is recognised and dropped.
"""

from __future__ import annotations

import pickle
import select
from dataclasses import dataclass, field
from typing import Any

from ..errors import Failure

__all__ = ["Task", "Result", "Order", "Hello", "Death", "send", "Readable"]


@dataclass(frozen=True, slots=True)
class Task:
    """Fetch ``indices`` (``None``: the next batch of an iterable dataset)."""

    seq: int
    epoch: int
    indices: list[int] | None

    def __reduce__(self) -> tuple[Any, ...]:  # positional: far cheaper than dataclass state
        return Task, (self.seq, self.epoch, self.indices)


@dataclass(slots=True)
class Result:
    """What a worker made of a task."""

    seq: int
    worker: int
    batch: Any = None
    failure: Failure | None = None
    exhausted: bool = False  # an iterable dataset's replica ran out
    empty: bool = False  # every sample of the batch was skipped
    skipped: tuple[Failure, ...] = ()
    start: float = 0.0
    fetched: float = 0.0
    end: float = 0.0
    retired: tuple[int, ...] = ()  # slots the worker dropped from its pool
    warning: str | None = None
    cpu: float | None = None  # CPU seconds the worker spent on it
    nbytes: int | None = None  # bytes of array data in the batch
    rss: int | None = None  # the worker's resident memory, now and then

    def __reduce__(self) -> tuple[Any, ...]:
        return Result, (self.seq, self.worker, self.batch, self.failure, self.exhausted, self.empty,
                        self.skipped, self.start, self.fetched, self.end, self.retired, self.warning,
                        self.cpu, self.nbytes, self.rss)


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

    def describe(self) -> str:
        import signal

        code = self.exitcode
        if code is None:
            how = "stopped responding"
        elif code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited unexpectedly with exit code {code}"
        return f"worker {self.worker} (pid {self.pid}) {how}"


# -- on the wire ----------------------------------------------------------------

def send(conn: Any, msg: Any) -> None:
    """Send ``msg`` on a multiprocessing Connection as a plain pickle (``recv()`` reads it).

    ``Connection.send`` pickles with ForkingPickler, which costs ~60% more per small
    message and would move a stray torch tensor by file descriptor; conveyor's messages
    carry arrays in shared memory or in their blob, never that way.
    """
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


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
