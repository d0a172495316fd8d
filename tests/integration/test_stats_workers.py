"""Stats and report() read from real runs with workers: spans, resident memory, the workers
that made batches, pauses, the timeline's tracks (the synthetic-timing half is
tests/unit/test_stats.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conveyor
from conveyor.plots import plot_timeline
from test_stats import _Computes, run


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_epochs_of_one_batch_are_not_read_as_a_loop_that_takes_no_time(num_workers: int) -> None:
    # a validation set smaller than a batch: no step between two batches is ever timed, the
    # wait was all of the time measured, and report() said "100% of each step is spent
    # waiting; the training loop takes (almost) no time between batches"
    with conveyor.DataLoader(_Computes(), batch_size=64, num_workers=num_workers, output="numpy") as loader:
        for _ in range(3):
            for _ in loader:
                time.sleep(0.01)
        stats, text = loader.stats(), loader.report()
    assert stats["batches"] == 3 and stats["steps"] == 0
    assert text.startswith("each epoch handed out one batch (3 so far), so no training step between batches was "
                           "timed: a batch took"), text
    assert "no time" not in text and "spent waiting" not in text
    assert ("persistent_workers=True" in text) == (stats["num_workers"] > 0)  # (adaptive may keep them back)


def test_a_worker_with_fetch_threads_reports_no_short_first_span() -> None:
    from conveyor.executors.task import Task
    from conveyor.executors.fetcher import Fetcher
    from conveyor.executors.worker import WorkerSpec

    # its threads fetch ahead from the start: the first batches come from what they fetched
    # before any span began (3 batches in 2.2 ms of wall on 2.3 ms of CPU read as a full core)
    clock = iter(range(1, 1000))
    spec = dataclasses.replace(WorkerSpec(list(range(100)), None, True, 2, False, False, 1, 0), fetch_threads=4)
    worker = Fetcher(spec, 0, cpu_clock=lambda: float(next(clock)))
    try:
        spans = [r.cpu_span[0] for k in range(20) if (r := worker.run(Task(k, 0, [k, k + 1]))).cpu_span]
    finally:
        worker.close()
    assert spans == [8, 8]


@pytest.mark.timeout(60)
def test_process_workers_report_their_resident_memory() -> None:
    import os
    import sys

    import conveyor

    if not os.path.exists("/proc/self/statm") or not sys.platform.startswith("linux"):
        pytest.skip("resident memory is read from /proc")
    with conveyor.DataLoader(list(range(64)), batch_size=4, num_workers=2, adaptive=False) as loader:
        assert len(list(loader)) == 16
        workers = loader.stats()["workers"]
    for w in (0, 1):
        rss = workers[w]["rss"]
        assert rss is not None and 1 << 20 < rss < 1 << 40  # a Python process: at least a MiB


class _Sleepy:
    """1 ms a sample, 8 ms a batch of 8: slow enough that the probing batch starts workers."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> int:
        import time

        time.sleep(0.001)
        return i


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_stats_count_the_workers_that_made_batches_in_a_short_epoch(worker_type: str) -> None:
    # one short epoch in which the pool still probed: thread workers made all but the first
    # batch, and stats() said num_workers=0 (report() then advised 'up to num_workers=1')
    import conveyor

    with conveyor.DataLoader(_Sleepy(), batch_size=8, num_workers=2, worker_type=worker_type) as loader:
        assert len(list(loader)) == 13
        s = loader.stats()
    made = {int(w): v["batches"] for w, v in s["workers"].items()}
    assert sum(n for w, n in made.items() if w >= 0) > 0, made  # the workers made batches
    assert s["num_workers"] == 2, (s["num_workers"], made)


