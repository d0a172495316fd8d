"""What both commands print with: a fixed-width table, and the note a sweep of worker
counts gives once where they pass the usable cores."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..placement import usable_cores

__all__ = ["sweeping", "table"]


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """Rows as a fixed-width table; ``columns`` are (key, header, format)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([format(r[k], f) if not isinstance(r[k], str) else r[k] for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@contextlib.contextmanager
def sweeping(workers: Iterable[int]) -> Iterator[None]:
    """A sweep asked for its worker counts: one note up front where they pass the usable
    cores, instead of the loader's warning at each setting (in the middle of the progress bar)."""
    cores = usable_cores()
    most = max(workers, default=0)
    if most > cores:
        print(f"note: up to {most} workers on {cores} usable cores: they compete for the same CPUs", flush=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*worker processes in total.*")
        yield
