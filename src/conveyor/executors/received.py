"""The main process's book of a process pool's shared-memory slots: which results hold
which slots (to be read, or given back), which freed slots ride back to which worker on
its next order, and the mappings of dead workers whose batches are still to be read.
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import transport
from .task import Result

__all__ = ["Received"]


class Received:
    """Slots of results received, by worker and generation (``(worker, gen)``)."""

    def __init__(self, pinner: Any) -> None:
        self.views = transport.Views(pinner)
        self.pending_freed: dict[tuple[int, int], list[int]] = {}  # (worker, gen) -> slot ids
        # results received and not yet decoded or released, by (worker, gen): their slots must
        # stay readable when that worker dies and its segments are unlinked
        self.undecoded: dict[tuple[int, int], dict[int, tuple[tuple[int, str], ...]]] = {}
        self.dying: set[tuple[int, int]] = set()  # dead generations whose slots are still to be read
        self.warned = False

    def collect_freed(self) -> None:
        """Note the slots the garbage collector freed since, for their workers."""
        pending = self.pending_freed
        for key in self.views.take_freed():
            pending.setdefault((key[0], key[1]), []).append(key[2])

    def freed_for(self, worker: int, gen: int) -> tuple[int, ...]:
        """The freed slots of ``worker``'s generation ``gen``, to ride on its next order."""
        self.collect_freed()
        ids = self.pending_freed.pop((worker, gen), None)
        return tuple(ids) if ids else ()

    def note(self, worker: int, gen: int, msg: Result) -> None:
        """A result came from ``worker``: its slots wait to be read. (The warning's
        ``stacklevel`` counts ``ProcessExecutor._note``, ``_take`` and ``take_ready`` on
        the way: it names the loader's code above its poll.)"""
        packed = msg.batch
        if isinstance(packed, transport.Packed) and packed.slots:
            self.undecoded.setdefault((packed.worker, packed.gen), {})[msg.seq] = packed.slots
        if msg.retired:
            self.views.retire(worker, gen, list(msg.retired))
        if msg.warning and not self.warned:
            self.warned = True
            warnings.warn(f"conveyor: shared memory is unavailable ({msg.warning}); batches now travel "
                          "through pipes, which is slower. Enlarge /dev/shm (e.g. docker --shm-size) "
                          "to get zero-copy batches back.", RuntimeWarning, stacklevel=6)

    def release(self, result: Result) -> None:
        packed = result.batch
        if isinstance(packed, transport.Packed) and packed.slots:
            key = (packed.worker, packed.gen)
            self.pending_freed.setdefault(key, []).extend(i for i, _ in packed.slots)
            self._read(key, result.seq)

    def decode(self, result: Result, output: str) -> Any:
        packed = result.batch
        if isinstance(packed, transport.Packed):
            batch = transport.decode(packed, self.views, output=output)
            if packed.slots:
                self._read((packed.worker, packed.gen), result.seq)
            return batch
        return packed

    def _read(self, key: tuple[int, int], seq: int) -> None:
        """A result's slots were read (or will not be): a dead generation with none left to
        read gives up its mappings (views the user holds keep theirs)."""
        waiting = self.undecoded.get(key)
        if waiting is not None:
            waiting.pop(seq, None)
            if not waiting:
                del self.undecoded[key]
        if key in self.dying and key not in self.undecoded:
            self.dying.discard(key)
            self.views.forget_worker(*key)

    def worker_gone(self, worker: int, gen: int) -> None:
        """``worker``'s generation ``gen`` is dead (before its slots are unlinked)."""
        # batches it finished that wait to be handed out are read from its slots later:
        # map those now, before the slots are unlinked; the rest of its mappings go
        key = (worker, gen)
        for slots in self.undecoded.get(key, {}).values():
            for slot_id, name in slots:
                self.views.keep((worker, gen, slot_id), name)
        if key in self.undecoded:
            self.dying.add(key)
        else:
            self.views.forget_worker(worker, gen)
        self.pending_freed.pop(key, None)
