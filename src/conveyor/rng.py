"""Per-sample and per-worker seeding of Python's, numpy's and torch's RNGs.

Randomness belongs to the sample, not the worker: with a loader seed, the
global RNGs are reseeded from ``(seed, epoch, index)`` before each sample is
fetched, so augmentation is bit-identical whatever the worker count, worker
type, prefetch depth or fetch concurrency. Without a loader seed, each
worker is seeded once from ``(base_seed, worker_id)`` as torch does.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np

from . import _torch
from ._platform import rng_memory
from ._platform.imports import find_wrapped, insert_first

__all__ = ["mix", "sample_seed", "seed_all", "worker_seed", "RngState", "fingerprint"]

_MASK64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix(*parts: int) -> int:
    """Hash integers into one well-mixed 64-bit seed.

    >>> mix(1, 2, 3) == mix(1, 2, 3) != mix(1, 2, 4)
    True
    """
    h = 0x243F6A8885A308D3
    for p in parts:
        h = _splitmix(h ^ (int(p) & _MASK64))
    return h


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 63-bit seed for sample ``index`` of ``epoch`` under loader ``seed``."""
    return mix(seed, epoch, index) >> 1


def worker_seed(base_seed: int, worker_id: int) -> int:
    """Seed of a worker without a loader seed: torch's ``base_seed + worker_id``."""
    return base_seed + worker_id


def seed_all(seed: int, *, numpy_seed: Any = None) -> None:
    """Seed ``random``, numpy's global RNG and (if imported) torch's.

    numpy's global RNG lives in ``numpy.random``, which numpy 2 imports lazily (~10 ms in a
    fresh process, ~6 ms in a forked one). Where nothing has imported it, nothing can draw
    from it: its seed is kept and applied the moment something imports it, which gives the
    same stream as seeding it now. ``numpy_seed`` may be a callable taking the
    ``numpy.random`` module (for seeds that need its ``SeedSequence``)."""
    random.seed(seed)
    if numpy_seed is None:
        numpy_seed = seed & 0xFFFFFFFF
    _seed_numpy(numpy_seed)
    torch = _torch.loaded()
    if torch is not None:
        torch.random.default_generator.manual_seed(seed)
    elif defer_torch:
        global torch_pending
        torch_pending = seed


# A process worker that starts without torch (``executors.torchless``) sets ``defer_torch``:
# the seed torch's RNG would have had is kept in ``torch_pending`` and applied the moment
# something imports torch there, which gives the same stream as seeding it then. Never in
# the main process: the user's own torch RNG is not conveyor's to seed.
defer_torch = False
torch_pending: int | None = None


class _WorkerNumpySeed:
    """The numpy seed torch gives worker ``worker_id`` of ``base_seed`` (a SeedSequence of
    both); comparable, so that two pending seeds can be told apart without numpy.random."""

    __slots__ = ("key",)

    def __init__(self, worker_id: int, base_seed: int) -> None:
        self.key = (worker_id, base_seed & 0xFFFFFFFF, (base_seed >> 32) & 0xFFFFFFFF)

    def __call__(self, np_random: Any) -> Any:
        return np_random.SeedSequence(list(self.key)).generate_state(4)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _WorkerNumpySeed) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __reduce__(self) -> tuple[Any, ...]:
        return _WorkerNumpySeed, (self.key[0], self.key[1] | self.key[2] << 32)


STREAM_SALT = 0x57EA  # a stream's RNGs at an epoch's start: mix(seed, epoch, STREAM_SALT)


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed a worker's RNGs as torch does; returns the worker's seed."""
    seed = worker_seed(base_seed, worker_id)
    seed_all(seed, numpy_seed=_WorkerNumpySeed(worker_id, base_seed))
    return seed


def _seed_numpy(numpy_seed: Any) -> None:
    """Seed numpy's global RNG now if ``numpy.random`` is imported, else when it is."""
    np_random = sys.modules.get("numpy.random")
    if np_random is None:
        _on_import.arm(numpy_seed)
        return
    _on_import.pending = None
    _apply(np_random, numpy_seed)


def _apply(np_random: Any, numpy_seed: Any) -> None:
    """Seed the imported ``numpy.random`` with a seed value or a callable that makes one."""
    np_random.seed(numpy_seed(np_random) if callable(numpy_seed) else numpy_seed)


