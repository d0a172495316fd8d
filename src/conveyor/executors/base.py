"""What every executor offers the loader, and the bookkeeping they share."""

from __future__ import annotations

from typing import Any, Protocol

from .task import Death, Result, Task

__all__ = ["Executor", "Event", "Ledger"]


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


