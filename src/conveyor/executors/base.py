"""What every executor offers the loader, and the bookkeeping they share."""

from __future__ import annotations

import _signal  # the C module under ``signal`` (see hold_ctrl_c)
import threading
from typing import Any, Protocol

from .task import Death, Result, Task

__all__ = ["Executor", "Event", "hold_ctrl_c"]

_SIGINT = int(getattr(_signal, "SIGINT", 2))

Event = Result | Death


class Executor(Protocol):
    """Runs tasks on ``num_workers`` workers and reports what came of them."""

    num_workers: int
    kind: str

    def submit(self, worker: int, tasks: list[Task]) -> None:
        """Hand ``tasks`` to ``worker`` (they run in the order given)."""

    def poll(self, timeout: float | None) -> list[Event]:
        """Wait up to ``timeout`` seconds for results or deaths; [] on timeout."""

    def outstanding(self, worker: int) -> int:
        """Tasks handed to ``worker`` whose result has not been polled yet."""

    def alive(self, worker: int) -> bool: ...

    def restart(self, worker: int, wait_s: float = 60.0) -> list[Task]:
        """Replace a dead worker; returns its unfinished tasks for re-issue."""

    def release(self, result: Result) -> None:
        """Give back transport resources of a result that will not be decoded."""

    def decode(self, result: Result) -> Any:
        """The batch of ``result`` as the user receives it."""

    def close(self) -> None: ...


class Ledger:
    """Which tasks each worker holds, in order."""

    def __init__(self, n: int) -> None:
        self.held: list[dict[int, Task]] = [{} for _ in range(n)]

    def add(self, worker: int, tasks: list[Task]) -> None:
        held = self.held[worker]
        for t in tasks:
            held[t.seq] = t

    def done(self, worker: int, seq: int) -> None:
        self.held[worker].pop(seq, None)

    def count(self, worker: int) -> int:
        return len(self.held[worker])

    def take(self, worker: int) -> list[Task]:
        tasks = list(self.held[worker].values())
        self.held[worker].clear()
        return tasks


class hold_ctrl_c:  # noqa: N801 - used as a statement: ``with hold_ctrl_c():``
    """Holds a Ctrl-C that comes inside the block and raises it once the block is over.

    For bookkeeping that must not be cut in two: a result read from a worker's pipe and not
    yet recorded was lost to a KeyboardInterrupt between the two, and its worker stayed
    counted as holding it (round robin then never gave it another batch). Python raises the
    interrupt at whatever bytecode it reaches, so the block swaps SIGINT's Python handler for
    one that notes the signal, and calls the original with it at the end. Nested blocks swap
    once; outside the main thread (no Python signal handler runs there) and where SIGINT's
    handler is not Python's (ignored, or at its default), nothing is swapped. The block must
    not wait for long: a Ctrl-C waits with it. ``_signal`` directly: ``signal.signal`` wraps
    each call in enum conversions, 18 us a swap where this costs ~1.4 us.
    """

    __slots__ = ("on",)
    depth = 0
    handler: Any = None
    caught: Any = None  # the frame of the first SIGINT taken while held

    def __enter__(self) -> None:
        self.on = threading.current_thread() is threading.main_thread()
        if not self.on:
            return
        cls = hold_ctrl_c
        cls.depth += 1
        if cls.depth == 1:
            handler = _signal.getsignal(_SIGINT)
            if callable(handler):
                cls.handler = handler
                _signal.signal(_SIGINT, _note_ctrl_c)

    def __exit__(self, *exc: object) -> None:
        if not self.on:
            return
        cls = hold_ctrl_c
        cls.depth -= 1
        if cls.depth or cls.handler is None:
            return
        handler, cls.handler = cls.handler, None
        _signal.signal(_SIGINT, handler)
        frame, cls.caught = cls.caught, None
        if frame is not None:
            handler(_SIGINT, frame)  # the Ctrl-C, now that the bookkeeping is whole


def _note_ctrl_c(signum: int, frame: Any) -> None:
    if hold_ctrl_c.caught is None:
        hold_ctrl_c.caught = frame
