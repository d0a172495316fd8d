"""Start-up of spawned and forkserver workers against the dataset's size (issue 43).

Rows of 3,072 uint8 (a CIFAR image) and an int64 label, 50 MB to 2 GB, 2 workers, batches
of 64 in order. Each case runs in a fresh process (its memory is the case's alone):

    torch      torch's DataLoader    + torch's TensorDataset
    conv+TD    conveyor's DataLoader + torch's TensorDataset
    conv+AD    conveyor's DataLoader + conveyor.ArrayDataset
    conv+user  conveyor's DataLoader + a user's class holding the numpy arrays

and reports the time from ``iter()`` to the first batch of the first epoch (which pays the
one-time move of the data into shared memory) and of the second (new workers: the
steady cost of a start), and the PSS of the whole process tree (main process, fork server,
workers: each shared page counted once over all) once both workers have made batches.

The full table (what benchmarks/results/spawn_start_<machine>.md holds), every variant, 50 MB
to 2 GB, spawn and forkserver, 3 repeats (72 cases, each in a fresh process; ~10-15 min on an
idle 2-core VM with 24 GB, most of it making the 2 GB arrays; needs ~3x the largest size free
in RAM):

    python benchmarks/spawn_start.py --repeats 3 --machine vm2c

A quicker look (conveyor's ArrayDataset beside torch only, ~2 min a repeat):

    python benchmarks/spawn_start.py --variants torch,conv+AD --repeats 1 --machine scratch

Each run writes results/spawn_start_<machine>.md and .json (--machine names them).

Where torch is imported matters under spawn and forkserver: each worker re-runs the main
module (multiprocessing's rule), so a script with ``import torch`` at its top imports torch in
every worker (~1.4 s and ~150 MB each), whatever the loader. By default the cases import torch
inside the measured function, as a script whose main module does not (a notebook, a
``main()`` in another module); ``--torch-at-top`` measures a script that imports it at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHUFFLE = os.environ.get("SPAWN_START_SHUFFLE") == "1"

if os.environ.get("SPAWN_START_TORCH_AT_TOP") == "1":
    import torch  # noqa: F401 - a training script's top-level import, re-run in each worker

ROW = 3072
VARIANTS = ("torch", "conv+TD", "conv+AD", "conv+user")
HERE = Path(__file__).resolve().parent


class UserArrays:
    """A user's own dataset: two numpy arrays as attributes, rows as samples."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return self.x[i], self.y[i]


def _memfd_pss(pid: int) -> dict[int, int]:
    """inode -> the PSS bytes of the process's mappings of memfd segments."""
    out: dict[int, int] = {}
    inode = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 6)
            if "-" in head[0] and not head[0].endswith(":"):
                inode = int(head[4]) if len(head) > 5 and head[5].startswith("/memfd:") else None
            elif inode is not None and head[0] == "Pss:":
                out[inode] = out.get(inode, 0) + int(head[1]) * 1024
    return out


def _memfd_allocated(pid: int) -> dict[int, int]:
    """inode -> the bytes allocated to each memfd the process holds open."""
    out: dict[int, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                out[st.st_ino] = st.st_blocks * 512
        except OSError:
            pass
    return out


def tree_pss() -> tuple[int, int]:
    """(memory of this process and all its descendants, how many processes), bytes: their
    PSS, plus the pages of the memfd segments (conveyor's shared data) that no process has
    touched yet. PSS counts a shared page only in the processes that map it and have
    touched it: a segment written through its descriptor (conveyor) and read in part by
    the workers would otherwise count only in part, where torch's, written through a
    mapping in the main process, counts whole."""
    import psutil

    me = psutil.Process()
    total, n = 0, 0
    touched: dict[int, int] = {}
    allocated: dict[int, int] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
            for ino, b in _memfd_pss(p.pid).items():
                touched[ino] = touched.get(ino, 0) + b
            allocated.update(_memfd_allocated(p.pid))
            n += 1
        except (psutil.Error, OSError):
            pass
    total += sum(max(0, size - touched.get(ino, 0)) for ino, size in allocated.items())
    return total, n


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process's descendants so far."""
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def one(variant: str, mb: int, method: str) -> dict[str, Any]:
    import numpy as np
    import torch  # imported by the training script in every case (else conveyor's first batch imports it)

    n = mb * 1_000_000 // ROW
    x = np.empty((n, ROW), dtype=np.uint8)
    x[:] = (np.arange(ROW) % 251).astype(np.uint8)  # every page written, as loaded data is
    x[:, 0] = np.arange(n) % 256
    y = np.arange(n, dtype=np.int64)
    nbytes = x.nbytes + y.nbytes
    if variant in ("torch", "conv+TD"):
        ds: Any = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    elif variant == "conv+AD":
        from conveyor import ArrayDataset

        ds = ArrayDataset(x, y)
    else:
        ds = UserArrays(x, y)
    del x, y  # the dataset holds the data, as with ArrayDataset(np.load(...))
    if variant == "torch":
        dl: Any = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context=method,
                                              shuffle=SHUFFLE)
    else:
        import conveyor

        dl = conveyor.DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context=method,
                                 adaptive=False, shuffle=SHUFFLE)
    kids0 = tree_cpu()
    c0 = time.process_time()
    t0 = time.perf_counter()
    it = iter(dl)
    first = next(it)
    first_s = time.perf_counter() - t0
    # CPU to the first batch holds still on a machine others load, where wall time does not
    main_cpu = time.process_time() - c0
    workers_cpu = tree_cpu() - kids0
    assert SHUFFLE or int(first[1][-1]) == 63
    for _ in range(7):  # batches from both workers: each has its dataset in hand
        next(it)
    pss, procs = tree_pss()
    # conveyor copies the data into shared memory while the workers make batches: the memory
    # measured then holds the data twice (the arrays and the copy under way); once the copy is
    # whole the dataset lets its own arrays go
    copying_pss = pss
    if variant != "torch":
        from conveyor.transport import share

        share.settle(120)
        pss, procs = tree_pss()
    del it, first
    t0 = time.perf_counter()
    it = iter(dl)
    next(it)
    second_s = time.perf_counter() - t0
    del it
    if hasattr(dl, "close"):
        dl.close()
    return {"variant": variant, "mb": mb, "method": method, "dataset_bytes": nbytes, "first_s": first_s,
            "second_s": second_s, "main_cpu_s": main_cpu, "workers_cpu_s": workers_cpu, "pss": pss,
            "copying_pss": copying_pss, "shuffle": SHUFFLE,
            "processes": procs}


