"""Soak test (run by hand, not in CI): stream batches while killing workers.

Streams ``--batches`` batches (default 10,000) from a loader with process
workers, ends a random worker every ~``--every`` batches, and checks that
every sample arrived exactly once and in order.

``--deaths kill`` (the default) SIGKILLs it. ``--deaths mixed`` picks each time
among SIGKILL and SIGTERM sent from the main process and a ``sys.exit()`` called
inside a sample; the last ``--hold`` batches handed out are kept and checked
again as they are let go (a dying worker must not take the slots of batches it
sent), and no process or shared-memory segment may be left at the end.

    python scripts/soak.py --batches 10000 --every 200
    python scripts/soak.py --batches 10000 --every 100 --deaths mixed
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
    """Sample i is ``width`` copies of i (and costs a little CPU). With ``trigger``, the worker
    that first finds that file there removes it and calls sys.exit() inside the sample."""

    def __init__(self, n: int, width: int = 4, trigger: str | None = None) -> None:
        self.n = n
        self.width = width
        self.trigger = trigger

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if self.trigger is not None and os.path.exists(self.trigger):
            try:
                os.unlink(self.trigger)  # one worker wins it
            except FileNotFoundError:
                pass
            else:
                sys.exit()
        x = np.full(self.width, i, dtype=np.int64)
        for _ in range(50):
            x = x + 0
        return x


def workers() -> list[int]:
    """This process's live worker processes (a fork server's children included), not
    multiprocessing's helpers."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline())
            # (a fork server's workers are forked from it: they show its command line too)
            server = "forkserver" in cmd and p.ppid() == os.getpid()
        except psutil.Error:
            continue
        if "resource_tracker" not in cmd and not server:
            out.append(p.pid)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deaths", choices=["kill", "mixed"], default="kill")
    ap.add_argument("--hold", type=int, default=16, help="batches kept and checked again (mixed)")
    ap.add_argument("--width", type=int, default=4, help="int64s a sample (2048+: batches in shared memory)")
    ap.add_argument("--context", default=None, help="start method: fork, spawn or forkserver")
    ap.add_argument("--prefetch", type=int, default=2, help="prefetch_factor (more: more batches sent and unread)")
    args = ap.parse_args(argv)

    import collections
    import tempfile

    from conveyor import DataLoader

    n = args.batches * args.batch_size
    rng = random.Random(args.seed)
    trigger = None
    if args.deaths == "mixed":
        trigger = os.path.join(tempfile.mkdtemp(prefix="soak_"), "exit")
    loader = DataLoader(Numbers(n, args.width, trigger), batch_size=args.batch_size, num_workers=args.workers,
                        output="numpy", adaptive=False, max_worker_restarts=10**9,
                        multiprocessing_context=args.context, prefetch_factor=args.prefetch)
    expected = 0
    ends: collections.Counter[str] = collections.Counter()
    held: collections.deque[tuple[int, np.ndarray]] = collections.deque()
    next_kill = rng.randint(args.every // 2, args.every * 3 // 2)
    t0 = time.perf_counter()

    def intact(start: int, batch: np.ndarray) -> bool:
        want = np.arange(start, start + len(batch))
        return bool(np.array_equal(batch[:, 0], want) and (batch == batch[:, :1]).all())

    with loader:
        for b, batch in enumerate(loader):
            if not intact(expected, batch):
                print(f"FAIL at batch {b}: got {batch[:4, 0]}..., expected from {expected}")
                return 1
            if args.deaths == "mixed":
                held.append((expected, batch))
                if len(held) > args.hold:
                    start, old = held.popleft()
                    if not intact(start, old):
                        print(f"FAIL: a batch held since sample {start} changed: {old[:4, 0]}...")
                        return 1
            expected += len(batch)
            if b == next_kill:
                how = "SIGKILL" if args.deaths == "kill" else rng.choice(["SIGKILL", "SIGTERM", "sys.exit"])
                if how == "sys.exit":
                    assert trigger is not None
                    open(trigger, "w").close()  # the next sample a worker starts ends it
                    ends[how] += 1
                else:
                    kids = workers()
                    if kids:
                        os.kill(rng.choice(kids), getattr(signal, how))
                        ends[how] += 1
                next_kill = b + rng.randint(args.every // 2, args.every * 3 // 2)
        stats = loader.stats()
    dt = time.perf_counter() - t0
    del batch, held
    ok = expected == n
    left = [name for name in os.listdir("/dev/shm") if name.startswith(f"conveyor_{os.getpid()}_")] \
        if os.path.isdir("/dev/shm") else []
    kids = workers()
    deaths = collections.Counter(d.split(") ", 1)[-1] for d in stats["deaths"])
    print(f"{'OK' if ok and not left and not kids else 'FAIL'}: {b + 1} batches, {expected} of {n} samples "
          f"exactly once and in order; ended {sum(ends.values())} workers ({dict(ends)}), "
          f"{stats['restarts']} restarted; deaths seen: {dict(deaths)}; {dt:.1f} s; "
          f"left behind: {len(left)} segments, {len(kids)} processes")
    return 0 if ok and not left and not kids else 1


if __name__ == "__main__":
    sys.exit(main())
