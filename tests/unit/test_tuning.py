"""Tuner decisions on synthetic stats snapshots: no real timing, no processes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import pytest

import conveyor.placement.machine
import conveyor.placement.tuner
from conveyor.placement import Decision, Tuner, cpu_budget, ram_budget

GiB = 2**30


@dataclass
class Workload:
    """A made-up data set and training loop: per-batch CPU and I/O seconds, the loop's step."""

    cpu: float
    io: float
    step: float
    cores: int
    report_cpu: bool = True
    rss: int = 0
    batch_bytes: int = 0


class Sim:
    """Cumulative ``loader.stats()`` snapshots of a loader running ``work`` under the given settings."""

    def __init__(self, work: Workload, decision: Decision) -> None:
        self.work = work
        self.d = decision
        self.snap = {"batches": 0, "steps": 0, "step_s": 0.0, "wait_s": 0.0, "workers": {}}
        self.clock = 0.0  # seconds the simulated loop has run

    def apply(self, d: Decision) -> None:
        self.d = d

    def run(self, batches: int) -> dict:
        w, d = self.work, self.d
        procs = max(1, d.num_workers)
        threads = d.fetch_threads
        # processes share the cores; a process's threads split each batch's samples and
        # share one core (GIL): a worker's wall per batch is the batch's fetching spread over
        # its threads, or its CPU time, whichever is longer
        cpu = w.cpu * max(1.0, procs / w.cores)
        busy = max((w.io + cpu) / threads, cpu)
        interval = busy / procs if d.num_workers else busy
        wait = max(0.0, interval - w.step) if d.num_workers else busy
        self.clock += (w.step + wait) * batches
        s = self.snap
        s["batches"] += batches
        s["steps"] += batches
        s["step_s"] += w.step * batches
        s["wait_s"] += wait * batches
        s["num_workers"] = d.num_workers
        s["fetch_threads"] = d.fetch_threads
        s["prefetch_factor"] = d.prefetch_factor
        if w.batch_bytes:
            s["mean_batch_bytes"] = w.batch_bytes
        keys = range(d.num_workers) if d.num_workers else [-1]
        for i, k in enumerate(keys):
            cur = s["workers"].setdefault(k, {"batches": 0, "busy_s": 0.0, "cpu_s": 0.0, "cpu_batches": 0,
                                             "mean_batch_s": 0.0, "std_batch_s": 0.0})
            n = batches // len(keys) + (1 if i < batches % len(keys) else 0)
            if not n:
                continue
            cur["batches"] += n
            cur["busy_s"] += busy * n
            cur["mean_batch_s"] = cur["busy_s"] / cur["batches"]
            if w.report_cpu:
                cur["cpu_s"] += w.cpu * n
                cur["cpu_batches"] += n
            else:
                cur["cpu_s"] = None
            if w.rss and k >= 0:
                cur["rss"] = w.rss
        return json.loads(json.dumps(s))  # plain data, as a real snapshot (keys become strings)


def tune(work: Workload, *, ram: int | None = None, every: int = 8, limit: int = 200,
         start: Decision | None = None, workers: int | None = None) -> tuple[Decision, int]:
    """Run the loop the loader will run: observe every ``every`` batches, apply each decision at
    once, fetch threads through the tuner's ThreadSteer (on the simulated clock). Returns the
    settled decision with the thread count that ran. ``workers``: the user fixed that many."""
    start = start or Decision(workers or 0, 1, None)
    tuner = Tuner(cpu=work.cores, ram=ram, workers=workers)
    sim = Sim(work, start)
    seen = 0
    with mock.patch.object(conveyor.placement.tuner.time, "perf_counter", lambda: sim.clock):
        while seen < limit:
            tuner.observe(sim.run(every))
            seen += every
            d = tuner.decision()
            if not d.reason.startswith("measuring"):
                threads = tuner.steer_threads(sim.d.fetch_threads) if sim.d.num_workers else d.fetch_threads
                sim.apply(replace(d, fetch_threads=threads, num_workers=workers or d.num_workers))
            if d.settled:
                return sim.d, seen
    raise AssertionError(f"the tuner did not settle within {limit} batches: {tuner.decision()}")


