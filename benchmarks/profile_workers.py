"""Where a batch's time goes on the worker path: conveyor's 2 workers, the featureless floor
(``floor2``) and torch without workers, step by step, per batch.

    parent: for run: for loader (alternated): fork a child ──> one JSON line ──> medians ──> table
    child:  build the scenario; patch timers in; t0; make the loader; every epoch, every
            batch: time next(); snapshots of every process's CPU at the end of epoch 1 and
            of the last; close

The steps, each a mean per batch over the epochs after the first (the steady state; with
one epoch, the batches after the first):

- main: the time the training loop spends in ``next()``, and of it: blocked waiting for a
  result (conveyor: ``ProcessExecutor.wait_ready``; floor: reading the pipe), reading and
  unpickling it (``take_ready``), decoding it into views of the shared slot (``decode``),
  and the rest (reorder, refill, stats);
- worker: fetch (``dataset[i]`` for the batch) and collate, from conveyor's own Result
  times (what ``stats()`` sums); encode (``transport.encode``: the tree, copies of leaves
  that were not collated into the slot); send (``_deliver``: pickle and pipe write, a
  group of results at once where conveyor groups tiny batches); the wait for orders
  between a send and the next fetch;
- hand-off: from the start of a worker's send to the main process having read that result
  (matched per worker, in order);
- every process's CPU, time runnable but waiting for a core (``/proc/<pid>/task/*/schedstat``),
  context switches and minor page faults, per batch.

The timers wrap private functions of conveyor (``Fetcher.run``, ``transport.encode``,
``serve._deliver``, ``ProcessExecutor.wait_ready/take_ready/decode``); a step whose function
is missing from the tree reads "-", the rest still run. Each timer adds ~1 us to its step.

    python benchmarks/profile_workers.py                          # images_uint8 and diabetes, 5 runs
    python benchmarks/profile_workers.py --scenario images_uint8 --runs 9 --out /tmp/profile.md
    python benchmarks/profile_workers.py --quick --runs 1         # a smoke test
    python benchmarks/profile_workers.py --scenario diabetes --loader conveyor2 --loader conveyor2_nice0

Linux only (/proc). torch0 has no worker rows; its ``next()`` is fetch and collate together.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import mmap
import os
import signal
import statistics
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "@@PROFILE "
LOADERS = ("torch0", "conveyor2", "floor2")
# conveyor2 with one thing changed: its workers left at nice 0 (conveyor lowers them to 5 after
# their first batch, CONVEYOR_WORKER_NICE), or seed=0 (every sample's RNGs seeded from (seed,
# epoch, index); the loader's own seeded shuffle may be read ahead, so tiny batches may travel
# in groups where the first batches are fast enough), or any sampler taken as one that may be
# read ahead (pool.reads_ahead_freely: what tiny batches' groups would bring to an unseeded
# shuffle; a measurement only, torch's order is not kept under it if an epoch is left early)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {"conveyor2_nice0": ("conveyor2", {}),
                                                   "conveyor2_seed0": ("conveyor2", {"seed": 0}),
                                                   "conveyor2_groups": ("conveyor2", {})}
SCENARIOS = ("images_uint8", "diabetes")

# step codes, shared with loaders.Floor's probe
FETCH, COLLATE, ENCODE, SEND, SENT, WAIT, TAKE, DECODE, GOT, NEXT = range(10)


class Recorder:
    """Timestamps ``(step, key, t0, t1)`` from the main process (region 0) and its forked workers
    (region 1 + worker id), in one anonymous shared mapping made before they fork: each region
    has one writer, so no lock. ``time.perf_counter`` is CLOCK_MONOTONIC, one clock for all."""

    REGIONS = 9
    CAP = 1 << 15
    REC = struct.Struct("<dddd")

    def __init__(self) -> None:
        self.size = 8 + self.CAP * self.REC.size
        self.buf = mmap.mmap(-1, self.REGIONS * self.size)
        self.region = 0

    def add(self, step: int, key: int, t0: float, t1: float) -> None:
        base = self.region * self.size
        n = int.from_bytes(self.buf[base:base + 8], "little")
        if n < self.CAP:
            self.REC.pack_into(self.buf, base + 8 + n * self.REC.size, step, key, t0, t1)
            self.buf[base:base + 8] = (n + 1).to_bytes(8, "little")

    def records(self, region: int) -> list[tuple[int, int, float, float]]:
        base = region * self.size
        n = int.from_bytes(self.buf[base:base + 8], "little")
        return [(int(s), int(k), a, b) for s, k, a, b in
                (self.REC.unpack_from(self.buf, base + 8 + i * self.REC.size) for i in range(n))]


def patch_conveyor(rec: Recorder) -> list[str]:
    """Wrap conveyor's worker-path functions with timers; returns the ones not found."""
    import conveyor.transport as transport
    from conveyor.executors import fetcher, processes, serve

    missing = []
    clock = time.perf_counter

    def wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            missing.append(f"{getattr(owner, '__name__', owner)}.{name}")
            return
        setattr(owner, name, make(orig))

    def run(orig: Any) -> Any:
        def timed(self: Any, task: Any) -> Any:
            if self.worker_id is not None:
                rec.region = self.worker_id + 1
            r = orig(self, task)
            if r.fetched:
                rec.add(FETCH, r.seq, r.start, r.fetched)
                rec.add(COLLATE, r.seq, r.fetched, r.end)
            return r
        return timed

    def encode(orig: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = orig(*args, **kwargs)
            rec.add(ENCODE, -1, t0, clock())
            return out
        return timed

    def deliver(orig: Any) -> Any:
        def timed(results: Any, msg: Any, ctxs: list[Any], drain: Any, pool: Any, spec: Any, worker_id: int) -> Any:
            t0 = clock()
            out = orig(results, msg, ctxs, drain, pool, spec, worker_id)
            rec.add(SEND, len(ctxs), t0, clock())
            for _ in ctxs:
                # from the send's start: the main process may read the result before the
                # worker, preempted by the wake-up it caused, returns from the write
                rec.add(SENT, worker_id, t0, t0)
            return out
        return timed

    def main_step(step: int) -> Callable[[Any], Any]:
        def make(orig: Any) -> Any:
            def timed(self: Any, *args: Any) -> Any:
                t0 = clock()
                out = orig(self, *args)
                t1 = clock()
                rec.add(step, -1, t0, t1)
                if step == TAKE:
                    for ev in out:
                        if getattr(ev, "seq", None) is not None and getattr(ev, "worker", -1) >= 0:
                            rec.add(GOT, ev.worker, t1, t1)
                return out
            return timed
        return make

    wrap(fetcher.Fetcher, "run", run)
    wrap(transport, "encode", encode)  # serve._serve imports it from the package when it starts
    wrap(serve, "_deliver", deliver)
    executor = getattr(processes, "ProcessExecutor", None)
    for name, step in (("wait_ready", WAIT), ("take_ready", TAKE), ("decode", DECODE)):
        wrap(executor, name, main_step(step))
    return missing


def proc_counters(pid: int) -> dict[str, float] | None:
    """Every thread of ``pid``: CPU and run-queue seconds, time slices, voluntary and forced
    context switches; the process's minor page faults. None once it is gone."""
    out = {"cpu_s": 0.0, "runq_s": 0.0, "slices": 0, "vcsw": 0, "icsw": 0}
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                    cpu, runq, slices = f.read().split()[:3]
                out["cpu_s"] += int(cpu) / 1e9
                out["runq_s"] += int(runq) / 1e9
                out["slices"] += int(slices)
                with open(f"/proc/{pid}/task/{t}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            out["vcsw"] += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            out["icsw"] += int(line.split()[1])
        with open(f"/proc/{pid}/stat") as f:
            out["minflt"] = int(f.read().rsplit(")", 1)[1].split()[7])
    except OSError:
        return None
    return out


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (its workers)."""
    kids = []
    for t in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            kids += [int(x) for x in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    return kids


def snapshot() -> dict[str, dict[str, float]]:
    me = os.getpid()
    out = {"main": proc_counters(me) or {}}
    for k in children(me):
        c = proc_counters(k)
        if c is not None:
            out[str(k)] = c
    return out


def child(scenario_name: str, loader_name: str, quick: bool, src: str | None,
          main_threads: int | None = None) -> dict[str, Any]:
    """Run one profiled (scenario, loader) pair in this process."""
    sys.path[:0] = [str(HERE), src or str(ROOT / "src")]
    import loaders
    import scenarios

    if main_threads:
        import torch
        torch.set_num_threads(main_threads)
    import warnings
    warnings.simplefilter("ignore")  # (conveyor's SlowSettingWarning: this profile knows)

    setup = scenarios.SCENARIOS[scenario_name].build("conveyor" if loader_name.startswith("conveyor") else "torch",
                                                    quick)
    variant = loader_name
    loader_name, opts = VARIANTS.get(variant, (variant, {}))
    loaders.preload(loader_name)
    rec = Recorder()
    missing: list[str] = []
    if loader_name.startswith("conveyor"):
        missing = patch_conveyor(rec)
        if variant.endswith("_nice0"):
            from conveyor.executors import serve
            serve.WORKER_NICE = 0  # (read by each worker after its first batch)
        if variant.endswith("_groups"):
            import conveyor.pool as conveyor_pool
            if hasattr(conveyor_pool, "reads_ahead_freely"):
                conveyor_pool.reads_ahead_freely = lambda loader: True
            else:
                missing.append("pool.reads_ahead_freely")
    elif loader_name == "floor2":
        # (a staticmethod: the class's attribute, read through the instance; inherited by its forks)
        loaders.Floor.probe = staticmethod(lambda step, w, t0, t1: rec.add(step, w, t0, t1))
        rec_region = rec

        orig_serve = loaders.Floor._serve

        def serve(self: Any, orders: int, results: int, buf: Any) -> None:  # pragma: no cover - the worker
            rec_region.region = self.wid + 1
            orig_serve(self, orders, results, buf)

        loaders.Floor._serve = serve  # type: ignore[method-assign]
    gc.collect()
    clock = time.perf_counter
    snaps = {"start": snapshot()}
    t0 = clock()
    handle = loaders.make(loader_name, setup.dataset, setup.batch_size, setup.collate_fn, setup.epochs,
                          shuffle=setup.shuffle, **opts)
    made = clock()
    ends: list[float] = []
    first = None
    k = 0
    try:
        for e in range(setup.epochs):
            it = iter(handle.epoch())
            while True:
                asked = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                got = clock()
                rec.region = 0
                rec.add(NEXT, k, asked, got)
                if first is None:
                    first = got - t0
                    if setup.epochs == 1:
                        cut = got  # one epoch: the steady state starts after the first batch
                        snaps["cut"] = snapshot()
                k += 1
                del batch
            ends.append(clock())
            if e == 0 and setup.epochs > 1:
                cut = ends[0]  # the steady state: the epochs after the first
                snaps["cut"] = snapshot()
        snaps["end"] = snapshot()
        stats = None
        if loader_name.startswith("conveyor"):
            stats = handle.epoch().stats()
    finally:
        handle.close()
    out = {"status": "ok", "t0": t0, "cut": cut, "seconds": ends[-1] - t0, "construct_s": made - t0, "first_batch_s": first,
           "epoch1_s": ends[0] - t0, "epoch_ends": [e - t0 for e in ends], "batches": k,
           "epochs": setup.epochs, "missing": missing, "snaps": snaps,
           "records": {r: rec.records(r) for r in range(Recorder.REGIONS) if rec.records(r)}}
    if stats is not None:
        out["stats"] = {"wait_s": stats.get("wait_s"), "batches": stats.get("batches"),
                        "workers": {str(w): {k2: v for k2, v in ws.items() if isinstance(v, (int, float))}
                                    for w, ws in (stats.get("workers") or {}).items()}}
    return out


def fork_child(args: tuple[str, str, bool, str | None, int | None], timeout: float) -> dict[str, Any]:
    """Run ``child(*args)`` in a forked process (its own process group) and read its JSON line."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setpgid(0, 0)
            os.close(r)
            try:
                result = child(*args)
            except BaseException as e:
                result = {"status": "error", "note": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()[-2000:]}
            data = (MARK + json.dumps(result) + "\n").encode()
            while data:
                data = data[os.write(w, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        import select
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"status": "error", "note": f"timed out after {timeout:.0f} s"}
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                data = os.read(r, 1 << 20)
                if not data:
                    break
                chunks.append(data)
    finally:
        os.close(r)
    os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith(MARK)]
    return json.loads(lines[-1][len(MARK):]) if lines else {"status": "error", "note": "no result"}


# ---------------------------------------------------------------- reading one run

def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def per_batch(run: dict[str, Any]) -> dict[str, float | None]:
    """One run's figures: milliseconds (counts) per batch over the epochs after the first, and
    the run's start-up."""
    recs = {int(r): v for r, v in run["records"].items()}
    main = recs.get(0, [])
    nexts = [(a, b) for s, _, a, b in main if s == NEXT]
    t_cut = run["cut"]  # the first epoch's end (one epoch: the first batch's), on the shared clock
    steady_nexts = [(a, b) for a, b in nexts if a >= t_cut]
    n = len(steady_nexts)
    out: dict[str, float | None] = {"batches": float(n)}
    if not n:
        return out
    span = run["epoch_ends"][-1] + run["t0"] - t_cut
    ms = 1e3 / n

    def inside(step: int, region: int = 0) -> float:
        return sum(b - a for s, _, a, b in recs.get(region, []) if s == step and a >= t_cut)

    out["wall"] = span * ms
    out["next"] = sum(b - a for a, b in steady_nexts) * ms
    out["next_median"] = 1e3 * statistics.median(b - a for a, b in steady_nexts)
    out["outside"] = out["wall"] - out["next"]
    has_main_steps = any(s in (WAIT, TAKE, DECODE) for s, _, _, _ in main)
    if has_main_steps:
        out["wait"] = inside(WAIT) * ms
        out["take"] = inside(TAKE) * ms
        out["decode"] = inside(DECODE) * ms
        out["rest"] = out["next"] - out["wait"] - out["take"] - out["decode"]
    workers = [r for r in recs if r > 0]
    if workers:
        for key, step in (("fetch", FETCH), ("collate", COLLATE), ("encode", ENCODE), ("send", SEND)):
            total = sum(inside(step, r) for r in workers)
            out[key] = total * ms
        sends = [k for r in workers for s, k, a, _ in recs[r] if s == SEND and a >= t_cut]
        out["batches_per_send"] = (sum(sends) / len(sends)) if sends else None
        idle, lat = 0.0, []
        for r in workers:
            rs = recs[r]
            starts = sorted(a for s, _, a, _ in rs if s == FETCH)
            sent = sorted(a for s, _, a, _ in rs if s == SENT)
            for end, nxt in zip(sent, starts[1:]):
                if end >= t_cut and nxt > end:
                    idle += nxt - end
            got = sorted(a for s, k, a, _ in main if s == GOT and k == r - 1)
            lat += [g - s for s, g in zip(sent, got) if s >= t_cut]
        out["idle"] = idle * ms / len(workers)
        out["handoff"] = 1e3 * statistics.median(lat) if lat else None
        out["handoff_mean"] = 1e3 * _mean(lat) if lat else None
    a, b = run["snaps"]["cut"], run["snaps"]["end"]
    for who in ("main", "workers"):
        keys = ["main"] if who == "main" else [p for p in b if p != "main" and p in a]
        for field in ("cpu_s", "runq_s", "vcsw", "icsw", "minflt", "slices"):
            d = sum(b[p].get(field, 0) - a[p].get(field, 0) for p in keys)
            out[f"{who}_{field}"] = d * (ms if field.endswith("_s") else 1.0 / n)
    if workers:
        # the first epoch: when each worker began its first fetch, and what the steps took in all
        t0 = run["t0"]
        firsts = [min((a for s, _, a, _ in recs[r] if s == FETCH), default=None) for r in workers]
        firsts = [f for f in firsts if f is not None]
        out["worker_first_fetch"] = 1e3 * (max(firsts) - t0) if firsts else None
        for key, steps in (("e1_blocked", (WAIT,)), ):
            out[key] = 1e3 * sum(b - a for s, _, a, b in main if s in steps and a < t_cut)
        out["e1_worker_busy"] = 1e3 * sum(b - a for r in workers for s, _, a, b in recs[r]
                                          if s in (FETCH, COLLATE, ENCODE, SEND) and a < t_cut) / len(workers)
        out["e1_worker_send"] = 1e3 * sum(b - a for r in workers for s, _, a, b in recs[r]
                                          if s == SEND and a < t_cut) / len(workers)
    out["first_batch"] = 1e3 * run["first_batch_s"]
    out["construct"] = 1e3 * run["construct_s"]
    out["epoch1"] = 1e3 * run["epoch1_s"]
    out["total"] = 1e3 * run["seconds"]
    s0, e1 = run["snaps"]["start"], run["snaps"]["cut"]
    out["startup_cpu"] = 1e3 * sum(e1[p]["cpu_s"] - s0.get(p, {}).get("cpu_s", 0.0) for p in e1)
    return out


ROWS: list[tuple[str, str, int]] = [
    # (key, label, digits); ms per batch unless the label says otherwise
    ("wall", "wall time per batch (steady: epochs 2..N; one epoch: batches 2..N)", 3),
    ("next", "main: in next(), mean", 3),
    ("next_median", "main: in next(), median", 3),
    ("wait", "  blocked waiting for a result (poll / pipe read)", 3),
    ("take", "  reading + unpickling results", 3),
    ("decode", "  decode: views over the shared slot", 3),
    ("rest", "  the rest of next() (reorder, refill, stats)", 3),
    ("outside", "main: outside next() (the loop itself)", 3),
    ("fetch", "workers: fetch (dataset[i] x batch)", 3),
    ("collate", "workers: collate (into the slot where it can)", 3),
    ("encode", "workers: encode (tree, leaf copies)", 3),
    ("send", "workers: send (pickle + pipe write)", 3),
    ("batches_per_send", "  batches per send message (count)", 1),
    ("idle", "workers: waiting for orders, per worker", 3),
    ("handoff", "hand-off: send begun -> main has read it (median)", 3),
    ("handoff_mean", "hand-off (mean)", 3),
    ("main_cpu_s", "CPU: main process", 3),
    ("workers_cpu_s", "CPU: workers (both)", 3),
    ("main_runq_s", "waiting for a core: main process", 3),
    ("workers_runq_s", "waiting for a core: workers (both)", 3),
    ("main_vcsw", "context switches, voluntary: main (count)", 2),
    ("workers_vcsw", "context switches, voluntary: workers (count)", 2),
    ("main_icsw", "context switches, forced: main (count)", 2),
    ("workers_icsw", "context switches, forced: workers (count)", 2),
    ("main_minflt", "minor page faults: main (count)", 1),
    ("workers_minflt", "minor page faults: workers (count)", 1),
    ("construct", "start-up: loader construction (ms, once)", 1),
    ("worker_first_fetch", "start-up: the later worker's first fetch begins (ms from construction, once)", 1),
    ("first_batch", "start-up: first batch (ms from construction, once)", 1),
    ("epoch1", "first epoch (ms, once)", 1),
    ("e1_blocked", "first epoch: main blocked waiting (ms, once)", 1),
    ("e1_worker_busy", "first epoch: a worker's fetch+collate+encode+send (ms, mean of the two)", 1),
    ("e1_worker_send", "first epoch: of which send (ms)", 1),
    ("startup_cpu", "CPU of all processes until the steady state (ms, once)", 1),
    ("total", "whole run (ms, once)", 1),
]


def table(scenario: str, per_loader: dict[str, list[dict[str, float | None]]], doc: str) -> str:
    names = list(per_loader)
    lines = [f"## {scenario}", "", doc, "",
             "| ms per batch (median of runs) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, label, digits in ROWS:
        cells = []
        for n in names:
            vals = [r[key] for r in per_loader[n] if r.get(key) is not None]
            cells.append(f"{statistics.median(vals):.{digits}f}" if vals else "-")
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    runs = {n: len(v) for n, v in per_loader.items()}
    lines += ["", "runs: " + ", ".join(f"{n} {k}" for n, k in runs.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append", help=f"scenarios (default {' '.join(SCENARIOS)})")
    p.add_argument("--loader", action="append", help=f"loaders (default {' '.join(LOADERS)})")
    p.add_argument("--runs", type=int, default=5, help="runs per loader, alternated (default 5)")
    p.add_argument("--quick", action="store_true", help="the scenarios' small sizes")
    p.add_argument("--src", default=None, help="the source tree conveyor is imported from (default src)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--main-threads", type=int, default=None,
                   help="torch.set_num_threads(N) in the main process of every run (default: torch's own; "
                   "on a machine other jobs load, torch0's intra-op threads wait for each other at every "
                   "parallel region of its collate: 1 measures the loader, not that)")
    p.add_argument("--out", default=None, help="also write the table (.md) and the runs (.json) here")
    a = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import scenarios  # torch imported once, before the forks

    names = a.scenario or list(SCENARIOS)
    loaders = a.loader or list(LOADERS)
    started = time.perf_counter()
    load0 = [round(x, 2) for x in os.getloadavg()]
    text = [f"# Where the worker path's time goes", "",
            f"- {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), load average at start {load0}; "
            f"{a.runs} runs per loader, alternated, each a forked child; quick={a.quick}; "
            f"main-process torch threads: {a.main_threads or 'torch default'}"]
    raw: dict[str, Any] = {}
    body = []
    for sname in names:
        per: dict[str, list[dict[str, float | None]]] = {n: [] for n in loaders}
        raw[sname] = {n: [] for n in loaders}
        for i in range(a.runs):
            for ln in loaders:
                run = fork_child((sname, ln, a.quick, a.src, a.main_threads), a.timeout)
                run["loader"] = ln
                if run["status"] != "ok":
                    print(f"{sname} {ln} #{i + 1}: {run['status']}: {run.get('note')}\n{run.get('traceback', '')}",
                          file=sys.stderr)
                    continue
                if run.get("missing"):
                    print(f"{sname} {ln}: no timer for {', '.join(run['missing'])}", file=sys.stderr)
                fig = per_batch(run)
                per[ln].append(fig)
                raw[sname][ln].append({k: v for k, v in run.items() if k != "records"})
                print(f"[{time.perf_counter() - started:6.1f}s] {sname:13s} {ln:10s} #{i + 1} {run['seconds']:.3f} s, "
                      f"steady {fig.get('wall') or 0:.3f} ms/batch", file=sys.stderr, flush=True)
        body.append(table(sname, per, scenarios.SCENARIOS[sname].doc))
    text[-1] += f"; load average at end {[round(x, 2) for x in os.getloadavg()]}; {time.perf_counter() - started:.0f} s"
    out = "\n".join(text) + "\n\n" + "\n".join(body)
    print(out)
    if a.out:
        path = Path(a.out)
        path.with_suffix(".md").write_text(out)
        path.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
