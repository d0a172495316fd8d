"""Device stage on a GPU: the seed's sequential-vs-asynchronous table, and host-to-device bandwidth.

1. Training a small CNN for a fixed number of steps, per sample:

   * sequential: ``for x, y in torch DataLoader(num_workers=0)``, then
     ``.to("cuda")`` and the step (the seed's Fig. 1: T = T_load + T_train);
   * asynchronous: the same loader wrapped in ``DevicePrefetcher(loader,
     "cuda", depth=2)``, so the next batches are built and copied on a side
     stream while the GPU trains (T ~ max(T_load, T_train)).

   "load" is the time the training loop spends waiting for its next batch
   (including the copy, for the sequential loop). The dataset's ``__getitem__``
   costs some CPU (numpy filtering of a 3x96x96 image). Every step ends with
   ``loss.item()``, as a training loop that logs its loss does.

2. The same CNN fed by loaders with workers, every batch copied with
   ``non_blocking=True`` and no ``.item()`` per step (the GPU may run behind):
   torch's DataLoader with 4 and with one worker per CPU, conveyor's with 4
   workers (``pin_memory=True``, then ``device="cuda"``) and with
   ``num_workers="auto"``. Samples per second, median of alternated runs.

3. Host-to-device copies of 64x3x224x224 batches (uint8 and float32), in GB/s:
   pageable ``.to("cuda")``; an already pinned tensor with
   ``non_blocking=True``; ``pin_memory()`` then the copy (torch's
   ``pin_memory=True``: one more host copy per batch); and a view over a
   shared-memory segment registered once with ``SlotPinner`` (conveyor's
   transport slots), copied with ``non_blocking=True``.

Writes benchmarks/results/device.md and device.json. Without CUDA it prints
"no CUDA: skipped" and exits 0.

    python benchmarks/bench_device.py [--steps 60] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "benchmarks" / "results"


class Images:
    """Map-style dataset whose ``__getitem__`` costs a few milliseconds of CPU."""

    def __init__(self, n: int, size: int = 96, work: int = 6) -> None:
        self.n = n
        self.size = size
        self.work = work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        rng = np.random.default_rng(i)
        img = rng.random((3, self.size, self.size), dtype=np.float32)
        for _ in range(self.work):  # a box blur and a normalisation, as an augmentation would
            img = (img + np.roll(img, 1, axis=1) + np.roll(img, 1, axis=2)) / 3.0
            img = (img - img.mean()) / (img.std() + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(img)), int(i % 10)


def small_cnn() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(256, 10),
    )


def train(batch_size: int, steps: int, asynchronous: bool) -> dict[str, float]:
    import torch
    from torch.utils.data import DataLoader

    from conveyor.device import DevicePrefetcher

    torch.manual_seed(0)
    model = small_cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(Images(batch_size * (steps + 5)), batch_size=batch_size, num_workers=0)

    def step(x: Any, y: Any) -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.item())

    x, y = next(iter(loader))  # warm up kernels and the allocator
    step(x.cuda(), y.cuda())
    torch.cuda.synchronize()

    source: Any = DevicePrefetcher(loader, "cuda", depth=2) if asynchronous else loader
    waiting = 0.0
    n = 0
    it = iter(source)
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(it)
        if not asynchronous:
            x, y = x.cuda(), y.cuda()
        waiting += time.perf_counter() - t0
        step(x, y)
        n += int(x.shape[0])
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    if asynchronous:
        source.close()
    return {"total_per_sample": total / n, "load_per_sample": waiting / n, "samples": n}


CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
LOADERS = {
    "torch, 4 workers, pin_memory": ("torch", {"num_workers": 4, "pin_memory": True}),
    f"torch, {CPUS} workers, pin_memory": ("torch", {"num_workers": CPUS, "pin_memory": True}),
    "conveyor, 4 workers, pin_memory": ("conveyor", {"num_workers": 4, "pin_memory": True}),
    "conveyor, 4 workers, device='cuda'": ("conveyor", {"num_workers": 4, "pin_memory": True, "device": "cuda"}),
    "conveyor, auto, device='cuda'": ("conveyor", {"num_workers": "auto", "pin_memory": True, "device": "cuda"}),
}


def train_with(kind: str, kwargs: dict[str, Any], batch_size: int, steps: int) -> dict[str, float]:
    """The small CNN fed by a loader with workers: seconds from ``iter()`` to the last step's end."""
    import torch

    import conveyor

    torch.manual_seed(0)
    model = small_cnn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    cls = torch.utils.data.DataLoader if kind == "torch" else conveyor.DataLoader
    loader = cls(Images(batch_size * steps, work=3), batch_size=batch_size, **kwargs)
    x = torch.zeros(batch_size, 3, 96, 96, device="cuda")  # warm up kernels and the allocator
    loss_fn(model(x), torch.zeros(batch_size, dtype=torch.long, device="cuda")).backward()
    torch.cuda.synchronize()
    start = time.perf_counter()
    first = 0.0
    n = 0
    for x, y in loader:
        if not first:
            first = time.perf_counter() - start
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        n += int(x.shape[0])
    torch.cuda.synchronize()
    total = time.perf_counter() - start
    out = {"seconds": total, "first_batch_s": first, "samples_per_s": n / total, "samples": n}
    if kind == "conveyor":
        tuning = loader.tuning()
        if tuning is not None:
            out["choice"] = {k: tuning.get(k) for k in ("num_workers", "fetch_threads", "prefetch_factor")}
        out["wait_fraction"] = loader.stats().get("wait_fraction")
        loader.close()
    return out


