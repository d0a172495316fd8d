"""``conveyor demo``: the diabetes example of a published PyTorch DataLoader tutorial, in
which every added worker made training slower, rerun on built-in data.

    built-in diabetes-shaped data --> torch DataLoader and conveyor at each worker count
    --> table, auto choice, report(), DIR/trace.json (+ timeline.png, sweep.png with matplotlib)
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import _torch
from ..errors import SlowSettingWarning
from ..plots import plot_sweep, plot_timeline
from ..report import report
from ..stats import write_trace
from .common import sweeping, table
from .diabetes import FEATURES, Diabetes

__all__ = ["EXPERIMENT", "run"]

BATCH, LR = 32, 0.01  # the tutorial's batch size and learning rate
EXPERIMENT = ("the diabetes example of a published PyTorch DataLoader tutorial, in which every added "
              "worker made training slower")


# -- the tutorial's model -------------------------------------------------------
def _torch_step() -> Callable[[Any, Any], float]:
    """The tutorial's 8-6-4-1 sigmoid MLP, BCELoss, SGD(lr=0.01): returns ``step(x, y) -> loss``."""
    torch = _torch.get()
    assert torch is not None
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 6), torch.nn.Sigmoid(),
        torch.nn.Linear(6, 4), torch.nn.Sigmoid(),
        torch.nn.Linear(4, 1), torch.nn.Sigmoid(),
    )
    criterion = torch.nn.BCELoss(reduction="mean")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def step(x: Any, y: Any) -> float:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.item())

    return step


def _numpy_step() -> Callable[[Any, Any], float]:
    """The same MLP written in numpy, for machines without torch."""
    rng = np.random.default_rng(0)
    sizes = [8, 6, 4, 1]
    ws = [rng.uniform(-1 / math.sqrt(a), 1 / math.sqrt(a), size=(a, b)) for a, b in zip(sizes, sizes[1:])]
    bs = [rng.uniform(-1 / math.sqrt(a), 1 / math.sqrt(a), size=b) for a, b in zip(sizes, sizes[1:])]

    def step(x: Any, y: Any) -> float:
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).reshape(-1, 1)
        acts = [x]
        for w, b in zip(ws, bs):
            acts.append(1.0 / (1.0 + np.exp(-(acts[-1] @ w + b))))
        p = np.clip(acts[-1], 1e-7, 1 - 1e-7)
        loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
        grad = (p - y) / len(x)  # d loss / d logit of a sigmoid + BCE
        for i in reversed(range(len(ws))):
            gw, gb = acts[i].T @ grad, grad.sum(axis=0)
            if i:
                grad = (grad @ ws[i].T) * acts[i] * (1 - acts[i])
            ws[i] -= LR * gw
            bs[i] -= LR * gb
        return loss

    return step


def _train(loader: Iterable[Any], epochs: int, step: Callable[[Any, Any], float]) -> dict[str, float]:
    """Train for ``epochs``; wall time, samples, and the time spent waiting inside ``next()``."""
    samples = 0
    wait = 0.0
    loss = float("nan")
    t0 = time.perf_counter()
    for _ in range(epochs):
        it = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - asked
            loss = step(x, y)
            samples += len(x)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples": samples, "wait": wait, "loss": loss}


def _row(name: str, workers: int | str, out: dict[str, float]) -> dict[str, Any]:
    return {"loader": name, "workers": workers, "seconds": out["seconds"],
            "samples_s": out["samples"] / max(1e-9, out["seconds"]),
            "wait": out["wait"] / max(1e-9, out["seconds"]), "loss": out["loss"]}


def _stack(items: Sequence[Any]) -> Any:
    torch = _torch.get()
    assert torch is not None
    return torch.stack(list(items))


def _fastest(make: Callable[[], Any], repeats: int, epochs: int, make_step: Callable[[], Any]
             ) -> tuple[dict[str, float], Any, list[float]]:
    """The fastest of ``repeats`` runs, each with a fresh loader from ``make``: (that run, its
    loader, closed, every run's seconds). One run on a shared machine can be slowed by
    anything else running; the fastest is the loader's own speed."""
    best, seconds = _fastest_each([make], repeats, epochs, make_step)[0]
    return best[0], best[1], seconds


