"""Where the time went, in pictures (the ``plot`` extra: matplotlib).

::

    loader (Stats)  --> plot_timeline(stats, png)    one row per worker, one for the training loop
    sweep results   --> plot_sweep(results, png)     samples/s against num_workers, a line per loader
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .stats import INLINE, LOOP, Stats, stats_of

__all__ = ["plot_sweep", "plot_timeline", "timeline_windows"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'conveyor[plot]'") from exc
    if "matplotlib.pyplot" not in __import__("sys").modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


WINDOW = 32  # batches a timeline panel shows: each bar a few pixels wide at least


def _handed_times(st: Stats) -> list[float]:
    """When each batch the trace holds was handed to the training loop, in order: a loop's
    step begins as a batch is handed out, and its last wait ends as the last one is. Without
    loop events (batches handed out of the main process's gathers), the fetches' ends."""
    steps, last = [], None
    for kind, worker, start, end in st.trace:
        if worker == LOOP:
            if kind == "step":
                steps.append(start)
            last = end if last is None else max(last, end)
    if steps and last is not None:
        return sorted(steps) + ([last] if last > max(steps) else [])
    return sorted(end for kind, _, _, end in st.trace if kind == "fetch")


def timeline_windows(stats: Stats | Any, batches: int = WINDOW) -> list[tuple[str, float, float]]:
    """The spans of time :func:`plot_timeline` draws, as ``(label, from_s, to_s)`` in seconds
    since the loader started: the run's first ``batches`` batches, and ``batches`` from the
    middle of the run (the steady state); a run of few batches in one span.

    >>> from conveyor.stats import Stats
    >>> st = Stats(started=0.0)
    >>> for i in range(200):
    ...     st.handed(i * 0.01, i * 0.01 + 0.002, 32, 1)
    >>> [(label, round(a, 3), round(b, 3)) for label, a, b in timeline_windows(st)]
    [('the start: batches 1-32', 0.0, 0.312), ('steady state: batches 85-116', 0.832, 1.152)]
    """
    st = stats_of(stats)
    t0 = st.started
    handed = [t - t0 for t in _handed_times(st)]
    if not handed:
        return [("no batches", 0.0, 0.0)]
    n = len(handed)
    if n <= 3 * batches:
        return [(f"all {n} batches", 0.0, handed[-1])]
    middle = n // 2 - batches // 2
    return [(f"the start: batches 1-{batches}", 0.0, handed[batches - 1]),
            (f"steady state: batches {middle + 1}-{middle + batches}", handed[middle - 1], handed[middle + batches - 1])]


def _setting(given: dict[str, Any], snap: dict[str, Any] | None = None) -> str:
    """The settings a loader was given (``"auto"`` for those it tunes), in words for a title,
    with what ran where it differs (``snap``: its ``stats()``): the workers "auto" ran, or the
    batches the main process made in place of the workers given."""
    nw = given.get("num_workers")
    if nw is None:
        return ""
    said = f"num_workers={nw!r}" if nw == "auto" else f"num_workers={nw}"
    for name in ("fetch_threads", "prefetch_factor"):
        value = given.get(name)
        if value is not None and (name != "fetch_threads" or value != 1) and (name != "prefetch_factor" or nw):
            said += f", {name}={value!r}" if value == "auto" else f", {name}={value}"
    snap = snap or {}
    batches, here = snap.get("batches") or 0, snap.get("main_process_batches") or 0
    if nw == "auto" and batches:
        ran = sum(1 for k, w in snap.get("workers", {}).items() if int(k) >= 0 and w.get("batches"))
        said += f" ({ran} worker{'' if ran == 1 else 's'} ran)"
    elif nw and here:
        said += f" ({here} of {batches} batches made in the main process)"
    return said


def _given(loader: Any) -> dict[str, Any]:
    """A loader's num_workers, fetch_threads and prefetch_factor as given ("auto" where tuned)."""
    auto = getattr(loader, "_auto", None) or {}
    return {name: "auto" if auto.get(name) else getattr(loader, name, None)
            for name in ("num_workers", "fetch_threads", "prefetch_factor")}


def _tracks(st: Stats, workers: int) -> dict[int, dict[str, list[tuple[float, float]]]]:
    """The timeline's tracks, top to bottom: the training loop, the main process (where it
    made batches), then every worker, each ``{kind: [(from_ms, length_ms)]}``; a worker that
    made no batch keeps its (empty) track."""
    t0 = st.started
    rows: dict[int, dict[str, list[tuple[float, float]]]] = {LOOP: {}}
    for w in range(workers):
        rows[w] = {}
    for kind, worker, start, end in list(st.trace):
        rows.setdefault(worker, {}).setdefault(kind, []).append(((start - t0) * 1e3, (end - start) * 1e3))
    return {w: rows[w] for w in sorted(rows, key=lambda w: (w != LOOP, w != INLINE, w))}


def plot_timeline(stats: Stats | Any, path: str | os.PathLike[str], *, setting: str | None = None,
                  batches: int = WINDOW) -> Path:
    """A PNG of each worker's fetches and the loop's steps and waits on one time axis: a
    track per worker (those that made no batch in view too), one for the training loop,
    over the run's first ``batches`` batches and ``batches`` of its steady state, side by
    side (a long run drawn whole blurs its bars into stripes).

    ``stats`` is a :class:`~conveyor.stats.Stats` or a conveyor DataLoader; ``setting``
    names what ran in the title (default: the loader's num_workers, fetch_threads and
    prefetch_factor).

    >>> plot_timeline(loader, "timeline.png")  # doctest: +SKIP
    """
    plt = _pyplot()
    st = stats_of(stats)
    snapshot = getattr(stats, "stats", None)  # a loader's: its settings (a bare Stats has none)
    snap = snapshot() if callable(snapshot) else {}
    given = _given(stats) if snap else {}
    if setting is None:
        setting = _setting(given, snap) if snap else ""
    # a track for each worker given (adaptive may have kept their batches here), or that ran
    tracks = given.get("num_workers") if isinstance(given.get("num_workers"), int) else snap.get("num_workers")
    rows = _tracks(st, int(tracks or 0))
    order = list(rows)
    windows = timeline_windows(st, batches)
    fig, axes = plt.subplots(1, len(windows), sharey=True, squeeze=False,
                             figsize=(7 * len(windows), 1.4 + 0.45 * len(order)))
    colors = {"fetch": "tab:blue", "step": "tab:green", "wait": "tab:red"}
    for ax, (label, a, b) in zip(axes[0], windows):
        for y, worker in enumerate(order):
            for kind, spans in rows[worker].items():
                ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colors.get(kind, "tab:gray"), label=kind)
        pad = 0.01 * max(b - a, 1e-6) * 1e3
        ax.set_xlim(a * 1e3 - pad, b * 1e3 + pad)
        ax.set_title(label, fontsize="medium")
        ax.set_xlabel("ms since the loader started")
        ax.grid(True, axis="x", alpha=0.3)
    first = axes[0][0]
    first.set_yticks(range(len(order)))
    first.set_yticklabels(["training loop" if w == LOOP else "main process" if w == INLINE else f"worker {w}"
                           for w in order])
    first.invert_yaxis()
    handles, labels = first.get_legend_handles_labels()
    for ax in axes[0][1:]:
        h, l = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + l
    unique = dict(zip(labels, handles))
    if unique:
        # beside the rows, not over them (it hid the end of the training loop's row)
        axes[0][-1].legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0),
                           fontsize="small")
    what = f"conveyor, {setting}" if setting else "conveyor"
    # the setting alone (the legend names the colours), wrapped to the figure: one window's
    # 7 inches cuts a longer title at both ends
    fig.suptitle(textwrap.fill(what, width=60 * len(windows)), fontsize="medium")
    return _save(plt, fig, path)


def plot_sweep(results: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """A PNG of throughput against worker count, one line per loader.

    ``results``: dicts with ``loader``, ``workers`` and ``samples_s``.

    >>> plot_sweep([{"loader": "conveyor", "workers": 0, "samples_s": 9e3}], "sweep.png")  # doctest: +SKIP
    """
    plt = _pyplot()
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        lines.setdefault(str(r["loader"]), []).append((int(r["workers"]), float(r["samples_s"])))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("num_workers")
    ax.xaxis.get_major_locator().set_params(integer=True)  # (else it draws ticks at 1.9, 2.0, 2.1 workers)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("samples / s")
    ax.set_title("throughput against worker count")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: str | os.PathLike[str]) -> Path:
    """Lay ``fig`` out, write it to ``path`` as a PNG (making its folder) and close it."""
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
