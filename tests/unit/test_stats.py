"""Stats hooks, report() sentences and the Chrome trace, all from synthetic timings (runs
with workers are tests/integration/test_stats_workers.py)."""

from __future__ import annotations

import json
import time
import types
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import conveyor
import conveyor.placement.probe
import conveyor.placement.rules
import conveyor.loader
from conveyor.plots import plot_sweep, plot_timeline
from conveyor.report import report, workers_needed
from conveyor.stats import Stats, trace_events, write_trace


def run(workers: int, batch_s: float, step_s: float, batches: int = 40, wait_s: float | None = None,
        cpu: float | None = None) -> Stats:
    """A Stats fed through the loader's hooks on a made-up clock: ``workers`` fetchers, one loop."""
    st = Stats(started=0.0)
    t = 0.0
    for i in range(batches):
        w = i % workers if workers else -1
        start = max(0.0, t - batch_s)
        st.result(w, start, start + batch_s * 0.8, start + batch_s, cpu=cpu)
        wait = (batch_s if workers == 0 else max(0.0, batch_s / workers - step_s)) if wait_s is None else wait_s
        st.handed(t, t + wait, 32, 1)
        t += wait + step_s
    st.epoch_end(at=t)
    return st


def snap(st: Stats, workers: int, **extra: object) -> dict:
    s = st.snapshot()
    s.update({"num_workers": workers, "fetch_threads": 1, "prefetch_factor": 2 if workers else None})
    s.update(extra)
    return s


def test_hooks_add_up() -> None:
    st = run(2, batch_s=0.04, step_s=0.01, batches=10, cpu=0.03)
    s = st.snapshot()
    assert s["batches"] == 10 and s["samples"] == 320 and s["steps"] == 9 and s["epochs"] == 1
    assert s["step_per_batch_s"] == pytest.approx(0.01)
    assert s["wait_fraction"] == pytest.approx(10 * 0.01 / (10 * 0.01 + 9 * 0.01))
    assert set(s["workers"]) == {0, 1}
    assert s["workers"][0]["mean_batch_s"] == pytest.approx(0.04)
    assert s["workers"][0]["cpu_s"] == pytest.approx(0.15)
    json.dumps(s)  # plain data


def test_report_bottleneck_names_the_worker_count() -> None:
    # 1 worker, 35 ms a batch, 10 ms a step: 40 waits of 25 ms, 39 steps of 10 ms -> 72%; ceil(35 / 10) = 4
    text = report(snap(run(1, batch_s=0.035, step_s=0.01), 1), cores=8)
    assert text.startswith("loading is the bottleneck: 72% of each step is spent waiting; 4 workers would hide it")
    assert workers_needed(snap(run(1, batch_s=0.035, step_s=0.01), 1)) == 4


def test_report_bottleneck_beyond_the_cores_says_so() -> None:
    text = report(snap(run(1, batch_s=0.1, step_s=0.01), 1), cores=2)
    assert "10 workers would hide it, but this process may use only 2 cores: use num_workers=2" in text


def test_report_never_suggests_fewer_workers_than_it_has() -> None:
    # 2 workers on 1 core: more cores are not to be had; the advice is about the samples,
    # not num_workers=1
    text = report(snap(run(2, batch_s=0.1, step_s=0.01), 2), cores=1)
    assert ("10 workers would hide it, but 2 workers already use more than the 1 core this process may use: "
            "make each sample cheaper") in text
    assert "num_workers=1" not in text
    # a loop that takes next to no time: no count of workers would "hide" loading
    text = report(snap(run(2, batch_s=0.1, step_s=0.00001), 2), cores=1)
    assert "takes (almost) no time between batches" in text and "workers would hide" not in text


def test_report_slow_first_batch_without_workers_is_not_worker_start_up() -> None:
    s = snap(run(0, batch_s=0.0002, step_s=0.01), 0, first_batch_s=1.5)
    text = report(s, cores=8)
    assert "first batch took 1.5 s: one-time costs" in text and "persistent_workers" not in text


def test_report_io_bound_suggests_fetch_threads() -> None:
    text = report(snap(run(1, batch_s=0.05, step_s=0.01, cpu=0.002), 1), cores=8)
    assert "bottleneck" in text and "fetch_threads=5" in text


def test_report_io_bound_stream_suggests_workers_not_fetch_threads() -> None:
    # an IterableDataset's worker reads its one iterator: the loader refuses fetch_threads for
    # it, so the advice was one the user could not take
    text = report(snap(run(1, batch_s=0.05, step_s=0.01, cpu=0.002), 1, iterable=True), cores=8)
    assert "bottleneck" in text and "fetch_threads" not in text and "num_workers=5" in text, text


