"""Shared test utilities: datasets that survive spawn, batch comparison, leak snapshots.

Datasets live here (a plain module on ``sys.path``) so that spawned workers can
import them by name. ``Snapshot`` records the child processes, Python threads,
open file descriptors and ``/dev/shm/conveyor_<pid>_*`` entries of this process;
``assert_no_leaks`` polls (with a grace period, never a timing assertion) until
they are back to the snapshot.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import psutil
import torch
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset as TorchIterable
from torch.utils.data import get_worker_info as torch_get_worker_info

import conveyor

SHM = "/dev/shm"


# --------------------------------------------------------------------------- datasets


class Pair(NamedTuple):
    x: torch.Tensor
    y: int


class Squares(TorchDataset):
    """``i -> (tensor([i, i*i]) float, i)``: the simplest map-style dataset."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([i, i * i], dtype=torch.float32), i


class Mixed(TorchDataset):
    """Samples of every container and leaf type default_collate knows."""

    def __init__(self, n: int = 17) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "t": torch.full((3,), i, dtype=torch.int16),
            "a": np.arange(4, dtype=np.float64) * i,
            "f": float(i) / 3,
            "i": i,
            "s": f"item-{i}",
            "b": bool(i % 2),
            "nt": Pair(torch.tensor([i, -i]), i * 2),
            "l": [i, np.int32(i + 1)],
        }


class GetItems(TorchDataset):
    """A dataset with ``__getitems__`` (torch calls it with the whole batch)."""

    def __init__(self, n: int = 20) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        raise AssertionError("__getitems__ should be used")

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return [torch.tensor([i, 10 * i]) for i in indices]


class Boxes(TorchDataset):
    """Detection-style samples: an image and a variable number of boxes."""

    def __init__(self, n: int = 12) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 8, 8, generator=g), torch.rand(i % 4 + 1, 4, generator=g)


def boxes_collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    images = torch.stack([b[0] for b in batch])
    return images, [b[1] for b in batch]


class Random(TorchDataset):
    """``torch.randint`` in ``__getitem__``: shows the worker's RNG stream."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, 2**30, (2,))


class Stream(TorchIterable):
    """An iterable dataset; ``shard`` picks how it splits between workers."""

    def __init__(self, n: int = 11, shard: str = "none") -> None:
        self.n = n
        self.shard = shard

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.shard == "torch":
            info: Any = torch.utils.data.get_worker_info()
        elif self.shard == "torch-by-name":  # the name bound when this module was imported
            info = torch_get_worker_info()
        elif self.shard == "conveyor":
            info = conveyor.get_worker_info()
        else:
            info = None
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield torch.tensor([i, 2 * i])


class Failing(TorchDataset):
    """Raises ``exc`` for index ``bad`` (or every index in ``bad`` when it is a set)."""

    def __init__(self, n: int, bad: int | set[int], exc: type[BaseException] = ValueError) -> None:
        self.n = n
        self.bad = {bad} if isinstance(bad, int) else set(bad)
        self.exc = exc

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i in self.bad:
            raise self.exc(f"bad sample {i}")  # the line the traceback must show
        return torch.tensor([i])


class Images(TorchDataset):
    """uint8 images large enough to travel through shared-memory slots."""

    def __init__(self, n: int = 64, side: int = 64, variable: bool = False) -> None:
        self.n = n
        self.side = side
        self.variable = variable

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        side = self.side * (1 + i // 8) if self.variable else self.side
        return torch.full((3, side, side), i % 251, dtype=torch.uint8)


def expected_images(ds: Images, indices: list[int]) -> torch.Tensor:
    return torch.stack([ds[i] for i in indices])


def init_record(worker_id: int) -> None:
    """A worker_init_fn that leaves a visible trace in the worker's RNG."""
    torch.manual_seed(1000 + worker_id)


# --------------------------------------------------------------------------- comparison


