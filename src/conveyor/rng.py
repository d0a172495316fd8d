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

__all__ = ["mix", "sample_seed", "seed_all", "worker_seed", "RngState"]

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
    """Seed ``random``, numpy's global RNG and (if imported) torch's."""
    random.seed(seed)
    if numpy_seed is None:
        numpy_seed = seed & 0xFFFFFFFF
    np.random.seed(numpy_seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.random.default_generator.manual_seed(seed)


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed a worker's RNGs as torch does; returns the worker's seed."""
    seed = worker_seed(base_seed, worker_id)
    state = np.random.SeedSequence([worker_id, base_seed & 0xFFFFFFFF, (base_seed >> 32) & 0xFFFFFFFF])
    seed_all(seed, numpy_seed=state.generate_state(4))
    return seed


class RngState:
    """Saved states of the global RNGs, to restore after seeding in the main thread.

    numpy imports ``numpy.random`` lazily (~10 ms in a fresh process): where nothing has
    imported it yet, nothing has drawn from its global RNG, and its state is recorded as
    None rather than imported for the snapshot. Restoring such a snapshot after something
    imported it gives numpy's global RNG a fresh seed from the OS, as its import would
    have. (A state freshly imported cannot be told from one drawn from, so a snapshot
    with numpy and one without are never the same.)
    """

    __slots__ = ("py", "np", "torch")

    def __init__(self) -> None:
        self.py = random.getstate()
        np_random = sys.modules.get("numpy.random")
        self.np = np_random.get_state() if np_random is not None else None
        torch = sys.modules.get("torch")
        self.torch = torch.random.default_generator.get_state() if torch is not None else None

    def restore(self) -> None:
        random.setstate(self.py)
        if self.np is not None:
            np.random.set_state(self.np)
        elif "numpy.random" in sys.modules:
            np.random.seed()  # imported since the snapshot (by seeding or the dataset): unseeded again
        torch = sys.modules.get("torch")
        if torch is not None and self.torch is not None:
            torch.random.default_generator.set_state(self.torch)

    def same(self, other: RngState) -> bool:
        """True when no global RNG moved between the two snapshots."""
        if self.py != other.py:
            return False
        if self.np is None or other.np is None:
            if self.np is not other.np:
                return False
        elif self.np[2] != other.np[2] or not np.array_equal(self.np[1], other.np[1]):
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