def test_cpu_bound_slow_fetch_gets_processes_within_budget() -> None:
    d, seen = tune(Workload(cpu=0.02, io=0.0, step=0.01, cores=8))
    assert (d.num_workers, d.fetch_threads) == (3, 1)  # ceil(0.02 * 1.1 / 0.01)
    assert "CPU-bound" in d.reason
    assert seen <= 48


def test_cpu_bound_never_exceeds_cpu_budget() -> None:
    d, _ = tune(Workload(cpu=0.08, io=0.0, step=0.01, cores=4))
    assert d.num_workers == 4 and d.fetch_threads == 1
    assert "CPU budget is 4" in d.reason


def test_io_bound_fetch_gets_threads_not_processes() -> None:
    d, seen = tune(Workload(cpu=0.002, io=0.05, step=0.01, cores=8))
    assert d.num_workers == 1
    assert d.fetch_threads == math.ceil(0.052 * 1.1 / 0.01)
    assert "I/O-bound" in d.reason
    assert seen <= 48


def test_threads_are_sized_for_the_workers_the_user_fixed() -> None:
    # num_workers=4, fetch_threads="auto": 6 fetches at once hide loading, 2 a worker; the
    # tuner sized threads for the one worker it would have picked, 6 for each of the 4
    d, _ = tune(Workload(cpu=0.002, io=0.05, step=0.01, cores=8), workers=4)
    assert (d.num_workers, d.fetch_threads) == (4, 2), d
    # ... and a memory cap does not cut workers the user fixed
    d, _ = tune(Workload(cpu=0.02, io=0.0, step=0.01, cores=8, rss=GiB), workers=4, ram=2 * GiB)
    assert d.num_workers == 4 and "memory allows" not in d.reason, d


def test_fast_fetch_needs_no_workers() -> None:
    d, _ = tune(Workload(cpu=0.0002, io=0.0, step=0.01, cores=8))
    assert d.num_workers == 0 and d.prefetch_factor is None


def test_moderate_fetch_needs_one_worker() -> None:
    d, _ = tune(Workload(cpu=0.005, io=0.0, step=0.01, cores=8), start=Decision(4, 1, 2))
    assert (d.num_workers, d.fetch_threads) == (1, 1)


def test_memory_limits_the_worker_count() -> None:
    work = Workload(cpu=0.04, io=0.0, step=0.005, cores=8, rss=2 * GiB, batch_bytes=64 * 2**20)
    unlimited, _ = tune(work, ram=None)
    limited, _ = tune(work, ram=5 * GiB)
    assert unlimited.num_workers == 8
    assert limited.num_workers == 2
    assert "memory allows 2" in limited.reason