def test_report_io_bound_with_threads_never_suggests_fewer() -> None:
    # 2 workers with 64 threads each, a batch every 1 ms of wall each (64 fetches in flight
    # already), a step of 20 us: 50 such workers would keep up, far more than the machine
    # has, so loading sets the pace; nothing suggests fewer threads
    s = {"batches": 64, "steps": 63, "wait_fraction": 0.98, "step_per_batch_s": 2e-5, "num_workers": 2,
         "fetch_threads": 64, "workers": {w: {"batches": 32, "busy_s": 0.032, "cpu_s": 0.008, "cpu_batches": 32}
                                          for w in (0, 1)}}
    text = report(s, cores=1)
    assert "loading sets the pace" in text and "fetch_threads" not in text
    # 4 threads a worker and a step of 100 us: 10 such workers, 40 fetches in flight, 20 a worker
    s["fetch_threads"], s["step_per_batch_s"] = 4, 1e-4
    assert "fetch_threads=20 with num_workers=2 would hide it" in report(s, cores=1)


def test_report_idle_workers() -> None:
    text = report(snap(run(8, batch_s=0.01, step_s=0.01), 8), cores=8)
    assert text.startswith("the training step is the bottleneck: the loop waited for data")
    assert "the workers are idle" in text and "; 1 worker would do" in text


def test_report_hidden() -> None:
    text = report(snap(run(2, batch_s=0.019, step_s=0.01, wait_s=0.0002), 2), cores=8)
    assert text == ("the training step is the bottleneck: the loop waited for data 2% of the time; faster loading "
                    "would not speed training up.")


def test_report_cheap_inline_and_no_batches() -> None:
    text = report(snap(run(0, batch_s=0.0002, step_s=0.01), 0), cores=8)
    assert text == "the training step is the bottleneck: the loop waited for data 2% of the time; num_workers=0 is fine."
    assert report({"batches": 0}).startswith("no batches yet")


def test_report_keeps_very_cheap_batches_inline() -> None:
    # 0.2 ms a batch, 2 ms a step: 9% waiting, yet a worker would cost more than it saves
    text = report(snap(run(0, batch_s=0.0002, step_s=0.002), 0), cores=8)
    assert text.startswith("loading in the main process takes 0.20 ms a batch (9% of the time)")
    assert "num_workers=0 is right" in text
    text = report(snap(run(0, batch_s=0.004, step_s=0.002), 0), cores=8)
    assert "2 workers would hide it" in text


def test_report_mentions_failures_restarts_and_slow_first_batch() -> None:
    s = snap(run(2, batch_s=0.019, step_s=0.01, wait_s=0.0002), 2, restarts=1,
             deaths=["worker 1 (pid 7) was killed by signal SIGKILL"],
             failures=[{"index": 5, "worker": 0, "error": "ValueError: bad row"}], first_batch_s=4.2)
    text = report(s, cores=8)
    assert "1 sample(s) failed and were skipped (first: index 5, ValueError: bad row)" in text
    assert "1 worker restart(s); worker 1 (pid 7) was killed by signal SIGKILL" in text
    assert "The first batch took 4.2 s (worker start-up); persistent_workers=True pays it once" in text
    # a loader whose workers persist was told to make them persist
    text = report(s | {"persistent_workers": True}, cores=8)
    assert "The first batch took 4.2 s (worker start-up), paid once: the workers persist" in text
    assert "persistent_workers=True" not in text


def test_mostly_hidden_loading_is_not_told_to_take_more_workers_than_cores() -> None:
    # 3 workers, batches of 40 ms, a 10 ms step: 4 would hide the 7% left, where 4 fit
    snap = {"batches": 100, "steps": 99, "wait_fraction": 0.07, "step_per_batch_s": 0.01, "num_workers": 3,
            "fetch_threads": 1, "workers": {i: {"batches": 33, "busy_s": 1.32} for i in range(3)}}
    assert "loading is mostly hidden: the consumer waited 7% of the time; 4 workers would hide the rest" \
        in report(snap, cores=8)
    said = report(snap, cores=3)
    assert said.startswith("loading is mostly hidden") and "would hide" not in said


def test_report_counts_every_core_of_the_share_as_auto_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # "auto" starts a worker a core; report() left one to the training loop: auto's own 2
    # workers on 2 cores, still starved, read "2 workers already use more than the 1 core ..."
    import conveyor.report as rep

    monkeypatch.setattr(rep, "cpu_share", lambda: 2)
    text = report(snap(run(2, batch_s=0.1, step_s=0.01), 2))
    assert "2 workers already use the 2 cores this process may use" in text and "more than" not in text


def test_report_names_no_worker_where_the_training_processes_leave_no_core() -> None:
    # 4 DDP ranks on 2 cores: "auto" starts no worker for batches that compute (one took the
    # training loop's core); report() still said "4 workers would hide it"
    shared = "4 training processes share this machine's 2 cores"
    text = report(snap(run(0, batch_s=0.035, step_s=0.01), 0, shared_cores=shared), cores=1)
    assert f"{shared}, which leaves no core for a worker that computes: make each sample cheaper" in text
    assert "would hide" not in text
    # ... fetches that wait still get their advice: they take no core
    waits = snap(run(1, batch_s=0.035, step_s=0.01, cpu=0.001), 1, shared_cores=shared)
    assert "fetch_threads=" in report(waits, cores=1)


