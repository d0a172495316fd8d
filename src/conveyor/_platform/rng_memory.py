"""Process-wide: the global RNGs' C structs read in place (``ctypes.string_at``).

Read, never written: ``random``'s Mersenne Twister (a position and 624 words) at its
object's address, numpy's global ``RandomState``'s words at its bit generator's state
address and the fields past its object header. Each layout is checked once on private
instances; where a check fails, ``rng.fingerprint`` asks the RNGs for their states instead.
"""

from __future__ import annotations

import ctypes
import random
from typing import Any

import numpy as np

__all__ = ["PY_IN_PLACE", "np_words", "py_words"]

MT_BYTES = 625 * 4  # 624 state words and the position
HEAD = object.__basicsize__  # an object's header (reference count, type): left out


def _py_layout() -> bool:
    """Is ``random.Random`` CPython's {header; int index; uint32 state[624]}?"""
    try:
        r = random.Random(0x5EED)
        r.random()
        raw = np.frombuffer(ctypes.string_at(id(r) + HEAD, MT_BYTES), dtype=np.uint32)
        words = r.getstate()[1]
        return int(raw[0]) == words[-1] and raw[1:].tolist() == list(words[:-1])
    except Exception:  # pragma: no cover - not CPython's layout
        return False


def np_fields(rs: Any) -> bytes:
    return ctypes.string_at(id(rs) + HEAD, type(rs).__basicsize__ - HEAD)


def _np_layout(np_random: Any) -> bool:
    """Does a private ``RandomState`` show every draw, a cached normal's too, in place?"""
    try:
        rs = np_random.RandomState(0x5EED)
        bitgen = rs._bit_generator
        addr = int(bitgen.ctypes.state_address)
        state = bitgen.state
        raw = np.frombuffer(ctypes.string_at(addr, MT_BYTES), dtype=np.uint32)
        if not (state["bit_generator"] == "MT19937" and int(raw[-1]) == state["state"]["pos"]
                and np.array_equal(raw[:-1], state["state"]["key"])):
            return False  # pragma: no cover
        fields = np_fields(rs)
        if np_fields(rs) != fields:
            return False  # pragma: no cover - fields that change with no draw
        rs.standard_normal()  # draws a pair of normals and keeps one for later
        words, kept = ctypes.string_at(addr, MT_BYTES), np_fields(rs)
        rs.standard_normal()  # takes the one kept: no word moves
        return kept != fields and words == ctypes.string_at(addr, MT_BYTES) and np_fields(rs) != kept
    except Exception:  # pragma: no cover - another bit generator or layout
        return False


PY_IN_PLACE = _py_layout()
_np_at: dict[int, int | None] = {}  # id of numpy's global RandomState -> its words' address


def _np_address(np_random: Any, rs: Any) -> int | None:
    if not _np_layout(np_random):
        return None  # pragma: no cover
    try:
        return int(rs._bit_generator.ctypes.state_address)
    except Exception:  # pragma: no cover
        return None


def py_words(inst: random.Random) -> bytes:
    """``random.Random`` ``inst``'s position and words, as they are (``PY_IN_PLACE`` only)."""
    return ctypes.string_at(id(inst) + HEAD, MT_BYTES)


def np_words(np_random: Any, rs: Any) -> tuple[int, bytes, bytes] | None:
    """numpy's ``RandomState`` ``rs``: (its id, its words, its fields), as they are; None
    where its layout is not the one checked."""
    key = id(rs)
    addr = _np_at[key] if key in _np_at else _np_at.setdefault(key, _np_address(np_random, rs))
    return (key, ctypes.string_at(addr, MT_BYTES), np_fields(rs)) if addr is not None else None