def test_threads_raised_for_fewer_workers_that_fit_in_memory_still_fit() -> None:
    # I/O-bound, 4 workers of 9 threads, 1 GiB each plus batches of 100 MiB, a 3 GiB budget:
    # memory fits 2, whose threads doubled to 18 hold more batches: 3.2 GiB went unchecked
    t = Tuner(cpu=4, ram=3 * GiB)
    t.observed.rss, t.observed.batch_bytes = GiB, 100 * 2**20
    d = t._choose({"busy": 0.1, "work": 0.8, "cpu": 0.2, "step": 0.025, "std": 0.0, "each": None, "use": None,
                   "samples": 32})
    each = GiB + (d.prefetch_factor or 2) * 100 * 2**20 * (d.fetch_threads // 8 + 1)
    assert d.fetch_threads > 9 and d.num_workers * each <= 3 * GiB, d
    assert f"memory allows {d.num_workers} (each worker ~{each / 2**20:.0f} MiB" in d.reason, d


def test_without_cpu_times_a_probe_tells_io_from_cpu() -> None:
    io, _ = tune(Workload(cpu=0.001, io=0.05, step=0.01, cores=2, report_cpu=False))
    assert io.fetch_threads > 1 and io.num_workers <= 2
    cpu, _ = tune(Workload(cpu=0.05, io=0.001, step=0.01, cores=2, report_cpu=False))
    assert (cpu.num_workers, cpu.fetch_threads) == (2, 1)


def test_a_batch_seen_waiting_counts_as_io_without_cpu_times() -> None:
    # no CPU times in the stats and no probe yet: a batch the loader saw waiting decides
    work = Workload(cpu=0.001, io=0.05, step=0.01, cores=2, report_cpu=False)
    told = Tuner(cpu=2, ram=None)
    told.note_waiting()
    sim = Sim(work, Decision(2, 2, 2))
    for _ in range(3):
        told.observe(sim.run(8))
    d = told.decision()
    assert "I/O-bound" in d.reason and d.fetch_threads > 2, d
    untold = Tuner(cpu=2, ram=None)
    sim = Sim(work, Decision(2, 1, 2))
    for _ in range(3):
        untold.observe(sim.run(8))
    assert "I/O-bound" not in untold.decision().reason


def test_windows_before_the_workers_first_cpu_times_are_not_read_as_no_cpu_clocks() -> None:
    # a worker's first CPU time comes with its fourth batch: the first window had none, and
    # was read as a machine without CPU clocks, a probe of 2 fetch threads a worker (JPEG
    # decoding, CPU-bound, then kept them: 0.82-0.90 of num_workers=2's time)
    tuner = Tuner(cpu=2, ram=None, warmup=4)
    sim = Sim(Workload(cpu=0.09, io=0.0, step=0.0001, cores=2), Decision(2, 1, 2))
    first = sim.run(4)
    for w in first["workers"].values():
        w["cpu_s"], w["cpu_batches"] = None, 0
    tuner.observe(first)
    assert tuner.measuring and "first CPU times" in tuner.decision().reason, tuner.decision()
    tuner.observe(sim.run(8))
    d = tuner.decision()
    assert not tuner.measuring and "CPU-bound" in d.reason and d.fetch_threads == 1, d


def test_measures_before_deciding() -> None:
    tuner = Tuner(cpu=4, ram=None, warmup=8)
    tuner.observe(Sim(Workload(0.02, 0.0, 0.01, 4), Decision(0, 1, None)).run(4))
    d = tuner.decision()
    assert not d.settled and d.reason.startswith("measuring")


def test_pin_round_trip_and_pinned_decisions_do_not_move() -> None:
    d = Decision(3, 8, 4, "I/O-bound", True)
    assert Decision.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    assert Decision.from_dict({"num_workers": 0, "prefetch_factor": 2}).prefetch_factor is None
    tuner = Tuner(cpu=8, ram=None)
    pinned = tuner.pin(d.to_dict())
    assert (pinned.num_workers, pinned.fetch_threads, pinned.prefetch_factor) == (3, 8, 4)
    assert pinned.settled and pinned.reason.startswith("fixed")
    tuner.observe(Sim(Workload(0.0001, 0.0, 0.01, 8), Decision(3, 8, 4)).run(64))
    assert tuner.decision() == pinned
    assert pinned.loader_kwargs() == {"num_workers": 3, "fetch_threads": 8, "prefetch_factor": 4}


def test_budgets() -> None:
    assert cpu_budget() >= 1
    b = ram_budget(0.25)
    assert b is None or b > 0


@pytest.mark.parametrize("step", [0.0, 1e-9])
def test_a_loop_that_takes_no_time_gets_the_whole_budget(step: float) -> None:
    d, _ = tune(Workload(cpu=0.01, io=0.0, step=step, cores=3))
    assert d.num_workers == 3


def test_threads_that_shorten_the_batch_are_not_read_as_needing_fewer() -> None:
    # 32 samples of 5 ms each and a loop that takes 1 ms a batch: 32 * 5 ms * 1.1 / 1 ms = 177
    # fetches must be in flight, 64 threads in each of 2 workers at most. With 16 threads a
    # batch takes 10 ms in a worker; read as if one fetch made it, 11 fetches would seem to do.
    d, seen = tune(Workload(cpu=0.002, io=0.16, step=0.001, cores=2), start=Decision(2, 16, 2))
    assert (d.num_workers, d.fetch_threads) == (2, 64), d
    assert "I/O-bound" in d.reason and seen <= 48


def test_threads_stop_where_they_fill_the_worker_core() -> None:
    # a fetch computes a quarter of its time: four threads keep a worker's core busy, and more
    # would only queue for it however many fetches the loop asks for
    d, _ = tune(Workload(cpu=0.02, io=0.06, step=0.0005, cores=2), start=Decision(2, 2, 2))
    assert (d.num_workers, d.fetch_threads) == (2, 4), d
    assert "keep its core busy" in d.reason


def _threads_chosen(span_use: float | None, core_use: float | None = None) -> int:
    """Fetch threads the tuner asks of 2 workers of 64 threads, 1 ms of CPU and 0.1 ms of
    wall a batch (threads fetched it ahead), their spans' CPU ``span_use`` of the wall spanned
    (None: no spans) and the core they held ``core_use`` of it (None: not told)."""
    tuner = Tuner(cpu=2, ram=None)
    for k in range(1, 7):
        w = {"batches": 16 * k, "busy_s": 1.6e-3 * k, "mean_batch_s": 1e-4, "std_batch_s": 0.0,
             "cpu_s": 0.016 * k, "cpu_batches": 16 * k}
        if span_use is not None:
            w["cpu_wall_s"] = 0.016 * k / span_use
        if core_use is not None:
            w["core_s"] = core_use * w["cpu_wall_s"]
        tuner.observe({"batches": 32 * k, "steps": 32 * k - 1, "step_s": 5e-5 * (32 * k - 1), "wait_s": 0.1 * k,
                       "num_workers": 2, "fetch_threads": 64, "workers": {0: w, 1: dict(w)}})
    return tuner.decision().fetch_threads


def test_a_worker_core_share_comes_from_its_spans_not_a_batch_interval() -> None:
    # 64 threads fetch a worker's batches ahead of it: the batch it waits for is done by the
    # time it asks, so its interval (0.1 ms) is mostly collating, CPU all along. Over spans of
    # batches, idle time included, the worker kept its core 30% busy: there is room, no cut.
    assert _threads_chosen(0.3) == 64
    assert _threads_chosen(None) == 32


def test_a_worker_core_share_is_the_core_it_held_not_its_threads_waits_added_up() -> None:
    # 64 threads that wake together from 5 ms sleeps queue for the 2 cores at once: their
    # waits added up (the CPU demand of each fetch) came to 3 s a second of wall, read as
    # a full core and cut to 32 threads. The core the worker held or waited for: 30% of it.
    assert _threads_chosen(3.0, core_use=0.3) == 64
    assert _threads_chosen(3.0) == 32


def _fetching(tuner: Tuner, threads: int, each: float, windows: int = 4, *, use: float | None = None) -> None:
    """``windows`` windows of 2 workers of ``threads`` fetch threads, 32 samples a batch, each
    fetch taking ``each`` seconds as the threads time it, a 0.2 ms loop that waits."""
    snap = tuner.observed.last or {"batches": 0, "samples": 0, "steps": 0, "step_s": 0.0, "wait_s": 0.0, "workers": {}}
    for _ in range(windows):
        snap = json.loads(json.dumps(snap))
        snap.update(num_workers=2, fetch_threads=threads, prefetch_factor=4)
        snap["batches"] += 4
        snap["samples"] += 4 * 32
        snap["steps"] += 4
        snap["step_s"] += 0.0002 * 4
        snap["wait_s"] += 0.02 * 4
        for k in ("0", "1"):
            w = snap["workers"].setdefault(k, {"batches": 0, "busy_s": 0.0, "cpu_s": 0.0, "cpu_batches": 0,
                                               "mean_batch_s": 0.01, "std_batch_s": 0.0, "cpu_wall_s": 0.0,
                                               "core_s": 0.0, "work_s": 0.0, "work_batches": 0})
            w["batches"] += 2
            w["busy_s"] += 0.02
            w["cpu_s"] += 0.002 * 2  # 2 ms of CPU a batch: its fetches mostly wait
            w["cpu_batches"] += 2
            w["work_s"] += each * 32 * 2
            w["work_batches"] += 2
            if use is not None:
                w["cpu_wall_s"] += 0.04
                w["core_s"] += 0.04 * use
        tuner.observe(snap)


def test_fetch_threads_that_crowd_each_other_are_cut_to_what_fetches_as_much() -> None:
    # one fetch took 3 ms alone; with 64 threads a worker each took 40 ms (the GIL, a core:
    # 1 ms of Python and 2 ms of waiting a sample ran 20% slower on 64 threads than on 4)
    tuner = Tuner(cpu=2, ram=None, start=Decision(2, 64, 2))
    tuner.note_waiting(0.003)
    _fetching(tuner, 64, 0.040)
    d = tuner.decision()
    assert d.fetch_threads == math.ceil(64 * conveyor.placement.tuner.CROWD_MARGIN / (0.040 / 0.003)), d
    assert "as long as one alone" in d.reason and tuner._crowded
    # the same fetch times without knowing what one took alone: nothing says they crowd
    blind = Tuner(cpu=2, ram=None, start=Decision(2, 64, 2))
    blind.note_waiting()
    _fetching(blind, 64, 0.040)
    assert blind.decision().fetch_threads == 64 and not blind._crowded


def test_a_full_core_of_fetches_as_fast_as_alone_is_not_cut_by_half() -> None:
    # 4 threads fill a worker's core, and each fetch takes about what it took alone: half as
    # many would fetch half as much (offered, a check over 4 batches let 2 threads stand)
    tuner = Tuner(cpu=2, ram=None, start=Decision(2, 4, 2))
    tuner.note_waiting(0.003)
    _fetching(tuner, 4, 0.0045, use=0.97)
    assert tuner.decision().fetch_threads == 4, tuner.decision()
    # fetches twice as slow as alone on a full core: they crowd it, fewer are offered
    crowded = Tuner(cpu=2, ram=None, start=Decision(2, 16, 2))
    crowded.note_waiting(0.003)
    _fetching(crowded, 16, 0.024, use=0.97)
    assert crowded.decision().fetch_threads < 16, crowded.decision()


def test_a_cut_of_crowding_threads_is_judged_by_how_fast_each_fetch_then_is() -> None:
    from conveyor.placement import ThreadSteer

    def cut(after: list[float]) -> tuple[list[int], int]:
        s = ThreadSteer()
        runs = [s.steer(64, 8, each=0.040, crowded=True), s.steer(64, 8, each=0.040, crowded=True)]
        for each in after:
            runs.append(s.steer(runs[-1], 8, each=each, crowded=False))
        return runs, s.floor

    # two votes, then straight to the model's count; the changeover window is not judged
    assert cut([0.030, 0.009, 0.008]) == ([64, 8, 8, 8, 8], 1)
    # each fetch as slow after the cut, two windows on: the threads were not crowding;
    # undone, and no cut goes below 64 again
    assert cut([0.040, 0.039, 0.041, 0.040]) == ([64, 8, 8, 8, 64, 64], 64)
    # one trial at a time: a cut checked by throughput is judged before crowding cuts again
    s = ThreadSteer()
    s.window(8, 1.0)
    s.steer(64, 8)
    s.window(16, 2.0)
    assert s.steer(64, 8) == 32  # at 8 batches/s
    s.window(20, 3.0)  # 4 batches/s: the cut cost throughput
    assert s.steer(32, 4, each=0.040, crowded=True) == 64 and s.floor == 64


def test_a_computing_fetch_that_also_waits_gets_threads_to_fill_its_core() -> None:
    # 2 ms of waiting and 2 of Python a sample (52-56% CPU with the batch's overhead), a loop
    # faster than 2 workers: 1 thread a worker left each core half idle (0.6 of 4 threads' speed)
    def tuned(cpu_share: float) -> Decision:
        tuner = Tuner(cpu=2, ram=None, start=Decision(2, 1, 2))
        for k in range(1, 7):
            w = {"batches": 8 * k, "busy_s": 0.010 * 8 * k, "mean_batch_s": 0.010, "std_batch_s": 0.0,
                 "cpu_s": 0.010 * cpu_share * 8 * k, "cpu_batches": 8 * k}
            tuner.observe({"batches": 16 * k, "steps": 16 * k - 1, "step_s": 0.0035 * (16 * k - 1),
                           "wait_s": 0.002 * 16 * k, "num_workers": 2, "fetch_threads": 1,
                           "workers": {0: w, 1: dict(w)}})
        return tuner.decision()

    half = tuned(0.55)
    assert "CPU-bound" in half.reason and (half.num_workers, half.fetch_threads) == (2, 2), half
    assert "threads a worker fill its core" in half.reason
    # decoding that computes all along (JPEG) stays at one thread a worker
    assert tuned(0.95).fetch_threads == 1


def test_ram_budget_is_bytes_none_or_auto() -> None:
    with pytest.raises(ValueError, match="ram"):
        Tuner(cpu=2, ram="plenty")
    assert Tuner(cpu=2, ram=None).ram is None
    assert Tuner(cpu=2, ram=1 << 30).ram == 1 << 30
    measured = Tuner(cpu=2).ram  # "auto": half of what the machine has available
    assert measured is None or measured > 0


def test_ranks_of_one_machine_share_its_cores_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # under DDP each rank's "auto" took every core and half the memory: 4 ranks on 2 cores
    # ran 2 workers each, and read the starved workers as waiting on storage
    tuning = conveyor.placement.machine
    monkeypatch.setattr(tuning, "usable_cores", lambda: 8)
    monkeypatch.setattr(tuning, "cgroup_cpus", lambda: None)  # (a quota: the next test)
    monkeypatch.setattr(tuning.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(tuning, "ram_budget", lambda: 8 << 30)
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert (tuning.cpu_share(), cpu_budget(), Tuner().ram) == (8, 7, 8 << 30)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's four ranks on these 8 cores
    assert (tuning.cpu_share(), cpu_budget(), Tuner().ram) == (2, 1, 2 << 30)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")  # more ranks than cores: a core each, at least
    assert tuning.cpu_share() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "nonsense")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    assert tuning.cpu_share() == 4
    # a launcher that binds each rank to cores of its own: the affinity is the share already
    monkeypatch.setattr(tuning, "usable_cores", lambda: 4)
    assert tuning.cpu_share() == 4
    monkeypatch.setattr(tuning.os, "cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert tuning.cpu_share() == 4


def _cgroups(tmp_path: Path, table: str, files: dict[str, str]) -> tuple[str, str]:
    """A cgroup tree under ``tmp_path``: (its root, a /proc/self/cgroup of ``table``)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    (tmp_path / "table").write_text(table)
    return str(root), str(tmp_path / "table")


@pytest.mark.parametrize("table, files, cpus", [
    # a container (cgroup namespace) with docker --cpus=1.5, unified hierarchy
    ("0::/\n", {"cgroup.controllers": "cpu memory", "cpu.max": "150000 100000"}, 1.5),
    # no quota at all
    ("0::/\n", {"cgroup.controllers": "cpu memory", "cpu.max": "max 100000"}, None),
    # a quota on the parent of this process's cgroup binds it too
    ("0::/a/b\n", {"cgroup.controllers": "", "a/cpu.max": "300000 100000", "a/b/cpu.max": "max 100000"}, 3.0),
    # v1 without a namespace: the cgroup's path is not there, the mount's root is the container's
    ("4:memory:/docker/x\n1:cpu,cpuacct:/docker/x\n0::/\n",
     {"cpu,cpuacct/cpu.cfs_quota_us": "200000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 2.0),
    ("1:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),
    # a hybrid host: v1 controllers, the unified hierarchy beside them
    ("1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
                           "unified/cpu.max": "50000 100000"}, 0.5),
])
def test_a_cgroup_cpu_quota_is_read(tmp_path: Path, table: str, files: dict[str, str], cpus: float | None) -> None:
    # docker --cpus and Kubernetes CPU limits leave the affinity listing every host core:
    # "auto" forked a worker per host core into a container allowed one or two
    root, path = _cgroups(tmp_path, table, files)
    assert conveyor.placement.machine.cgroup_cpus(root, path) == cpus


@pytest.mark.parametrize("table, files, free", [
    ("0::/\n", {"cgroup.controllers": "", "memory.max": str(1 << 30), "memory.current": str(1 << 28)}, 3 << 28),
    ("0::/\n", {"cgroup.controllers": "", "memory.max": "max", "memory.current": str(1 << 28)}, None),
    ("4:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712",
                       "memory/memory.usage_in_bytes": "649773056"}, None),  # v1's "no limit"
    ("4:memory:/\n", {"memory/memory.limit_in_bytes": str(2 << 30), "memory/memory.usage_in_bytes": str(3 << 30)}, 0),
])
def test_a_cgroup_memory_limit_is_read(tmp_path: Path, table: str, files: dict[str, str], free: int | None) -> None:
    root, path = _cgroups(tmp_path, table, files)
    assert conveyor.placement.machine.cgroup_free_bytes(root, path) == free


def test_a_cgroup_quota_and_limit_bound_what_auto_may_take(monkeypatch: pytest.MonkeyPatch) -> None:
    tuning = conveyor.placement.machine
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tuning, "usable_cores", lambda: 32)  # the host's cores, all in the affinity
    monkeypatch.setattr(tuning, "cgroup_cpus", lambda: 2.5)
    assert (tuning.cpu_share(), tuning.cpu_budget()) == (3, 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # the container's ranks share its quota
    assert tuning.cpu_share() == 1
    monkeypatch.setattr(tuning, "cgroup_cpus", lambda: 64.0)  # a quota above the cores: the cores bind
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert tuning.cpu_share() == 32
    monkeypatch.setattr(tuning, "cgroup_free_bytes", lambda: 1 << 30)
    assert tuning.ram_budget(0.5) == 1 << 29  # (this machine has more than 1 GiB free)


def test_the_cgroup_quota_is_read_once_a_while_not_at_every_iter(monkeypatch: pytest.MonkeyPatch) -> None:
    # its files cost 0.4-1.1 ms, each "auto" iter() read them: 3% of a 36 ms diabetes run
    tuning = conveyor.placement.machine
    reads: list[int] = []

    def quota() -> float:
        reads.append(1)
        return 2.0

    monkeypatch.setattr(tuning, "usable_cores", lambda: 8)
    monkeypatch.setattr(tuning, "cgroup_cpus", quota)
    assert [tuning.cpu_share() for _ in range(5)] == [2] * 5 and len(reads) == 1
    monkeypatch.setattr(tuning, "QUOTA_TTL_S", 0.0)  # ... and again once it is old
    tuning.cpu_share()
    assert len(reads) == 2


def test_auto_under_ranks_of_one_machine_starts_its_share_of_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    import conveyor.loader

    cores = conveyor.placement.machine.usable_cores()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores))
    loader = conveyor.DataLoader(list(range(8)), batch_size=2, num_workers="auto")
    assert conveyor.placement.machine.cpu_share() == 1 and loader.num_workers == 1  # the most "auto" may start


def test_fetches_timed_by_threads_ahead_of_their_batch_count_not_the_batch_wall() -> None:
    # batch_size=None, 5 ms a sample: the fetch threads fetch the batches a worker holds ahead
    # of their turn, so a batch's own wall time in the worker is near nothing. Read from it,
    # the work looked like 0.0 ms of CPU and one thread was chosen; the threads' own timing
    # says 5 ms of waiting a batch. With one sample a batch, the threads need as many
    # batches in flight as there are threads.
    tuner = Tuner(cpu=2, ram=None)
    snap: dict = {"batches": 0, "samples": 0, "steps": 0, "step_s": 0.0, "wait_s": 0.0,
                  "num_workers": 2, "fetch_threads": 4, "prefetch_factor": 2, "workers": {}}
    for _ in range(8):
        snap = json.loads(json.dumps(snap))
        n = 16
        snap["batches"] += n
        snap["samples"] += n  # one sample a batch
        snap["steps"] += n
        snap["step_s"] += 0.0001 * n
        snap["wait_s"] += 0.001 * n
        for k in ("0", "1"):
            w = snap["workers"].setdefault(k, {"batches": 0, "busy_s": 0.0, "cpu_s": 0.0, "cpu_batches": 0,
                                               "mean_batch_s": 0.00005, "std_batch_s": 0.0,
                                               "cpu_wall_s": 0.0, "work_s": 0.0, "work_batches": 0})
            w["batches"] += n // 2
            w["busy_s"] += 0.00005 * (n // 2)
            w["cpu_s"] += 0.00005 * (n // 2)
            w["cpu_batches"] += n // 2
            w["cpu_wall_s"] += 0.001 * (n // 2)  # the worker's CPU over the wall time its batches spanned
            w["work_s"] += 0.005 * (n // 2)
            w["work_batches"] += n // 2
        tuner.observe(snap)
    d = tuner.decision()
    assert "I/O-bound" in d.reason and "5.0 ms of fetching" in d.reason, d
    assert d.fetch_threads > 4, d
    assert d.prefetch_factor is not None and d.prefetch_factor >= d.fetch_threads, d


def test_the_tuner_keeps_a_bounded_history() -> None:
    # a window every few batches, kept for ever: 10,000 of them (3.45 MB) after 40k batches
    tuner = Tuner(cpu=4, ram=None)
    sim = Sim(Workload(0.002, 0.0, 0.01, 4), Decision(2, 1, 2))
    with mock.patch.object(conveyor.placement.tuner.time, "perf_counter", lambda: sim.clock):
        for _ in range(conveyor.placement.tuner.WINDOWS_KEPT + 50):
            tuner.observe(sim.run(4))
    assert len(tuner.windows) == conveyor.placement.tuner.WINDOWS_KEPT
    assert tuner.decision().num_workers >= 1