class _Computes:
    """Samples of 2 ms of CPU work each."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> list[int]:
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass
        return [i, i]


def test_loader_report_names_the_ranks_that_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # loader.report() tells report() what the launcher says: 4 ranks on 2 cores
    monkeypatch.setattr(conveyor.loader, "_no_core_left", lambda: True)
    monkeypatch.setattr(conveyor.placement.rules, "ranks_words", lambda: "4 training processes share this machine's 2 cores")
    with conveyor.DataLoader(_Computes(), batch_size=8, output="numpy") as loader:
        for _ in loader:
            time.sleep(0.001)  # a step of 1 ms against batches of 16 ms made here
        text = loader.report()
    assert "4 training processes share this machine's 2 cores, which leaves no core" in text, text


def test_a_worker_added_mid_run_is_busy_for_the_time_it_lived_not_called_uneven() -> None:
    # worker 1 joined for the last 4 s of 10, as busy as worker 0 (80%): over the whole run it
    # read 32%, and report() said "the work is uneven ...; even it out" before any other advice
    now = time.perf_counter()
    st = Stats(started=now - 10.0)
    for k in range(100):  # worker 0: 100 batches of 80 ms, one each 100 ms
        st.result(0, now - 10.0 + k * 0.1, 0.0, now - 10.0 + k * 0.1 + 0.08)
    for k in range(40):  # worker 1: the last 4 s, the same
        st.result(1, now - 4.0 + k * 0.1, 0.0, now - 4.0 + k * 0.1 + 0.08)
    workers = st.snapshot()["workers"]
    assert workers[0]["busy_fraction"] == pytest.approx(0.8, abs=0.02)
    assert workers[1]["busy_fraction"] == pytest.approx(0.8, abs=0.02)
    # ... where a worker that lived the whole run and made half as much is still uneven
    st.result(2, now - 10.0, 0.0, now - 6.0)
    said = report({**st.snapshot(), "batches": 141, "num_workers": 3, "steps": 99, "wait_fraction": 0.5, "step_per_batch_s": 0.01})
    assert "the work is uneven: worker 0 was busy 80% of the time, worker 2 40%" in said, said


def test_the_workers_needed_leave_out_the_main_process_probing_batches() -> None:
    # 2 probing batches made here at 300 ms (first calls' costs) beside 40 of 30 ms made by
    # 2 workers, a 10 ms step: 3 workers keep up; the probe made it "5 workers would hide it"
    snap = {"batches": 42, "steps": 41, "wait_fraction": 0.3, "step_per_batch_s": 0.01, "num_workers": 2,
            "fetch_threads": 1, "workers": {-1: {"batches": 2, "busy_s": 0.6},
                                            0: {"batches": 20, "busy_s": 0.6}, 1: {"batches": 20, "busy_s": 0.6}}}
    assert workers_needed(snap) == 3
    assert "3 workers would hide it" in report(snap, cores=8)
    # ... and without workers, the main process's batches are all there is
    alone = {**snap, "num_workers": 0, "workers": {-1: {"batches": 42, "busy_s": 1.26}}}
    assert workers_needed(alone) == 3


def test_the_clocks_start_at_the_first_iter_not_when_the_loader_is_made() -> None:
    # the model built between the two (seconds) read as the workers' start-up in report()
    loader = conveyor.DataLoader(list(range(8)), batch_size=4, output="numpy")
    asked = time.perf_counter()
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader._stats.started >= asked
    first = loader.stats()["first_batch_s"]
    again = time.perf_counter()
    list(loader)  # a later epoch leaves them where they began
    assert loader._stats.started < again and loader.stats()["first_batch_s"] == first


def test_trace_is_chrome_json_with_a_track_per_worker(tmp_path: Path) -> None:
    st = run(3, batch_s=0.045, step_s=0.01, batches=12)
    path = write_trace(st, tmp_path / "t" / "trace.json")
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys()
        assert e["dur"] >= 0 and isinstance(e["ts"], (int, float))
    fetch_tids = {e["tid"] for e in spans if e["name"] == "fetch"}
    loop_tids = {e["tid"] for e in spans if e["name"] in ("step", "wait")}
    assert len(fetch_tids) == 3 and len(loop_tids) == 1 and not fetch_tids & loop_tids
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names[t] for t in fetch_tids) == ["worker 0", "worker 1", "worker 2"]
    assert names[loop_tids.pop()] == "training loop"
    assert sum(e["name"] == "fetch" for e in spans) == 12
    assert {e["name"] for e in spans} == {"fetch", "step", "wait"}


def test_trace_respects_the_limit_and_accepts_loader_like_objects() -> None:
    st = Stats(started=0.0, trace_limit=5)
    for i in range(10):
        st.result(0, i, i + 0.5, i + 1.0)
    assert sum(e["ph"] == "X" for e in trace_events(st)) == 5

    class Loaderish:
        _stats = st

    assert trace_events(Loaderish()) == trace_events(st)
    with pytest.raises(TypeError):
        trace_events(object())


@pytest.fixture(scope="module")
def fonts_listed() -> None:
    """matplotlib's font list, built before the test's check for started processes: on a
    machine without its cache, the first import of its font manager runs ``fc-list``."""
    pytest.importorskip("matplotlib.font_manager")


def test_plots_write_pngs(tmp_path: Path, fonts_listed: None) -> None:
    st = run(2, batch_s=0.03, step_s=0.01, batches=8)
    a = plot_timeline(st, tmp_path / "timeline.png")
    b = plot_sweep([{"loader": "torch", "workers": 0, "samples_s": 100.0},
                    {"loader": "conveyor", "workers": 0, "samples_s": 150.0},
                    {"loader": "conveyor", "workers": 2, "samples_s": 300.0}], tmp_path / "sweep.png")
    for p in (a, b):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_without_matplotlib_name_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real = builtins.__import__

    def deny(name: str, *args: object, **kwargs: object) -> object:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib here")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", deny)
    with pytest.raises(ImportError, match=r"pip install 'conveyor\[plot\]'"):
        plot_sweep([], tmp_path / "x.png")


def test_the_trace_allocates_no_object_per_event() -> None:
    # tuples kept per event set off the cyclic GC every few hundred batches, and at length
    # a full collection of the whole process mid-epoch
    import gc

    st = Stats(started=0.0)
    gc.disable()
    try:
        before = gc.get_count()[0]
        for i in range(3000):
            st.result(0, i, i + 0.25, i + 0.5)
            st.handed(i + 0.5, i + 0.75, 32, 1)
        grown = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert grown < 100, grown
    assert len(st.trace) == 9000 - 1  # a fetch and a wait per batch, a step between two
    assert list(st.trace)[:3] == [("fetch", 0, 0.0, 0.5), ("wait", -2, 0.5, 0.75), ("fetch", 0, 1.0, 1.5)]


def test_batches_gathered_in_bulk_are_counted_and_traced() -> None:
    # an ArrayDataset batched in the main process: one gather for many batches, counted as
    # main-process batches, its gathers on the main process's track
    import numpy as np

    from conveyor import ArrayDataset, DataLoader

    loader = DataLoader(ArrayDataset(np.arange(64, dtype=np.float32)), batch_size=2, output="numpy")
    n = sum(1 for _ in loader)
    stats = loader.stats()
    assert n == 32 and stats["main_process_batches"] == 32 and stats["workers"][-1]["batches"] == 32
    events = list(loader._stats.trace)
    assert any(kind == "fetch" and worker == -1 for kind, worker, _, _ in events)


def test_a_gather_of_many_batches_spreads_its_time_evenly_in_the_batch_cost_spread() -> None:
    # one gather of 64 batches in 0.64 s and 64 single batches of 10 ms: all cost 10 ms each;
    # summing the gather's square as one batch's made the spread ~8x the mean
    st = Stats(started=0.0)
    st.result(-1, 0.0, 0.0, 0.64, batches=64)
    for i in range(64):
        st.result(-1, 1.0 + i * 0.01, 0.0, 1.0 + (i + 1) * 0.01)
    w = st.snapshot()["workers"][-1]
    assert w["batches"] == 128 and w["mean_batch_s"] == pytest.approx(0.01)
    assert w["std_batch_s"] == pytest.approx(0.0, abs=1e-6)


def test_the_main_process_track_is_named_for_any_worker_count() -> None:
    # batches made in the main process by an adaptive loader with workers were drawn on a
    # track named "(num_workers=0)"
    from conveyor import DataLoader
    from conveyor.stats import trace_events

    loader = DataLoader(list(range(64)), batch_size=8, num_workers=2, adaptive=True, output="numpy")
    assert sum(1 for _ in loader) == 8
    names = {e["args"]["name"] for e in trace_events(loader) if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert "main process" in names and not any("num_workers=0" in n for n in names)
    loader.close()


def test_device_prefetcher_is_exported() -> None:
    import conveyor
    import conveyor.device

    assert conveyor.DevicePrefetcher is conveyor.device.DevicePrefetcher and "DevicePrefetcher" in conveyor.__all__


def test_workers_report_cpu_over_spans_of_batches_the_main_process_per_batch() -> None:
    from conveyor.executors.task import Task
    from conveyor.executors.fetcher import Fetcher
    from conveyor.executors.worker import WorkerSpec

    clock = iter(range(1, 1000))  # every read of the CPU clock: one more second
    spec = WorkerSpec(list(range(100)), None, True, 2, False, False, 1, 0)
    worker = Fetcher(spec, 0, cpu_clock=lambda: float(next(clock)))
    timed = {k + 1: r for k in range(20) if (r := worker.run(Task(k, 0, [k, k + 1]))).cpu is not None}
    spans = {k: r.cpu_span for k, r in timed.items()}
    # a span starts at the second batch; the first ends after three, the next every eight
    assert list(spans) == [4, 12, 20] and [n for n, _, _ in spans.values()] == [3, 8, 8]
    # one clock: the core seconds of a span are its CPU seconds
    assert all(wall >= 0 and core == timed[k].cpu == 1.0 for k, (_, wall, core) in spans.items())
    main = Fetcher(spec, None, cpu_clock=lambda: float(next(clock)))
    timed = [k + 1 for k in range(20) if (r := main.run(Task(k, 0, [k]))).cpu is not None]
    assert timed == [2, 10, 18] and all(main.run(Task(0, 0, [0])).cpu_span is None for _ in range(9))
    st = Stats(started=0.0)
    st.result(0, 0.0, 0.1, 0.2, cpu=0.5, cpu_span=(8, 2.0, 0.4))
    st.result(-1, 0.0, 0.1, 0.2, cpu=0.1)
    w = st.snapshot()["workers"]
    assert (w[0]["cpu_batches"], w[0]["cpu_wall_s"], w[0]["core_s"]) == (8, 2.0, 0.4)
    assert (w[-1]["cpu_batches"], w[-1]["cpu_wall_s"], w[-1]["core_s"]) == (1, None, None)


def test_process_clocks_add_up_thread_waits_for_demand_but_not_for_the_core(tmp_path, monkeypatch) -> None:
    from conveyor.executors import sched

    def waited(**seconds: float) -> None:  # schedstat's second field: nanoseconds runnable, not running
        for tid in {p.name for p in tmp_path.iterdir()} - set(seconds):
            (tmp_path / tid / "schedstat").unlink()
            (tmp_path / tid).rmdir()  # the thread ended
        for tid, s in seconds.items():
            (tmp_path / tid).mkdir(exist_ok=True)
            (tmp_path / tid / "schedstat").write_text(f"5000 {int(s * 1e9)} 7\n")

    monkeypatch.setattr(sched, "_TASKS", str(tmp_path))
    monkeypatch.setattr(sched, "_waits", sched._Waits())
    waited(a=0.0, b=0.0, c=0.0)
    cpu0 = time.process_time()
    demand0, core0 = sched.process_clocks()
    # three threads wait 1, 2 and 3 s for a core, at once: 6 s of demand, 3 s of the core
    waited(a=1.0, b=2.0, c=3.0)
    demand1, core1 = sched.process_clocks()
    cpu1 = time.process_time()
    assert demand1 - demand0 == pytest.approx(6.0 + cpu1 - cpu0, abs=0.05)
    assert core1 - core0 == pytest.approx(3.0 + cpu1 - cpu0, abs=0.05)
    # the thread that waited most ends, the others wait 1 s more, a new one 0.5 s: the clocks
    # go on from where they were (summed over live threads, demand stepped back by 3 s)
    waited(a=2.0, b=3.0, d=0.5)
    demand2, core2 = sched.process_clocks()
    cpu2 = time.process_time()
    assert demand2 - demand1 == pytest.approx(2.5 + cpu2 - cpu1, abs=0.05)
    assert core2 - core1 == pytest.approx(1.0 + cpu2 - cpu1, abs=0.05)
    assert sched.process_demand() >= demand2


def _threaded(threads: int, busy_s: float, cpu_s: float) -> dict:
    """2 workers of ``threads`` fetch threads, 32 batches each taking ``busy_s`` of wall and
    ``cpu_s`` of CPU in all, a 4 ms step, half of it waiting."""
    return {"batches": 64, "steps": 63, "wait_fraction": 0.5, "step_per_batch_s": 0.004, "num_workers": 2,
            "fetch_threads": threads,
            "workers": {w: {"batches": 32, "busy_s": busy_s, "cpu_s": cpu_s, "cpu_batches": 32} for w in (0, 1)}}


def test_report_advises_workers_not_threads_where_getitems_makes_the_batch() -> None:
    # one worker, its batches waiting on storage: fetch threads would hide it, unless the
    # dataset's own __getitems__ makes each batch in one call (the loader warns of threads then)
    waits = _threaded(1, 0.32, 0.004) | {"num_workers": 1,
                                         "workers": {0: {"batches": 64, "busy_s": 0.64, "cpu_s": 0.008,
                                                         "cpu_batches": 64}}}
    assert "fetch_threads=" in report(waits, cores=8)
    said = report(waits | {"batch_getitems": True}, cores=8)
    assert "__getitems__ makes each batch in one call, so num_workers=" in said and "fetch_threads" not in said


def test_report_reads_a_fetch_cpu_share_with_its_threads() -> None:
    # 16 threads a worker, a batch every 10 ms of wall, 2 ms of CPU: each fetch computes
    # 1.25% of the time it takes (2 ms of 160), the core is 20% busy: it waits on storage
    assert "fetches mostly wait on storage (CPU 1% of their time)" in report(_threaded(16, 0.32, 0.064), cores=8)
    # the same fetches with 8 ms of CPU a batch: they wait, but the worker's core is 80% busy,
    # and more threads would not find room on it: more workers would
    text = report(_threaded(16, 0.32, 0.256), cores=8)
    assert "3 workers would hide it" in text and "fetch_threads" not in text, text


def test_report_does_not_take_fetch_threads_holding_the_gil_for_storage() -> None:
    # 8 threads that hold the GIL take turns: a fetch computes 1/8 of its time, but the core
    # is full. Each report asked for twice the threads (1 -> 2 -> 4 -> 8 -> 16), no faster.
    text = report(_threaded(8, 0.32, 0.32), cores=8)
    assert "wait on storage" not in text and "fetch_threads" not in text and "3 workers would hide it" in text


def _uneven(busy: tuple[float, float], std: float, **extra: object) -> dict:
    return {"batches": 64, "steps": 63, "wait_fraction": 0.3, "step_per_batch_s": 0.01, "num_workers": 2,
            **extra, "workers": {w: {"batches": 32, "busy_s": 0.16, "mean_batch_s": 0.005, "std_batch_s": std,
                                     "busy_fraction": b} for w, b in enumerate(busy)}}


def test_report_names_what_holds_back_workers_that_should_keep_up() -> None:
    # uneven workers (an IterableDataset's shards of 300 and 100 items): the busiest sets the pace
    text = report(_uneven((0.95, 0.32), 0.001, iterable=True), cores=8)
    assert "the work is uneven: worker 0 was busy 95% of the time, worker 1 32%" in text and "shards" in text
    # a straggler every 20 samples: batches of uneven cost, handed out in order
    text = report(_uneven((0.5, 0.5), 0.008), cores=8)
    assert "unevenly (std 8.0 ms)" in text and "in_order=False" in text
    assert "in_order=False" not in report(_uneven((0.5, 0.5), 0.008, in_order=False), cores=8)
    # neither: the hand-over, and no word of batch_size (which changes the training)
    text = report(_uneven((0.5, 0.5), 0.001), cores=8)
    assert "handing batches over; raise prefetch_factor" in text and "batch_size" not in text


def test_report_names_a_costly_collate() -> None:
    s = snap(run(2, batch_s=0.1, step_s=0.01), 2)
    for w in s["workers"].values():
        w["collate_s"] = 0.9 * w["busy_s"]
    text = report(s, cores=1)
    assert "make the collate_fn cheaper (it takes 90% of a batch's time)" in text, text


def _close(a: object, b: object) -> bool:
    """Equal, but for the last bits of sums (folded in at once, they add in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-7)  # (a spread of ~0 s comes of a difference of sums)
    return a == b


