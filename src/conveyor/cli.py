"""The ``conveyor`` command: ``demo`` (no data needed) and ``tune`` (your dataset).

::

    conveyor demo [--workers 0,1,2,4] [--epochs N] [--out DIR] [--quick]
        built-in diabetes-shaped data --> torch DataLoader and conveyor at each worker count
        --> table, auto choice, report(), DIR/trace.json (+ timeline.png, sweep.png with matplotlib)
    conveyor tune MODULE:FACTORY --batch-size N [--workers ...] [--fetch-threads ...] [--batches N]
        FACTORY() --> dataset --> every (workers, fetch_threads) --> table + the settings to use
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _torch
from .errors import SlowSettingWarning
from .report import plot_sweep, plot_timeline, report
from .stats import write_trace

__all__ = ["Diabetes", "main", "make_diabetes"]

ROWS, FEATURES, BATCH, LR = 759, 8, 32, 0.01
EXPERIMENT = ("the diabetes example of a published PyTorch DataLoader tutorial, in which every added "
              "worker made training slower")


# -- the built-in data set ----------------------------------------------------
def make_diabetes(rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stand-in for the diabetes.csv of a published PyTorch DataLoader tutorial
    (the demo's experiment): ``rows`` x 8 float32 features in [-1, 1], 0/1 labels.

    >>> x, y = make_diabetes(); x.shape, y.shape, x.dtype.name
    ((759, 8), (759, 1), 'float32')
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, size=(rows, FEATURES)).astype(np.float32)
    w = rng.normal(0.0, 1.5, size=FEATURES)
    logits = x.astype(np.float64) @ w + 0.6 + rng.normal(0.0, 0.5, size=rows)
    y = (logits > 0).astype(np.float32)[:, None]
    return x, y


class Diabetes:
    """The demo's map-style data set: ``(features, label)`` pairs, torch tensors when torch is installed.

    Like that tutorial's ``DiabetesDataset`` (a ``torch.utils.data.Dataset``): ``__getitem__`` and ``__len__``.

    >>> ds = Diabetes(tensors=False); len(ds), ds[0][0].shape
    (759, (8,))
    """

    def __init__(self, tensors: bool | None = None) -> None:
        x, y = make_diabetes()
        self.len = x.shape[0]
        if tensors is None:
            tensors = _torch.available()
        if tensors:
            torch = _torch.get()
            assert torch is not None
            self.x_data: Any = torch.from_numpy(x)
            self.y_data: Any = torch.from_numpy(y)
        else:
            self.x_data, self.y_data = x, y

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return self.x_data[index], self.y_data[index]

    def __len__(self) -> int:
        return self.len


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


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """Rows as a fixed-width table; ``columns`` are (key, header, format)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([format(r[k], f) if not isinstance(r[k], str) else r[k] for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def _positive_ints(text: str) -> list[int]:
    values = _ints(text)
    if 0 in values:
        raise argparse.ArgumentTypeError(f"expected integers of at least 1, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {value}")
    return value


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
    slows a run of each setting alike instead of every run of one (a sequential sweep once
    put conveyor's num_workers=0 at 3.55 s and num_workers=2, the same path, at 0.11 s)."""
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
    from .loader import DataLoader

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
def demo(args: argparse.Namespace) -> int:
    """The demo, with the model's torch on ``--torch-threads`` intra-op threads (then put back).

    torch's default is a thread per core, which on few cores spin against the loaders'
    worker processes: on 2 cores the rounds of one setting ran 2.03 and 4.21 s, the training
    step swamping any difference in loading (the benchmarks pin one thread for the same
    reason). With one thread every round took ~0.1 s."""
    if not _torch.available():
        return _demo(args)
    torch = _torch.get()
    before = torch.get_num_threads()
    torch.set_num_threads(args.torch_threads)
    try:
        return _demo(args)
    finally:
        torch.set_num_threads(before)


def _demo(args: argparse.Namespace) -> int:
    from .loader import DataLoader

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
    with _sweeping(workers), warnings.catch_warnings():
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
    print(_table(rows, [("loader", "loader", ""), ("workers", "workers", ""), ("seconds", "seconds", ".2f"),
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


# -- conveyor tune ----------------------------------------------------------------
def _load_factory(spec: str) -> Callable[[], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"conveyor tune: expected MODULE:FACTORY (e.g. mydata:make_dataset), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"conveyor tune: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the module's own code failed (a SyntaxError, a raise)
        traceback.print_exc()  # the user's code: where it failed is theirs to see
        raise SystemExit(f"conveyor tune: importing {module_name!r} failed with {type(exc).__name__}: {exc}") \
            from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"conveyor tune: {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise SystemExit(f"conveyor tune: {spec} is not callable")
    return obj


def _progress(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="batch", file=sys.stderr, dynamic_ncols=True)


@contextlib.contextmanager
def _sweeping(workers: Iterable[int]) -> Iterator[None]:
    """A sweep asked for its worker counts: one note up front where they pass the usable
    cores, instead of the loader's warning at each setting (in the middle of the progress bar)."""
    from .placement import usable_cores

    cores = usable_cores()
    most = max(workers, default=0)
    if most > cores:
        print(f"note: up to {most} workers on {cores} usable cores: they compete for the same CPUs", flush=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*worker processes in total.*")
        yield


def tune(args: argparse.Namespace) -> int:
    from .loader import DataLoader, _is_iterable_dataset

    if args.batches < 2:
        raise SystemExit("conveyor tune: --batches must be at least 2 (the first batch is timed on its own)")
    if args.batch_size < 1:
        raise SystemExit(f"conveyor tune: --batch-size must be a positive integer, got {args.batch_size}")
    if not math.isfinite(args.step_ms) or args.step_ms < 0:
        # (nan and inf passed here and failed after the first setting's first batch)
        raise SystemExit(f"conveyor tune: --step-ms must be a non-negative number, got {args.step_ms:g}")
    factory = _load_factory(args.factory)
    try:
        dataset = factory()
    except Exception as exc:
        traceback.print_exc()  # the user's code: where it failed is theirs to see
        raise SystemExit(f"conveyor tune: calling {args.factory}() failed with {type(exc).__name__}: {exc} "
                         "(FACTORY is called with no arguments and returns the dataset)") from None
    if isinstance(dataset, (str, bytes, bytearray)) or not (hasattr(dataset, "__getitem__")
                                                            or hasattr(dataset, "__iter__")):
        kind = type(dataset).__name__
        raise SystemExit(f"conveyor tune: {args.factory}() returned {'an' if kind[0] in 'aeiou' else 'a'} {kind}, "
                         "not a dataset "
                         "(an object with __getitem__ and __len__, or an iterable)")
    if _is_iterable_dataset(dataset):
        # a stream's worker reads its one iterator: no fetch threads, no shuffling by the loader
        if args.shuffle:
            raise SystemExit(f"conveyor tune: {args.factory}() returned an iterable dataset, which the loader "
                             "cannot shuffle: leave out --shuffle")
        if any(t > 1 for t in args.fetch_threads):
            print("note: an iterable dataset's worker reads one iterator, so fetch threads do not apply: "
                  "sweeping num_workers alone", flush=True)
            args.fetch_threads = [1]
    if args.output != "numpy":
        _torch.get()  # import torch now, not inside the first setting's timing
    step = args.step_ms / 1e3
    combos = [(w, t) for w in args.workers for t in args.fetch_threads]
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"shuffle": args.shuffle}
    if args.worker_type != "process":
        extra["worker_type"] = args.worker_type
    if args.output:
        extra["output"] = args.output
    if args.on_error != "raise":
        extra["on_error"] = args.on_error
    with _sweeping(args.workers):
        bar = _progress(len(combos) * args.batches)
        try:
            for w, t in combos:
                if bar is not None:
                    bar.set_description(f"num_workers={w} fetch_threads={t}")
                else:
                    print(f"  num_workers={w} fetch_threads={t} ...", file=sys.stderr, flush=True)
                loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=w, fetch_threads=t, **extra)
                done = samples = 0
                first: float | None = None
                last = 0.0
                t0 = time.perf_counter()
                try:
                    while done < args.batches:
                        progressed = False
                        for batch in loader:
                            progressed = True
                            if first is None:
                                first = time.perf_counter() - t0
                            done += 1
                            samples += _batch_len(batch, args.batch_size)
                            if bar is not None:
                                bar.update(1)
                            if step:
                                time.sleep(step)
                            last = time.perf_counter() - t0
                            if done >= args.batches:
                                break
                        if not progressed:
                            raise SystemExit("conveyor tune: the dataset gave no batches")
                except Exception as exc:
                    if bar is not None:
                        bar.close()
                        bar = None
                    traceback.print_exc()  # the user's code: where it failed is theirs to see
                    hint = "" if args.on_error == "skip" else " (--on-error skip sweeps past bad samples)"
                    raise SystemExit(f"conveyor tune: loading failed at num_workers={w} fetch_threads={t} with "
                                     f"{type(exc).__name__}: {exc}{hint}") from None
                finally:
                    loader.close()
                seconds = last  # to the last batch's step: closing the loader is not loading
                # steady state: from the first batch on (start-up is its own column)
                steady = max(1e-9, last - (first or 0.0))
                n = max(1, done - 1)
                rows.append({"workers": w, "threads": t, "seconds": seconds, "batches_s": n / steady,
                             "samples_s": n * (samples / max(1, done)) / steady, "first_ms": (first or 0.0) * 1e3})
        finally:
            if bar is not None:
                bar.close()
    print(_table(rows, [("workers", "num_workers", ""), ("threads", "fetch_threads", ""),
                        ("seconds", "seconds", ".2f"), ("batches_s", "batches/s", ",.1f"),
                        ("samples_s", "samples/s", ",.0f"), ("first_ms", "first batch ms", ",.0f")]))
    top = max(r["samples_s"] for r in rows)
    # the cheapest setting within 5% of the fastest: fewer processes first, then fewer threads
    pick = min((r for r in rows if r["samples_s"] >= 0.95 * top), key=lambda r: (r["workers"], r["threads"]))
    kwargs = [f"batch_size={args.batch_size}", f"num_workers={pick['workers']}"]
    if pick["threads"] != 1:
        kwargs.append(f"fetch_threads={pick['threads']}")
    for k, v in extra.items():
        if k != "shuffle" or v:
            kwargs.append(f"{k}={v!r}")
    print()
    how = f"with a {args.step_ms:g} ms step" if step else "loading only, no training step"
    how += ", after the first batch"
    print(f"use ({pick['samples_s']:,.0f} samples/s, {pick['samples_s'] / top:.0%} of the fastest setting, "
          f"{how}; re-check with loader.report() while training):")
    print()
    print("    from conveyor import DataLoader")
    print(f"    loader = DataLoader(dataset, {', '.join(kwargs)})")
    from .placement import usable_cores

    cores = usable_cores()
    if pick["workers"] > cores:
        print(f"\nnote: num_workers={pick['workers']} is more than the {cores} usable cores (the loader warns of "
              "that): the fetches wait rather than compute; fewer workers with more fetch_threads may do as well")
    edge = [flag for flag, key, swept in (("--workers", "workers", args.workers),
                                           ("--fetch-threads", "threads", args.fetch_threads))
            if len(set(swept)) > 1 and pick[key] == max(swept)]
    if edge:
        print(f"\nnote: the pick is the largest {' and '.join(edge)} swept: larger values may be faster still")
    return 0


def _batch_len(batch: Any, default: int) -> int:
    """The samples in a collated batch: the leading dimension of its first array, field by
    field, else the length of its first list of plain values (collated strings stay a list:
    a batch of (names, images) counted its 2 fields), else ``default``."""
    todo = [batch]
    plain: int | None = None
    while todo:
        x = todo.pop(0)
        shape = getattr(x, "shape", None)
        if shape:
            return int(shape[0])
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)) and x:
            if all(isinstance(v, (str, bytes, int, float, bool)) for v in x):
                plain = len(x) if plain is None else plain
            else:
                todo.extend(x)
    return plain if plain is not None else default


# -- entry point ------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="conveyor",
        description="conveyor: a fast, self-tuning drop-in for torch.utils.data.DataLoader.",
        epilog="commands:\n"
               "  demo   rerun the diabetes example of a published PyTorch DataLoader tutorial, in which\n"
               "         every added worker made training slower, on built-in data: torch's DataLoader and\n"
               "         conveyor at several worker counts; print the table, the auto choice and where the\n"
               "         time went; write a Perfetto trace and PNG plots. Needs no data.\n"
               "  tune   sweep num_workers x fetch_threads over YOUR dataset (MODULE:FACTORY returns it)\n"
               "         and print the DataLoader settings to use.\n\n"
               "examples:\n"
               "  conveyor demo --quick\n"
               "  conveyor tune mydata:make_dataset --batch-size 64 --workers 0,2,4 --fetch-threads 1,8",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"conveyor {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{demo,tune}")
    d = sub.add_parser("demo", help="compare torch's DataLoader and conveyor on the built-in diabetes data",
                       description=f"Rerun {EXPERIMENT} (759 x 8 float32 + label, batch 32, shuffle, 8-6-4-1 "
                                   "sigmoid MLP, BCELoss, SGD lr 0.01) on built-in synthetic data with torch's "
                                   "DataLoader and conveyor at each worker count.")
    d.add_argument("--workers", type=_ints, default=None, metavar="N,N,...",
                   help="worker counts to compare (default 0,1,2,4; 0,1 with --quick)")
    d.add_argument("--epochs", type=_positive, default=None, help="epochs per run (default 10, 1 with --quick)")
    d.add_argument("--out", default="conveyor-demo", help="folder for trace.json and the plots (default ./conveyor-demo)")
    d.add_argument("--repeats", type=_positive, default=None,
                   help="runs per setting, the fastest reported (default 2, 1 with --quick)")
    d.add_argument("--quick", action="store_true", help="a fast smoke run")
    d.add_argument("--torch-threads", type=_positive, default=1,
                   help="torch intra-op threads for the model (default 1: torch's one per core spin against the "
                        "workers, and the training step's noise swamps the loaders')")
    d.set_defaults(run=demo)
    t = sub.add_parser("tune", help="find the fastest settings for your own dataset",
                       description="Import MODULE, call FACTORY() for a dataset, and time conveyor's DataLoader "
                                   "for every num_workers x fetch_threads pair (loading only, unless --step-ms adds a simulated training step).")
    t.add_argument("factory", metavar="MODULE:FACTORY", help="e.g. mydata:make_dataset (imported from the cwd)")
    t.add_argument("--batch-size", type=int, required=True, metavar="N",
                   help="samples per batch, as your training uses (required)")
    t.add_argument("--workers", type=_ints, default=[0, 1, 2, 4], metavar="N,N,...",
                   help="num_workers values to sweep (default 0,1,2,4)")
    t.add_argument("--fetch-threads", type=_positive_ints, default=[1, 8], metavar="N,N,...",
                   help="fetch_threads values to sweep, each with every worker count (default 1,8)")
    t.add_argument("--batches", type=int, default=50, help="batches timed per setting (default 50)")
    t.add_argument("--step-ms", type=float, default=0.0,
                   help="sleep this long after each batch, standing in for a training step (default 0)")
    t.add_argument("--shuffle", action="store_true", help="shuffle, as training would")
    t.add_argument("--worker-type", choices=["process", "thread"], default="process",
                   help="process: worker processes, as torch's (default); thread: worker threads in this "
                        "process, for datasets that release the GIL or cannot be copied into a process")
    t.add_argument("--output", choices=["torch", "numpy"], default=None,
                   help="what the batches are made of: torch tensors or numpy arrays (default torch when "
                        "torch is installed, else numpy)")
    t.add_argument("--on-error", choices=["raise", "skip"], default="raise",
                   help="skip: leave bad samples out of their batch, as DataLoader(on_error='skip') does, so "
                        "a dataset with a few unreadable files can be swept (default raise)")
    t.set_defaults(run=tune)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``conveyor`` command line.

    >>> main(["--help"])  # doctest: +SKIP
    """
    p = parser()
    args = p.parse_args(argv)
    if getattr(args, "run", None) is None:
        p.print_help()
        return 2
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print(f"conveyor {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