def run_case(variant: str, mb: int, method: str, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", variant, str(mb), method],
                         capture_output=True, text=True, env=env, timeout=timeout)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"variant": variant, "mb": mb, "method": method, "error": (out.stderr or out.stdout)[-800:]}


def table(results: list[dict[str, Any]], sizes: list[int], methods: list[str]) -> str:
    lines = []
    for method in methods:
        lines.append(f"\n### {method}, 2 workers\n")
        lines.append("| loader + dataset | " + " | ".join(
            f"{mb} MB: 1st / 2nd epoch s, CPU main + workers s, PSS ÷ data" for mb in sizes) + " |")
        lines.append("|---|" + "---|" * len(sizes))
        for v in VARIANTS:
            cells = []
            for mb in sizes:
                rs = [r for r in results if r["variant"] == v and r["mb"] == mb and r["method"] == method]
                ok = [r for r in rs if "error" not in r]
                if not ok:
                    cells.append("error" if rs else "-")
                    continue
                f = statistics.median(r["first_s"] for r in ok)
                s = statistics.median(r["second_s"] for r in ok)
                p = statistics.median(r["pss"] / r["dataset_bytes"] for r in ok)
                pc = statistics.median(r.get("copying_pss", r["pss"]) / r["dataset_bytes"] for r in ok)
                m = statistics.median(r["main_cpu_s"] for r in ok)
                w = statistics.median(r["workers_cpu_s"] for r in ok)
                during = f" ({pc:.2f}x copying)" if pc > p + 0.01 else ""
                cells.append(f"{f:.2f} / {s:.2f}, {m:.2f} + {w:.2f}, {p:.2f}x{during}")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", nargs=3, metavar=("VARIANT", "MB", "METHOD"), help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="50,500,2000", help="dataset sizes in MB")
    ap.add_argument("--methods", default="spawn,forkserver")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--machine", default=platform.node() or "local")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--shuffle", action="store_true", help="shuffled batches (the rows of the first batch lie "
                    "anywhere in the data)")
    ap.add_argument("--torch-at-top", action="store_true",
                    help="the main module imports torch at its top (so does each spawned worker)")
    args = ap.parse_args()
    if args.torch_at_top:
        os.environ["SPAWN_START_TORCH_AT_TOP"] = "1"
    if args.shuffle:
        os.environ["SPAWN_START_SHUFFLE"] = "1"
    if args.one:
        variant, mb, method = args.one
        print("RESULT " + json.dumps(one(variant, int(mb), method)), flush=True)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    variants = args.variants.split(",")
    results: list[dict[str, Any]] = []
    t_start = time.time()
    for rep in range(args.repeats):
        for mb in sizes:
            for k, method in enumerate(methods):
                # alternate: each size and method starts with another loader
                turn = (rep + k + sizes.index(mb)) % len(variants)
                for v in variants[turn:] + variants[:turn]:
                    r = run_case(v, mb, method, args.timeout)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    out = HERE / "results" / f"spawn_start_{args.machine}.md"
    (HERE / "results" / f"spawn_start_{args.machine}.json").write_text(json.dumps(results, indent=1))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cores = os.cpu_count()
    try:
        import psutil

        ram = f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        ram = "RAM unknown"
    head = (f"# Worker start-up against dataset size ({args.machine})\n\n"
            f"`python benchmarks/spawn_start.py --sizes {args.sizes} --methods {args.methods} --variants "
            f"{args.variants} --repeats {args.repeats}{' --torch-at-top' if args.torch_at_top else ''}{' --shuffle' if args.shuffle else ''}` on {cores} cores, {ram}, Python {platform.python_version()}; "
            f"{time.strftime('%Y-%m-%d', time.gmtime(t_start))}, {time.time() - t_start:.0f} s in all; load average {load:.1f} at the end.\n"
            "Each cell: time from iter() to the first batch of the first epoch (which moves the data into "
            "shared memory once) and of the second epoch (new workers); the CPU seconds the main process and "
            "the workers (fork server included) spent until the first batch of the first epoch; the PSS of "
            "the whole process tree over the dataset's size, with both workers running (for conveyor, once its copy into "
            "shared memory is whole; in brackets while it was still under way, where more). Medians of the "
            "repeats. Cases alternate; each runs in a fresh process.\n")
    out.write_text(head + table(results, sizes, methods) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