def _same_but_elapsed(a: Stats, b: Stats) -> None:
    sa, sb = a.snapshot(), b.snapshot()
    for snap in (sa, sb):
        for key in ("elapsed_s", "throughput_batches_s", "throughput_samples_s"):
            snap.pop(key)
        for w in snap["workers"].values():
            w.pop("busy_fraction")
    assert _close(sa, sb), (sa, sb)
    assert list(a.trace) == list(b.trace)
    assert a.trace.dropped == b.trace.dropped


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.sampled_from(["batch", "batch", "batch", "slow", "end", "pause", "read", "worker"]),
                max_size=40),
       hs.integers(min_value=1, max_value=60))
def test_lean_batches_folded_in_at_once_are_what_batch_by_batch_records(plan: list[str], limit: int) -> None:
    # every mark among the lean path's batches (an epoch's end, a new iter() after a pause, a
    # read, a worker's batch) and a trace that fills up: the fold gives what result() and
    # handed() give batch by batch
    now, later = Stats(started=0.0, trace_limit=limit), Stats(started=0.0, trace_limit=limit)
    clock = [0.0]

    def tick(dt: float) -> float:
        clock[0] += dt
        return clock[0]

    fake = types.SimpleNamespace(perf_counter=lambda: clock[0])  # run_start's gap, the same for both
    with mock.patch.object(conveyor.stats, "time", fake):
        _play(plan, now, later, tick)
    _same_but_elapsed(now, later)


