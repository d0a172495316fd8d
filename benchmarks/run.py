"""Side-by-side benchmark of conveyor against torch, torchdata, Grain and SPDL.

    parent: probe peers ──> for scenario: for repeat: for loader (A B C A B C ...):
              child = fresh `python run.py --child SCENARIO LOADER` ──> one JSON line on stdout
            ──> median per (scenario, loader) ──> results/<name>.md + results/<name>.json
    child:  build the dataset; t0; make the loader; every epoch, every batch: step;
            t1 (end of the last epoch); close; print the JSON

Each (scenario, loader) pair runs in its own process, so one loader's memory,
threads and worker processes cannot slow the next. By default the child is
forked from the parent after torch and the scenarios are imported (the parent
runs no torch op, so it has no threads to inherit) and its stdout is a pipe to
the parent: importing torch can take seconds on a busy 2-core machine.
``--exec`` starts a brand-new interpreter per run instead. Times include the
loader's construction and worker start-up. Speed-ups are torch's median time
over the loader's median time, measured in the same invocation.

    python benchmarks/run.py                       # full suite, 3 repeats
    python benchmarks/run.py --quick               # smoke test, every scenario once, small
    python benchmarks/run.py --scenario latency --loader torch2 --loader conveyor2_ft32
    python benchmarks/run.py --scenario overlap --loader conveyor2 --profile   # cProfile the child
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import select
import shutil
import signal
import tempfile
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "@@RESULT "
QUICK_LOADERS = ("torch0", "torch2", "conveyor0")
PEERS = ("grain2", "spdl2")
# torch's loader with each worker count a user would try: "auto" is read against the best
TORCH_ROWS = ("torch0", "torch1", "torch2", "torch4")
# named selections of the suite: (scenarios, None for every scenario that runs conveyor_auto;
# loaders). "workers": the worker-path rows (conveyor2 against torch and the
# featureless floor, auto against the best torch) on the four worker scenarios; "auto":
# "auto" against torch's four worker counts on every scenario that runs it
SUITES: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]] = {
    "workers": (("diabetes", "images_uint8", "detection", "jpeg"),
                TORCH_ROWS + ("conveyor2", "conveyor_auto", "floor2")),
    "auto": (None, TORCH_ROWS + ("conveyor_auto",)),
}


# ---------------------------------------------------------------- child side

def child(scenario_name: str, loader_name: str, quick: bool, profile_dir: str | None,
          src: str | None = None) -> dict[str, Any]:
    """Run one (scenario, loader) pair in this process and return its measurements; ``src``:
    the source tree conveyor is imported from (default this checkout's ``src``)."""
    sys.path[:0] = [str(HERE), src or str(ROOT / "src")]
    import loaders
    import scenarios

    scenario = scenarios.SCENARIOS[scenario_name]
    base, extra = scenario.variants.get(loader_name, (loader_name, {}))
    family = "conveyor" if base.startswith("conveyor") else "torch" if base.startswith("torch") else "peer"
    try:
        setup = scenario.build(family, quick)
    except scenarios.Skip as e:
        return {"status": "skip", "note": str(e)}
    opts = {**setup.opts.get(base, {}), **setup.opts.get(loader_name, {}), **extra}

    loaders.preload(base)
    # Nor is the import's garbage timed: a child imports conveyor (or a peer) after the fork,
    # torch came with the parent, and the full collection that import leaves due ran in the
    # first timed batch (jpeg: ~80 ms of conveyor's first batch, over the parent's heap).
    # Every loader's child collects here, torch's too.
    gc.collect()
    profiler = None
    if profile_dir:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    passes: list[float] = []
    warmup_s = None
    cpu0 = cpu_snapshot()
    t0 = time.perf_counter()
    try:
        handle = loaders.make(base, setup.dataset, setup.batch_size, setup.collate_fn,
                              setup.warmup_epochs + setup.epochs * setup.best_of, shuffle=setup.shuffle, **opts)
    except (TypeError, ValueError) as e:
        if base == "conveyor_auto":
            return {"status": "skip", "note": f"num_workers='auto' not supported yet: {type(e).__name__}: {e}"}
        raise
    try:
        if setup.warmup_epochs:
            run_epochs(handle, setup, setup.warmup_epochs, t0)
            warmup_s = time.perf_counter() - t0
        for i in range(setup.best_of):
            start = t0 if i == 0 and not setup.warmup_epochs else time.perf_counter()
            batches, got_first = run_epochs(handle, setup, setup.epochs, start)
            passes.append(time.perf_counter() - start)
            if i == 0:
                first = got_first
        seconds = min(passes)
        chosen = handle.chosen()
    finally:
        if profiler is not None:
            profiler.disable()
        handle.close()
    out: dict[str, Any] = {"status": "ok", "seconds": seconds, "batches": batches, "first_batch_s": first,
                           "workers": handle.workers, "opts": opts, "cpu": cpu_use(cpu0, cpu_snapshot())}
    if chosen is not None:
        out["chosen"] = chosen
    if family == "conveyor" and "conveyor" in sys.modules:
        out["conveyor_from"] = str(Path(sys.modules["conveyor"].__file__ or "?").resolve().parent.parent)
    if warmup_s is not None:
        out["warmup_s"] = warmup_s
    if len(passes) > 1:
        out["passes_s"] = passes
    if setup.ideal_per_batch_s is not None and handle.workers is not None:
        out["ideal_s"] = setup.ideal_per_batch_s(handle.workers) * batches
    if profiler is not None and profile_dir:
        import io
        import pstats
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(35)
        stats.sort_stats("tottime").print_stats(25)
        path = Path(profile_dir) / f"profile_{scenario_name}_{loader_name}.txt"
        path.write_text(f"# {scenario_name} / {loader_name}: {seconds:.3f} s (profiled)\n" + text.getvalue())
        out["profile"] = str(path)
    return out


def run_epochs(handle: Any, setup: Any, epochs: int, t0: float) -> tuple[int, float | None]:
    """Run ``epochs`` epochs of ``handle`` with the setup's step; (batches, seconds to the first)."""
    batches = 0
    first: float | None = None
    for _ in range(epochs):
        for batch in handle.epoch():
            if first is None:
                first = time.perf_counter() - t0
            if setup.step is not None:
                setup.step(batch)
            batches += 1
            del batch
    return batches, first


def cpu_snapshot() -> tuple[list[float], float]:
    """The machine's CPU seconds by kind (/proc/stat: user nice system idle iowait irq softirq
    steal) and this process tree's own (itself and its reaped children)."""
    try:
        with open("/proc/stat", "rb") as f:
            hz = os.sysconf("SC_CLK_TCK")
            ticks = [int(x) / hz for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        ticks = []
    own = sum(os.times()[:4])
    return ticks, own


def cpu_use(before: tuple[list[float], float], after: tuple[list[float], float]) -> dict[str, float]:
    """Where the machine's CPU went between two snapshots: ours, other processes' (the machine
    is shared: what they take, a loader that fills every core loses), idle, and stolen by the
    hypervisor. Ours includes close() and is at clock-tick resolution; children a loader
    has not reaped by then count as others'."""
    (t0, own0), (t1, own1) = before, after
    out = {"own_s": own1 - own0}
    if len(t0) == len(t1) == 8:
        d = [b - a for a, b in zip(t0, t1)]
        busy = d[0] + d[1] + d[2] + d[5] + d[6]
        out.update(others_s=max(0.0, busy - out["own_s"]), idle_s=d[3] + d[4], steal_s=d[7])
    return {k: round(v, 3) for k, v in out.items()}


def probe() -> dict[str, Any]:
    """Versions of the libraries and which peer loaders can run here."""
    sys.path.insert(0, str(HERE))
    import loaders

    versions: dict[str, str] = {}
    for module in ("numpy", "torch", "PIL", "torchdata", "grain", "spdl", "conveyor"):
        try:
            versions[module] = getattr(__import__(module), "__version__", "?")
        except Exception as e:
            versions[module] = f"missing ({type(e).__name__})"
    if versions.get("spdl") == "?":
        try:
            from importlib.metadata import version
            versions["spdl"] = version("spdl")
        except Exception:
            pass
    notes = {name: note for name in loaders.LOADERS if (note := loaders.available(name))}
    return {"versions": versions, "unavailable": notes}


# ---------------------------------------------------------------- parent side

def machine(versions: dict[str, str]) -> dict[str, Any]:
    """CPU model, usable cores, RAM, /dev/shm and library versions."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    try:
        shm = f"{shutil.disk_usage('/dev/shm').total / 2**30:.1f} GiB"
    except OSError:
        shm = "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return {"cpu": cpu, "cores_usable": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "ram": ram,
            "load_avg_start": [round(x, 2) for x in os.getloadavg()],
            "dev_shm": shm, "platform": platform.platform(), "python": platform.python_version(),
            "versions": versions, "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _scenario_steady(name: str) -> bool:
    """Does scenario ``name`` run every loader with glibc's thresholds fixed?"""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # (not src: which conveyor a child imports is child()'s choice)
    import scenarios

    sc = scenarios.SCENARIOS.get(name)
    return bool(sc is not None and sc.steady_malloc)


def steady_malloc() -> None:
    """Keep glibc from handing freed memory back to the kernel in this process (a child):
    a batch allocated by a collate_fn that calls torch.stack itself otherwise faults its pages
    in again after some frees and not others, and such runs split in two for every loader
    (detection: torch0 0.058 or 0.111 s, conveyor0 0.053 or 0.148 s)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # not glibc: nothing to set
        pass


def spawn(args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``run.py ARGS`` in a fresh interpreter and parse its result line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"status": "error", "note": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "error", "note": f"exit {proc.returncode}: {tail[:300]}"}
    return json.loads(lines[-1][len(MARK):])


def fork_child(args: list[str], timeout: float) -> dict[str, Any]:
    """Fork a child that runs ``main(ARGS)`` with its stdout on a pipe to us."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    err = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:  # the child: own process group, so a timeout can end it and its workers
        code = 1
        try:
            os.setpgid(0, 0)
            os.close(read_fd)
            os.dup2(write_fd, 1)
            os.dup2(err.fileno(), 2)
            code = main(args)
            sys.stdout.flush()
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        return _collect(pid, read_fd, err, timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise


def _collect(pid: int, read_fd: int, err: Any, timeout: float) -> dict[str, Any]:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([pipe], [], [], left)
            if ready:
                data = os.read(pipe.fileno(), 1 << 16)
                if not data:
                    break
                chunks.append(data)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    lines = [ln for ln in b"".join(chunks).decode(errors="replace").splitlines() if ln.startswith(MARK)]
    err.seek(0)
    tail = (err.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
    err.close()
    if timed_out:
        return {"status": "error", "note": f"timed out after {timeout:.0f} s"}
    if not lines:
        return {"status": "error", "note": f"exit status {status}: {tail[:300]}"}
    return json.loads(lines[-1][len(MARK):])


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return {"status": runs[-1]["status"], "note": runs[-1].get("note", "")}
    times = [r["seconds"] for r in ok]
    out: dict[str, Any] = {"status": "ok", "median_s": statistics.median(times), "runs_s": times,
                           "batches": ok[0]["batches"],
                           "first_batch_s": statistics.median(r["first_batch_s"] or 0.0 for r in ok),
                           "workers": ok[0]["workers"], "opts": ok[0]["opts"]}
    if "warmup_s" in ok[0]:
        out["warmup_s"] = statistics.median(r["warmup_s"] for r in ok)
    if "passes_s" in ok[0]:
        out["best_of"] = len(ok[0]["passes_s"])
        out["passes_s"] = [r["passes_s"] for r in ok]
    for key in ("others_s", "idle_s", "steal_s"):
        if all(key in r.get("cpu", {}) for r in ok):
            out[key] = statistics.median(r["cpu"][key] for r in ok)
    choices = [json.dumps(r["chosen"], sort_keys=True) for r in ok if r.get("chosen")]
    if choices:
        out["chosen"] = {c: choices.count(c) for c in sorted(set(choices), key=choices.index)}
    if "ideal_s" in ok[0]:
        out["ideal_s"] = ok[0]["ideal_s"]
        out["efficiency"] = ok[0]["ideal_s"] / out["median_s"]
    return out


def speedups(result: dict[str, dict[str, Any]]) -> None:
    """Add ``vs_torch2`` and ``vs_torch0`` (torch time / loader time) to every loader, and
    ``vs_torchbest`` (the fastest of the torch rows that ran, named in ``torchbest``)."""
    for ref in ("torch2", "torch0"):
        base = result.get(ref, {}).get("median_s")
        for r in result.values():
            if r.get("status") == "ok" and base:
                r[f"vs_{ref}"] = base / r["median_s"]
    best = best_torch(result)
    if best is not None:
        for r in result.values():
            if r.get("status") == "ok":
                r["vs_torchbest"] = result[best]["median_s"] / r["median_s"]
                r["torchbest"] = best


AUTO_TARGETS = ("conveyor_auto/best>=0.9", "conveyor_auto/torch0>=1", "conveyor_auto/torchbest>=1")


def best_torch(result: dict[str, dict[str, Any]]) -> str | None:
    """The fastest (median) of torch's rows with 0, 1, 2 and 4 workers that ran."""
    ran = [n for n in TORCH_ROWS if result.get(n, {}).get("status") == "ok"]
    return min(ran, key=lambda n: result[n]["median_s"]) if ran else None


def best_fixed(result: dict[str, dict[str, Any]]) -> str | None:
    """The conveyor loader with hand-picked settings that ran fastest (median)."""
    fixed = [n for n, r in result.items() if n.startswith("conveyor") and n != "conveyor_auto"
             and r.get("status") == "ok"]
    return min(fixed, key=lambda n: result[n]["median_s"]) if fixed else None


def paired(ref: dict[str, Any], mine: dict[str, Any]) -> float | None:
    """Median over repeats of ref's time / mine's time in the same repeat. Loaders of one
    repeat run back to back, so this cancels the machine's slow drifts (on this shared VM
    whole stretches of seconds run ~1.5x slower for every loader, torch0 included)."""
    pairs = list(zip(ref.get("runs_s", []), mine.get("runs_s", [])))
    return statistics.median(a / b for a, b in pairs) if pairs else None


def median_interval(values: list[float], coverage: float = 0.9) -> tuple[float, float, float]:
    """A distribution-free interval for the median of ``values``: the order statistics
    x(k) and x(n+1-k) with the largest k whose binomial coverage, 1 - 2 P(Bin(n, 1/2) < k),
    is at least ``coverage`` (with under 5 values, min and max: less coverage than asked).
    Returns (low, high, the coverage it has)."""
    xs = sorted(values)
    n = len(xs)

    def cover(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and cover(k + 1) >= coverage:
        k += 1
    return xs[k - 1], xs[n - k], cover(k)


def check(target: str, result: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Evaluate ``"A/B>=x"`` (B's time over A's), ``"A/peers>=x"``, ``"A/best>=x"`` (the
    fastest fixed conveyor setting), ``"A/torchbest>=x"`` (the fastest of torch's rows with
    0, 1, 2 and 4 workers that ran) or ``"A:efficiency>=x"``. Ratios of medians; against
    one loader the paired ratio (``paired``) is reported beside it, and the target counts
    as met when either estimate is. A target missed by both whose paired ratios' interval
    (``median_interval``) reaches it is marked ``noise``: the runs cannot tell it from met."""
    left, goal = target.split(">=")
    want = float(goal)
    out: dict[str, Any] = {"target": target}
    if ":" in left:
        name, key = left.split(":")
        value = result.get(name, {}).get(key)
    else:
        name, ref = left.split("/")
        refs = (PEERS if ref == "peers" else (best_fixed(result),) if ref == "best"
                else (best_torch(result),) if ref == "torchbest" else (ref,))
        ok = [r for r in refs if r and result.get(r, {}).get("status") == "ok"]
        ref_times = [result[r]["median_s"] for r in ok]
        mine = result.get(name, {}).get("median_s")
        value = min(ref_times) / mine if ref_times and mine else None
        if ref != "peers" and len(ok) == 1 and mine:
            out["ref"] = ok[0]
            out["paired"] = paired(result[ok[0]], result[name])
            ratios = [a / b for a, b in zip(result[ok[0]].get("runs_s", []), result[name].get("runs_s", []))]
            if ratios:
                out["interval"] = median_interval(ratios)
    out["value"] = value
    values = [v for v in (value, out.get("paired")) if v is not None]
    out["met"] = None if not values else max(values) >= want
    if out["met"] is False and "interval" in out:
        out["noise"] = out["interval"][1] >= want
    return out


def ran_for(target: str, result: dict[str, dict[str, Any]]) -> bool:
    """Did this invocation run the loaders ``target`` names (a run or a suite that left them
    out says nothing of it; one that ran and failed reads n/a)?"""
    left = target.split(">=")[0]
    if ":" in left:
        return left.split(":")[0] in result
    name, ref = left.split("/")
    return name in result and (ref in ("peers", "best", "torchbest") or ref in result)


def verdict(t: dict[str, Any]) -> str:
    """met, MISSED, MISSED with the interval that reaches the target, or n/a."""
    if t["met"] is None:
        return "n/a"
    if t["met"]:
        return "met"
    if t.get("noise"):
        lo, hi, cov = t["interval"]
        return f"MISSED, within noise (paired {cov:.0%} interval {lo:.2f}-{hi:.2f})"
    return "MISSED"


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    v = m["versions"]
    out = [f"# conveyor benchmarks: {report['name']}", "",
           f"- machine: {m['cpu']}, {m['cores_usable']} usable cores (cpu_count {m['cpu_count']}), "
           f"RAM {m['ram']}, /dev/shm {m['dev_shm']}, {m['platform']}",
           f"- load average (1/5/15 min) at start {m['load_avg_start']}, at end {m.get('load_avg_end')}: "
           "other jobs on the machine share these cores",
           f"- python {m['python']}, " + ", ".join(f"{k} {val}" for k, val in v.items()),
           f"- commit {m['commit']}, {m['date']}; repeats {report['repeats']} (median), "
           f"quick={report['quick']}; each run in a fresh {report['fresh']}, loaders alternated per repeat"
           + ("; glibc kept from trimming freed memory (--steady-malloc)" if report.get("steady_malloc") else ""),
           "- speed-up = torch's median time / the loader's median time (higher is better), "
           "torch2 = DataLoader(num_workers=2, persistent_workers=True), torch0 = num_workers=0 (torch1, torch4: "
           "1 and 4 workers)", ""]
    if report["unavailable"]:
        out += [f"- {k}: {note}" for k, note in report["unavailable"].items()] + [""]
    out += ["## Summary", "", "| scenario | conveyor loader | vs torch2 | vs torch0 | vs best of grain/spdl | "
            "auto / best of torch0,1,2,4 | targets |", "|---|---|---|---|---|---|---|"]
    for name, sc in report["scenarios"].items():
        head = sc["headline"]
        r = sc["loaders"].get(head, {})
        peers = [sc["loaders"][p]["median_s"] for p in PEERS if sc["loaders"].get(p, {}).get("status") == "ok"]
        vs_peers = min(peers) / r["median_s"] if peers and r.get("median_s") else None
        auto = sc["loaders"].get("conveyor_auto", {})
        torch_ran = ",".join(n[len("torch"):] for n in TORCH_ROWS if sc["loaders"].get(n, {}).get("status") == "ok")
        vs_best = (f"{fmt(auto['vs_torchbest'])} (best {auto['torchbest']} of torch{torch_ran})"
                   if auto.get("vs_torchbest") is not None else "-")
        targets = "; ".join(
            f"{t['target']}: {fmt(t['value'])}"
            + (f" (vs {t['ref']}; paired {fmt(t['paired'])})" if t.get("ref") and t['target'].split('/')[1].startswith(('best', 'torchbest')) else
               f" (paired {fmt(t['paired'])})" if "paired" in t else "")
            + f" {verdict(t)}"
            for t in sc["targets"]) or "-"
        out.append(f"| {name} | {head} | {fmt(r.get('vs_torch2'))} | {fmt(r.get('vs_torch0'))} | "
                   f"{fmt(vs_peers)} | {vs_best} | {targets} |")
    for name, sc in report["scenarios"].items():
        reps = f" ({sc['repeats']} repeats: short runs)" if sc.get("repeats", report["repeats"]) != report["repeats"] else ""
        if sc.get("steady_malloc") and not report.get("steady_malloc"):
            reps += ("; glibc's trim and mmap thresholds fixed in every run of every loader, whose runs "
                     "split in two without (see the benchmarks README)")
        out += ["", f"## {name}", "", sc["doc"] + reps, "",
                "| loader | median s | runs s | batches | first batch s | vs torch2 | vs torch0 | note |",
                "|---|---|---|---|---|---|---|---|"]
        for loader, r in sc["loaders"].items():
            if r["status"] != "ok":
                out.append(f"| {loader} | - | - | - | - | - | - | {r['status']}: {r.get('note', '')} |")
                continue
            note = (f"efficiency {r['efficiency']:.2f} (ideal {r['ideal_s']:.2f} s; fastest run "
                    f"{r['ideal_s'] / min(r['runs_s']):.2f})" if "efficiency" in r else "")
            if "warmup_s" in r:
                note = (note + f" warm-up epoch {r['warmup_s']:.4f} s").strip()
            if "best_of" in r:
                note = (note + f"; each run the best of {r['best_of']} passes").strip()
            for key, what in (("others_s", "other processes' CPU"), ("steal_s", "stolen CPU")):
                if r.get(key, 0.0) >= max(0.02, 0.02 * r["median_s"]):
                    note = (note + f"; {what} {r[key]:.2f} s a run").strip("; ")
            if r.get("chosen"):
                runs_n = len(r["runs_s"])
                note = (note + "; chose " + "; ".join(
                    ", ".join(f"{k}={v}" for k, v in json.loads(c).items()) + f" ({n} of {runs_n} runs)"
                    for c, n in r["chosen"].items())).strip("; ")
            if r.get("opts"):
                note = (note + "; " + ", ".join(f"{k}={val}" for k, val in r["opts"].items())).strip("; ")
            runs = " ".join(f"{t:.3f}" if t >= 0.01 else f"{t:.4f}" for t in r["runs_s"])
            median = f"{r['median_s']:.3f}" if r["median_s"] >= 0.01 else f"{r['median_s']:.4f}"
            out.append(f"| {loader} | {median} | {runs} | {r['batches']} | {r['first_batch_s']:.3f} | "
                       f"{fmt(r.get('vs_torch2'))} | {fmt(r.get('vs_torch0'))} | {note} |")
    return "\n".join(out) + "\n"


def selection(suite: str | None, scenario: list[str] | None,
              loader: list[str] | None) -> tuple[list[str], list[str] | None]:
    """The scenarios to run and the loaders to keep in each (None: the scenario's own list):
    a suite's selection, narrowed by ``--scenario`` and ``--loader``."""
    import scenarios

    names = list(scenario or scenarios.SCENARIOS)
    wanted = list(loader) if loader else None
    if suite is not None:
        only, rows = SUITES[suite]
        names = [n for n in names if (n in only if only is not None
                                      else "conveyor_auto" in scenarios.SCENARIOS[n].loaders)]
        wanted = [r for r in rows if wanted is None or r in wanted]
    return names, wanted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="every scenario once, small sizes, few loaders")
    p.add_argument("--suite", choices=sorted(SUITES), help="a named selection of scenarios and loaders "
                   "(workers: the worker-path rows; auto: auto against torch0/1/2/4 everywhere); "
                   "--scenario and --loader narrow it further")
    p.add_argument("--scenario", action="append", help="run only these scenarios (repeatable)")
    p.add_argument("--loader", action="append", help="run only these loaders (repeatable)")
    p.add_argument("--repeats", type=int, default=None, help="runs per pair (default 3, quick 1; "
                   "scenarios of very short runs get at least their min_repeats)")
    p.add_argument("--repeats-exact", action="store_true", help="no min_repeats: exactly --repeats everywhere")
    p.add_argument("--name", default=None, help="results file stem (default 'full' or 'quick')")
    p.add_argument("--out", default=str(HERE / "results"), help="results directory")
    p.add_argument("--profile", action="store_true", help="cProfile each child's timed region into --out")
    p.add_argument("--timeout", type=float, default=None, help="seconds per child run")
    p.add_argument("--exec", action="store_true", help="a new interpreter per run instead of a fork")
    p.add_argument("--steady-malloc", action="store_true",
                   help="every child keeps freed memory from the kernel (glibc trim threshold 256 MB, "
                   "mmap threshold 32 MB), so batches do not fault their pages in again at random")
    p.add_argument("--src", default=None, help="the source tree conveyor's rows import conveyor from "
                   "(default this checkout's src; compare_trees.py runs two)")
    p.add_argument("--child", nargs=2, metavar=("SCENARIO", "LOADER"), help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    if a.probe:
        print(MARK + json.dumps(probe()), flush=True)
        return 0
    if a.child:
        if a.steady_malloc or _scenario_steady(a.child[0]):
            steady_malloc()
        try:
            result = child(a.child[0], a.child[1], a.quick, str(out_dir) if a.profile else None, a.src)
        except BaseException as e:
            result = {"status": "error", "note": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()[-2000:]}
        print(MARK + json.dumps(result), flush=True)
        return 0

    sys.path.insert(0, str(HERE))
    import loaders  # noqa: F401  (imported once here so that forked children start warm)
    import scenarios  # imports torch; the parent runs no torch op, children do the work

    unknown = [n for n in a.scenario or () if n not in scenarios.SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(scenarios.SCENARIOS)}")
    names, wanted = selection(a.suite, a.scenario, a.loader)
    repeats = a.repeats or (1 if a.quick else 3)
    timeout = a.timeout or (90.0 if a.quick else 600.0)
    name = a.name or a.suite or ("quick" if a.quick else "full")

    info = spawn(["--probe"], timeout=120)
    unavailable = info.get("unavailable", {})
    report: dict[str, Any] = {"name": name, "quick": a.quick, "repeats": repeats, "suite": a.suite,
                              "src": a.src or str(ROOT / "src"),
                              "fresh": "interpreter (--exec)" if a.exec else "forked process",
                              "steady_malloc": a.steady_malloc,
                              "machine": machine(info.get("versions", {})), "unavailable": unavailable,
                              "scenarios": {}}
    started = time.perf_counter()
    for sname in names:
        sc = scenarios.SCENARIOS[sname]
        chosen = [ln for ln in sc.loaders if (wanted is None or ln in wanted)
                  and (not a.quick or wanted or ln in QUICK_LOADERS or ln == sc.headline)]
        runs: dict[str, list[dict[str, Any]]] = {ln: [] for ln in chosen}
        for ln in chosen:
            base = sc.variants.get(ln, (ln, {}))[0]
            if base in unavailable:
                runs[ln].append({"status": "skip", "note": unavailable[base]})
        reps = repeats if a.quick or a.repeats_exact else max(repeats, sc.min_repeats)
        for rep in range(reps):
            for ln in chosen:
                if runs[ln] and runs[ln][-1]["status"] != "ok":
                    continue  # skipped or failed once: do not retry
                args = (["--child", sname, ln, "--out", str(out_dir)] + ["--quick"] * a.quick
                        + (["--src", a.src] if a.src else [])
                        + ["--profile"] * a.profile + ["--steady-malloc"] * a.steady_malloc)
                r = spawn(args, timeout) if a.exec else fork_child(args, timeout)
                runs[ln].append(r)
                shown = f"{r['seconds']:.3f} s" if r["status"] == "ok" else f"{r['status']}: {r.get('note', '')}"
                print(f"[{time.perf_counter() - started:6.1f}s] {sname:15s} {ln:15s} #{rep + 1} {shown}", flush=True)
        result = {ln: summarize(rs) for ln, rs in runs.items() if rs}
        speedups(result)
        targets = sc.targets + (AUTO_TARGETS if "conveyor_auto" in result and result["conveyor_auto"].get(
            "status") == "ok" and not a.quick else ())
        report["scenarios"][sname] = {"doc": sc.doc, "headline": sc.headline, "loaders": result, "repeats": reps,
                                      "steady_malloc": a.steady_malloc or sc.steady_malloc,
                                      "targets": [check(t, result) for t in targets if ran_for(t, result)]}
    report["elapsed_s"] = time.perf_counter() - started
    report["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (out_dir / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