class _SeedOnImport:
    """An import hook that seeds numpy's global RNG right after ``numpy.random`` is imported,
    while a seed is pending. It finds nothing itself: it wraps the loader the other finders
    return for ``numpy.random``. (A plain class: ``importlib.abc`` takes ~10 ms to import.)"""

    def __init__(self) -> None:
        self.pending: Any = None  # the numpy seed to apply at import; None: do nothing

    def arm(self, numpy_seed: Any) -> None:
        self.pending = numpy_seed
        insert_first(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if self.pending is None or fullname != "numpy.random":
            return None
        return find_wrapped(self, fullname, path, target, _seed_imported)


def _seed_imported(module: Any) -> None:
    """``numpy.random`` has just run: the pending seed, if any."""
    pending, _on_import.pending = _on_import.pending, None
    if pending is not None:
        _apply(module, pending)


_on_import = _SeedOnImport()


class _Pending:
    """A snapshot's numpy state where ``numpy.random`` is not imported but a seed waits for it."""

    __slots__ = ("seed",)

    def __init__(self, seed: Any) -> None:
        self.seed = seed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Pending) and type(other.seed) is type(self.seed) and other.seed == self.seed

    def __reduce__(self) -> tuple[Any, ...]:
        return _Pending, (self.seed,)


class RngState:
    """Saved states of the global RNGs, to restore after seeding in the main thread.

    numpy imports ``numpy.random`` lazily (~10 ms in a fresh process): where nothing has
    imported it yet, nothing has drawn from its global RNG, and its state is recorded
    without importing it: as the seed waiting for its import (see ``seed_all``), or as
    None. Restoring a None snapshot after something imported it gives numpy's global RNG
    a fresh seed from the OS, as its import would have. (A state freshly imported cannot
    be told from one drawn from, so a snapshot with numpy and one without are never the
    same.)
    """

    __slots__ = ("py", "np", "torch")

    def __init__(self) -> None:
        self.py = random.getstate()
        np_random = sys.modules.get("numpy.random")
        pending = _on_import.pending
        self.np: Any = (np_random.get_state() if np_random is not None else
                        None if pending is None else _Pending(pending))
        torch = _torch.loaded()
        self.torch = torch.random.default_generator.get_state() if torch is not None else None

    def restore(self) -> None:
        random.setstate(self.py)
        state = self.np
        if type(state) is _Pending:
            _seed_numpy(state.seed)
        else:
            _on_import.pending = None
            if state is not None:
                np.random.set_state(state)
            elif "numpy.random" in sys.modules:
                np.random.seed()  # imported since the snapshot (by seeding or the dataset): unseeded again
        torch = _torch.loaded()
        if torch is not None and self.torch is not None:
            torch.random.default_generator.set_state(self.torch)

    def same(self, other: RngState) -> bool:
        """True when no global RNG moved between the two snapshots."""
        if self.py != other.py:
            return False
        a, b = self.np, other.np
        if type(a) is tuple and type(b) is tuple:
            if a[2] != b[2] or not np.array_equal(a[1], b[1]):
                return False
        elif not (a is None and b is None or type(a) is _Pending and a == b):
            return False
        if self.torch is None or other.torch is None:
            return self.torch is other.torch
        return bool(self.torch.equal(other.torch))

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_state, (self.py, self.np, self.torch)


def _rebuild_state(py: Any, np_state: Any, torch_state: Any) -> RngState:
    state = RngState.__new__(RngState)
    state.py, state.np, state.torch = py, np_state, torch_state
    return state


# -- fingerprint: has anything drawn from the global RNGs? ---------------------------------
# Fetch threads that share a process's global RNGs take turns to seed a sample and fetch it;
# a dataset that draws nothing from them need not (``executors.seeding.SeededFetch``). Telling
# whether a fetch drew must cost little next to it: ``RngState`` and ``same`` cost ~45 and
# ~9 us (numpy's ``get_state`` alone ~30 us), a fingerprint ~3 us. It reads the Mersenne
# Twister states of ``random`` and ``numpy.random`` in place (their C structs: a position and
# 624 words; any draw moves the position, 624 of them renew the words), and the fields of
# numpy's ``RandomState`` object past its header (where it keeps a second normal drawn for
# later, which a draw takes without moving the words). Checks on private instances confirm
# those layouts once (``_platform.rng_memory``); where they fail it falls back to ``getstate``.


def fingerprint() -> tuple[Any, ...]:
    """A token of where the global RNGs stand: two are equal when nothing drew from them in
    between (nor seeded them elsewhere). Cheap enough to take around every sample."""
    inst = random._inst  # type: ignore[attr-defined]
    if rng_memory.PY_IN_PLACE and type(inst) is random.Random:
        py: Any = (rng_memory.py_words(inst), inst.gauss_next)
    else:  # pragma: no cover - another interpreter, or random._inst replaced
        py = random.getstate()
    np_random = sys.modules.get("numpy.random")
    if np_random is None:
        nps: Any = ("pending", _on_import.pending)
    else:
        rs = np_random.mtrand._rand
        words = rng_memory.np_words(np_random, rs)
        nps = words if words is not None else np_random.get_state()
    torch = _torch.loaded()
    ts = torch.random.default_generator.get_state().numpy().tobytes() if torch is not None else None
    return py, nps, ts