def _fastest_each(makes: Sequence[Callable[[], Any]], repeats: int, epochs: int, make_step: Callable[[], Any]
                  ) -> list[tuple[tuple[dict[str, float], Any], list[float]]]:
    """``_fastest`` for several settings at once, their runs taken in turn (round after
    round, not one setting's runs in a block): a minute of other work on a shared machine
    slows a run of each setting alike instead of every run of one
    (docs/decisions/demo-times-settings-in-turn.md)."""
    best: list[tuple[dict[str, float], Any] | None] = [None] * len(makes)
    seconds: list[list[float]] = [[] for _ in makes]
    for _ in range(repeats):
        for k, make in enumerate(makes):
            loader = make()
            try:
                out = _train(loader, epochs, make_step())
            finally:
                close = getattr(loader, "close", None)
                if callable(close):
                    close()
            seconds[k].append(out["seconds"])
            if best[k] is None or out["seconds"] < best[k][0]["seconds"]:  # type: ignore[index]
                best[k] = (out, loader)
    return [(b, s) for b, s in zip(best, seconds)]  # type: ignore[misc]


def _sweep(ds: Diabetes, workers: list[int], epochs: int, output: str, make_step: Callable[[], Any],
           has_torch: bool, rows: list[dict[str, Any]], loaders: dict[int, Any], out_dir: Path,
           repeats: int = 1) -> None:
    """Train with torch's DataLoader and conveyor at each worker count; a row per setting."""
    from ..loader import DataLoader

    def runs(seconds: list[float]) -> str:
        return " (runs " + ", ".join(f"{s:.2f}" for s in seconds) + ")" if len(seconds) > 1 else ""

    settings: list[tuple[str, int, Callable[[], Any]]] = []
    for n in workers:
        if has_torch:
            torch = _torch.get()
            assert torch is not None
            settings.append(("torch", n, lambda n=n: torch.utils.data.DataLoader(
                ds, batch_size=BATCH, shuffle=True, num_workers=n)))
        settings.append(("conveyor", n, lambda n=n: DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=n,
                                                               output=output)))
    if repeats > 1:
        print(f"  {len(settings)} settings, {repeats} runs each, taken in turn ...", flush=True)
    results = _fastest_each([make for _, _, make in settings], repeats, epochs, make_step)
    for (name, n, _), ((out, loader), seconds) in zip(settings, results):
        rows.append(_row(name, n, out))
        if name == "conveyor":
            loaders[n] = loader
            write_trace(loader, out_dir / f"trace-conveyor-w{n}.json")
        print(f"  {name:<9} num_workers={n}: {rows[-1]['seconds']:.2f} s{runs(seconds)}", flush=True)


def _workers_finding(rows: Sequence[dict[str, Any]]) -> tuple[str, bool]:
    """The experiment's finding in this run's numbers: what each worker count costs against
    num_workers=0, for each loader (rows: ``_row``'s, the worker counts the sweep ran), and
    whether every worker count was slower than none."""
    lines = []
    for name in ("torch", "conveyor"):
        mine = {r["workers"]: r["seconds"] for r in rows if r["loader"] == name and isinstance(r["workers"], int)}
        if 0 not in mine or len(mine) < 2:
            continue
        base = mine[0]
        slower = [f"num_workers={n} {mine[n] / base:.1f}x" for n in sorted(mine) if n]
        lines.append(f"{name}: " + ", ".join(slower) + f" the time of num_workers=0 ({base:.2f} s)")
    if not lines:
        return "", False
    worse = all(r["seconds"] > min(x["seconds"] for x in rows if x["loader"] == r["loader"] and x["workers"] == 0)
                for r in rows if isinstance(r["workers"], int) and r["workers"] and
                any(x["loader"] == r["loader"] and x["workers"] == 0 for x in rows))
    head = ("as in the experiment, every worker here costs more than it saves (batches this cheap are faster "
            "made in the training process):" if worse else "workers against num_workers=0:")
    return head + "\n  " + "\n  ".join(lines), worse


