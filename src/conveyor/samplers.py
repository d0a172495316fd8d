"""Samplers: which dataset indices to load, in which order.

```
 data_source ──> Sampler ──> index, index, ...  ──> BatchSampler ──> [index, ...], ...
                   ▲                                     │
  (seed, epoch) or a torch.Generator          state_dict / load_state_dict
```

Randomness has two modes:

* **torch mode** (no ``seed=`` given and torch installed): the samplers draw
  exactly what ``torch.utils.data``'s samplers draw, from the same RNG and in
  the same order, so the same ``torch.manual_seed`` or ``torch.Generator``
  gives the same indices as torch.
* **seed mode** (``seed=`` given, or torch missing): the order is a pure
  function of ``(seed, epoch)`` computed with numpy. Each iteration uses the
  current epoch and then moves to the next one; ``set_epoch`` picks it.

Every sampler checkpoints with ``state_dict()``: a small JSON-ready dict from
which ``load_state_dict`` on an identically built sampler makes the next
iteration repeat the one that most recently started (or the one that would
start next). Skipping consumed items on resume is the loader's job.
"""

from __future__ import annotations

import base64
import itertools
import math
import os
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from conveyor import _torch

__all__ = [
    "BatchSampler",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]

T = TypeVar("T", covariant=True)

VERSION = 1
MULTINOMIAL_LIMIT = 2**24  # torch.multinomial's cap on categories
CHUNK = 32  # torch draws indices with replacement 32 at a time
NP_CHUNK = 1 << 16
NP_BLOCK = 1 << 20  # weights per block when drawing a few items without replacement from many


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _gen_state(generator: Any) -> bytes:
    return generator.get_state().numpy().tobytes()


def _set_gen_state(generator: Any, data: bytes) -> None:
    torch = _torch.get()
    assert torch is not None
    generator.set_state(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _np_rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))


class Sampler(Generic[T]):
    """Base class: yields dataset indices (or batches of them) from ``__iter__``.

    Subclasses may add ``__len__``; the base defines none on purpose, so
    ``list(sampler)`` still works for samplers of unknown length.

    Example:
        >>> class Evens(Sampler[int]):
        ...     def __iter__(self):
        ...         return iter(range(0, 10, 2))
        >>> list(Evens())
        [0, 2, 4, 6, 8]
    """

    def __iter__(self) -> Iterator[T]:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch for the next iteration (no-op here).

        Example:
            >>> SequentialSampler(range(3)).set_epoch(1)
        """

    def state_dict(self) -> dict[str, Any]:
        """A JSON-ready checkpoint of this sampler.

        Example:
            >>> SequentialSampler(range(3)).state_dict()["class"]
            'SequentialSampler'
        """
        if type(self).state_dict is Sampler.state_dict:
            raise TypeError(f"{type(self).__name__} does not implement state_dict() and load_state_dict(): "
                            "add them to make a loader using this sampler resumable")
        return {"version": VERSION, "class": type(self).__name__}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint made by ``state_dict`` of the same kind of sampler.

        Example:
            >>> s = SequentialSampler(range(3))
            >>> s.load_state_dict(s.state_dict())
        """
        self._check(state)

    def _check(self, state: dict[str, Any], **expect: object) -> None:
        name = type(self).__name__
        if not isinstance(state, dict):
            raise ValueError(f"{name}.load_state_dict expects a dict, got {type(state).__name__}")
        if state.get("class") != name:
            raise ValueError(f"state was saved by {state.get('class')!r}, cannot load it into {name}")
        if state.get("version") != VERSION:
            raise ValueError(f"unsupported {name} state version {state.get('version')!r} (expected {VERSION})")
        for key, value in expect.items():
            if state.get(key) != value:
                raise ValueError(
                    f"{name} state does not match this sampler: {key} is {state.get(key)!r} "
                    f"in the state but {value!r} here"
                )


class SequentialSampler(Sampler[int]):
    """Yields ``0, 1, ..., len(data_source) - 1``.

    Example:
        >>> list(SequentialSampler("abc"))
        [0, 1, 2]
    """

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def order(self) -> np.ndarray:
        """This iteration's whole sequence as one int64 array (what ``__iter__`` yields)."""
        return np.arange(len(self.data_source), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.data_source)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "n": len(self.data_source)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check(state, n=len(self.data_source))


