"""Unit tests run in this process alone: a test here fails if it starts a process, leaves a
child process, starts one of conveyor's threads (a worker or fetch pool, a device loader) or
leaves any thread running. Tests that need processes or worker pools live in
tests/integration/."""

from __future__ import annotations

import multiprocessing.process
import multiprocessing.util
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

_started: list[str] = []


def _counting(name: str, start: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        _started.append(name)
        return start(*args, **kwargs)
    return counted


def _thread_start(start: Callable[[threading.Thread], None]) -> Callable[[threading.Thread], None]:
    def counted(self: threading.Thread) -> None:
        # who starts it: a thread the test starts to drive a pipe is its own and must only
        # be gone by the end; one conveyor starts is a pool or a loader's
        module = sys._getframe(1).f_globals.get("__name__", "")
        if module.startswith("conveyor"):
            _started.append(f"conveyor thread {self.name!r} ({module})")
        start(self)
    return counted


def _descendants(new: set[int]) -> list[psutil.Process]:
    """Those of the processes ``new`` (pids that appeared during a test) that descend from
    this one: reading the parents of the few new pids costs far less than a walk of every
    process on the machine for this one's children."""
    me, mine = os.getpid(), []
    for pid in new:
        try:
            p = psutil.Process(pid)
            if any(q.pid == me for q in p.parents()):
                mine.append(p)
        except psutil.Error:  # gone already: not left running
            pass
    return mine


@pytest.fixture(autouse=True)
def _in_process_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    pids = set(psutil.pids())
    threads = set(threading.enumerate())
    # every way a process starts from Python: subprocess and multiprocessing's spawn and
    # forkserver go through fork_exec; fork and posix_spawn are os's
    for owner, name in ((subprocess, "_fork_exec"), (os, "fork"), (os, "forkpty"),
                        (os, "posix_spawn"), (os, "posix_spawnp")):
        if getattr(owner, name, None) is not None:
            monkeypatch.setattr(owner, name, _counting(f"{owner.__name__}.{name}", getattr(owner, name)))
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds",
                        _counting("multiprocessing spawn", multiprocessing.util.spawnv_passfds))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        _counting("multiprocessing.Process.start", multiprocessing.process.BaseProcess.start))
    monkeypatch.setattr(threading.Thread, "start", _thread_start(threading.Thread.start))
    _started.clear()
    yield
    started, _started[:] = list(_started), []
    left = _descendants(set(psutil.pids()) - pids)
    running = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert not started, f"a unit test started {started}: it belongs in tests/integration/"
    assert not left, f"a unit test left child processes {left}: it belongs in tests/integration/"
    assert not running, f"a unit test left threads running {running}: it belongs in tests/integration/"
