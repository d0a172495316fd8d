"""``conveyor tune MODULE:FACTORY``: every (num_workers, fetch_threads) pair over the user's
own dataset, and the settings to use.

    FACTORY() --> dataset --> every (workers, fetch_threads) --> table + the settings to use
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from .. import _torch
from ..placement import usable_cores
from .common import sweeping, table

__all__ = ["run"]


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


def run(args: argparse.Namespace) -> int:
    from ..config import is_iterable_dataset
    from ..loader import DataLoader

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
    if is_iterable_dataset(dataset):
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
    with sweeping(args.workers):
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
    print(table(rows, [("workers", "num_workers", ""), ("threads", "fetch_threads", ""),
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
    a batch of (names, images) would count its 2 fields), else ``default``."""
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