class _Random(Sampler[int]):
    """Shared RNG handling of the shuffling samplers (torch mode and seed mode)."""

    # torch mode with generator=None: RandomSampler draws a seed from the global
    # RNG; the others draw from the global RNG directly.
    _draws_seed = False

    def _init_rng(self, generator: Any, seed: int | None) -> None:
        if seed is not None:
            if generator is not None:
                raise ValueError("pass either generator or seed, not both")
            if not _is_int(seed) or seed < 0:
                raise ValueError(f"seed should be a non-negative integer, but got seed={seed!r}")
            seed = int(seed)
        elif generator is not None:
            if not _torch.is_generator(generator):
                raise TypeError(f"generator should be a torch.Generator, but got {type(generator).__name__}")
        elif not _torch.available():
            seed = _fresh_seed()
        self.generator = generator
        self.seed = seed
        self._epoch = 0  # seed mode: epoch of the next iteration
        self._current: int | None = None  # seed mode: epoch of the running iteration
        self._mark: dict[str, Any] | None = None  # torch mode: how the last iteration began
        self._replay: dict[str, Any] | None = None  # torch mode: loaded, used by the next iteration
        self._pending = False  # torch mode: an iteration was asked for and has not drawn yet

    @property
    def _torch_mode(self) -> bool:
        return self.seed is None

    def __iter__(self) -> Iterator[int]:
        # Seed mode takes its epoch now: each iterator keeps the epoch it was made for, even
        # when another one is made before its first item. Torch mode draws at the first item,
        # as torch's samplers do; until then the state describes a fresh start.
        # The draws come in chunks (a permutation, torch's 32 indices with replacement) and
        # chain hands out their items at C speed, where a generator was resumed for every
        # index (a shuffled batch of 32 of 759: 2.8 -> 2.3 us). chain takes its first chunk
        # at the first item, so nothing is drawn before then, as before.
        if self._torch_mode:
            self._pending = True
            return itertools.chain.from_iterable(self._chunks(None))
        return itertools.chain.from_iterable(self._chunks(self._numpy_start()))

    def _chunks(self, rng: np.random.Generator | None) -> Iterator[Iterable[int]]:
        """This iteration's indices as consecutive chunks, each drawn when the one before is used up."""
        raise NotImplementedError

    def _will_start(self) -> None:
        """An iteration (or ``order()``) is coming: until it draws, the state is a fresh start's."""
        if self._torch_mode:
            self._pending = True

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (seed mode; no-op in torch mode).

        Example:
            >>> s = RandomSampler(range(5), seed=0)
            >>> s.set_epoch(3)
        """
        if not _is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch should be a non-negative integer, but got epoch={epoch!r}")
        self._epoch = int(epoch)
        self._current = None

    def _numpy_start(self) -> np.random.Generator:
        epoch = self._epoch
        self._current = epoch
        self._epoch = epoch + 1
        assert self.seed is not None
        return _np_rng(self.seed, epoch)

    def _torch_start(self) -> Any:
        """The torch generator for a new iteration (None: the global RNG), recording how it began."""
        torch = _torch.get()
        assert torch is not None
        self._pending = False
        replay, self._replay = self._replay, None
        if self.generator is not None:
            if replay is not None:
                _set_gen_state(self.generator, replay["generator"])
            self._mark = {"generator": _gen_state(self.generator)}
            return self.generator
        if self._draws_seed:
            if replay is not None:
                seed = replay["torch_seed"]
            else:
                seed = int(torch.empty((), dtype=torch.int64).random_().item())
            self._mark = {"torch_seed": seed}
            return torch.Generator().manual_seed(seed)
        if replay is not None:
            self._mark = replay
            gen = torch.Generator()
            _set_gen_state(gen, replay["global_state"])
            return gen
        self._mark = {"global_state": torch.get_rng_state().numpy().tobytes()}
        return None

    def _rng_state(self) -> dict[str, Any]:
        if not self._torch_mode:
            epoch = self._current if self._current is not None else self._epoch
            return {"mode": "seed", "seed": self.seed, "epoch": epoch}
        mark = self._replay or (None if self._pending else self._mark)
        if self.generator is not None:
            data = mark["generator"] if mark else _gen_state(self.generator)
            return {"mode": "torch", "generator": _b64(data)}
        if self._draws_seed:
            return {"mode": "torch", "torch_seed": mark["torch_seed"] if mark else None}
        return {"mode": "torch", "global_state": _b64(mark["global_state"]) if mark else None}

    def _load_rng(self, state: dict[str, Any]) -> None:
        mode = "torch" if self._torch_mode else "seed"
        name = type(self).__name__
        if state.get("mode") != mode:
            raise ValueError(f"{name} state was saved in {state.get('mode')!r} mode, this sampler is in {mode!r} mode")
        if mode == "seed":
            self.seed = int(state["seed"])
            self.set_epoch(int(state["epoch"]))
            return
        if self.generator is not None:
            if "generator" not in state:
                raise ValueError(f"{name} state has no generator state but this sampler has a generator")
            self._replay = {"generator": _unb64(state["generator"])}
        elif self._draws_seed:
            if "torch_seed" not in state:
                raise ValueError(f"{name} state has no torch_seed but this sampler uses the global RNG")
            seed = state["torch_seed"]
            self._replay = None if seed is None else {"torch_seed": int(seed)}
        else:
            if "global_state" not in state:
                raise ValueError(f"{name} state has no global_state but this sampler uses the global RNG")
            data = state["global_state"]
            self._replay = None if data is None else {"global_state": _unb64(data)}
        self._mark = None
        self._pending = False

    def _torch_seed_for_numpy(self, gen: Any) -> np.random.Generator:
        """A numpy RNG seeded by one draw from a torch generator (None: global RNG)."""
        torch = _torch.get()
        assert torch is not None
        seed = int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())
        return np.random.default_rng(seed)


class RandomSampler(_Random):
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
        if not _is_int(count) or count <= 0:
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


class SubsetRandomSampler(_Random):
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


class WeightedRandomSampler(_Random):
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
        if not _is_int(num_samples) or num_samples <= 0:
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


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of ``sampler`` (any iterable) into lists of ``batch_size``.

    Example:
        >>> list(BatchSampler(range(5), batch_size=2, drop_last=False))
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not _is_int(batch_size) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        # conveyor's shuffling samplers are iterated now, not at the first batch: in seed mode
        # they take their epoch then (this iterator keeps it); in torch mode nothing is drawn
        # yet. Others stay untouched until the first batch, as torch's BatchSampler leaves
        # them (a set_epoch() in between still counts).
        if isinstance(self.sampler, _Random):
            return self._batches(iter(self.sampler))
        return self._lazy()

    def _lazy(self) -> Iterator[list[int]]:
        yield from self._batches(iter(self.sampler))

    def _batches(self, items: Iterator[int]) -> Iterator[list[int]]:
        size = self.batch_size
        if self.drop_last:
            # zip over one iterator repeated: full tuples only, no per-item Python work
            yield from map(list, zip(*([items] * size)))
            return
        islice = itertools.islice
        batch = list(islice(items, size))
        while batch:
            yield batch
            batch = list(islice(items, size))

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def _inner(self) -> Any:
        if not (hasattr(self.sampler, "state_dict") and hasattr(self.sampler, "load_state_dict")):
            raise TypeError(
                f"{type(self.sampler).__name__} must implement state_dict/load_state_dict "
                "for BatchSampler to be resumable"
            )
        return self.sampler

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "sampler": self._inner().state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        inner = self._inner()
        self._check(state, batch_size=self.batch_size, drop_last=self.drop_last)
        inner.load_state_dict(state["sampler"])


def _world() -> tuple[int | None, int | None]:
    """(world size, rank) from torch.distributed if initialized, else from the environment."""
    torch = _torch.loaded()  # initializing torch.distributed means torch is imported
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
    size, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    return (int(size) if size else None), (int(rank) if rank else None)


class DistributedSampler(Sampler[int]):
    """Yields this rank's share of the dataset indices for distributed training.

    With ``even=True`` (torch's semantics) every rank gets ``ceil(n / world)``
    indices, padding by repeating indices (or dropping the tail with
    ``drop_last``), shuffled by ``seed + epoch`` exactly as
    ``torch.utils.data.DistributedSampler``. With ``even=False`` (for
    evaluation) rank ``r`` gets positions ``r, r + world, ...``: the ranks
    partition the dataset with no duplicates (``drop_last`` still drops the
    tail). Without torch the shuffle is numpy's, from ``(seed, epoch)``.

    Example:
        >>> list(DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False))
        [1, 3, 0]
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        even: bool = True,
    ) -> None:
        if num_replicas is None or rank is None:
            world, own = _world()
            num_replicas = world if num_replicas is None else num_replicas
            rank = own if rank is None else rank
        if num_replicas is None or rank is None:
            raise ValueError(
                "cannot tell num_replicas/rank: torch.distributed is not initialized and "
                "WORLD_SIZE/RANK are not set; pass num_replicas= and rank="
            )
        if not _is_int(num_replicas) or num_replicas <= 0:
            raise ValueError(f"num_replicas should be a positive integer, but got num_replicas={num_replicas}")
        if not _is_int(rank) or rank < 0 or rank >= num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.even = even
        self.epoch = 0
        n = len(dataset)
        if drop_last and n % self.num_replicas:
            self.num_samples = math.ceil((n - self.num_replicas) / self.num_replicas)
        elif even or drop_last:
            self.num_samples = math.ceil(n / self.num_replicas)
        else:
            self.num_samples = len(range(self.rank, n, self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas if (even or drop_last) else n

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; with ``shuffle`` each epoch has its own order.

        Example:
            >>> DistributedSampler(range(8), num_replicas=2, rank=0).set_epoch(1)
        """
        self.epoch = epoch

    def _order(self, n: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(n)
        torch = _torch.get()
        if torch is None:
            return _np_rng(self.seed, self.epoch).permutation(n)
        gen = torch.Generator()
        gen.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=gen).numpy()

    def __iter__(self) -> Iterator[int]:
        order = self._order(len(self.dataset))
        if self.drop_last:
            order = order[: self.total_size]
        elif self.even:
            order = np.resize(order, self.total_size)  # cyclic repeat: torch's padding
        return iter(order[self.rank : self.total_size : self.num_replicas].tolist())

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "n": len(self.dataset),
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "even": self.even,
            "seed": self.seed,
            "epoch": self.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check(
            state,
            n=len(self.dataset),
            num_replicas=self.num_replicas,
            rank=self.rank,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            even=self.even,
        )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
