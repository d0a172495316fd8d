"""Soak test (run by hand, not in CI): stream batches while killing workers.

Streams ``--batches`` batches (default 10,000) from a loader with process
workers, SIGKILLs a random worker every ~``--every`` batches, and checks that
every sample arrived exactly once and in order.

    python scripts/soak.py --batches 10000 --every 200
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import numpy as np


class Numbers:
    """Sample i is the array [i, i, i, i] (and costs a little CPU)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        x = np.full(4, i, dtype=np.int64)
        for _ in range(50):
            x = x + 0
        return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import psutil

    from conveyor import DataLoader

    n = args.batches * args.batch_size
    rng = random.Random(args.seed)
    loader = DataLoader(Numbers(n), batch_size=args.batch_size, num_workers=args.workers,
                        output="numpy", adaptive=False, max_worker_restarts=10**9)
    expected = 0
    kills = 0
    next_kill = rng.randint(args.every // 2, args.every * 3 // 2)
    t0 = time.perf_counter()
    with loader:
        for b, batch in enumerate(loader):
            got = batch[:, 0]
            want = np.arange(expected, expected + len(got))
            if not np.array_equal(got, want):
                print(f"FAIL at batch {b}: got {got[:4]}..., expected {want[:4]}...")
                return 1
            expected += len(got)
            if b == next_kill:
                kids = [p for p in psutil.Process().children() if p.name() != "resource_tracker"]
                if kids:
                    os.kill(rng.choice(kids).pid, signal.SIGKILL)
                    kills += 1
                next_kill = b + rng.randint(args.every // 2, args.every * 3 // 2)
        stats = loader.stats()
    dt = time.perf_counter() - t0
    ok = expected == n
    print(f"{'OK' if ok else 'FAIL'}: {b + 1} batches, {expected} of {n} samples exactly once and in order; "
          f"{kills} workers killed, {stats['restarts']} restarted, {dt:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
