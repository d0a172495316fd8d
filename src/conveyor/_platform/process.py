"""Process-wide: the process's own hooks and settings.

- ``on_fork_child``: ``os.register_at_fork(after_in_child=...)`` (the RNG lock, the
  schedstat reader: a child forked while another thread held a lock would wait for ever).
- ``exiting``: an ``atexit`` hook, registered at import, that notes the interpreter exits.
- ``leave``: a spawned worker's end, its exit handlers run and ``os._exit`` (no teardown).
- ``lower_priority``: ``os.nice`` in a worker process, once its first batch is out.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

__all__ = ["exiting", "leave", "lower_priority", "on_fork_child"]


def on_fork_child(fn: Callable[[], None]) -> None:
    """Call ``fn`` in every child forked from now on (where the OS forks)."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=fn)


_exiting = False  # the interpreter runs its exit hooks (see _close)


def _note_exit() -> None:
    global _exiting
    _exiting = True


atexit.register(_note_exit)  # (hooks run last registered first: before finalizers registered later)


def exiting() -> bool:
    """Does the interpreter run its exit hooks?"""
    return _exiting


def leave() -> None:
    """End this process as a forked worker ends, but with its own exit handlers run: they
    were registered here (a spawned worker imports afresh) and would have run at its exit.
    What is skipped is the teardown: modules cleared, objects finalized one by one."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to save
                pass
        os._exit(0)


def lower_priority(nice: int) -> None:
    """Add ``nice`` to this process's niceness (where it may)."""
    try:
        os.nice(nice)
    except OSError:
        pass
