"""Where the overlap scenario's time goes: a CPU budget per batch, loader by loader.

The overlap scenario asks for 4 ms of CPU per batch in the workers (the collate) and
4 ms in the main process (the step), so on a machine with C cores the best a loader
can do is max(4 ms, 8 ms / C) a batch. Every microsecond a loader spends anywhere
else comes out of that: on 2 cores, both are fully subscribed, and a batch cannot
take less than (main CPU + workers' CPU) / 2. This script measures those CPU times
per batch (from /proc/<pid>/task/*/schedstat, nanoseconds, every thread), in the
steady state and at the edges (start, epoch boundary), so the efficiency that
benchmarks/run.py reports can be read as a sum of named costs.

    python benchmarks/overlap_budget.py                 # conveyor2 and torch2, 3 runs each
    python benchmarks/overlap_budget.py --runs 5 --out benchmarks/results/overlap_budget.md

Linux only (schedstat). Each run is a fresh child process, loaders alternated.
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
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
BATCHES = 256  # an epoch of the overlap scenario (2048 samples, batch 8)
EPOCHS = 2
STEADY = (20, 240)  # batches of the first epoch counted as steady state
COLD_REPEATS = 200  # timings of the per-batch work in each state (cold_cost)


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, in nanoseconds (0 once it is gone)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def _runqueue_ns() -> int:
    """Nanoseconds this thread has spent runnable but not running (preempted), so far."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


