"""What to do when a worker process dies: replace it and re-issue its tasks.

Workers hold no position in the epoch (tasks are made in the main process),
so a replacement worker can take over the dead one's unfinished tasks and the
epoch still delivers every sample exactly once, in order. The budget
``max_worker_restarts`` bounds how often; past it, or when re-issue is
impossible (an iterable dataset's replica state died with the worker), the
loader raises :class:`WorkerDied` naming every death.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import WorkerDied
from .task import Death

__all__ = ["Recovery", "WorkerDied"]


def _indices(death: Death, limit: int = 8) -> str:
    idx = [t.indices for t in death.tasks]
    if not idx:
        return "no batch in hand"
    shown = ", ".join("next batch" if i is None else str(i if len(i) <= 8 else i[:8] + ["..."]) for i in idx[:limit])
    return f"batches in hand: {shown}" + (" ..." if len(idx) > limit else "")


@dataclass
class Recovery:
    """Counts deaths against the restart budget."""

    max_restarts: int
    can_reissue: bool
    deaths: list[Death] = field(default_factory=list)

    def should_restart(self, death: Death, *, fresh: bool = False) -> bool:
        """``fresh``: the dead worker's part of the epoch has not begun (a stream's replica
        that handed out nothing yet starts over in a new worker, nothing lost)."""
        self.deaths.append(death)
        return (self.can_reissue or fresh) and len(self.deaths) <= self.max_restarts

    def error(self) -> WorkerDied:
        last = self.deaths[-1]
        lines = [f"- {d.describe()}; {_indices(d)}" for d in self.deaths]
        if not self.can_reissue:
            why = ("an iterable dataset's workers cannot be replaced (each holds its own "
                   "position in the stream)")
        else:
            why = f"the restart budget is spent (max_worker_restarts={self.max_restarts})"
        # torch's words first (users match on them), then which worker, how, and why no restart
        msg = (f"{last.torch_words()} {last.describe()[0].upper()}{last.describe()[1:]}: "
               f"{len(self.deaths)} worker death(s) so far, and {why}.\n" + "\n".join(lines))
        if any(d.cause is None for d in self.deaths):
            msg += ("\nA worker killed by SIGKILL is often the out-of-memory killer: use fewer workers "
                    "or a smaller prefetch_factor; SIGSEGV/SIGBUS points at native code (a decoder) or "
                    "a full /dev/shm.")
        if any(d.cause is not None for d in self.deaths):
            msg += ("\nThe same batch hanging in every new worker points at its samples (a read that "
                    "never returns): raise timeout if they are only slow.")
        if last.stack:
            msg += f"\nThe last one's Python stack before it was killed:\n{last.stack}"
        return WorkerDied(msg, list(self.deaths))