def _play(plan: list[str], now: Stats, later: Stats, tick: Callable[[float], float]) -> None:
    for i, what in enumerate(plan):
        if what in ("batch", "slow"):
            asked = tick(0.5)
            start, end = tick(0.01), tick(0.1)
            got = tick(0.2 if what == "slow" else 1e-6)
            now.result(-1, start, 0.0, end)
            now.handed(asked, got, 8 + i % 3, 0)
            later.made_here(start, end, asked, got, 8 + i % 3)
        elif what == "end":
            at = tick(0.01)
            now.epoch_end(at)
            later.epoch_end(at)
        elif what == "pause":
            for s in (now, later):
                s.pause()
            tick(3.0)
            for s in (now, later):
                s.run_start()
        elif what == "read":
            later.snapshot()
        else:
            start = tick(0.01)
            for s in (now, later):
                s.result(0, start, start + 0.01, start + 0.02, cpu=0.01)


def test_lean_batches_folded_in_later_count_as_if_fed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the lean path records five numbers a batch and the totals catch up on the next read:
    # any read, any other event and the end of an epoch see the same as result() + handed()
    import conveyor.stats as stats_mod

    monkeypatch.setattr(stats_mod, "PENDING_MAX", 7)  # a flush mid-way too
    now, later = Stats(started=0.0), Stats(started=0.0)
    t = 0.0
    for epoch in range(2):
        for i in range(20):
            start, end, asked, got = t + 0.1, t + 0.3, t, t + 0.35 + (i % 3) * 1e-6
            now.result(-1, start, 0.0, end)
            now.handed(asked, got, 32 - i % 2, 0)
            later.made_here(start, end, asked, got, 32 - i % 2)
            if i == 11:  # a worker's batch among them: order kept on the trace
                now.result(0, t + 0.36, t + 0.37, t + 0.38, cpu=0.01, nbytes=100)
                later.result(0, t + 0.36, t + 0.37, t + 0.38, cpu=0.01, nbytes=100)
            if i == 15:
                assert later.snapshot()["batches"] == now.snapshot()["batches"]  # a read mid-epoch
            t += 1.0
        now.epoch_end()
        later.epoch_end()
    _same_but_elapsed(now, later)
    assert len(later.pending) == 0  # the read folded the epochs' ends in, where they came
    assert now.batches == later.batches == 40 and now.steps == later.steps == 38  # no step across an epoch's end
    assert now.epochs == later.epochs == 2