class Floor:
    """The least a loader with 2 process workers can do here, for reference ("floor2"): fork
    two workers at the first epoch, hand batch k's indices to worker k % 2 over a pipe (two
    batches ahead per worker), get back the batch's number over another pipe and the batch
    itself in a shared mapping (8 slots a worker), and nothing else: no probing, stats,
    recovery, ordering beyond the rotation, or cleanup beyond closing the pipes. What it
    loses against the ideal is what this machine costs any such design."""

    SLOTS = 8

    def __init__(self, dataset: Any, batch_size: int, collate_fn: Any) -> None:
        import mmap

        import numpy as np

        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate_fn
        self.workers: list[tuple[int, int, int, Any]] = []  # pid, order fd, result fd, slots
        self.rng = np.random.default_rng(0)
        self.mmap = mmap.mmap
        first = collate_fn([dataset[0]] * batch_size)
        self.shape, self.dtype, self.nbytes = first.shape, first.dtype, first.numel() * first.element_size()

    def _start(self) -> None:
        import torch

        for w in range(2):
            buf = self.mmap(-1, self.SLOTS * self.nbytes)
            orders_r, orders_w = os.pipe()
            results_r, results_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in (orders_w, results_r, *(fd for _, o, r, _ in self.workers for fd in (o, r))):
                    os.close(fd)  # the pipes' other ends: EOF reaches each worker at close()
                os.nice(5)
                torch.set_num_threads(1)
                slots = torch.frombuffer(buf, dtype=self.dtype).view(self.SLOTS, *self.shape)
                pending = b""
                while True:
                    data = os.read(orders_r, 1 << 16)
                    if not data:
                        os._exit(0)
                    pending += data
                    while len(pending) >= 4 + self.batch_size * 4:
                        seq = int.from_bytes(pending[:4], "little")
                        idx = [int.from_bytes(pending[4 + 4 * j:8 + 4 * j], "little") for j in range(self.batch_size)]
                        pending = pending[4 + 4 * self.batch_size:]
                        slots[seq // 2 % self.SLOTS].copy_(self.collate([self.dataset[i] for i in idx]))
                        os.write(results_w, seq.to_bytes(4, "little"))
            os.close(orders_r)
            os.close(results_w)
            self.workers.append((pid, orders_w, results_r, buf))

    def epoch(self) -> Iterator[Any]:
        import torch

        if not self.workers:
            self._start()
        order = self.rng.permutation(len(self.dataset))
        batches = [order[k:k + self.batch_size] for k in range(0, len(order) - self.batch_size + 1, self.batch_size)]

        def send(seq: int) -> None:
            indices = b"".join(int(i).to_bytes(4, "little") for i in batches[seq])
            os.write(self.workers[seq % 2][1], seq.to_bytes(4, "little") + indices)

        ahead = min(len(batches), 4)
        for seq in range(ahead):
            send(seq)
        done: set[int] = set()
        for seq in range(len(batches)):
            while seq not in done:
                data = os.read(self.workers[seq % 2][2], 4096)
                done.update(int.from_bytes(data[j:j + 4], "little") for j in range(0, len(data), 4))
            done.discard(seq)
            view = torch.frombuffer(self.workers[seq % 2][3], dtype=self.dtype, count=self.nbytes // self.dtype.itemsize,
                                    offset=(seq // 2 % self.SLOTS) * self.nbytes).view(self.shape)
            if seq + ahead < len(batches):
                send(seq + ahead)
            yield view

    def close(self) -> None:
        for pid, orders_w, results_r, _ in self.workers:
            os.close(orders_w)
            os.close(results_r)
            os.waitpid(pid, 0)
        self.workers = []


def measure(loader_name: str) -> dict[str, Any]:
    """One run of the overlap scenario with ``loader_name`` in this process (a child's)."""
    import loaders
    import scenarios

    setup = scenarios.SCENARIOS["overlap"].build("conveyor" if loader_name.startswith("conveyor") else "torch",
                                                 False)
    loaders.preload(loader_name)
    me = os.getpid()
    rq0 = _runqueue_ns()
    t0 = time.perf_counter()
    if loader_name == "floor2":
        floor = Floor(setup.dataset, setup.batch_size, setup.collate_fn)
        handle = loaders.Handle(floor.epoch, floor.close, 2)
    else:
        handle = loaders.make(loader_name, setup.dataset, setup.batch_size, setup.collate_fn, EPOCHS)
    marks: dict[str, tuple[float, int, int]] = {}
    n = 0
    try:
        for _ in range(EPOCHS):
            for batch in handle.epoch():
                if n in (0, 10, STEADY[0], STEADY[1], BATCHES - 6, BATCHES + 6):
                    kids = _children(me)
                    marks[str(n)] = (time.perf_counter(), _cpu_ns(me), sum(_cpu_ns(k) for k in kids))
                setup.step(batch)
                n += 1
                del batch
        end = time.perf_counter()
    finally:
        handle.close()
    assert n == EPOCHS * BATCHES, n
    ideal = scenarios.overlap_ideal(handle.workers or 0)
    (ta, ma, wa), (tb, mb, wb) = marks[str(STEADY[0])], marks[str(STEADY[1])]
    k = STEADY[1] - STEADY[0]
    edge_a, edge_b = marks[str(BATCHES - 6)], marks[str(BATCHES + 6)]
    return {
        "total_s": end - t0,
        "efficiency": ideal * n / (end - t0),
        "first_s": marks["0"][0] - t0,
        # the first ten batches against ten ideal ones: worker start-up and the probe
        "start_loss_s": marks["10"][0] - t0 - 10 * ideal,
        "epoch_edge_loss_s": edge_b[0] - edge_a[0] - 12 * ideal,
        "steady_batch_s": (tb - ta) / k,
        "main_cpu_s": (mb - ma) / 1e9 / k,
        "workers_cpu_s": (wb - wa) / 1e9 / k,
        # the training loop's thread waiting for a core it was ready to use: a worker the
        # scheduler placed on its core (idle balancing while it waited, or a wake-up there)
        "main_preempted_s": (_runqueue_ns() - rq0) / 1e9,
    }


def cold_cost() -> dict[str, float]:
    """Microseconds a small piece of per-batch work (index 8 samples out of a tensor, stack
    them) takes back to back, right after 4 ms of other CPU work, and right after 4 ms
    asleep. Every per-batch cost of every loader in this scenario is paid in the second or
    third state (after a training step, after a collate, after waiting), so the ratio says
    how much more the loader's own work costs here than a warm microbenchmark suggests."""
    import scenarios
    import torch

    data = torch.arange(2048 * 16, dtype=torch.float32).reshape(2048, 16)

    def work() -> None:
        torch.stack([data[i] for i in range(8)])

    out = {}
    for state, before in (("warm", None), ("after_cpu", lambda: scenarios.busy(0.004)),
                          ("after_sleep", lambda: time.sleep(0.004))):
        took = []
        for _ in range(COLD_REPEATS):
            if before is not None:
                before()
            t = time.perf_counter()
            work()
            took.append(time.perf_counter() - t)
        out[state] = 1e6 * statistics.median(took)
    return out


def child_main(loader_name: str) -> None:
    """A fresh child's measurement: the overlap run with ``loader_name``, or ``"cold"``."""
    sys.path[:0] = [str(HERE), str(HERE.parent / "src")]
    print(json.dumps(cold_cost() if loader_name == "cold" else measure(loader_name)))


def run_child(loader_name: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", loader_name], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu_model() -> str:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import run  # the suite's description of the machine

    return str(run.machine({})["cpu"])


def report(results: dict[str, list[dict[str, Any]]], cores: int, cold: dict[str, float] | None = None) -> str:
    med = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for name, runs in results.items()}
    lines = [
        "# overlap: where the time goes",
        "",
        f"- machine: {_cpu_model()}, {cores} usable cores, {platform.platform()}, python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"- {len(next(iter(results.values())))} runs per loader (fresh process each, alternated), medians; "
        "CPU from /proc schedstat (every thread of the main process, every worker)",
        "- scenario: 4 ms CPU collate in the workers, 4 ms CPU step in the main process, batch 8, "
        f"{EPOCHS} epochs of {BATCHES} batches; ideal {1e3 * 0.004:.1f} ms a batch with workers",
        "",
    ]
    if cold is not None:
        lines += [
            f"- per-batch work here (index 8 samples of 16 floats, stack them): {cold['warm']:.1f} us back to back, "
            f"{cold['after_cpu']:.1f} us right after 4 ms of other CPU work, {cold['after_sleep']:.1f} us right "
            "after 4 ms asleep "
            f"(medians of {COLD_REPEATS}; a loader's per-batch costs are paid in the last two states)",
        ]
    lines += [
        "",
        "| loader | total s | efficiency | first batch ms | start loss ms (10 batches) | epoch edge loss ms "
        "(12 batches) | steady ms/batch | main CPU ms/batch | workers CPU ms/batch | CPU bound ms/batch "
        "| main thread preempted ms (run) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in med.items():
        bound = max(m["main_cpu_s"], (m["main_cpu_s"] + m["workers_cpu_s"]) / cores)
        lines.append(
            f"| {name} | {m['total_s']:.3f} | {m['efficiency']:.3f} | {1e3 * m['first_s']:.1f} | "
            f"{1e3 * m['start_loss_s']:.1f} | {1e3 * m['epoch_edge_loss_s']:.1f} | {1e3 * m['steady_batch_s']:.3f} | "
            f"{1e3 * m['main_cpu_s']:.3f} | {1e3 * m['workers_cpu_s']:.3f} | {1e3 * bound:.3f} | "
            f"{1e3 * m['main_preempted_s']:.1f} |")
    if "floor2" in med:
        lines += ["", "floor2 is no loader: two forked workers, a pipe each way, the batches in a shared mapping "
                  "and nothing else (`Floor`), for what this machine allows any design of this shape."]
    lines += [
        "",
        "CPU bound = max(main CPU, (main CPU + workers' CPU) / cores): the shortest a steady-state batch",
        "can take when the cores run nothing else. Main CPU above 4 ms is the loader's work in",
        "next() (reading the result, building the batch, handing out the next task); workers' CPU above",
        "4 ms is fetching, collating, writing the batch and sending it, and waking up for it.",
        "Main thread preempted: time the training loop was ready to run and a worker (or anything",
        "else) had its core, over the whole run. On a fully subscribed machine it moves CPU time",
        "between the main process and the workers rather than adding to it.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--loader", action="append",
                   help="loaders to measure (default conveyor2 torch2 floor2; floor2: see Floor)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", help="write the markdown table here too")
    a = p.parse_args(argv)
    if a.child:
        child_main(a.child)
        return 0
    names = a.loader or ["conveyor2", "torch2", "floor2"]
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for _ in range(a.runs):
        for n in names:
            results[n].append(run_child(n))
    text = report(results, len(os.sched_getaffinity(0)), run_child("cold"))
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
