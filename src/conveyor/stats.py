"""Stage timings, gathered through hooks the loader calls.

The loader calls :meth:`Stats.result` for every batch a worker finishes and
:meth:`Stats.handed` each time it hands a batch to the user; from these come
the wait ratio (how much of each training step the consumer spent waiting
for data), per-worker fetch times, throughput, and a Chrome trace. The tuner
reads these numbers and nothing else.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import Failure

__all__ = ["Stats", "WorkerTimes"]


@dataclass
class WorkerTimes:
    batches: int = 0
    fetch_s: float = 0.0
    collate_s: float = 0.0
    busy_s: float = 0.0


@dataclass
class Stats:
    """Running totals for one loader (all its epochs)."""

    trace_limit: int = 100_000
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0  # consumer time spent inside __next__
    step_s: float = 0.0  # consumer time between batches (training)
    first_batch_s: float | None = None
    workers: dict[int, WorkerTimes] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    deaths: list[str] = field(default_factory=list)
    restarts: int = 0
    started: float = field(default_factory=time.perf_counter)
    last_handed: float | None = None
    trace: collections.deque[tuple[str, int, float, float]] = field(default_factory=collections.deque)
    queue_depth_sum: int = 0

    def result(self, worker: int, start: float, fetched: float, end: float) -> None:
        wt = self.workers.get(worker)
        if wt is None:
            wt = self.workers[worker] = WorkerTimes()
        wt.batches += 1
        if fetched:
            wt.fetch_s += fetched - start
            wt.collate_s += end - fetched
        wt.busy_s += end - start
        if len(self.trace) < self.trace_limit:
            self.trace.append(("fetch", worker, start, end))

    def handed(self, asked: float, got: float, size: int, ready: int) -> None:
        """The consumer asked at ``asked`` and got a batch of ``size`` at ``got``."""
        self.batches += 1
        self.samples += size
        self.wait_s += got - asked
        self.queue_depth_sum += ready
        if self.first_batch_s is None:
            self.first_batch_s = got - self.started
        if self.last_handed is not None:
            self.step_s += max(0.0, asked - self.last_handed)
            if len(self.trace) < self.trace_limit:
                self.trace.append(("step", -2, self.last_handed, asked))
        if len(self.trace) < self.trace_limit and got - asked > 1e-5:
            self.trace.append(("wait", -2, asked, got))
        self.last_handed = got

    def epoch_end(self) -> None:
        self.last_handed = None

    def skipped(self, failures: tuple[Failure, ...] | list[Failure]) -> None:
        self.failures.extend(failures)

    def snapshot(self) -> dict[str, Any]:
        elapsed = max(1e-9, time.perf_counter() - self.started)
        total = self.wait_s + self.step_s
        return {
            "batches": self.batches,
            "samples": self.samples,
            "wait_s": self.wait_s,
            "step_s": self.step_s,
            "wait_fraction": (self.wait_s / total) if total > 0 else 0.0,
            "first_batch_s": self.first_batch_s,
            "throughput_batches_s": self.batches / elapsed,
            "throughput_samples_s": self.samples / elapsed,
            "mean_ready_batches": self.queue_depth_sum / self.batches if self.batches else 0.0,
            "workers": {
                w: {"batches": t.batches, "fetch_s": t.fetch_s, "collate_s": t.collate_s,
                    "busy_s": t.busy_s, "mean_batch_s": t.busy_s / t.batches if t.batches else 0.0}
                for w, t in sorted(self.workers.items())
            },
            "failures": [
                {"index": (f.indices[0] if isinstance(f.indices, list) and len(f.indices) == 1 else f.indices),
                 "worker": f.worker_id, "error": f.summary()}
                for f in self.failures
            ],
            "deaths": list(self.deaths),
            "restarts": self.restarts,
        }