def test_an_epochs_end_after_lean_batches_waits_for_the_next_read() -> None:
    st = Stats(started=0.0)
    st.made_here(0.1, 0.2, 0.0, 0.25, 8)
    st.epoch_end()
    assert len(st.pending) == 10 and st.epochs == 0  # nothing folded at the epoch's end
    st.made_here(1.1, 1.2, 1.0, 1.25, 8)
    snap = st.snapshot()
    assert snap["epochs"] == 1 and snap["batches"] == 2 and snap["steps"] == 0


def test_lean_batches_left_pending_show_in_the_trace() -> None:
    st = Stats(started=0.0)
    st.made_here(0.1, 0.2, 0.0, 0.25, 8)
    st.made_here(1.1, 1.2, 1.0, 1.25, 8)
    assert list(st.trace) == [("fetch", -1, 0.1, 0.2), ("wait", -2, 0.0, 0.25), ("fetch", -1, 1.1, 1.2),
                              ("step", -2, 0.25, 1.0), ("wait", -2, 1.0, 1.25)]
    assert st.batches == 2 and st.samples == 16


def _in_workers(batches: int, made_here: int = 0, **extra: object) -> dict:
    """A snapshot of 2 workers that waited ``wait_s`` over ``batches`` batches (extra: any key)."""
    s = {"batches": batches, "steps": batches - 1, "step_per_batch_s": 0.01, "fetch_threads": 1,
         "num_workers": 2, "workers_started": True, "wait_s": 0.003 * batches,
         "wait_per_batch_s": 0.003, "wait_fraction": 0.23,
         "workers": {w: {"batches": batches // 2, "busy_s": 0.005 * (batches // 2), "mean_batch_s": 0.005,
                         "std_batch_s": 0.0, "busy_fraction": 0.5} for w in (0, 1)}}
    if made_here:
        s["workers"] = {-1: {"batches": made_here, "busy_s": 0.005 * made_here, "mean_batch_s": 0.005}}
    s.update(extra)
    return s


