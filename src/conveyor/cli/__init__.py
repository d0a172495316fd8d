"""The ``conveyor`` command: ``demo`` (no data needed) and ``tune`` (your dataset).

::

    conveyor demo [--workers 0,1,2,4] [--epochs N] [--out DIR] [--quick]
        built-in diabetes-shaped data --> torch DataLoader and conveyor at each worker count
        --> table, auto choice, report(), DIR/trace.json (+ timeline.png, sweep.png with matplotlib)
    conveyor tune MODULE:FACTORY --batch-size N [--workers ...] [--fetch-threads ...] [--batches N]
        FACTORY() --> dataset --> every (workers, fetch_threads) --> table + the settings to use

``main`` parses the arguments and runs ``demo.run`` or ``tune.run``; ``diabetes`` holds the
demo's built-in data, ``common`` what both commands print with.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import demo, tune
from .diabetes import Diabetes, make_diabetes

__all__ = ["Diabetes", "main", "make_diabetes"]


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


# -- entry point ------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    from .. import __version__

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
                       description=f"Rerun {demo.EXPERIMENT} (759 x 8 float32 + label, batch 32, shuffle, 8-6-4-1 "
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
    d.set_defaults(run=demo.run)
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
    t.set_defaults(run=tune.run)
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
