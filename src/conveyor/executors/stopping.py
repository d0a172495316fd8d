"""Stopping process workers: a worker reaped (``reap``), a hung one's stack read
(``read_stack``), and the stack files a pool leaves swept (``sweep_stacks``).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .task import Order

__all__ = ["read_stack", "reap", "sweep_stacks"]


def reap(wk: Any, reaping: Any, timeout: float, stack_at: Callable[[], str]) -> None:
    """Stop a worker (told, then terminated, then killed) and close its pipes, bell, process
    object and stack file, once (``reaping``, a lock, makes it once)."""
    with reaping:  # once: a second close of its descriptors may close another file's
        if wk.reaped:
            return
        wk.reaped = True
    try:
        try:
            wk.tell(Order(stop=True))
        except (BrokenPipeError, OSError):
            pass
        wk.proc.join(timeout)
        if wk.proc.is_alive():
            wk.proc.terminate()
            wk.proc.join(2.0)
        if wk.proc.is_alive():
            wk.proc.kill()
            wk.proc.join(2.0)
    except BaseException:
        wk.reaped = False  # cut short (Ctrl-C) while it waited: the next close() reaps it
        raise
    for conn in (wk.tasks, wk.results):
        try:
            conn.close()
        except OSError:
            pass
    if wk.bell is not None:
        wk.bell.close()
    try:
        wk.proc.close()
    except ValueError:
        pass
    try:
        os.unlink(stack_at())
    except (OSError, ValueError):
        pass


def read_stack(pid: int, path: str) -> str | None:
    """Ask a (hung) worker for its Python stack (SIGUSR1: it writes it to ``path``); None when
    it cannot say."""
    try:
        before = os.path.getsize(path)
    except OSError:
        return None
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return None
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            if os.path.getsize(path) > before:
                time.sleep(0.05)
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(before)
                    return f.read()
        except OSError:
            return None
    return None


def sweep_stacks(prefix: str) -> None:
    if not prefix:
        return
    d = tempfile.gettempdir()
    try:
        for name in os.listdir(d):
            if name.startswith(prefix) and name.endswith(".stack"):
                try:
                    os.unlink(os.path.join(d, name))
                except OSError:
                    pass
    except OSError:
        pass
