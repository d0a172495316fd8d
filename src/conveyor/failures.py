"""What goes wrong in an epoch, counted and explained.

``SkipBudget`` counts the samples seen and skipped under ``on_error="skip"`` against
``max_failures``; ``replace_dead`` replaces a dead worker and re-issues its tasks within
``max_worker_restarts``; the functions below say where a batch that timed out is (which worker,
which indices, its stack, a worker still starting or busy with an earlier epoch's batch) and
kill a hung worker under ``restart_hung=True``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .errors import Failure, TooManyFailures, rebuild
from .executors.processes import ProcessExecutor
from .executors.task import Death, Task

if TYPE_CHECKING:
    from .epoch import Run

__all__ = ["SkipBudget", "replace_dead", "restart_hung", "held_over", "awaited", "timeout_error", "indices_words"]


class SkipBudget:
    """An epoch's samples seen and failed under ``on_error="skip"``, against ``limit``
    (``max_failures``: a count, or a fraction of the samples seen so far)."""

    __slots__ = ("limit", "stats", "seen", "failed", "first", "kinds")

    def __init__(self, limit: int | float, stats: Any) -> None:
        self.limit = limit
        self.stats = stats
        self.seen = 0
        self.failed = 0
        self.first: Failure | None = None  # this epoch's first failure, chained by TooManyFailures
        self.kinds: dict[str, int] = {}  # this epoch's failures by exception type

    def count(self, failures: list[Failure], samples: int, failed: int | None = None) -> None:
        """``samples`` more were seen, ``failed`` of them (all by default) failing with ``failures``."""
        self.stats.incidents.skipped(failures)
        self.failed += samples if failed is None else failed
        self.seen += samples
        if failures and self.first is None:
            self.first = failures[0]
        for f in failures:
            kind = f.type_name.rsplit(".", 1)[-1]
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
        limit = self.limit
        seen = max(1, self.seen)
        # a fraction allows that share of the samples seen so far, rounded up: one bad sample
        # early on is not yet a rate
        over = self.failed > (limit if isinstance(limit, int) else math.ceil(limit * seen - 1e-9))
        if over:
            first = self.first or failures[0]
            summary = ", ".join(f"{k} x{v}" for k, v in sorted(self.kinds.items(), key=lambda kv: -kv[1]))
            err = TooManyFailures(
                f"{self.failed} of {seen} samples failed so far this epoch ({summary}), more than "
                f"max_failures={limit!r} allows under on_error='skip'. The epoch's first failure is chained "
                "below.", list(self.stats.incidents.failures))
            try:
                raise err from rebuild(first)
            finally:
                # the exception would hold this frame, and the frame it: a cycle that keeps the
                # epoch's workers, pipes and slots until a full collection, for a loop that
                # catches it and goes on (docs/decisions/no-reference-cycles-to-workers.md)
                del err


def restart_hung(run: Run) -> bool:
    """With ``restart_hung=True``, kill the worker holding the awaited batch; recovery replaces it."""
    if not run.loader.restart_hung or not run.ex.can_kill:
        return False
    found = awaited(run)
    if found is None:
        return False
    worker, batch = found
    stack = run.ex.stack(worker)
    cause = f"stuck for more than timeout={run.loader.timeout} s on {batch}, restart_hung=True"
    run.ex.kill(worker, cause, stack)  # the next poll reports its death; its tasks are re-issued
    return True


def held_over(run: Run, worker: int | None = None) -> str:
    """A worker (``worker``, or any) still busy with a batch of an earlier epoch, which
    the awaited batch waits behind (persistent workers, after a timeout or a break)."""
    for w, held in enumerate(run.ex.held()):
        old = [t for t in held.values() if t.seq < run.origin.first_seq]
        if old and worker in (None, w):
            return (f"worker {w} is still making a batch of an earlier epoch ({indices_words(old[0])}), and "
                    "must finish it first")
    return ""


def awaited(run: Run) -> tuple[int, str] | None:
    """The worker holding the batch the consumer waits for, and that batch in words."""
    seq = run.reorder.next if run.loader.in_order else min(run.inflight, default=None)
    where = run.inflight.get(seq) if seq is not None else None
    if seq is None or where is None:
        return None
    worker, task = where
    return worker, f"batch {seq - run.origin.first_seq} of this epoch ({indices_words(task)})"


def timeout_error(run: Run) -> RuntimeError:
    found = awaited(run)
    if found is None:
        behind = held_over(run)
        where = f" waiting for batch {run.reorder.next - run.origin.first_seq} of this epoch: {behind}" if behind else ""
        return RuntimeError(f"DataLoader timed out after {run.loader.timeout} seconds{where}")
    worker, batch = found
    starting = run.ex.starting_for(worker)
    stack = run.ex.stack(worker)
    run.ex.give_up(worker)  # closing need not wait for it to finish its batch
    msg = f"DataLoader timed out after {run.loader.timeout} seconds waiting for {batch} from worker {worker}"
    behind = held_over(run, worker)
    if behind:
        msg += f" ({behind})"
    if starting is not None:
        how = ("imports the main script and its modules afresh, unpickles the dataset and runs worker_init_fn"
               if run.ex.method != "fork" else "runs worker_init_fn")
        msg += (f", which has not started yet after {starting:.1f} s: a new worker {how} before its first "
                "batch, and the timeout counts that too (raise timeout; with persistent_workers=True only the "
                "first epoch pays it)")
    if stack:
        msg += f"; its Python stack right now:\n{stack}"
    return RuntimeError(msg)


def indices_words(task: Task) -> str:
    """A task's samples in words, for messages: its indices, or a stream's next batch."""
    return "the next batch" if task.indices is None else f"indices {list(task.indices)}"


def replace_dead(run: Run, death: Death) -> None:
    """A worker died: replace it within ``max_worker_restarts`` and hand its unfinished tasks to
    the replacement, or raise the death (``WorkerDied``) once the budget is spent."""
    if run.finished or run.pool.dead:
        raise StopIteration  # workers stopped by close() (from another thread): no restart
    incidents = run.stats.incidents
    incidents.deaths.append(death.describe())
    # a stream's replica that has handed out nothing this epoch (a worker that died in an
    # epoch the user broke off, say) starts over in a new worker: nothing is lost
    w = death.worker
    fresh = (run.replicas is not None and w < len(run.replicas.done) and run.replicas.done[w] == 0
             and not any(r.worker == w for r in run.reorder.buffer.values()))
    if not run.recovery.should_restart(death, fresh=fresh):
        err = run.recovery.error()
        run.close()
        raise err
    incidents.restarts += 1
    # a replacement that does not start is waited for as a batch is: timeout, when set
    wait = run.loader.timeout or 60.0
    if isinstance(run.ex, ProcessExecutor):
        # replacements killed before they start are replaced within the same budget
        budget = run.recovery.max_restarts
        tasks = run.ex.restart(death.worker, wait, tries=1 + budget - len(run.recovery.deaths),
                                spent=f"max_worker_restarts={budget} allows no more")
        for early in run.ex.take_start_deaths():
            run.recovery.deaths.append(early)
            incidents.deaths.append(early.describe())
            incidents.restarts += 1
    else:
        tasks = run.ex.restart(death.worker, wait)
    tasks = [t for t in tasks if t.seq in run.inflight]
    if tasks:
        for t in tasks:
            run.inflight[t.seq] = (death.worker, t)
        run.ex.submit(death.worker, tasks)
