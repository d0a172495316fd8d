"""Copy-on-read cost of a Python list of paths vs a StringArray in forked workers.

For N path strings (``/data/train/class_123/img_0001234.jpg``), each run loads
every item once through ``torch.utils.data.DataLoader`` (in a shuffled order,
as in training; ``__getitem__`` returns ``len(path)``), with 0 workers or with 2
fork workers kept alive (persistent_workers), and then samples the PSS
(proportional set size) summed over the main process and its workers. Each
configuration runs in a fresh interpreter so runs cannot disturb each other.

    extra PSS = PSS(2 workers) - PSS(0 workers), reported as % of the list's size

A control dataset that holds no strings shows what two idle workers cost on
their own. Prints a markdown table and writes benchmarks/results/strings.json.

    python benchmarks/bench_strings.py [--n 2000000] [--batch-size 1024]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "benchmarks" / "results" / "strings.json"
KINDS = ("list", "stringarray", "control")


def make_paths(n: int) -> list[str]:
    return [f"/data/train/class_{i % 1000:03d}/img_{i:07d}.jpg" for i in range(n)]


def list_size(paths: list[str]) -> int:
    """Bytes held by the list object and its string objects."""
    return sys.getsizeof(paths) + sum(map(sys.getsizeof, paths))


class PathLengths:
    """Map-style dataset: the length of the i-th path (touches the string)."""

    def __init__(self, paths: Any) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        return len(self.paths[i])


class Control:
    """Same length, holds no strings: what the workers cost by themselves."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return 1


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rollup(pid: int) -> dict[str, int]:
    """PSS fields of /proc/<pid>/smaps_rollup, in bytes (empty off Linux)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines()[1:]:
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[name] = int(value.split()[0]) * 1024
    return out


def tree_pss() -> dict[str, int]:
    """PSS of this process and its children: total, and anonymous + shmem only.

    File-backed pages (libtorch, numpy) are also shared with unrelated
    processes that map the same libraries, so total PSS drifts with what else
    runs on the machine; anonymous pages are shared only inside this tree,
    which is exactly where copy-on-read shows.
    """
    import psutil

    me = psutil.Process()
    total = anon = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except psutil.NoSuchProcess:
            continue
        fields = _rollup(proc.pid)
        anon += fields.get("Pss_Anon", 0) + fields.get("Pss_Shmem", 0)
    return {"pss": total, "pss_anon": anon}


def run_one(kind: str, workers: int, n: int, batch_size: int, freeze: bool, which: str = "torch") -> dict[str, Any]:
    """One configuration, in this (fresh) process."""
    import numpy as np

    if which == "conveyor":
        from conveyor import DataLoader
    else:
        from torch.utils.data import DataLoader

    from conveyor.datasets import StringArray

    if kind == "control":
        dataset: Any = Control(n)
        expected = n
    else:
        paths = make_paths(n)
        expected = sum(map(len, paths))
        dataset = PathLengths(paths if kind == "list" else StringArray(paths))
        del paths
    gc.collect()
    if freeze:
        gc.freeze()  # workers' collections then skip every object made before the fork
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        # A shuffled order kept in one numpy array: torch's RandomSampler would make
        # 2M int objects per epoch in the main process, which only adds noise here.
        sampler=np.random.default_rng(0).permutation(n),
        num_workers=workers,
        persistent_workers=workers > 0,
        multiprocessing_context="fork" if workers else None,
        **({"adaptive": False} if which == "conveyor" else {}),
    )
    start = time.perf_counter()
    total = 0
    for batch in loader:
        total += int(batch.sum())
    seconds = time.perf_counter() - start
    if total != expected:
        raise RuntimeError(f"{kind}: summed {total}, expected {expected}")
    time.sleep(0.5)  # let workers settle after their last batch
    gc.collect()
    _malloc_trim()  # hand freed heap back, so allocator slack does not count as PSS
    pss = tree_pss()  # workers still alive: the iterator is kept by persistent_workers
    del loader
    return {**pss, "epoch_s": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--one", nargs=4, metavar=("KIND", "WORKERS", "FREEZE", "LOADER"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:
        kind, workers, freeze, which = args.one
        print(json.dumps(run_one(kind, int(workers), args.n, args.batch_size, freeze == "1", which)))
        return

    paths = make_paths(args.n)
    size = list_size(paths)
    from conveyor.datasets import StringArray

    buffers = StringArray(paths).nbytes
    del paths

    rows = []
    # conveyor's process workers freeze the collector's objects before forking by themselves
    for which, freeze in (("torch", False), ("torch", True), ("conveyor", False)):
        for kind in KINDS:
            run = {}
            for workers in (0, 2):
                cmd = [sys.executable, __file__, "--n", str(args.n), "--batch-size", str(args.batch_size)]
                cmd += ["--one", kind, str(workers), "1" if freeze else "0", which]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                run[workers] = json.loads(out.stdout.strip().splitlines()[-1])
            extra_anon = run[2]["pss_anon"] - run[0]["pss_anon"]
            extra_total = run[2]["pss"] - run[0]["pss"]
            rows.append(
                {
                    "dataset": kind,
                    "loader": which,
                    "gc_freeze": freeze,
                    "pss_anon_0_workers_mib": round(run[0]["pss_anon"] / 2**20, 1),
                    "pss_anon_2_workers_mib": round(run[2]["pss_anon"] / 2**20, 1),
                    "extra_pss_anon_mib": round(extra_anon / 2**20, 1),
                    "extra_pss_anon_pct_of_list": round(100 * extra_anon / size, 1),
                    "extra_pss_total_mib": round(extra_total / 2**20, 1),
                    "extra_pss_total_pct_of_list": round(100 * extra_total / size, 1),
                    "epoch_s_0_workers": run[0]["epoch_s"],
                    "epoch_s_2_workers": run[2]["epoch_s"],
                }
            )
    result = {
        "n_strings": args.n,
        "batch_size": args.batch_size,
        "order": "shuffled (numpy permutation sampler)",
        "start_method": "fork",
        "python_list_bytes": size,
        "stringarray_bytes": buffers,
        "headline": "extra_pss_anon_pct_of_list: anonymous+shmem PSS, 2 workers minus 0 workers",
        "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    print(f"{args.n:,} paths: Python list {size / 2**20:.1f} MiB, StringArray buffers {buffers / 2**20:.1f} MiB\n")
    print("| loader | dataset | gc.freeze | anon PSS 0w / 2w (MiB) | extra anon PSS (MiB) | extra, % of list | extra total PSS, % of list | epoch 0w / 2w (s) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['loader']} | {r['dataset']} | {'yes' if r['gc_freeze'] or r['loader'] == 'conveyor' else 'no'} "
            f"| {r['pss_anon_0_workers_mib']:.1f} / {r['pss_anon_2_workers_mib']:.1f} | {r['extra_pss_anon_mib']:.1f} "
            f"| {r['extra_pss_anon_pct_of_list']:.1f}% | {r['extra_pss_total_pct_of_list']:.1f}% "
            f"| {r['epoch_s_0_workers']:.1f} / {r['epoch_s_2_workers']:.1f} |"
        )
    print("\n'control' holds no strings: it is what two idle torch workers cost by themselves.")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
