"""What every executor offers the loader, and the bookkeeping they share."""

from __future__ import annotations

from typing import Any

from .task import Death, Result, Task

__all__ = ["Executor", "Event", "Ledger"]


Event = Result | Death


class Executor:
    """Runs tasks on ``num_workers`` workers and reports what came of them: the whole
    interface the loader uses. Process workers implement every method; the defaults here are
    what an executor inside the main process (``MainProcess``, ``ThreadExecutor``) means
    by each: no start-up to wait for, nothing to kill, no Python stack to read apart."""

    num_workers: int = 0
    kind: str = ""
    method: str | None = None  # the process start method ("fork", "spawn", "forkserver"); None: in-process
    can_kill = False  # can a stuck worker be killed (and replaced)?

    def submit(self, worker: int, tasks: list[Task], grouped: bool = False) -> None:
        """Hand ``tasks`` to ``worker`` (they run in the order given; ``grouped``: as one order)."""
        raise NotImplementedError

    def poll(self, timeout: float | None) -> list[Event]:
        """Wait up to ``timeout`` seconds for results or deaths; [] on timeout."""
        raise NotImplementedError

    def wait_ready(self, timeout: float | None) -> Any:
        """``poll`` in two: wait up to ``timeout`` for something to take in (a Ctrl-C may cut
        this short); returns what ``take_ready`` takes, falsy when nothing came."""
        return self.poll(timeout)

    def take_ready(self, ready: Any) -> list[Event]:
        """The events ``wait_ready`` found (the caller holds a Ctrl-C around this and its
        bookkeeping of them)."""
        return ready  # type: ignore[no-any-return]

    def outstanding(self, worker: int) -> int:
        """Tasks handed to ``worker`` whose result has not been polled yet."""
        raise NotImplementedError

    def held(self) -> list[dict[int, Task]]:
        """The tasks each worker holds, by seq."""
        return []

    @property
    def ready(self) -> int:
        """How many workers have finished starting."""
        return self.num_workers

    def starting_for(self, worker: int) -> float | None:
        """Seconds ``worker`` has been starting, or None once it has started."""
        return None

    def alive(self, worker: int) -> bool:
        raise NotImplementedError

    def restart(self, worker: int, wait_s: float = 60.0) -> list[Task]:
        """Replace a dead worker; returns its unfinished tasks for re-issue."""
        raise NotImplementedError

    def grow(self, n: int) -> None:
        """Run ``n`` workers from now on (never fewer)."""
        raise NotImplementedError

    def set_threads(self, n: int) -> None:
        """Fetch threads per worker from the next batch on."""
        raise NotImplementedError

    def set_rng(self, worker: int, state: Any) -> None:
        """Have ``worker`` take its global RNGs from ``state`` (as a probing batch left them)."""

    def flush_freed(self) -> None:
        """Send the workers the slots of batches the user has dropped."""

    def stack(self, worker: int) -> str | None:
        """``worker``'s Python stack right now, where it can be read."""
        return None

    def kill(self, worker: int, cause: str, stack: str | None = None) -> None:
        """Kill a stuck worker (``can_kill``); the next poll reports its death."""
        raise NotImplementedError(f"{type(self).__name__} cannot kill a worker")

    def give_up(self, worker: int) -> None:
        """Stop waiting for ``worker`` (timed out): closing does not wait for its batch."""

    def release(self, result: Result) -> None:
        """Give back transport resources of a result that will not be decoded."""

    def decode(self, result: Result) -> Any:
        """The batch of ``result`` as the user receives it."""
        return result.batch

    def close(self) -> None:
        raise NotImplementedError


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


