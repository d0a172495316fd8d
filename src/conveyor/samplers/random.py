"""The samplers that draw: ``RandomSampler`` (permutations, or draws with replacement),
``SubsetRandomSampler`` (a permutation of given indices) and ``WeightedRandomSampler``
(draws in proportion to weights). Their RNG (torch mode or seed mode) is ``RandomBase``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import numpy as np

from conveyor import _torch

from .base import RandomBase, is_int

__all__ = ["RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler"]

MULTINOMIAL_LIMIT = 2**24  # torch.multinomial's cap on categories
CHUNK = 32  # torch draws indices with replacement 32 at a time
NP_CHUNK = 1 << 16
NP_BLOCK = 1 << 20  # weights per block when drawing a few items without replacement from many


class RandomSampler(RandomBase):
    """Yields indices of ``data_source`` in random order.

    Without replacement it yields whole permutations (cut to ``num_samples``);
    with replacement it draws ``num_samples`` indices independently. In torch
    mode it matches ``torch.utils.data.RandomSampler`` draw for draw.

    Example:
        >>> sorted(RandomSampler(range(4), seed=0))
        [0, 1, 2, 3]
    """

    _draws_seed = True

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Any = None,
        *,
        seed: int | None = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
        count = self.num_samples
        if not is_int(count) or count <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={count}")
        self._init_rng(generator, seed)

    @property
    def num_samples(self) -> int:
        """``num_samples`` if given, else the current ``len(data_source)``."""
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __len__(self) -> int:
        return self.num_samples

    def _chunks(self, rng: np.random.Generator | None) -> Iterator[Iterable[int]]:
        n = len(self.data_source)
        count = self.num_samples
        if rng is None:
            torch = _torch.get()
            assert torch is not None
            gen = self._torch_start()
            if self.replacement:
                for _ in range(count // CHUNK):
                    yield torch.randint(high=n, size=(CHUNK,), dtype=torch.int64, generator=gen).tolist()
                rest = count % CHUNK
                yield torch.randint(high=n, size=(rest,), dtype=torch.int64, generator=gen).tolist()
            else:
                for _ in range(count // n):
                    yield torch.randperm(n, generator=gen).tolist()
                yield torch.randperm(n, generator=gen).tolist()[: count % n]
            return
        if self.replacement:
            for start in range(0, count, NP_CHUNK):
                yield rng.integers(0, n, size=min(NP_CHUNK, count - start)).tolist()
        else:
            for _ in range(count // n):
                yield rng.permutation(n).tolist()
            if count % n:
                yield rng.permutation(n)[: count % n].tolist()

    def order(self) -> np.ndarray:
        """This iteration's whole sequence as one int64 array, drawn exactly as ``__iter__`` draws it.

        ``__iter__`` keeps its own lazy, chunk-by-chunk draws: an epoch broken off early
        must leave a shared generator where torch's sampler would leave it.

        >>> RandomSampler(range(4), seed=0).order().tolist() == list(RandomSampler(range(4), seed=0))
        True
        """
        n = len(self.data_source)
        count = self.num_samples
        parts: list[np.ndarray] = []
        if self._torch_mode:
            torch = _torch.get()
            assert torch is not None
            gen = self._torch_start()
            if self.replacement:
                for _ in range(count // CHUNK):
                    parts.append(torch.randint(high=n, size=(CHUNK,), dtype=torch.int64, generator=gen).numpy())
                parts.append(torch.randint(high=n, size=(count % CHUNK,), dtype=torch.int64, generator=gen).numpy())
            else:
                for _ in range(count // n):
                    parts.append(torch.randperm(n, generator=gen).numpy())
                parts.append(torch.randperm(n, generator=gen).numpy()[: count % n])
        else:
            rng = self._numpy_start()
            if self.replacement:
                for start in range(0, count, NP_CHUNK):
                    parts.append(rng.integers(0, n, size=min(NP_CHUNK, count - start)))
            else:
                for _ in range(count // n):
                    parts.append(rng.permutation(n))
                if count % n:
                    parts.append(rng.permutation(n)[: count % n])
        out = np.concatenate(parts) if len(parts) != 1 else parts[0]
        return out.astype(np.int64, copy=False)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "n": len(self.data_source),
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            **self._rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check(state, n=len(self.data_source), num_samples=self.num_samples, replacement=self.replacement)
        self._load_rng(state)


class SubsetRandomSampler(RandomBase):
    """Yields the given indices in random order, without replacement.

    Example:
        >>> sorted(SubsetRandomSampler([7, 3, 5], seed=1))
        [3, 5, 7]
    """

    def __init__(self, indices: Sequence[int], generator: Any = None, *, seed: int | None = None) -> None:
        self.indices = indices
        self._init_rng(generator, seed)

    def __len__(self) -> int:
        return len(self.indices)

    def _chunks(self, rng: np.random.Generator | None) -> Iterator[Iterable[int]]:
        n = len(self.indices)
        if rng is None:
            torch = _torch.get()
            assert torch is not None
            order = torch.randperm(n, generator=self._torch_start()).tolist()
        else:
            order = rng.permutation(n).tolist()
        yield map(self.indices.__getitem__, order)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "n": len(self.indices), **self._rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check(state, n=len(self.indices))
        self._load_rng(state)


class WeightedRandomSampler(RandomBase):
    """Yields ``num_samples`` indices of ``weights``, each drawn with probability proportional to its weight.

    With at most 2**24 weights, torch mode uses ``torch.multinomial`` exactly
    as torch does (with or without replacement: the same draws as torch's
    sampler). Larger weight arrays and seed mode use numpy (inverse CDF;
    exponential keys), so there is no cap on the number of categories. Zero
    weights are never drawn. Bad weights raise ``ValueError`` when the sampler
    is made (torch raises ``RuntimeError`` when it is iterated).

    Example:
        >>> list(WeightedRandomSampler([0.0, 1.0, 0.0], 3, seed=0))
        [1, 1, 1]
    """

    def __init__(
        self,
        weights: Sequence[float] | Any,
        num_samples: int,
        replacement: bool = True,
        generator: Any = None,
        *,
        seed: int | None = None,
    ) -> None:
        if not is_int(num_samples) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        if _torch.is_tensor(weights):
            torch = _torch.get()
            assert torch is not None
            w = weights.detach().to("cpu", torch.double).numpy()
        else:
            w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(w.shape)}")
        w = np.ascontiguousarray(w)
        if len(w) == 0:
            raise ValueError("weights should not be empty")
        if not np.isfinite(w).all():
            raise ValueError("weights should be finite (no inf or nan)")
        if (w < 0).any():
            raise ValueError("weights should be non-negative")
        positive = int(np.count_nonzero(w))
        if positive == 0:
            raise ValueError("weights should have a positive sum")
        if not replacement and num_samples > positive:
            raise ValueError(
                f"cannot draw num_samples={num_samples} without replacement from {positive} positive weights"
            )
        self._w = w
        self.num_samples = int(num_samples)
        self.replacement = replacement
        self._cdf: np.ndarray | None = None
        self._last = int(np.flatnonzero(w)[-1])
        self._init_rng(generator, seed)

    @property
    def weights(self) -> Any:
        """The weights as a float64 tensor (a numpy array without torch)."""
        torch = _torch.get()
        return self._w if torch is None else torch.from_numpy(self._w)

    def __len__(self) -> int:
        return self.num_samples

    def _chunks(self, rng: np.random.Generator | None) -> Iterator[Iterable[int]]:
        if rng is None:
            torch = _torch.get()
            assert torch is not None
            gen = self._torch_start()
            if len(self._w) <= MULTINOMIAL_LIMIT:
                drawn = torch.multinomial(torch.from_numpy(self._w), self.num_samples, self.replacement,
                                          generator=gen)
                yield drawn.tolist()
                return
            rng = self._torch_seed_for_numpy(gen)
        yield self._draw(rng).tolist()

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        w, k = self._w, self.num_samples
        if self.replacement:
            if self._cdf is None:
                self._cdf = np.cumsum(w)
            cdf = self._cdf
            picks = np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right")
            return np.minimum(picks, self._last, out=picks)
        # Exponential keys: the k smallest Exp(1)/w are a weighted sample without replacement, in draw order.
        if len(w) > NP_BLOCK and k <= NP_BLOCK // 2:
            keys, picks = _smallest_keys_blocked(rng, w, k)
        else:
            keys = rng.standard_exponential(len(w))
            with np.errstate(divide="ignore"):
                np.divide(keys, w, out=keys)
            picks = np.argpartition(keys, k - 1)[:k] if k < len(w) else np.arange(len(w))
            keys = keys[picks]
        return picks[np.argsort(keys, kind="stable")]

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "n": len(self._w),
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            **self._rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check(state, n=len(self._w), num_samples=self.num_samples, replacement=self.replacement)
        self._load_rng(state)


def _smallest_keys_blocked(rng: np.random.Generator, w: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k smallest keys Exp(1)/w and their indices, one block at a time (small k, huge w)."""
    best_keys = np.empty(0)
    best = np.empty(0, dtype=np.intp)
    keys = np.empty(NP_BLOCK)
    for start in range(0, len(w), NP_BLOCK):
        part = w[start : start + NP_BLOCK]
        block = keys[: len(part)]
        rng.standard_exponential(out=block)
        with np.errstate(divide="ignore"):
            np.divide(block, part, out=block)
        top = np.argpartition(block, k - 1)[:k] if k < len(block) else np.arange(len(block))
        merged_keys = np.concatenate([best_keys, block[top]])
        merged = np.concatenate([best, top + start])
        if len(merged) > k:
            keep = np.argpartition(merged_keys, k - 1)[:k]
            merged_keys, merged = merged_keys[keep], merged[keep]
        best_keys, best = merged_keys, merged
    return best_keys, best
