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
import inspect
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["LOADERS", "Handle", "available", "make", "workers_of"]

Collate = Callable[[list[Any]], Any] | None

LOADERS = ("torch0", "torch1", "torch2", "torch4", "torchdata2", "grain2", "spdl2",
           "conveyor0", "conveyor2", "conveyor2t", "conveyor_auto", "floor2")

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
        # conveyor.DataLoader is made (loader.py and the executors imported) at its first use,
        # not by ``import conveyor``: unloaded, each forked run imported them inside its clock
        _ = importlib.import_module("conveyor").DataLoader
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
    if name == "floor2":
        floor = Floor(dataset, batch_size, _default(collate_fn), shuffle, direct=collate_fn is None)
        return Handle(floor.epoch, floor.close, 2)
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
    if workers != "auto" and workers > 0 and "adaptive" in inspect.signature(conveyor.DataLoader).parameters:
        # a fixed worker count means workers make every batch, whichever default the
        # loader has: the rows then compare conveyor's workers with torch's
        opts.setdefault("adaptive", False)
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


class Floor:
    """The featureless floor ("floor2"): what 2 forked workers cost on this machine with
    nothing but the trip itself. Two processes forked at construction (persistent); batch k's
    indices go to worker k % 2 through a pipe, two batches ahead per worker; the worker fetches,
    collates, writes each large array leaf into its slot of a shared mapping (8 slots a
    worker, sized from the first batch) and sends the tree, small leaves inline, as one
    pickle through another pipe; the main process reads it and wraps the slot's bytes with
    ``torch.from_numpy``. With torch's default collate, a large stack is written straight into
    the slot (as conveyor's collate and torch's own in a worker do); a custom collate's output
    is copied there. No seeding, stats, recovery, error capture, slot lifetime (a batch
    held past 6 more is overwritten) or cleanup beyond the pipes. A loader with workers
    cannot do less work per batch here; what conveyor2 loses against it is its features'
    price, what floor2 loses against torch0 is the host's."""

    SLOTS = 8
    AHEAD = 2
    INLINE = 1 << 15
    # profile_workers.py's timestamps: probe(step, worker, t0, t1), None in the suite's runs
    probe: Callable[[int, int, float, float], None] | None = None
    FETCH, COLLATE, ENCODE, SEND, SENT, WAIT, TAKE, DECODE, GOT = range(9)

    def __init__(self, dataset: Any, batch_size: int, collate: Callable[[list[Any]], Any], shuffle: bool,
                 direct: bool = False) -> None:
        import mmap
        import os

        import numpy as np

        self.dataset, self.batch_size, self.collate, self.shuffle = dataset, batch_size, collate, shuffle
        self.direct = direct
        self.rng = np.random.default_rng(0)
        # slot size: twice the large leaves of a batch of the first samples (ragged batches vary)
        leaves: list[Any] = []
        _flatten(collate([dataset[i] for i in range(min(batch_size, len(dataset)))]), leaves)
        big = sum(_nbytes(x) + 64 for x in leaves if _nbytes(x) >= self.INLINE)
        self.slot = max(1 << 16, 2 * big)
        self.workers: list[tuple[int, int, int, Any, bytearray]] = []  # pid, order fd, result fd, map, buffer
        for w in range(2):
            self.wid = w  # (a forked worker keeps its own)
            buf = mmap.mmap(-1, self.SLOTS * self.slot)
            orders_r, orders_w = os.pipe()
            results_r, results_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the worker
                for fd in (orders_w, results_r, *(fd for _, o, r, _, _ in self.workers for fd in (o, r))):
                    os.close(fd)
                self._serve(orders_r, results_w, buf)
                os._exit(0)
            os.close(orders_r)
            os.close(results_w)
            self.workers.append((pid, orders_w, results_r, buf, bytearray()))

    def _serve(self, orders: int, results: int, buf: Any) -> None:  # pragma: no cover - the worker
        import os
        import pickle
        import time

        import numpy as np

        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            pass
        probe, w, clock = self.probe, self.wid, time.perf_counter
        pending = bytearray()
        while True:
            data = os.read(orders, 1 << 16)
            if not data:
                return
            pending += data
            while len(pending) >= 4 and len(pending) >= 4 + (n := int.from_bytes(pending[:4], "little")):
                seq, indices = pickle.loads(pending[4:4 + n])
                del pending[:4 + n]
                base, offset, recs = (seq // 2 % self.SLOTS) * self.slot, 0, []
                t0 = clock() if probe else 0.0
                samples = [self.dataset[i] for i in indices]
                first = samples[0]
                if self.direct and isinstance(first, torch.Tensor) and first.nbytes * len(samples) >= self.INLINE \
                        and first.nbytes * len(samples) <= self.slot:
                    # a stack of tensors: straight into the slot
                    t1 = clock() if probe else 0.0
                    out = torch.from_numpy(np.ndarray((len(samples), *first.shape), first.numpy().dtype,
                                                      buffer=buf, offset=base))
                    torch.stack(samples, out=out)
                    t2 = clock() if probe else 0.0
                    arr = out.numpy()
                    msg = pickle.dumps((None, [(arr.dtype.str, arr.shape, base)]), protocol=pickle.HIGHEST_PROTOCOL)
                    t3 = clock() if probe else 0.0
                    os.write(results, len(msg).to_bytes(4, "little") + msg)
                    if probe:
                        self._probed(probe, w, t0, t1, t2, t3, clock())
                    continue
                t1 = clock() if probe else 0.0
                batch = self.collate(samples)
                t2 = clock() if probe else 0.0
                leaves: list[Any] = []
                tree = _flatten(batch, leaves)
                for x in leaves:
                    arr = x.numpy() if hasattr(x, "numpy") else x
                    if arr.nbytes >= self.INLINE and offset + arr.nbytes <= self.slot:
                        np.copyto(np.ndarray(arr.shape, arr.dtype, buffer=buf, offset=base + offset), arr)
                        recs.append((arr.dtype.str, arr.shape, base + offset))
                        offset = (offset + arr.nbytes + 63) & ~63
                    else:
                        recs.append((arr.dtype.str, arr.shape, arr.tobytes()))
                msg = pickle.dumps((tree, recs), protocol=pickle.HIGHEST_PROTOCOL)
                t3 = clock() if probe else 0.0
                os.write(results, len(msg).to_bytes(4, "little") + msg)
                if probe:
                    self._probed(probe, w, t0, t1, t2, t3, clock())

    def _probed(self, probe: Callable[[int, int, float, float], None], w: int, t0: float, t1: float, t2: float,
                t3: float, t4: float) -> None:  # pragma: no cover - the worker
        """One batch's steps in a worker: fetch t0..t1, collate t1..t2, encode t2..t3 (copies
        into the slot, the pickle), send t3..t4."""
        for step, key, a, b in ((self.FETCH, w, t0, t1), (self.COLLATE, w, t1, t2), (self.ENCODE, w, t2, t3),
                                (self.SEND, 1, t3, t4), (self.SENT, w, t3, t3)):  # (SEND's key: batches sent)
            probe(step, key, a, b)

    def _send(self, seq: int, batches: list[Any]) -> None:
        import os
        import pickle

        msg = pickle.dumps((seq, batches[seq]), protocol=pickle.HIGHEST_PROTOCOL)
        os.write(self.workers[seq % 2][1], len(msg).to_bytes(4, "little") + msg)

    def _recv(self, w: int) -> Any:
        import os
        import pickle
        import time

        import numpy as np
        import torch

        _, _, fd, buf, pending = self.workers[w]
        probe = self.probe
        if probe:
            t0 = time.perf_counter()
        while len(pending) < 4 or len(pending) < 4 + int.from_bytes(pending[:4], "little"):
            pending += os.read(fd, 1 << 20)
        if probe:
            t1 = time.perf_counter()
        n = int.from_bytes(pending[:4], "little")
        tree, recs = pickle.loads(pending[4:4 + n])
        del pending[:4 + n]
        if probe:
            t2 = time.perf_counter()
            probe(self.WAIT, w, t0, t1)
            probe(self.TAKE, w, t1, t2)
            probe(self.GOT, w, t2, t2)
        leaves = []
        for dtype, shape, where in recs:
            if isinstance(where, bytes):
                arr = np.frombuffer(where, dtype=dtype).reshape(shape)
                leaves.append(torch.from_numpy(arr.copy()))
            else:
                arr = np.ndarray(shape, dtype=dtype, buffer=buf, offset=where)
                leaves.append(torch.from_numpy(arr))
        out = _unflatten(tree, iter(leaves))
        if probe:
            probe(self.DECODE, w, t2, time.perf_counter())
        return out

    def epoch(self) -> Iterator[Any]:
        n = len(self.dataset)
        order = self.rng.permutation(n) if self.shuffle else range(n)
        batches = [[int(i) for i in order[k:k + self.batch_size]] for k in range(0, n, self.batch_size)]
        ahead = min(len(batches), 2 * self.AHEAD)
        for seq in range(ahead):
            self._send(seq, batches)
        for seq in range(len(batches)):
            batch = self._recv(seq % 2)
            if seq + ahead < len(batches):
                self._send(seq + ahead, batches)
            yield batch

    def close(self) -> None:
        import os

        for pid, orders, results, _, _ in self.workers:
            os.close(orders)
            os.waitpid(pid, 0)
            os.close(results)
        self.workers = []


def _nbytes(x: Any) -> int:
    return int(x.nbytes) if hasattr(x, "nbytes") else 0


def _flatten(tree: Any, leaves: list[Any]) -> Any:
    """``tree`` with each tensor or array leaf replaced by None (appended to ``leaves``; the
    scenarios' batches hold no None of their own)."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(_flatten(x, leaves) for x in tree)
    if isinstance(tree, dict):
        return {k: _flatten(v, leaves) for k, v in tree.items()}
    if hasattr(tree, "numpy") or hasattr(tree, "__array_interface__"):
        leaves.append(tree)
        return None
    return tree


def _unflatten(tree: Any, leaves: Iterator[Any]) -> Any:
    if isinstance(tree, (tuple, list)):
        return type(tree)(_unflatten(x, leaves) for x in tree)
    if isinstance(tree, dict):
        return {k: _unflatten(v, leaves) for k, v in tree.items()}
    return next(leaves) if tree is None else tree
