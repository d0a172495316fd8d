"""Process-wide: ``gc.freeze()`` while fork workers run, and a ``gc.callbacks`` entry
(``_see_full_collections``) that unfreezes for each full collection and freezes again
after it. Counted across pools (``freeze``/``unfreeze``): lifted when the last closes.
"""

from __future__ import annotations

import _thread
import gc
import signal
import sys
import threading
import time

__all__ = ["freeze", "unfreeze"]

# Copy-on-read: a garbage collection walks every tracked object and writes to its
# header, so after a fork each page of Python objects that either process scans gets
# copied, until every worker holds a copy of the dataset's lists and dicts. Objects
# frozen with gc.freeze() are never scanned, so while fork workers run, the objects
# that existed when they started stay shared by all. The freeze is counted across
# loaders and lifted when the last such pool closes (unless the user froze first).
_freezes = 0


_user_froze = False
_sigint_held = False  # a Ctrl-C taken in a full collection's callback, for its end
_in_callback = False  # _see_full_collections is starting the thread that sends it again


# Python 3.12's collector keeps immortal objects in the frozen generation: 375 at start on
# 3.12.1, back after every collection even once unfrozen (3.11 and 3.13 start with none).
# Counted as the user's freeze, they would keep every freeze of ours in place for good, and
# loaders dropped in a reference cycle would never be collected. Only a count above this
# baseline is the user's. (A user who froze before importing conveyor on 3.12 is then
# taken for one who did not: the last pool's close unfreezes their objects too.)
_FROZEN_AT_START = gc.get_freeze_count() if sys.version_info[:2] == (3, 12) and hasattr(gc, "freeze") else 0


def freeze(collect: bool = True) -> None:
    global _freezes, _user_froze
    if not hasattr(gc, "freeze"):
        return
    if _freezes == 0:
        _user_froze = gc.get_freeze_count() > _FROZEN_AT_START
    elif not _user_froze and collect:
        # another pool holds the freeze: a loader dropped since in a reference cycle was frozen
        # with everything else and could never be collected (nor its workers stopped). Collect
        # such loaders now, once, before freezing anew. Only for a loader's first workers (a
        # new loader, as in k-fold): a full collection of a large heap is slow, and a
        # validation loader iterated every few steps would pay it every pass
        # (docs/decisions/gc-freeze-while-fork-workers-live.md). (A full collection
        # unfreezes for its duration: _see_full_collections.)
        gc.collect()
        if _freezes == 0:  # the collection closed the pools that held it
            _user_froze = gc.get_freeze_count() > _FROZEN_AT_START
    _freezes += 1
    gc.freeze()
    if _see_full_collections not in gc.callbacks:
        gc.callbacks.append(_see_full_collections)


def _see_full_collections(phase: str, info: dict[str, int]) -> None:
    """A full collection (the user's ``gc.collect()``, say) looks at frozen objects too, and
    what survives it is frozen again: a loader dropped in a reference cycle is collected
    (and its workers stopped) when the user asks for it, as it would be without a freeze.
    Younger collections, the frequent ones, still leave the frozen objects alone.

    A signal that arrives during a collection is handled at the first call Python makes
    after it, and an exception raised in a gc callback (or a finalizer the collection runs)
    is reported as ignored: a Ctrl-C there is lost. So nothing is called before a young
    collection returns, and a KeyboardInterrupt raised at the (un)freeze is sent to the main
    thread again once the collection is over and this callback has returned. (Not from a
    timer: on a busy machine the timer's signal can land while this callback still waits for
    the timer thread to start, and is lost in turn; docs/decisions/ctrl-c-is-never-lost.md.)"""
    global _sigint_held, _in_callback
    if info["generation"] != 2:  # no call: see above
        return
    if _freezes and not _user_froze:
        try:
            if phase == "start":
                gc.unfreeze()
            else:
                gc.freeze()
        except KeyboardInterrupt:
            _sigint_held = True
    if phase == "stop" and _sigint_held:
        _sigint_held = False
        _in_callback = True
        # a bare thread: threading's start() waits for the thread, a wait a signal interrupts
        _thread.start_new_thread(_send_sigint_again, (threading.main_thread().ident,))
        _in_callback = False  # the last statement, and no call: nothing is handled after it here


def _send_sigint_again(main: int) -> None:
    while _in_callback:  # the main thread holds the GIL until it has left the callback
        time.sleep(0.0001)
    signal.pthread_kill(main, signal.SIGINT)


def unfreeze() -> None:
    global _freezes
    if not hasattr(gc, "freeze") or _freezes == 0:
        return
    _freezes -= 1
    if _freezes == 0:
        if not _user_froze:
            gc.unfreeze()
        if _see_full_collections in gc.callbacks:  # nothing frozen of ours: no Python in collections
            gc.callbacks.remove(_see_full_collections)
