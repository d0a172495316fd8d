"""Tasks of several batches, for batches too small to be worth a trip each.

A process worker's batch costs, beyond making it, an order to read and a result to send,
and a wake-up of the process at the other end of each: ~20-40 us of CPU a batch on either
side, and a context switch or two. Where making a batch costs about as much (32 rows of 8
floats) that is most of the work (docs/decisions/task-groups-for-tiny-batches.md). Such
batches travel in groups: the main process sends a worker ``size`` tasks in one order and
only once it has room for that many, and the worker sends their results back together, in
one message, once the last is made (``serve._serve``). The rest is as for single tasks:
batch k goes to worker k % num_workers, each result is its own ``Result`` (its failure,
timings and sample count its own), a death re-issues every task of the group the worker
held, and a state_dict counts the batches handed out.

``Grouping`` decides ``size`` from the first results of a pool's workers: batches that
arrive with little data (``MAX_BYTES``) and took a worker little time (the fastest of the
first few) get groups that take about ``BUDGET_S`` to make, ``MAX_SIZE`` batches at most. Batches that are large, slow,
or fetched by fetch threads keep groups of one (a larger group only delays each batch).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Grouping", "MAX_SIZE", "BUDGET_S", "MAX_BYTES"]

MAX_SIZE = 8  # batches a task carries at most
BUDGET_S = 1e-3  # a worker's seconds to make one group, at most (the first batch's wait)
MAX_BYTES = 1 << 15  # a grouped batch's array bytes: small enough to travel inside the message
SAMPLED = 4  # results looked at before deciding


class Grouping:
    """How many batches a process worker's task carries (1 until measured)."""

    __slots__ = ("size", "times", "decided")

    def __init__(self) -> None:
        self.size = 1
        self.times: list[float] = []
        self.decided = False

    def note(self, result: Any) -> None:
        """Look at one worker result (a worker's first is left out: it pays one-time costs)."""
        if self.decided:
            return
        if result.failure is not None or result.exhausted or not result.end:
            return
        if result.work is not None or (result.nbytes or 0) > MAX_BYTES:
            self.decided = True  # fetch threads made it, or it is large: one batch a task
            return
        self.times.append(result.end - result.start)
        if len(self.times) > SAMPLED:
            # the fastest: on a busy machine a batch's wall time is mostly preemption, and a
            # median of tiny batches reads as groups of one
            fastest = min(self.times[1:])
            self.size = max(1, min(MAX_SIZE, int(BUDGET_S / max(fastest, 1e-6))))
            self.decided = True