def test_report_names_the_workers_start_up_where_each_epochs_first_batch_is_the_wait() -> None:
    # 2 workers that keep up; most of the wait was for each epoch's first batch (the workers
    # starting): raising prefetch_factor (the old advice) does not touch that
    text = report(_in_workers(40, first_waits_s=0.1), cores=8)
    assert "83% of the wait (0.10 s) is for each epoch's first batch, the workers' start-up" in text
    assert "persistent_workers=True pays it once" in text and "prefetch_factor" not in text
    text = report(_in_workers(40, first_waits_s=0.1, persistent_workers=True), cores=8)
    assert "is for the first batch, the workers' start-up: paid once" in text
    # the same wait spread over the epoch: not the start-up
    assert "start-up" not in report(_in_workers(40, first_waits_s=0.01), cores=8)


def test_report_says_the_main_process_made_every_batch_while_the_workers_started() -> None:
    # spawned persistent workers still importing: every batch made here, none handed over
    text = report(_in_workers(32, made_here=32), cores=8)
    assert "the main process made all 32 batches while the workers started up" in text
    assert "handing batches over" not in text


def test_report_does_not_ask_for_more_prefetch_where_batches_were_ready() -> None:
    text = report(_in_workers(40, mean_ready_batches=14.0), cores=8)
    assert "14.0 batches were ready on average" in text and "does not shorten" in text
    assert "raise prefetch_factor" not in text
    assert "raise prefetch_factor" in report(_in_workers(40, mean_ready_batches=0.2), cores=8)


def test_report_blames_the_main_process_not_the_workers_where_they_sit_idle() -> None:
    # a loop with (almost) no step, 2 workers busy ~30% of the time: it read "20 workers would
    # hide it, but 2 workers already use the 2 cores: make the collate_fn cheaper"
    idle = {w: {"batches": 128, "busy_s": 0.03, "mean_batch_s": 0.00025, "std_batch_s": 0.0,
                "busy_fraction": b} for w, b in ((0, 0.26), (1, 0.38))}
    s = _in_workers(256, workers=idle, step_per_batch_s=1e-5, wait_fraction=0.97, wait_per_batch_s=0.0005,
                    wait_s=0.128)
    text = report(s, cores=2)
    assert "though the workers sat idle 68% of the time: the main process sets the pace" in text
    assert "num_workers=0" in text and "would hide it" not in text
    # costlier batches: fewer workers would do as well
    for w in idle.values():
        w["mean_batch_s"], w["busy_s"] = 0.002, 0.002 * 128
    assert "1 worker would do as well" in report(s, cores=2)


