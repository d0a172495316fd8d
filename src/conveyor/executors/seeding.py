"""Seeding: the lock on the process's global RNGs and seeded fetches on shared threads.

``rng_lock`` is held from seeding a sample to its last draw wherever threads of one
process share the global RNGs (thread workers, fetch threads); ``SeededFetch`` finds out
whether a dataset draws from them at all, and fetches unseeded, at once, when it does not.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .. import _torch, rng
from .._platform import process

__all__ = ["RngLock", "SeededFetch", "rng_lock"]


class RngLock:
    """The process's lock on its global RNGs, held while a sample is seeded and fetched and
    while the main process saves or restores them, wherever threads of one process share
    them (thread workers, fetch threads).

    Fetches that draw nothing from them hold it shared (``shared``): many at once, but
    never while a thread holds it whole (see ``SeededFetch``).

    A thread cannot be stopped: one stuck in a sample (a read that never returns) would hold
    the lock, and every seeded loader of the process after it would hang. A loader that gives
    such threads up hands the lock on (``abandon``): its later users take a fresh one, and
    the stuck thread, should it ever return, releases the one it took.

    Thread workers seed the RNGs of the process the training loop runs in. The states they
    found before their first seeding are kept (``keep_found``) and put back at an epoch's
    start and end (``put_back``): otherwise a sampler drawing its order from a global RNG (one
    without a generator) draws each epoch's from wherever the sample fetched last in wall time
    left them, and two runs with one seed can shuffle differently
    (docs/decisions/rng-lock-for-thread-workers.md). A snapshot and a restore cost ~200 us
    (numpy's ``get_state`` and ``set_state``): too much to pay around every sample."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._took = threading.local()  # the lock this thread holds
        self._readers: set[int] = set()  # threads that hold it shared
        self._left = threading.Condition(threading.Lock())  # a reader let go
        self.found: rng.RngState | None = None  # the RNGs as thread workers found them

    def _take(self) -> threading.Lock:
        while True:
            lock = self._lock
            if lock.acquire(timeout=0.5):
                if lock is self._lock:
                    return lock
                lock.release()  # handed on while this thread waited: take the new one

    def __enter__(self) -> None:
        self.take()

    def take(self, unless: Callable[[], bool] | None = None) -> bool:
        """Hold the lock whole (``with lock`` does), once shared holders let go. With
        ``unless``: if it holds once this thread's turn comes, give the turn up and return
        False, without waiting for the shared holders."""
        lock = self._take()
        if unless is not None and unless():
            lock.release()
            return False
        self._took.lock = lock
        self._owner = threading.get_ident()
        left = self._left
        with left:
            while self._readers:
                left.wait(0.5)
        return True

    def __exit__(self, *exc: object) -> None:
        lock = self._took.lock
        if lock is self._lock:
            self._owner = None
        lock.release()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock alongside other shared holders (for fetches that draw nothing)."""
        me = threading.get_ident()
        lock = self._take()  # none start while a thread holds it whole, or waits to
        try:
            with self._left:
                self._readers.add(me)
        finally:
            lock.release()
        try:
            yield
        finally:
            left = self._left
            with left:
                self._readers.discard(me)
                left.notify_all()

    def keep_found(self) -> None:
        """Before a thread worker seeds the RNGs, holding the lock whole: note how it found
        them, unless a seeding since the last ``put_back`` already did."""
        if self.found is None:
            self.found = rng.RngState()

    def put_back(self) -> None:
        """The global RNGs as thread workers found them, if they seeded them since the last
        call (the main thread's, at an epoch's start and end; see the class)."""
        if self.found is None:
            return
        with self:
            found, self.found = self.found, None
            if found is not None:
                found.restore()

    def save(self) -> rng.RngState:
        """Holding the lock whole: the RNGs' states, which the main process puts back
        (``restore``) after a batch it makes, seeding them. Thread workers seeding meanwhile
        find them so: were they noted only by a worker's first seeding, one between two of
        that batch's samples would take a sample's seeded states for the loop's, and
        ``put_back`` would set those at the epoch's end."""
        state = rng.RngState()
        if self.found is None:
            self.found = state
        return state

    def restore(self, state: rng.RngState) -> None:
        """Holding the lock whole: put back what ``save`` returned."""
        state.restore()
        if self.found is state:
            self.found = None  # as found: no thread worker's seeding is left in them

    def abandon(self, idents: set[int]) -> None:
        """Hand the lock on if one of these (stuck, given up) threads holds it."""
        with self._left:
            if self._readers & idents:
                self._readers -= idents
                self._left.notify_all()
        if self._owner is not None and self._owner in idents:
            self._lock, self._owner = threading.Lock(), None

    def _after_fork(self) -> None:
        # a child forked while another thread held the lock would wait for it forever
        self._lock, self._owner = threading.Lock(), None
        self._took = threading.local()
        self._readers = set()
        self._left = threading.Condition(threading.Lock())
        self.found = None  # a process worker's RNGs are its own


FREE_AFTER = 2  # checked fetches that did not depend on the global RNGs, before fetches go unseeded
_FLIP = 0x5EEDF11D  # another seed for a checked fetch's second try


class SeededFetch:
    """Fetches samples seeded from their own seeds, on the fetch threads of a worker, which
    share its global RNGs.

    Seeding and fetching must be done in turn (under ``RngLock``), or a thread's draws would
    mix with another's seeding; in turn, the fetch threads fetch one at a time
    (docs/decisions/fingerprint-before-seeding-in-turn.md). Yet most datasets draw nothing
    from the global RNGs, and what they give does not depend on the seed. So the first
    fetches, in turn, are checked: seeded, fingerprinted (``rng.fingerprint``), fetched,
    fingerprinted again, then seeded otherwise and fetched again (a sample that reads the RNGs
    without moving them, as ``torch.initial_seed()`` or a draw inside ``torch.random.fork_rng``
    do, comes out otherwise). Once FREE_AFTER such fetches showed no dependence, fetches go
    unseeded and at once (holding the lock shared), each between two fingerprints. One whose
    fingerprints differ (it drew, or anything else in the worker did meanwhile) is not used:
    it is fetched again in turn, seeded, and so is every fetch from then on. A fetch in turn
    never runs beside an unseeded one, so what it draws is its own. One that raises with its
    fingerprints unmoved raises as it is: a seeded fetch would have, the RNGs being no part
    of it.

    Only worker fetchers (``Fetcher.worker_id`` set) do this: the main process puts its own
    RNG state back after each batch it makes, and a collate_fn drawing there would start
    every batch from that one state where no sample seeded the RNGs."""

    def __init__(self, lock: RngLock, *, shared: bool = False) -> None:
        self.lock = lock
        self.shared = shared  # a thread worker's: the RNGs it seeds are the training loop's too
        self.draws = False  # a fetch depended on the global RNGs: every fetch is seeded, in turn
        self.free = False  # fetches go unseeded, at once
        self.quiet = 0  # checked fetches that did not depend on the RNGs

    def _unseeded(self, dataset: Any, index: int) -> Any:
        """Fetch at once, unseeded; ``_FAILED`` where the fetch must be made again, seeded."""
        with self.lock.shared():
            if not self.free:
                return _FAILED
            before = rng.fingerprint()
            try:
                out = dataset[index]
            except Exception:
                if rng.fingerprint() == before:
                    raise  # as a seeded fetch would have: the RNGs were no part of it
                out = _FAILED
            if out is not _FAILED and rng.fingerprint() == before:
                return out
            self.free, self.draws = False, True
            return _FAILED

    def __call__(self, dataset: Any, index: int, seed: int) -> Any:
        if self.free:
            out = self._unseeded(dataset, index)
            if out is not _FAILED:
                return out
            with self.lock:
                return self._in_turn(dataset, index, seed, check=False)
        if not self.lock.take(unless=lambda: self.free):
            return self(dataset, index, seed)  # switched while this thread waited its turn
        try:
            return self._in_turn(dataset, index, seed, check=True)
        finally:
            self.lock.__exit__()

    def _in_turn(self, dataset: Any, index: int, seed: int, *, check: bool) -> Any:
        """Seed and fetch, holding the lock whole; with ``check``, check the fetch (see above)."""
        if self.shared:
            self.lock.keep_found()
        rng.seed_all(seed)
        if not check or self.draws or self.free:
            return dataset[index]
        before = rng.fingerprint()
        out = dataset[index]
        if rng.fingerprint() != before:
            self.draws = True
            return out
        rng.seed_all(seed ^ _FLIP)
        try:
            again = dataset[index]
        except Exception:
            again = _FAILED
        if again is _FAILED or not _same(out, again):
            self.draws = True
            return out
        self.quiet += 1
        if self.quiet >= FREE_AFTER:
            self.free = True
        return out


def _same(a: Any, b: Any) -> bool:
    """Are two samples equal, leaf by leaf? (False where that cannot be told: NaN, objects
    without equality.)"""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    torch = _torch.loaded()
    try:
        if torch is not None and isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
        if hasattr(a, "__array__") and not isinstance(a, (str, bytes)):
            import numpy as np

            x, y = np.asarray(a), np.asarray(b)
            return x.dtype == y.dtype and x.shape == y.shape and bool(np.array_equal(x, y))
        return bool(a == b)
    except Exception:
        return False


_FAILED = object()


rng_lock = RngLock()
process.on_fork_child(rng_lock._after_fork)
