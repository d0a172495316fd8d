"""Queued copies from pinned worker batches, with and without the slot fence (needs CUDA).

With ``pin_memory=True`` a worker's batch is a view of a shared-memory slot registered with
CUDA, and ``batch.to("cuda", non_blocking=True)`` only queues the copy. The loop below keeps
the GPU behind (a sleep kernel before each copy), drops each host batch at once and asks for
the next, so the slot goes back to its worker while the copy still waits. Without the fence
(``SlotPinner.fence`` stood in by one that returns None) the worker writes a later batch into
the slot first; with it, the slot waits for the copy. Counts the batches that arrived wrong.

    python scripts/pinned_copy_race.py [--batches 64]

Measured on an H200 (2026-11-27): with the GPU ~1 ms behind per batch, 62 of 64 batches wrong
without the fence, 0 of 64 with it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


class Filled:
    """Sample i: 65536 float32 values, all equal to i (a batch of 4 is 1 MiB: it travels in a slot)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(1 << 16, i, dtype=np.float32)


def run(batches: int, fence: bool, sleep_cycles: int) -> tuple[int, float]:
    import torch

    import conveyor
    from conveyor.device import SlotPinner

    original = SlotPinner.fence
    if not fence:
        SlotPinner.fence = lambda self: None  # type: ignore[method-assign]
    try:
        loader = conveyor.DataLoader(Filled(4 * batches), batch_size=4, num_workers=1, pin_memory=True,
                                     adaptive=False)
        outs = []
        t0 = time.perf_counter()
        for batch in loader:
            torch.cuda._sleep(sleep_cycles)  # the GPU falls behind the loop
            outs.append(batch.to("cuda", non_blocking=True))
            del batch
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        loader.close()
    finally:
        SlotPinner.fence = original  # type: ignore[method-assign]
    wrong = 0
    for k, out in enumerate(outs):
        host = out.cpu()
        want = torch.arange(4 * k, 4 * k + 4, dtype=torch.float32)
        if not torch.equal(host[:, 0], want) or not bool((host == host[:, :1]).all()):
            wrong += 1
    return wrong, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--batches", type=int, default=64)
    args = p.parse_args()
    from conveyor.device import cuda_ready

    if not cuda_ready(import_torch=True):  # torch missing, or no CUDA
        print("no CUDA: skipped")
        return 0
    fenced_wrong = 0
    for cycles in (0, 2_000_000, 20_000_000):
        for fence in (False, True):
            wrong, seconds = run(args.batches, fence, cycles)
            if fence:
                fenced_wrong += wrong
            print(f"GPU sleep {cycles:>10} cycles a batch, fence {'on ' if fence else 'off'}: "
                  f"{wrong}/{args.batches} batches wrong, {seconds:.3f} s", flush=True)
    return 1 if fenced_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