def test_report_does_not_advise_fetch_threads_that_already_run() -> None:
    # fetches of unknown CPU share (no clock) on 2 workers filling the cores: 64 threads ran
    s = snap(run(2, batch_s=0.04, step_s=0.01), 2)
    s["fetch_threads"] = 64
    assert "fetch_threads" not in report(s, cores=2)
    s["fetch_threads"] = 8
    assert "raise fetch_threads (now 8)" in report(s, cores=2)
    s["fetch_threads"] = 1
    assert "use fetch_threads if fetches wait on storage" in report(s, cores=2)


def test_an_iter_after_lean_batches_cuts_the_step_as_it_does_after_others() -> None:
    now, later = Stats(started=0.0), Stats(started=0.0)
    for st, lean in ((now, False), (later, True)):
        for epoch in range(2):
            for i in range(3):
                t = epoch * 10.0 + i
                if lean:
                    st.made_here(t, t + 0.1, t, t + 0.2, 8)
                else:
                    st.result(-1, t, 0.0, t + 0.1)
                    st.handed(t, t + 0.2, 8, 0)
            st.run_start()  # a break, then a new iter(): no step across it
    a, b = now.snapshot(), later.snapshot()
    assert a["steps"] == b["steps"] == 4 and a["step_s"] == pytest.approx(b["step_s"]) == pytest.approx(3.2)
    assert now.idle_s > 0 and later.idle_s > 0


def test_a_trace_past_its_limit_says_how_many_events_it_left_out(tmp_path: Path) -> None:
    st = Stats(started=0.0, trace_limit=4)
    for i in range(3):
        st.result(0, i, i + 0.5, i + 1.0)
        st.handed(i + 1.0, i + 1.1, 8, 0)
    assert st.trace.dropped == 4 and len(st.trace) == 4  # of 3 fetches, 3 waits and 2 steps
    with pytest.warns(UserWarning, match="4 later ones were left out"):
        doc = json.loads(write_trace(st, tmp_path / "t.json").read_text())
    assert doc["otherData"]["dropped_events"] == 4
    kept = Stats(started=0.0)
    kept.result(0, 0.0, 0.5, 1.0)
    assert "dropped_events" not in json.loads(write_trace(kept, tmp_path / "k.json").read_text())["otherData"]


def test_report_of_epochs_that_ended_without_a_batch_does_not_ask_to_iterate() -> None:
    from conveyor import DataLoader

    loader = DataLoader(list(range(3)), batch_size=4, drop_last=True, output="numpy")
    assert list(loader) == [] and list(loader) == []
    assert loader.report().startswith("2 epoch(s) ended without a batch: the dataset is empty")
    assert DataLoader([1]).report().startswith("no batches yet")


def test_the_timeline_shows_the_start_and_the_steady_state_a_few_dozen_batches_each() -> None:
    # 240 batches drawn whole blurred their wait and step bars into stripes
    from conveyor.plots import _handed_times, timeline_windows

    st = run(2, batch_s=0.03, step_s=0.01, batches=240)
    handed = [t - st.started for t in _handed_times(st)]
    assert len(handed) == 240
    windows = timeline_windows(st, batches=32)
    assert [w[0] for w in windows] == ["the start: batches 1-32", "steady state: batches 105-136"]
    (_, a0, b0), (_, a1, b1) = windows
    assert a0 == 0.0 and sum(a0 < t <= b0 for t in handed) == 32
    assert sum(a1 < t <= b1 for t in handed) == 32 and a1 > b0
    short = run(2, batch_s=0.03, step_s=0.01, batches=40)
    assert [w[0] for w in timeline_windows(short, batches=32)] == ["all 40 batches"]


def test_report_advises_persistent_workers_once_and_gives_the_first_batch_one_set_of_numbers() -> None:
    # "52% of the wait (0.10 s) is for each epoch's first batch ... persistent_workers=True
    # pays it once. The first batch took 2.7 s (worker start-up); persistent_workers=True
    # pays it once": two numbers of one thing that disagree, and the advice twice
    text = report(_in_workers(40, first_waits_s=0.1, first_batch_s=2.7), cores=8)
    assert "83% of the wait (0.10 s) is for each epoch's first batch" in text, text
    assert "2.7 s" not in text and text.count("persistent_workers=True") == 1, text
    # the main process kept the batches: its advice names persistent_workers, the first batch does not again
    kept = snap(run(0, batch_s=0.004, step_s=0.002), 2, workers_not_started="a worker's batch costs more",
                first_batch_s=2.7)
    text = report(kept, cores=8)
    assert text.count("persistent_workers=True") == 1 and "The first batch took 2.7 s (worker start-up)" in text, text


def test_report_names_the_torch_import_and_not_the_workers_start_up() -> None:
    # a numpy dataset with torch output: the first iter() imports torch (~1.7 s), which the
    # first batch paid and report() called the workers' start-up
    s = snap(run(2, batch_s=0.019, step_s=0.01, wait_s=0.0002), 2, first_batch_s=0.02, torch_import_s=1.7)
    text = report(s, cores=8)
    assert "Importing torch took 1.7 s before the first batch (once per process" in text, text
    assert "start-up" not in text and "persistent_workers" not in text, text