# -- conveyor demo ----------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    """The demo, with the model's torch on ``--torch-threads`` intra-op threads (then put back).

    torch's default is a thread per core, which on few cores spin against the loaders'
    worker processes, the training step's noise swamping any difference in loading (the
    benchmarks pin one thread for the same reason; docs/decisions/demo-times-settings-in-turn.md)."""
    if not _torch.available():
        return _run(args)
    torch = _torch.get()
    before = torch.get_num_threads()
    torch.set_num_threads(args.torch_threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(before)


def _run(args: argparse.Namespace) -> int:
    from ..loader import DataLoader

    has_torch = _torch.available()
    epochs = args.epochs if args.epochs is not None else (1 if args.quick else 10)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 2)
    workers = args.workers if args.workers is not None else ([0, 1] if args.quick else [0, 1, 2, 4])
    out_dir = Path(args.out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"conveyor demo: cannot make the --out folder {str(out_dir)!r}: "
                         f"{exc.strerror or exc}") from None
    ds = Diabetes(tensors=has_torch)
    output = "torch" if has_torch else "numpy"
    make_step = _torch_step if has_torch else _numpy_step
    print(f"conveyor demo: {EXPERIMENT}, on built-in data ({len(ds)} x {FEATURES} float32 + label), "
          f"batch {BATCH}, shuffle, 8-6-4-1 sigmoid MLP, BCELoss, SGD lr {LR}, {epochs} epoch(s)")
    if has_torch:
        print(f"the model runs on {args.torch_threads} torch intra-op thread(s) (--torch-threads; torch's default, "
              "one per core, competes with the workers for the cores)")
    else:
        print("note: torch is not installed: conveyor runs with output='numpy' and a numpy MLP; "
              "the torch DataLoader comparison is skipped (pip install 'conveyor[torch]')")
    warm = make_step()  # the first backward pass pays one-off set-up: keep it out of every timing
    for i in range(0, 4 * BATCH, BATCH):
        xs, ys = zip(*(ds[j] for j in range(i, i + BATCH)))
        warm(*((_stack(xs), _stack(ys)) if has_torch else (np.stack(xs), np.stack(ys))))
    rows: list[dict[str, Any]] = []
    loaders: dict[int, Any] = {}
    with sweeping(workers), warnings.catch_warnings():
        # the demo states what SlowSettingWarning would say, with both loaders' numbers (below)
        warnings.simplefilter("ignore", SlowSettingWarning)
        _sweep(ds, workers, epochs, output, make_step, has_torch, rows, loaders, out_dir, repeats)

    auto_line = "auto: not available"
    try:
        out, al, _ = _fastest(lambda: DataLoader(ds, batch_size=BATCH, shuffle=True,  # type: ignore[arg-type]
                                                 num_workers="auto", output=output),
                              repeats, epochs, make_step)
    except (TypeError, ValueError):
        al = None
    if al is not None:
        rows.append(_row("conveyor", "auto", out))
        snap = al.stats()
        chosen = al.tuning() if callable(getattr(al, "tuning", None)) else snap.get("tuning")
        why = f"; {chosen['reason']}" if isinstance(chosen, dict) and chosen.get("reason") else ""
        where = ("every batch made in the main process" if not snap.get("workers_started") else
                 f"{snap.get('num_workers')} worker(s) started")
        auto_line = (f"auto chose num_workers={snap.get('num_workers')}, fetch_threads={snap.get('fetch_threads')}, "
                     f"prefetch_factor={snap.get('prefetch_factor')}: {where}{why}")

    print()
    if repeats > 1:
        print(f"each row: the fastest of {repeats} runs")
    print(table(rows, [("loader", "loader", ""), ("workers", "workers", ""), ("seconds", "seconds", ".2f"),
                        ("samples_s", "samples/s", ",.0f"), ("wait", "wait %", ".0%")]))
    print()
    print(auto_line)
    ours = [r for r in rows if r["loader"] == "conveyor" and r["workers"] != "auto"]
    best = max(ours, key=lambda r: r["samples_s"])
    torch_rows = [r for r in rows if r["loader"] == "torch"]
    finding, workers_lose = _workers_finding(rows)
    if finding:
        print(finding)
    if torch_rows:
        tb = max(torch_rows, key=lambda r: r["samples_s"])
        print(f"best torch: num_workers={tb['workers']} at {tb['samples_s']:,.0f} samples/s; best conveyor: "
              f"num_workers={best['workers']} at {best['samples_s']:,.0f} samples/s "
              f"({best['samples_s'] / tb['samples_s']:.1f}x)")
    bl = loaders[best["workers"]]
    text = bl.report() if callable(getattr(bl, "report", None)) else report(bl.stats())
    if best["workers"] == 0 and workers_lose:
        # report() of a loader without workers can only guess what a worker's trip would cost;
        # the sweep above measured it
        per = bl.stats().get("wait_per_batch_s") or 0.0
        text = (f"each batch takes {per * 1e3:.2f} ms to make in the training process; the rows above "
                "measured that workers cost more than that, so num_workers=0 is right for this data")
    print(f"where time went (conveyor, num_workers={best['workers']}): {text}")

    trace = write_trace(bl, out_dir / "trace.json")
    print(f"wrote {trace} (the best setting; trace-conveyor-w<N>.json for each; open in https://ui.perfetto.dev)")
    try:
        print(f"wrote {plot_timeline(bl, out_dir / 'timeline.png')}")
        print(f"wrote {plot_sweep([r for r in rows if r['workers'] != 'auto'], out_dir / 'sweep.png')}")
    except ImportError as exc:
        print(f"no plots: {exc}")
    return 0
