"""The sampler protocol and the samplers with no randomness of their own: ``Sampler``,
``SequentialSampler``, ``BatchSampler``; and ``RandomBase``, the torch-mode / seed-mode RNG
the random samplers (``random.py``) share, with its ``state_dict`` form.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterable, Iterator, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from conveyor import _torch

__all__ = ["BatchSampler", "RandomBase", "Sampler", "SequentialSampler", "is_int", "np_rng"]

T = TypeVar("T", covariant=True)

VERSION = 1


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


def is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def np_rng(seed: int, epoch: int) -> np.random.Generator:
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


class RandomBase(Sampler[int]):
    """Shared RNG handling of the shuffling samplers (torch mode and seed mode)."""

    # torch mode with generator=None: RandomSampler draws a seed from the global
    # RNG; the others draw from the global RNG directly.
    _draws_seed = False

    def _init_rng(self, generator: Any, seed: int | None) -> None:
        if seed is not None:
            if generator is not None:
                raise ValueError("pass either generator or seed, not both")
            if not is_int(seed) or seed < 0:
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
        # chain hands out their items at C speed, with no generator resumed for every index
        # (docs/decisions/lean-path-for-main-process-batches.md). chain takes its first chunk
        # at the first item, so nothing is drawn before then.
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
            >>> from conveyor.samplers import RandomSampler
            >>> s = RandomSampler(range(5), seed=0)
            >>> s.set_epoch(3)
        """
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch should be a non-negative integer, but got epoch={epoch!r}")
        self._epoch = int(epoch)
        self._current = None

    def _numpy_start(self) -> np.random.Generator:
        epoch = self._epoch
        self._current = epoch
        self._epoch = epoch + 1
        assert self.seed is not None
        return np_rng(self.seed, epoch)

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


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of ``sampler`` (any iterable) into lists of ``batch_size``.

    Example:
        >>> list(BatchSampler(range(5), batch_size=2, drop_last=False))
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not is_int(batch_size) or batch_size <= 0:
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
        if isinstance(self.sampler, RandomBase):
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
