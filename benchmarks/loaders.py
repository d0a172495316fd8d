"""Loader adapters: one way to drive torch, torchdata, Grain, SPDL and conveyor.

    make(name, dataset, batch_size, collate_fn, epochs, **opts) ──> Handle
    for e in range(epochs): for batch in handle.epoch(): step(batch)
    handle.close()

Each adapter builds its loader once (workers persist across epochs where the
library allows it) and hands out one epoch of batches per ``epoch()`` call.
Peers that stream one pipeline over all epochs (Grain, SPDL) are built for
``epochs`` passes and sliced into epochs of ``ceil(len / batch_size)`` batches.

>>> h = make("torch0", list(range(10)), batch_size=4, collate_fn=None, epochs=1)
>>> [len(b) for b in h.epoch()]
[4, 4, 2]
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["LOADERS", "Handle", "available", "make", "workers_of"]

Collate = Callable[[list[Any]], Any] | None

LOADERS = ("torch0", "torch2", "torchdata2", "grain2", "spdl2",
           "conveyor0", "conveyor2", "conveyor2t", "conveyor_auto")

PEER_MODULES = {"torchdata2": "torchdata.stateful_dataloader", "grain2": "grain", "spdl2": "spdl.pipeline"}


@dataclass
class Handle:
    """A built loader: ``epoch()`` yields one epoch of batches, ``close()`` frees it."""

    epoch: Callable[[], Iterable[Any]]
    close: Callable[[], None]
    workers: int | None
    # what the loader chose for itself (conveyor_auto: its tuning), read before close
    chosen: Callable[[], dict[str, Any] | None] = lambda: None


def available(name: str) -> str | None:
    """None when loader ``name`` can run here, else ``"unavailable: <reason>"``."""
    module = PEER_MODULES.get(name)
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as e:  # a broken peer must not stop the suite
        return f"unavailable: {type(e).__name__}: {e}"
    return None


def preload(name: str) -> None:
    """Import what loader ``name`` needs, so that no import is timed (torch's never is: the
    parent imported it before forking the child)."""
    if name.startswith("conveyor"):
        importlib.import_module("conveyor")
    elif name == "torchdata2":
        importlib.import_module("torchdata.stateful_dataloader")
    elif name in PEER_MODULES:
        importlib.import_module(PEER_MODULES[name])


def workers_of(name: str) -> int | None:
    """The worker count a loader name stands for (None for "auto")."""
    if name.endswith("_auto"):
        return None
    digits = "".join(itertools.takewhile(str.isdigit, name.rstrip("t")[::-1]))[::-1]
    return int(digits) if digits else 0


def make(name: str, dataset: Any, batch_size: int, collate_fn: Collate, epochs: int,
         shuffle: bool = True, **opts: Any) -> Handle:
    """Build loader ``name`` over ``dataset``; extra ``opts`` go to its constructor."""
    if name.startswith("torch") and not name.startswith("torchdata"):
        return _torch(dataset, batch_size, collate_fn, workers_of(name) or 0, shuffle, stateful=False, **opts)
    if name == "torchdata2":
        return _torch(dataset, batch_size, collate_fn, 2, shuffle, stateful=True, **opts)
    if name == "grain2":
        return _grain(dataset, batch_size, collate_fn, 2, shuffle, epochs, **opts)
    if name == "spdl2":
        return _spdl(dataset, batch_size, collate_fn, 2, shuffle, epochs, **opts)
    if name.startswith("conveyor"):
        return _conveyor(name, dataset, batch_size, collate_fn, shuffle, **opts)
    raise ValueError(f"unknown loader {name!r}; known: {', '.join(LOADERS)}")


def _torch(dataset: Any, batch_size: int, collate_fn: Collate, workers: int, shuffle: bool,
           stateful: bool, **opts: Any) -> Handle:
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        from torch.utils.data import DataLoader as Loader
    loader = Loader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=collate_fn,
                    num_workers=workers, persistent_workers=workers > 0, **opts)

    def close() -> None:
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        loader._iterator = None

    return Handle(lambda: loader, close, workers)


def _conveyor(name: str, dataset: Any, batch_size: int, collate_fn: Collate, shuffle: bool,
              **opts: Any) -> Handle:
    import conveyor

    workers: Any = "auto" if name == "conveyor_auto" else workers_of(name)
    if name.endswith("t"):
        opts.setdefault("worker_type", "thread")
    loader = conveyor.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=collate_fn,
                                 num_workers=workers, persistent_workers=workers != 0, **opts)
    count = loader.num_workers if isinstance(getattr(loader, "num_workers", None), int) else None

    def chosen() -> dict[str, Any] | None:
        tuning = loader.tuning() if workers == "auto" else None
        return {k: tuning.get(k) for k in ("num_workers", "fetch_threads", "prefetch_factor")} if tuning else None

    return Handle(lambda: loader, loader.close, count, chosen)


def _index_batches(n: int, batch_size: int, shuffle: bool, epochs: int, seed: int = 0) -> Iterator[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(n) if shuffle else np.arange(n)
        for start in range(0, n, batch_size):
            yield order[start:start + batch_size].tolist()


def _default(collate_fn: Collate) -> Callable[[list[Any]], Any]:
    if collate_fn is not None:
        return collate_fn
    from torch.utils.data import default_collate
    return default_collate


def _grain(dataset: Any, batch_size: int, collate_fn: Collate, workers: int, shuffle: bool,
           epochs: int, **opts: Any) -> Handle:
    import grain

    per_epoch = math.ceil(len(dataset) / batch_size)
    ds = grain.MapDataset.source(dataset)
    if shuffle:
        ds = ds.shuffle(seed=0)
    ds = ds.batch(batch_size, batch_fn=_default(collate_fn)).repeat(epochs)
    it = iter(ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, **opts)))

    def close() -> None:
        stop = getattr(it, "close", None) or getattr(it, "stop", None)
        if stop is not None:
            stop()

    return Handle(lambda: itertools.islice(it, per_epoch), close, workers)


def _spdl(dataset: Any, batch_size: int, collate_fn: Collate, concurrency: int, shuffle: bool,
          epochs: int, **opts: Any) -> Handle:
    from spdl.pipeline import PipelineBuilder

    collate = _default(collate_fn)
    per_epoch = math.ceil(len(dataset) / batch_size)

    def fetch(indices: list[int]) -> Any:
        return collate([dataset[i] for i in indices])

    pipeline = (
        PipelineBuilder()
        .add_source(_index_batches(len(dataset), batch_size, shuffle, epochs))
        .pipe(fetch, concurrency=concurrency, output_order="input")
        .add_sink(3)
        .build(num_threads=concurrency, **opts)
    )
    pipeline.start()
    it = pipeline.get_iterator(timeout=600)
    return Handle(lambda: itertools.islice(it, per_epoch), pipeline.stop, concurrency)
