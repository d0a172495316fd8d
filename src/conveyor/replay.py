"""Resuming a sampler that keeps no state: torch's own samplers, a list, a custom one.

A sampler with ``state_dict()`` says how its current iteration began, and a resumed epoch
starts it there and skips what was handed out. One without is resumed by replaying it:
when the loader starts iterating it, it notes the states of every RNG the draws can come
from (the global ones of ``random``, numpy and torch, and each generator the sampler, or
the sampler inside a batch sampler, holds as an attribute) and keeps a running digest of
the batches of indices it draws. A resumed epoch puts those RNG states back, draws the
batches already handed out again, and checks them against the digest; the global RNGs
then get their caller's states back (the sampler's own generators stay where the replay
left them, as they were in the saved run). Exact for samplers whose order follows from
those RNGs and their own attributes (torch's RandomSampler, SubsetRandomSampler,
WeightedRandomSampler, BatchSampler, and DistributedSampler after the same
``set_epoch``); for any other (a clock, a file that changed) the digest says the order
differs, with a warning.

Everything is plain JSON, as the rest of the loader's state: no pickle to load.
"""

from __future__ import annotations

import base64
import operator
import pickle
import random
import sys
import zlib
from typing import Any

import numpy as np

from . import _torch
from .rng import RngState

__all__ = ["GLOBALS", "Mark", "Replaying", "as_json", "check", "digest", "inner"]


def digest(previous: int, batch: Any) -> int:
    """The running digest after ``batch`` (a batch of indices, or one index)."""
    try:
        data = pickle.dumps(_plain(batch), 4)  # a fixed protocol: the same bytes on every Python
    except Exception:
        data = repr(batch).encode()
    return zlib.crc32(data, previous)


def _plain(batch: Any) -> Any:
    """Indices as Python ints, so equal batches digest alike: numpy integers and tensors
    pickle with more than their value (a 0-d tensor view's storage, which differs from
    run to run, would make every resume of a sampler yielding ``randperm(n).unbind()`` warn)."""
    if isinstance(batch, (list, tuple)):
        if not batch or type(batch[0]) is int:  # torch's samplers: a list of ints, as it is
            return batch
        return [_plain(b) for b in batch]
    if type(batch) is int:
        return batch
    try:
        return operator.index(batch)
    except TypeError:
        pass
    tolist = getattr(batch, "tolist", None)  # an array or tensor of indices
    return tolist() if callable(tolist) else batch


def inner(sampler: Any) -> Any:
    """The sampler inside a batch sampler, or the sampler itself."""
    within = getattr(sampler, "sampler", None)
    return sampler if within is None else within  # (an array of indices has no truth value)


def _holders(sampler: Any) -> list[Any]:
    """The sampler and the one inside it (a batch sampler's), whose generators count."""
    within = inner(sampler)
    return [sampler] if within is sampler else [sampler, within]


def _kinds() -> dict[type, str]:
    """The RNG classes that can exist now (numpy's only once ``numpy.random`` is imported:
    importing it costs ~10 ms, and without it no numpy generator exists)."""
    kinds: dict[type, str] = {random.Random: "random"}
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        kinds[np_random.Generator] = "numpy"
        kinds[np_random.RandomState] = "numpy_legacy"
    torch = _torch.loaded()
    if torch is not None:
        kinds[torch.Generator] = "torch"
    return kinds


def _generators(sampler: Any) -> list[tuple[int, str, str, Any]]:
    """(holder, attribute, kind, generator) for each RNG a holder keeps as an attribute (of
    those classes exactly: a scan by type, ~1 us, as it runs every epoch)."""
    kinds = _kinds()
    found = []
    for h, holder in enumerate(_holders(sampler)):
        for name, value in getattr(holder, "__dict__", {}).items():
            kind = kinds.get(type(value))
            if kind is not None:
                found.append((h, name, kind, value))
    return found


def _get(kind: str, gen: Any) -> Any:
    if kind == "numpy":
        return gen.bit_generator.state
    if kind == "numpy_legacy":
        return gen.get_state()
    if kind == "random":
        return gen.getstate()
    return gen.get_state()  # a uint8 tensor, written as bytes only for a state (Mark.json)