def same(a: Any, b: Any, path: str = "batch") -> None:
    """Assert that ``a`` and ``b`` are equal in value, dtype and container type, recursively."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.equal(a, b), f"{path}: values differ\n{a}\n{b}"
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def same_epochs(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b), f"{len(a)} batches != {len(b)} batches"
    for i, (x, y) in enumerate(zip(a, b)):
        same(x, y, f"batch {i}")


def key(batch: Any) -> bytes:
    """A hashable fingerprint of a batch, for comparing multisets of batches."""
    if isinstance(batch, torch.Tensor):
        return repr((str(batch.dtype), tuple(batch.shape), batch.tolist())).encode()
    if isinstance(batch, (list, tuple)):
        return b"(" + b",".join(key(x) for x in batch) + b")"
    if isinstance(batch, dict):
        return b"{" + b",".join(repr(k).encode() + b":" + key(v) for k, v in batch.items()) + b"}"
    return repr(batch).encode()


# --------------------------------------------------------------------------- leaks


def shm_entries(pid: int | None = None) -> set[str]:
    """``/dev/shm`` segments and temp-dir stack files made by loaders of process ``pid`` (default: this one)."""
    import tempfile

    prefix = f"conveyor_{os.getpid() if pid is None else pid}_"
    found: set[str] = set()
    for folder, suffix in ((SHM, ""), (tempfile.gettempdir(), ".stack")):
        try:
            found |= {n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(suffix)}
        except OSError:
            pass
    return found


def all_shm_entries() -> set[str]:
    try:
        return {n for n in os.listdir(SHM) if n.startswith("conveyor_")}
    except OSError:
        return set()


def children() -> set[int]:
    """Live child processes, leaving out multiprocessing's long-lived helpers."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "multiprocessing.resource_tracker" in cmd or "multiprocessing.forkserver" in cmd:
            continue
        out.add(p.pid)
    return out


def fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def threads() -> set[int]:
    return {t.ident or 0 for t in threading.enumerate()}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    children: set[int]
    threads: set[int]
    fds: int
    shm: set[str]

    @classmethod
    def take(cls) -> Snapshot:
        gc.collect()
        return cls(children(), threads(), len(fds()), shm_entries())

    def extra(self) -> dict[str, Any]:
        now = Snapshot(children(), threads(), len(fds()), shm_entries())
        out: dict[str, Any] = {}
        if now.children - self.children:
            out["children"] = sorted(now.children - self.children)
        if now.threads - self.threads:
            out["threads"] = [t.name for t in threading.enumerate() if (t.ident or 0) in now.threads - self.threads]
        if now.fds > self.fds:
            out["fds"] = {fd: _fd_target(fd) for fd in sorted(fds())}
            out["fd_count"] = (self.fds, now.fds)
        if now.shm - self.shm:
            out["shm"] = sorted(now.shm - self.shm)
        return out


def _fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def assert_no_leaks(before: Snapshot, grace: float = 8.0) -> None:
    """Poll until nothing is left over from ``before``; fail naming what is left."""
    deadline = time.monotonic() + grace
    while True:
        gc.collect()
        left = before.extra()
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"resources left over: {left}")
        time.sleep(0.1)


def wait_until(cond: Callable[[], bool], grace: float = 10.0) -> bool:
    """Poll ``cond`` until it holds or ``grace`` seconds pass; returns the last value."""
    deadline = time.monotonic() + grace
    while True:
        if cond():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _worker_options() -> dict[str, Any]:
    import inspect

    params = inspect.signature(conveyor.DataLoader).parameters
    return {"adaptive": False} if "adaptive" in params else {}


# Loader options that make batches really come from the workers (no main-process shortcut).
WORKERS: dict[str, Any] = _worker_options()


def drain(loader: Any) -> list[Any]:
    """Every batch of one epoch, the loader closed after (also when the epoch raises)."""
    try:
        return list(loader)
    finally:
        loader.close()


def run_script(path: Path, text: str, env: dict[str, str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Write ``text`` to ``path`` and run it with this Python: output captured as text."""
    path.write_text(text)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=timeout, **kw)