def bandwidth(dtype_name: str, reps: int) -> dict[str, float]:
    import torch

    from conveyor.device import SlotPinner
    from conveyor.transport.segment import Segment, new_prefix

    dtype = getattr(torch, dtype_name)
    shape = (64, 3, 224, 224)
    host = (torch.rand(shape) * 255).to(dtype)
    nbytes = host.numel() * host.element_size()
    dev = torch.empty(shape, dtype=dtype, device="cuda")
    pinned = host.pin_memory()

    seg = Segment.create(new_prefix() + "bench", nbytes)
    pinner = SlotPinner()
    registered = pinner.register(seg)
    root = np.frombuffer(seg.buf, dtype=np.uint8)
    slot_view = torch.from_numpy(root[:nbytes]).view(dtype).view(shape)
    slot_view.copy_(host)

    def timed(fn: Any) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return nbytes * reps / (time.perf_counter() - t0) / 1e9

    out = {
        "bytes": nbytes,
        "pageable": timed(lambda: dev.copy_(host)),
        "pinned": timed(lambda: dev.copy_(pinned, non_blocking=True)),
        "pin_then_copy": timed(lambda: dev.copy_(host.pin_memory(), non_blocking=True)),
        "registered_slot": timed(lambda: dev.copy_(slot_view, non_blocking=True)) if registered else float("nan"),
        "slot_is_pinned": bool(slot_view.is_pinned()),
    }
    del slot_view, root
    pinner.close()
    seg.unlink()
    seg.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--loader-batch", type=int, default=64)
    p.add_argument("--loader-steps", type=int, default=120)
    p.add_argument("--loader-repeats", type=int, default=3)
    args = p.parse_args()
    from conveyor.device import cuda_ready

    if not cuda_ready(import_torch=True):  # torch missing, or no CUDA
        print("no CUDA: skipped")
        return 0
    import torch

    table = {}
    for bs in args.batch_sizes:
        seq = train(bs, args.steps, asynchronous=False)
        asy = train(bs, args.steps, asynchronous=True)
        table[bs] = {"sequential": seq, "asynchronous": asy}
        print(f"batch {bs}: sequential {seq['total_per_sample'] * 1e3:.3f} ms/sample "
              f"(load {seq['load_per_sample'] * 1e3:.3f}), asynchronous {asy['total_per_sample'] * 1e3:.3f} "
              f"(load {asy['load_per_sample'] * 1e3:.3f})", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in LOADERS}
    for _ in range(args.loader_repeats):  # loaders alternate, so a drift of the host hits all alike
        for name, (kind, kwargs) in LOADERS.items():
            r = train_with(kind, kwargs, args.loader_batch, args.loader_steps)
            runs[name].append(r)
            print(f"{name}: {r['samples_per_s']:.0f} samples/s, first batch "
                  f"{r['first_batch_s']:.2f} s {r.get('choice') or ''}", flush=True)
    fed = {}
    for name, rs in runs.items():
        mid = sorted(rs, key=lambda r: r["samples_per_s"])[len(rs) // 2]
        fed[name] = dict(mid, all_samples_per_s=[r["samples_per_s"] for r in rs])
    bw = {name: bandwidth(name, args.reps) for name in ("uint8", "float32")}
    for name, r in bw.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items() if isinstance(v, float)), flush=True)

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "python": platform.python_version(), "steps": args.steps, "reps": args.reps}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "device.json").write_text(json.dumps({"meta": meta, "train": table, "h2d_gbps": bw,
                                                     "loaders": fed}, indent=2))
    lines = [
        "# Device stage", "",
        f"{meta['device']}, torch {meta['torch']}, Python {meta['python']}; {args.steps} steps of a small CNN "
        "on 3x96x96 images whose `__getitem__` costs CPU; torch DataLoader(num_workers=0), sequential "
        "vs wrapped in `DevicePrefetcher(loader, 'cuda', depth=2)`. Milliseconds per sample.", "",
        "| | Total (sequential) | Loading (sequential) | Total (asynchronous) | Loading (asynchronous) |",
        "|---|---|---|---|---|",
    ]
    for bs, r in table.items():
        s, a = r["sequential"], r["asynchronous"]
        lines.append(f"| Batch {bs} | {s['total_per_sample'] * 1e3:.3f} | {s['load_per_sample'] * 1e3:.3f} | "
                     f"{a['total_per_sample'] * 1e3:.3f} | {a['load_per_sample'] * 1e3:.3f} |")
    base = fed["torch, 4 workers, pin_memory"]["samples_per_s"]
    lines += ["", f"The same CNN fed by loaders with workers: batch {args.loader_batch}, "
              f"{args.loader_steps} steps, from `iter()` to the last step's end ({CPUS} CPUs); the "
              f"median of {args.loader_repeats} alternated runs, every run in the last column:", "",
              "| Loader | Samples/s | x torch (4 workers) | First batch (s) | Runs |", "|---|---|---|---|---|"]
    for name, r in fed.items():
        each = ", ".join(f"{v:.0f}" for v in r["all_samples_per_s"])
        lines.append(f"| {name} | {r['samples_per_s']:.0f} | {r['samples_per_s'] / base:.2f} | "
                     f"{r['first_batch_s']:.2f} | {each} |")
    lines += [f"\n`auto` chose {r['choice']}." for r in fed.values() if r.get("choice")]
    lines += ["", "Host-to-device copies of one 64x3x224x224 batch, GB/s:", "",
              "| dtype | MB | pageable | pinned | pin_memory() + copy | registered shm slot |",
              "|---|---|---|---|---|---|"]
    for name, r in bw.items():
        lines.append(f"| {name} | {r['bytes'] / 1e6:.1f} | {r['pageable']:.2f} | {r['pinned']:.2f} | "
                     f"{r['pin_then_copy']:.2f} | {r['registered_slot']:.2f} |")
    (RESULTS / "device.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