def _set(kind: str, gen: Any, state: Any) -> None:
    if kind == "numpy":
        gen.bit_generator.state = state
    elif kind == "numpy_legacy":
        gen.set_state(state)
    elif kind == "random":
        gen.setstate(state)
    else:
        torch = _torch.get()
        assert torch is not None
        gen.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def _enc(x: Any) -> Any:
    """RNG states (tuples, dicts, arrays, bytes, numbers) as JSON; ``_dec`` undoes it."""
    if isinstance(x, np.ndarray):
        return {"ndarray": _b64(x.tobytes()), "dtype": x.dtype.str, "shape": list(x.shape)}
    if isinstance(x, (bytes, bytearray)):
        return {"bytes": _b64(bytes(x))}
    if isinstance(x, tuple):
        if len(x) > 64 and all(type(v) is int and 0 <= v < 1 << 32 for v in x):
            # Python's Mersenne Twister words: a third of their size in decimal digits
            return {"u32": _b64(np.array(x, dtype="<u4").tobytes())}
        return {"tuple": [_enc(v) for v in x]}
    if isinstance(x, list):
        return [_enc(v) for v in x]
    if isinstance(x, dict):
        return {"dict": {str(k): _enc(v) for k, v in x.items()}}
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def _dec(x: Any) -> Any:
    if isinstance(x, list):
        return [_dec(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "ndarray" in x:
        return np.frombuffer(base64.b64decode(x["ndarray"]), dtype=np.dtype(x["dtype"])).reshape(x["shape"]).copy()
    if "bytes" in x:
        return base64.b64decode(x["bytes"])
    if "u32" in x:
        return tuple(int(v) for v in np.frombuffer(base64.b64decode(x["u32"]), dtype="<u4"))
    if "tuple" in x:
        return tuple(_dec(v) for v in x["tuple"])
    return {k: _dec(v) for k, v in x["dict"].items()}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


GLOBALS = frozenset({"random", "numpy", "torch"})


class Mark:
    """The RNG states a new iteration of a sampler begins from, taken when it begins and
    written as JSON only when a state is asked for (``json``).

    Copying numpy's global state costs ~50 us and Python's ~10 us: a loader takes them all
    at its first epoch, sees which ones the sampler's first draw moved (``moved``), and from
    then on takes only those and torch's (~2 us), and the sampler's own generators."""

    __slots__ = ("py", "np", "torch", "own", "_json")

    def __init__(self, sampler: Any, globals_: frozenset[str] = GLOBALS) -> None:
        self.py = random.getstate() if "random" in globals_ else None
        np_random = sys.modules.get("numpy.random")  # not imported yet: nothing drew from it
        self.np = np_random.get_state() if "numpy" in globals_ and np_random is not None else None
        torch = _torch.loaded()
        self.torch = torch.random.default_generator.get_state() if torch is not None and "torch" in globals_ else None
        self.own = [(h, name, kind, _get(kind, gen)) for h, name, kind, gen in _generators(sampler)]
        self._json: dict[str, Any] | None = None

    def moved(self) -> frozenset[str]:
        """The global RNGs drawn from since this mark (taken with all of them)."""
        now = Mark(None)
        moved = set()
        if now.py != self.py:
            moved.add("random")
        if now.np is not None and (self.np is None or now.np[2] != self.np[2]
                                   or not np.array_equal(now.np[1], self.np[1])):
            moved.add("numpy")
        if now.torch is not None and (self.torch is None or not bool(now.torch.equal(self.torch))):
            moved.add("torch")
        return frozenset(moved)

    def json(self) -> dict[str, Any]:
        if self._json is None:
            self._json = {
                "random": _enc(self.py),
                "numpy": _enc(self.np),
                "torch": _enc(self.torch.numpy().tobytes()) if self.torch is not None else None,
                "own": [[h, name, kind, _enc(state.numpy().tobytes() if kind == "torch" else state)]
                        for h, name, kind, state in self.own],
            }
        return self._json


def as_json(rngs: Mark | dict[str, Any]) -> dict[str, Any]:
    return rngs.json() if isinstance(rngs, Mark) else rngs


class Replaying:
    """``with Replaying(rngs, sampler):`` the RNGs as ``rngs`` (a ``Mark``'s JSON) found them;
    on leaving, the global RNGs get back the states they had on entering (the sampler's own
    generators keep what the draws inside made of them)."""

    def __init__(self, rngs: dict[str, Any], sampler: Any) -> None:
        self.rngs = rngs
        self.sampler = sampler
        self.saved: RngState | None = None

    def __enter__(self) -> Replaying:
        rngs = self.rngs
        self.saved = RngState()
        if rngs["random"] is not None:
            random.setstate(_dec(rngs["random"]))
        if rngs["numpy"] is not None:
            np.random.set_state(_dec(rngs["numpy"]))
        torch = _torch.loaded()
        if rngs["torch"] is not None and torch is not None:
            torch.random.default_generator.set_state(
                torch.frombuffer(bytearray(_dec(rngs["torch"])), dtype=torch.uint8))
        here = {(h, name, kind): gen for h, name, kind, gen in _generators(self.sampler)}
        for h, name, kind, state in rngs["own"]:
            gen = here.get((h, name, kind))
            if gen is not None:  # else the sampler changed: the digest will tell
                _set(kind, gen, _dec(state))
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.saved is not None
        self.saved.restore()


def check(sampler: Any, expected: int | None, got: int, drawn: int, wanted: int) -> str | None:
    """What to warn about after a replay, or None when it drew what the saved run drew."""
    name = type(inner(sampler)).__name__
    if drawn < wanted:
        return (f"resuming: {name} gave {drawn} batches where the saved run had handed out {wanted}; "
                "the resumed epoch is not the saved one's")
    if expected is not None and got != expected:
        fix = "Implement state_dict() and load_state_dict() on the sampler for an exact resume"
        if callable(getattr(inner(sampler), "set_epoch", None)):
            # torch's DistributedSampler: its order is its epoch's, which only the user sets
            fix = (f"{name} orders each epoch by the epoch set_epoch() gave it: after load_state_dict(), "
                   "call sampler.set_epoch() with the epoch the saved run had set before iterating "
                   "(the loader's state_dict()['epoch'] where the loop sets one an epoch from 0), or "
                   "implement state_dict() and load_state_dict() on the sampler")
        return (f"resuming: {name} has no state_dict(), and replaying it from the saved RNG states "
                "drew other batches than the saved run did, so the rest of this epoch is not the saved "
                f"one's. {fix}")
    return None

