"""Moving batches from process workers to the main process.

worker: collate into a slot (``Writer``) -> ``encode`` -> small ``Packed`` message
main:   ``decode`` -> numpy/torch views over the slot; GC of the views frees the slot
"""

from __future__ import annotations

from .codec import INLINE_BYTES, Leaf, Packed, decode, encode, to_numpy
from .segment import Segment, available, new_prefix, shm_dir_free, sweep, sweep_stale
from .slots import SlotPool, Views, Writer

__all__ = [
    "INLINE_BYTES", "Leaf", "Packed", "Segment", "SlotPool", "Views", "Writer",
    "available", "decode", "encode", "new_prefix", "shm_dir_free", "sweep", "sweep_stale", "to_numpy",
]
