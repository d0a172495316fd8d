"""Process-wide: signal handlers and masks.

- ``hold_ctrl_c``: SIGINT's Python handler swapped for one that notes the signal, for the
  length of a block of bookkeeping (main process, main thread).
- ``no_sigpipe``: SIGPIPE blocked for the writing thread while it writes to a worker's
  pipe, and one the write raised taken (where the program set SIGPIPE to its default).
- In conveyor's own worker processes: SIGINT ignored (``ignore_ctrl_c``), SIGTERM and
  SIGHUP handled to clean up and die of the signal (``clean_up_on_term``), SIGUSR1 made to
  dump every thread's stack with ``faulthandler`` (``install_stack_dump``).
"""

from __future__ import annotations

import _signal  # the C module under ``signal`` (see hold_ctrl_c)
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["HOLD_SIGPIPE", "clean_up_on_term", "hold_ctrl_c", "ignore_ctrl_c", "install_stack_dump", "no_sigpipe"]

_SIGINT = int(getattr(_signal, "SIGINT", 2))


class hold_ctrl_c:  # noqa: N801 - used as a statement: ``with hold_ctrl_c():``
    """Holds a Ctrl-C that comes inside the block and raises it once the block is over.

    For bookkeeping that must not be cut in two: a result read from a worker's pipe and not
    yet recorded is lost to a KeyboardInterrupt between the two, and its worker stays
    counted as holding it (round robin then never gives it another batch). Python raises the
    interrupt at whatever bytecode it reaches, so the block swaps SIGINT's Python handler for
    one that notes the signal, and calls the original with it at the end. Nested blocks swap
    once; outside the main thread (no Python signal handler runs there) and where SIGINT's
    handler is not Python's (ignored, or at its default), nothing is swapped. The block must
    not wait for long: a Ctrl-C waits with it. ``_signal`` directly: ``signal.signal`` wraps
    each call in enum conversions, 18 us a swap where this costs ~1.4 us.

    With ``later``, the Ctrl-C is kept past the block, for ``deliver()`` once the caller has
    recorded what the block made: forking runs ``os.register_at_fork`` hooks in the parent
    (logging's lock release), a KeyboardInterrupt raised in one is reported as ignored and
    the training loop goes on (docs/decisions/ctrl-c-is-never-lost.md); raised at the block's
    end, it would come before the new worker is recorded for close() to stop. Inside another
    block, the outer one raises it at its end.
    """

    __slots__ = ("on", "later", "kept")
    depth = 0
    handler: Any = None
    caught: Any = None  # the frame of the first SIGINT taken while held

    def __init__(self, later: bool = False) -> None:
        self.later = later
        self.kept: tuple[Any, Any] | None = None  # (handler, frame) for ``deliver``

    def __enter__(self) -> hold_ctrl_c:
        self.on = threading.current_thread() is threading.main_thread()
        if not self.on:
            return self
        cls = hold_ctrl_c
        cls.depth += 1
        if cls.depth == 1:
            handler = _signal.getsignal(_SIGINT)
            if callable(handler):
                cls.handler = handler
                _signal.signal(_SIGINT, _note_ctrl_c)
        return self

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
        if frame is not None and self.later:
            self.kept = (handler, frame)
        elif frame is not None:
            handler(_SIGINT, frame)  # the Ctrl-C, now that the bookkeeping is whole

    def deliver(self) -> None:
        """The Ctrl-C a ``later`` block kept, now."""
        kept, self.kept = self.kept, None
        if kept is not None:
            kept[0](_SIGINT, kept[1])


def _note_ctrl_c(signum: int, frame: Any) -> None:
    if hold_ctrl_c.caught is None:
        hold_ctrl_c.caught = frame


# (no SIGPIPE on Windows; no sigtimedwait to take a raised one on macOS)
HOLD_SIGPIPE = hasattr(signal, "SIGPIPE") and hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask")


@contextlib.contextmanager
def no_sigpipe() -> Iterator[None]:
    """A write to a pipe whose reader is gone raises BrokenPipeError, also where the program
    set SIGPIPE to its default (the idiom that lets ``| head`` end a script): that kills the
    process, silently, at the write. A stop sent once more to a worker that has stopped (as
    it is reaped) would kill the training process with status 141 at the end of each epoch.
    The signal is held for this thread while it writes, and one the write raised taken."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    try:
        yield
    finally:
        if signal.SIGPIPE not in old:
            if signal.SIGPIPE in signal.sigpending():
                signal.sigtimedwait({signal.SIGPIPE}, 0)
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_ctrl_c() -> None:
    """In a worker process: Ctrl-C is the main process's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def clean_up_on_term(cleanup: Callable[[], None]) -> None:
    """In a worker process: SIGTERM and SIGHUP run ``cleanup``, then end it as they would have."""
    def on_term(signum: int, frame: Any) -> None:
        # SIGTERM/SIGHUP to the whole process group (timeout, systemd, SLURM's scancel, a
        # closed terminal) ends the main process before it can sweep: each worker removes its
        # own slots and stack file, then dies of the signal as it would have
        cleanup()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        # a signal the main process ignores (``nohup``: SIGHUP) stays ignored here too: the
        # closed terminal that ends nothing else must not end the workers either
        if sig is not None and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, on_term)


def install_stack_dump(path: str) -> Any:
    """SIGUSR1 writes every thread's Python stack to ``path`` (read when a worker hangs)."""
    try:
        import faulthandler

        f = open(path, "w")
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
        return f
    except (AttributeError, ValueError, RuntimeError, OSError):  # pragma: no cover - not on this OS
        return None