class _Shards:
    """A stream whose worker k reads 3 * (2 - k) batches of 4: shards of unequal length."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        import numpy as np

        from conveyor import get_worker_info

        info = get_worker_info()
        k = info.id if info is not None else 0
        for i in range(12 * (2 - k)):
            yield np.full(2, i, dtype=np.float32)


@pytest.mark.timeout(60)
def test_a_streams_end_is_no_batch_of_its_worker() -> None:
    # each worker's last task found its stream ended: that counted as a batch, and a worker
    # with nothing left showed 3 "batches" of 0.1 ms, shrinking the mean a report quotes
    from conveyor import DataLoader, IterableDataset

    ds = type("Shards", (_Shards, IterableDataset), {})()
    with DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=4, output="numpy") as loader:
        got = list(loader)
        stats = loader.stats()
    assert len(got) == 9 == stats["batches"]
    assert {k: w["batches"] for k, w in stats["workers"].items()} == {0: 6, 1: 3}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pause_after_an_epoch_left_early_is_no_training_step(num_workers: int) -> None:
    # 4 batches, break, 0.5 s of validation, a whole epoch: the pause counted as one step
    # (step_per_batch_s read 63 ms of a 10 ms loop) and as the loader's time
    from conveyor import DataLoader

    with DataLoader(list(range(64)), batch_size=4, num_workers=num_workers, output="numpy") as loader:
        t0 = time.perf_counter()
        for i, _ in enumerate(loader):
            if i == 3:
                break
        p0 = time.perf_counter()
        time.sleep(0.5)
        pause = time.perf_counter() - p0
        for _ in loader:
            time.sleep(0.001)
        s = loader.stats()
        wall = time.perf_counter() - t0
    assert s["batches"] == 20 and s["steps"] == 3 + 15
    # the steps and the loader's time fit in the run less the pause, however long a busy
    # machine makes each (counted, the pause would be in them: neither fits)
    assert s["step_s"] <= wall - pause, (s["step_s"], wall, pause)
    assert s["elapsed_s"] <= wall - pause, (s["elapsed_s"], wall, pause)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["end", "break", "close"])
def test_stats_read_after_a_run_hold_still(how: str) -> None:
    # throughput and busy fractions were divided by the time up to the read: 2 s after the
    # run they fell to a quarter, and report() turned from "uneven" to "20 workers"
    from conveyor import DataLoader

    loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, adaptive=False, output="numpy")
    for i, _ in enumerate(loader):
        if how == "break" and i == 5:
            break
    if how == "close":
        loader.close()
    first = loader.stats()
    time.sleep(0.3)
    later = loader.stats()
    loader.close()
    assert first["batches"] == later["batches"] > 0
    assert later["throughput_batches_s"] == first["throughput_batches_s"]
    assert later["elapsed_s"] == first["elapsed_s"]
    assert [w["busy_fraction"] for w in later["workers"].values()] == \
        [w["busy_fraction"] for w in first["workers"].values()]


def test_the_timeline_has_a_track_for_every_worker_and_names_the_setting(tmp_path: Path) -> None:
    from conveyor.plots import _given, _setting, _tracks
    from conveyor.stats import LOOP

    st = run(2, batch_s=0.03, step_s=0.01, batches=8)
    # a worker that made no batch in the run (the third of three) still has its track
    assert list(_tracks(st, 3)) == [LOOP, 0, 1, 2]
    assert set(_tracks(st, 3)[0]) == {"fetch"} and not _tracks(st, 3)[2]
    assert _setting({"num_workers": 2, "fetch_threads": 1, "prefetch_factor": 2}) == "num_workers=2, prefetch_factor=2"
    assert _setting({"num_workers": 0, "fetch_threads": 8, "prefetch_factor": None}) == "num_workers=0, fetch_threads=8"
    ran = {"batches": 40, "main_process_batches": 2, "workers": {-1: {"batches": 2}, 0: {"batches": 38}}}
    assert (_setting({"num_workers": "auto", "fetch_threads": "auto", "prefetch_factor": "auto"}, ran)
            == "num_workers='auto', fetch_threads='auto', prefetch_factor='auto' (1 worker ran)")
    assert (_setting({"num_workers": 2, "fetch_threads": 1, "prefetch_factor": 2}, ran)
            == "num_workers=2, prefetch_factor=2 (2 of 40 batches made in the main process)")
    assert _setting(_given(conveyor.DataLoader(list(range(8)), num_workers=2, fetch_threads=4))) == \
        "num_workers=2, fetch_threads=4, prefetch_factor=2"
    pytest.importorskip("matplotlib")
    with conveyor.DataLoader(list(range(64)), batch_size=4, num_workers=2, output="numpy") as loader:
        for _ in loader:
            pass
        png = plot_timeline(loader, tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TORCH_BEFORE_THE_CLOCK = """
import sys
import numpy as np
import conveyor
from conveyor.stats import Stats

class Rows:
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return np.full(4, i, dtype=np.float32)

begin = Stats.begin
seen = []
def noting(self):
    seen.append("torch" in sys.modules)
    begin(self)
Stats.begin = noting
assert "torch" not in sys.modules
with conveyor.DataLoader(Rows(), batch_size=8, num_workers=%d) as loader:  # output: torch's tensors
    # (the class is torch's DataLoader's subclass, made at its first use: torch may be imported
    # by then; if not, the first iter() imports it and times it apart)
    before_iter = "torch" in sys.modules
    batches = [b for b in loader]
    s = loader.stats()
assert type(batches[0]).__module__.startswith("torch"), type(batches[0])
assert seen == [True], seen  # torch was there when the clock started
if before_iter:
    assert s["torch_import_s"] is None, s["torch_import_s"]
else:
    assert s["torch_import_s"] is not None and s["torch_import_s"] > 0, s["torch_import_s"]
print("OK")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_the_first_iter_imports_torch_before_the_loaders_clock_starts(tmp_path: Path, workers: int,
                                                                      script_env: dict[str, str]) -> None:
    pytest.importorskip("torch")
    path = tmp_path / "first_import.py"
    path.write_text(TORCH_BEFORE_THE_CLOCK % workers)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=script_env,
                          timeout=110, cwd=tmp_path)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
